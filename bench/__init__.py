"""Benchmarks of the gateway: `make bench` (python -m bench.run). See bench/RESULTS.md."""
