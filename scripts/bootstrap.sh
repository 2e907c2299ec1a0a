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
if ! "$VENV/bin/python" -m pip install -q -e ".[dev]" >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" >&2
  exit 1
fi
rm -f "$log" "$VENV"/.installed-*
touch "$stamp"
