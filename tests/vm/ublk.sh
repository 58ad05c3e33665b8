#!/usr/bin/env bash
# The ublk export under a real Linux kernel (issues 12, 17): one VM boot. See ublk.py.
#
#   tests/vm/ublk.sh            # quick: raw /dev/ublkb0 SIGKILL + --recover, stop --keep-ublk
#                               # + --recover (hand-over), read-only
#   tests/vm/ublk.sh --full     # and ext4 over the device (kill and hand-over)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/setup.sh"
exec python3 "$HERE/ublk.py" "$@"
