#!/usr/bin/env bash
# Builds the Go example client with Debian's Go toolchain and grpc-go (GOPATH mode, no module
# downloads) and runs it:  examples/go/run.sh 127.0.0.1:50051
# BUILD=dir puts the GOPATH, the build cache and the binary elsewhere (default examples/go/build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD:-$here/build}
binary=$build/go-client
if [ ! -x "$binary" ] || [ -n "$(find "$here" -name '*.go' -newer "$binary")" ]; then
  generated=$build/gopath/src/github.com/antwort-grpc/antwort-grpc/gen/go
  rm -rf "$build/gopath" && mkdir -p "$generated" "$build/gopath/src/antwortclient"
  (cd "$root/protos" && protoc -I. --go_out="$generated" --go_opt=paths=source_relative \
    --go-grpc_out="$generated" --go-grpc_opt=paths=source_relative antwort/v1/*.proto)
  cp "$here"/*.go "$build/gopath/src/antwortclient/"
  GO111MODULE=off GOPATH="$build/gopath:/usr/share/gocode" GOCACHE="$build/cache" \
    go build -o "$binary" antwortclient
fi
exec "$binary" "$@"
