//! The on-disk parsers fuzzed on stable Rust for a bounded time (see `uraid_testkit::fuzz`):
//! the corpus in `fuzz/seeds/NAME` and crashes in `fuzz/crashes/NAME` are replayed, then
//! seeded mutations run. The same bodies are the `fuzz/` cargo-fuzz targets.

use uraid_core::fuzzing;
use uraid_testkit::fuzz::{run, Target};

#[test]
fn fuzz_superblock() {
    run(&Target {
        name: "superblock",
        seeds: fuzzing::superblock_seeds(),
        max_len: 4096,
        body: &fuzzing::superblock,
    });
}

#[test]
fn fuzz_superblock090() {
    run(&Target {
        name: "superblock090",
        seeds: fuzzing::superblock090_seeds(),
        max_len: 4096,
        body: &fuzzing::superblock090,
    });
}

#[test]
fn fuzz_bitmap_super() {
    run(&Target {
        name: "bitmap_super",
        seeds: fuzzing::bitmap_super_seeds(),
        max_len: 512,
        body: &fuzzing::bitmap_super,
    });
}

#[test]
fn fuzz_journal_parse() {
    run(&Target {
        name: "journal_parse",
        seeds: fuzzing::journal_seeds(),
        max_len: 6 * 4096,
        body: &fuzzing::journal,
    });
}

#[test]
fn fuzz_ppl() {
    run(&Target {
        name: "ppl",
        seeds: fuzzing::ppl_seeds(),
        max_len: 3 * 4096,
        body: &fuzzing::ppl,
    });
}
