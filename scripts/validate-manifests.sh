#!/usr/bin/env bash
# Renders every kustomize overlay under deploy/overlays with `kubectl kustomize` (no cluster
# needed) and validates the output with kubernetes-validate against offline schemas.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in deploy/overlays/*/; do
  name=$(basename "$overlay")
  kubectl kustomize "$overlay" >"$out/$name.yaml"
  "$BIN/kubernetes-validate" --strict --quiet "$out/$name.yaml"
done
