#!/usr/bin/env bash
# Builds the Go load generator with Debian's Go toolchain and grpc-go (GOPATH mode, no module
# downloads; scripts/system-deps.sh installs them) and prints the binary's path. Rebuilds only
# when its Go files or the protos are newer than the binary.
# BUILD=dir puts the GOPATH, the build cache and the binary elsewhere (default bench/loadgen/build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD:-$here/build}
binary=$build/loadgen
if [ ! -x "$binary" ] || [ -n "$(find "$here" "$root/protos" -path "$build" -prune -o -newer "$binary" -name '*.*' -print)" ]; then
  generated=$build/gopath/src/github.com/antwort-grpc/antwort-grpc/gen/go
  rm -rf "$build/gopath" && mkdir -p "$generated" "$build/gopath/src/antwortloadgen"
  (cd "$root/protos" && protoc -I. --go_out="$generated" --go_opt=paths=source_relative \
    --go-grpc_out="$generated" --go-grpc_opt=paths=source_relative antwort/v1/*.proto)
  cp "$here"/*.go "$build/gopath/src/antwortloadgen/"
  GO111MODULE=off GOPATH="$build/gopath:/usr/share/gocode" GOCACHE="$build/cache" \
    go build -o "$binary" antwortloadgen >&2
fi
echo "$binary"
