#!/usr/bin/env bash
# The main job: a demo raid5 on sparse files in ./uraid-demo, served over NBD on 127.0.0.1
# (it prints how to connect; Ctrl-C stops it cleanly). Extra arguments go to `uraid demo`.
#
# The ublk export is built with libublk, whose build needs libclang. As root with apt-get,
# this script installs libclang-dev if it is missing; otherwise it builds without ublk.
set -euo pipefail
cd "$(dirname "$0")/.."
features=()
if ! ldconfig -p 2>/dev/null | grep -q 'libclang'; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq libclang-dev >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq libclang-dev >/dev/null; } \
            || features=(--no-default-features)
    else
        echo "demo: no libclang here: building without the ublk export" >&2
        features=(--no-default-features)
    fi
fi
exec cargo run --release "${features[@]}" -- demo "$@"
