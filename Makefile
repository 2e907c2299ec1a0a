# The two commands a newcomer needs: `make run` and `make test`. Both bootstrap the virtualenv.
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: run run-tools test test-fast lint protos demo bench venv clean

venv:
	@scripts/bootstrap.sh

run: venv
	$(BIN)/antwort-grpc serve

# The gateway on a scripted stand-in model that calls the tools it is offered (README, "Tools").
run-tools: venv
	$(BIN)/antwort-grpc serve --script examples/tool_caller.json

test: venv
	@scripts/system-deps.sh
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q

# The inner loop: everything but the heavy tests (tests/conftest.py lists them; `make test` runs them).
test-fast: venv
	@scripts/system-deps.sh
	$(PY) -m pytest -q -m "not heavy" -n auto --durations=10

lint: venv
	$(BIN)/ruff check antwort_grpc tests scripts examples
	$(BIN)/ruff format --check antwort_grpc tests scripts examples
	$(BIN)/mypy antwort_grpc
	cd protos && ../$(BIN)/buf lint
	# The contract only grows: Go/Java code generated from the baseline keeps working.
	cd protos && ../$(BIN)/buf breaking --against contract-baseline.binpb
	$(BIN)/hadolint Dockerfile
	# Every kustomize overlay, rendered by kubectl kustomize, against offline schemas.
	BIN=$(BIN) scripts/validate-manifests.sh

# The agentic loop end to end against a scripted fake model backend (nothing to install).
demo: venv
	$(PY) scripts/demo.py

# Benchmarks (a few minutes; not part of `make test`): bench/results/latest.json and bench/RESULTS.md.
# BENCH_TINY=1 runs everything in seconds; BENCH_ARGS="--only stream,tools --profile overhead" and so on.
bench: venv
	@scripts/system-deps.sh  # the Go toolchain and protoc for the bench's load generator
	$(PY) -m bench.run $(BENCH_ARGS)

protos: venv
	$(PY) scripts/gen_protos.py

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache
