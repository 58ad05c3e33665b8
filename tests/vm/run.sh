#!/usr/bin/env bash
# Linux md <-> uraid interoperability tests in a qemu VM (project issue 3).
#
#   tests/vm/run.sh            # quick mode, the CI default: a few minutes
#   tests/vm/run.sh --full     # all layouts, chunk sizes and disk counts
#   tests/vm/run.sh --only 'raid5-.*fail' --keep    # a subset, keeping the images
#   URAID=path/to/uraid tests/vm/run.sh            # default target/debug/uraid
#
# Installs what it needs on first use (tests/vm/setup.sh), then runs tests/vm/harness.py;
# all arguments go to the harness (see `tests/vm/run.sh --help`).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/setup.sh"
exec python3 "$HERE/harness.py" "$@"
