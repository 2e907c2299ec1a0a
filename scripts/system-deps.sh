#!/usr/bin/env bash
# Installs the Debian packages the test suite needs when they are missing (CI starts clean).
set -euo pipefail
need=()
[ -n "$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null)" ] || need+=(postgresql)
# A real Go client of the contract (tests/interop) and the bench's Go load generator (bench/loadgen,
# built by tests/test_bench_smoke.py): Debian's Go toolchain and grpc-go.
command -v go >/dev/null || need+=(golang-go golang-google-grpc-dev golang-google-protobuf-dev)
command -v protoc-gen-go-grpc >/dev/null || need+=(protobuf-compiler protoc-gen-go protoc-gen-go-grpc)
# grpc-go needs protobuf 1.5's shim: with the default 1.3 package the client builds but panics.
dpkg -s golang-github-golang-protobuf-1-5-dev >/dev/null 2>&1 || need+=(golang-github-golang-protobuf-1-5-dev)
# The Java example client (examples/java): a JDK and Debian's grpc-java jars, StatusProto and
# BadRequest from proto-google-common-protos.
command -v javac >/dev/null || need+=(default-jdk-headless)
for pkg in libgrpc-java libprotobuf-java protobuf-compiler-grpc-java-plugin libnetty-java libperfmark-java \
  libgoogle-gson-java libgoogle-common-protos-java; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# The Node example clients (examples/node): node and npm; the test installs their npm packages.
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
# A real terminal for the CLI's tests (tests/test_cli_terminal.py): tmux runs the client in a pane.
command -v tmux >/dev/null || need+=(tmux)
# A real Prometheus server scrapes the gateway in tests/test_metrics.py (and promtool checks it).
command -v promtool >/dev/null || need+=(prometheus)
# kubectl renders the kustomize overlays in deploy/ (make lint, tests/test_deploy.py); it needs no
# cluster. Debian's kubernetes-client when the machine has no kubectl of its own.
command -v kubectl >/dev/null || need+=(kubernetes-client)
if ((${#need[@]})); then
  echo "installing ${need[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  $sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
