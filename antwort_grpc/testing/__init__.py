"""Test doubles that speak real wire protocols (used by the tests, the demo and the benchmarks)."""
