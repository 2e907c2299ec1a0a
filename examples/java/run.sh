#!/usr/bin/env bash
# Builds the Java example client with Debian's grpc-java (no Maven) and runs it:
#   examples/java/run.sh 127.0.0.1:50051
# BUILD=dir puts the generated code and classes elsewhere (default examples/java/build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD:-$here/build}
jars=/usr/share/java
classpath=$build/classes
for jar in grpc-api grpc-context grpc-core grpc-netty grpc-protobuf grpc-protobuf-lite grpc-stub protobuf \
  protobuf-util guava gson perfmark-api geronimo-annotation-1.3-spec jsr305 error_prone_annotations \
  proto-google-common-protos netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-codec-socks \
  netty-common netty-handler netty-handler-proxy netty-resolver netty-transport netty-transport-native-unix-common; do
  [ -f "$jars/$jar.jar" ] || { echo "missing $jars/$jar.jar: run scripts/system-deps.sh" >&2; exit 1; }
  classpath=$classpath:$jars/$jar.jar
done
if [ ! -f "$build/classes/AntwortClient.class" ] || [ "$here/AntwortClient.java" -nt "$build/classes/AntwortClient.class" ]; then
  rm -rf "$build" && mkdir -p "$build/gen" "$build/classes"
  (cd "$root/protos" && protoc -I. --java_out="$build/gen" --plugin=protoc-gen-grpc-java=/usr/bin/grpc_java_plugin \
    --grpc-java_out="$build/gen" antwort/v1/*.proto)
  find "$build/gen" -name '*.java' > "$build/sources"
  echo "$here/AntwortClient.java" >> "$build/sources"
  javac -nowarn -d "$build/classes" -cp "$classpath" @"$build/sources"
fi
exec java -cp "$classpath" AntwortClient "$@"
