#!/usr/bin/env bash
# uraid's ublk and NBD exports under a real Linux kernel (project issue 4): one VM boot.
#
#   tests/vm/export.sh                       # default uraid: target/debug/uraid
#   URAID=path/to/uraid tests/vm/export.sh
#   tests/vm/export.sh --keep                # keep images and logs
#
# Needs what tests/vm/setup.sh installs, plus nbd-client and e2fsprogs (debugfs) on the host.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/setup.sh"
if ! command -v nbd-client >/dev/null && [ ! -x /usr/sbin/nbd-client ] && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nbd-client >/dev/null
fi
exec python3 "$HERE/export.py" "$@"
