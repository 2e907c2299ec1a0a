#!/usr/bin/env bash
# Installs the Debian packages the test suite needs when they are missing (CI starts clean).
set -euo pipefail
need=()
[ -n "$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null)" ] || need+=(postgresql)
if ((${#need[@]})); then
  echo "installing ${need[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  $sudo_ apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
