#!/usr/bin/env bash
# The test command: formatting, lints, every crate's tests, then Linux md interop in a VM.
#   scripts/test.sh          quick mode (CI)
#   scripts/test.sh --full   long property/simulator runs and every VM scenario
set -euo pipefail
cd "$(dirname "$0")/.."

full=0
[ "${1:-}" = "--full" ] && full=1
[ $full = 1 ] && export URAID_FULL=1

# Tests that skip (a tool missing, not root) append "test: reason" here; the count and the
# reasons are printed at the end, pass or fail. Under CI (CI set) such a test fails instead.
URAID_SKIP_LOG=$(mktemp "${TMPDIR:-/tmp}/uraid-skips.XXXXXX")
export URAID_SKIP_LOG
report_skips() {
    local n
    n=$(sort -u "$URAID_SKIP_LOG" | grep -c . || true)
    if [ "$n" = 0 ]; then
        echo "== 0 skipped"
    else
        echo "== $n skipped:"
        sort -u "$URAID_SKIP_LOG" | sed 's/^/   /'
    fi
    rm -f "$URAID_SKIP_LOG"
}
trap report_skips EXIT

# Under CI the debug build keeps line tables only (file:line in backtraces and panics, no
# variable info): less to generate and link in ~80 test binaries, and less disk. Not set
# outside CI, where it would rebuild what a plain `cargo test` built.
# Nor does a CI build keep incremental state (1.6 GB of target/debug/incremental that a clean
# clone never reuses): CI machines have been seen with little disk free.
if [ -n "${CI:-}" ]; then
    export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== docs build without warnings (intra-doc links)"
RUSTDOCFLAGS='-D warnings' cargo doc --workspace --no-deps
echo "== the production build holds no test crate (uraid-sim, uraid-testkit)"
if cargo tree -p uraid -e normal --prefix none | grep -E '^uraid-(sim|testkit) '; then
    echo "uraid's normal dependencies include a test crate" >&2
    exit 1
fi
echo "== module import graphs have no circle (scripts/modgraph.py)"
for src in crates/engine/src crates/cli/src crates/core/src crates/nbd/src; do
    python3 scripts/modgraph.py "$src" > /dev/null
done
echo "== one NBD adapter: the CLI serves through uraid_engine::nbd::ArrayBackend"
if grep -rn 'impl .*Backend for' crates/cli/src; then
    echo "crates/cli implements uraid_nbd::Backend itself; use uraid_engine::nbd::ArrayBackend" >&2
    exit 1
fi
echo "== cargo test"
cargo test --workspace --no-fail-fast
echo "== the VM suites' own helpers: where member images go when the disk is short"
python3 -m unittest tests/vm/test_scratch.py
echo "== Linux md interoperability (VM)"
# `cargo test --workspace` built target/debug/uraid already (the integration tests run it);
# `cargo build -p uraid` would build it again with other dependency features (minutes).
[ -x target/debug/uraid ] || cargo build -p uraid
if [ $full = 1 ]; then
    tests/vm/run.sh --full
else
    tests/vm/run.sh
fi
echo "== exports in the VM: nbd-client and ublk, ext4 on top"
tests/vm/export.sh
echo "== ublk: the server SIGKILLed under fio and recovered; read-only (VM)"
if [ $full = 1 ]; then
    tests/vm/ublk.sh --full
else
    tests/vm/ublk.sh
fi
echo "== the raid5 write journal with Linux md, both ways (VM)"
tests/vm/journal.sh
echo "== a raid5 Linux md left mid-reshape, read by uraid (VM)"
tests/vm/reshape.sh
echo "== a raid10 Linux md left mid-grow, read and finished by uraid, checked by Linux (VM)"
tests/vm/reshape10.sh
echo "== raid5 with PPL, both ways and crashed mid-write (VM)"
tests/vm/ppl.sh
if [ $full = 1 ]; then
    echo "== the never-written map's stamp against Linux md's superblock writes (VM)"
    python3 tests/vm/stamp.py
fi
echo "== all tests passed"
