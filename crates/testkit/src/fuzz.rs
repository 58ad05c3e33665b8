//! A fuzz driver for stable Rust.
//!
//! libFuzzer (cargo-fuzz) needs a nightly toolchain; CI has stable. This drives the same
//! target bodies (functions in the crates, which the `fuzz/` targets call too):
//!
//! 1. every file of `fuzz/seeds/NAME/` (the checked-in corpus) and `fuzz/crashes/NAME/`
//!    (inputs that once failed) is replayed;
//! 2. then inputs are generated from a seed that is printed: mutations (bit flips, special
//!    values, cuts, copies, splices) of the corpus and of the target's own valid encodings,
//!    and some plain random bytes.
//!
//! Bounds: `URAID_FUZZ_SECS` seconds per target (2, or 30 with `URAID_FULL=1`) and at most
//! `URAID_FUZZ_CASES` cases. `URAID_FUZZ_SEED` replays a printed seed. A failing input is
//! saved under `target/fuzz-crashes/NAME/`; the message says where to check it in.
//! `URAID_FUZZ_WRITE_SEEDS=1` writes each target's built-in seeds into `fuzz/seeds/NAME/`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The `fuzz/` folder of the repository.
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// What one run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The seed of the generated cases (printed, to reproduce a failure).
    pub seed: u64,
    /// How many corpus and crash files were replayed first.
    pub replayed_files: usize,
    /// How many generated cases ran.
    pub cases: u64,
}

/// A target: its name (the folder under `fuzz/seeds` and `fuzz/crashes`), valid inputs to
/// mutate besides the corpus, the longest input to generate, and its body, which panics on
/// a broken promise.
pub struct Target<'a> {
    /// The folder under `fuzz/seeds` and `fuzz/crashes`.
    pub name: &'a str,
    /// Valid inputs to mutate besides the corpus.
    pub seeds: Vec<Vec<u8>>,
    /// The longest input to generate.
    pub max_len: usize,
    /// Runs one input; panics on a broken promise.
    pub body: &'a dyn Fn(&[u8]),
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

/// FNV-1a, for a seed per target name and for crash file names.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// Runs `t` as described in the module docs; panics with the seed, the case and the saved
/// input when the body panics.
pub fn run(t: &Target<'_>) -> Report {
    let full = std::env::var_os("URAID_FULL").is_some();
    let secs = env_u64("URAID_FUZZ_SECS").unwrap_or(if full { 30 } else { 2 });
    let max_cases = env_u64("URAID_FUZZ_CASES").unwrap_or(u64::MAX);
    let seed = env_u64("URAID_FUZZ_SEED").unwrap_or_else(|| fnv(t.name.as_bytes()));
    if std::env::var_os("URAID_FUZZ_WRITE_SEEDS").is_some() {
        write_seeds(t);
    }
    run_with(t, seed, Duration::from_secs(secs), max_cases)
}

/// Writes the target's own seeds into `fuzz/seeds/NAME/` (the corpus cargo-fuzz starts
/// from), named by their hash; run after a format change, then check them in.
fn write_seeds(t: &Target<'_>) {
    let dir = fuzz_dir().join("seeds").join(t.name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for s in &t.seeds {
        let p = dir.join(format!("seed-{:016x}", fnv(s)));
        std::fs::write(&p, s).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}

/// [`run`] with explicit bounds.
pub fn run_with(t: &Target<'_>, seed: u64, time: Duration, max_cases: u64) -> Report {
    let name = t.name;
    let mut corpus = t.seeds.clone();
    let mut replayed = 0;
    for dir in ["seeds", "crashes"] {
        for f in files_in(&fuzz_dir().join(dir).join(name)) {
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| (t.body)(&data))) {
                panic!(
                    "fuzz {name}: replaying {} failed: {}",
                    f.display(),
                    panic_text(&*p)
                );
            }
            replayed += 1;
            corpus.push(data);
        }
    }
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    eprintln!(
        "fuzz {name}: seed {seed:#x} (URAID_FUZZ_SEED replays it), {replayed} files replayed"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut cases = 0;
    while cases < max_cases && start.elapsed() < time {
        let input = generate(&mut rng, &corpus, t.max_len);
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| (t.body)(&input))) {
            let saved = save_crash(name, &input);
            panic!(
                "fuzz {name}: case {cases} of seed {seed:#x} failed: {}\n  input ({} bytes) saved \
                 to {}; copy it into fuzz/crashes/{name}/ so every run replays it",
                panic_text(&*p),
                input.len(),
                saved.display()
            );
        }
        cases += 1;
    }
    eprintln!("fuzz {name}: {cases} generated cases passed");
    Report {
        seed,
        replayed_files: replayed,
        cases,
    }
}

fn save_crash(name: &str, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/fuzz-crashes")
        .join(name);
    let path = dir.join(format!("crash-{:016x}", fnv(input)));
    let _ = std::fs::create_dir_all(&dir);
    if let Err(e) = std::fs::write(&path, input) {
        eprintln!(
            "fuzz {name}: cannot save the input to {}: {e}",
            path.display()
        );
    }
    path
}

/// Values that sit on the edges parsers check.
const SPECIAL: [u64; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// One input: a few mutations of a corpus entry, or (one in eight) random bytes.
pub fn generate(rng: &mut StdRng, corpus: &[Vec<u8>], max_len: usize) -> Vec<u8> {
    if rng.gen_ratio(1, 8) {
        let len = rng.gen_range(0..=max_len);
        return (0..len).map(|_| rng.gen()).collect();
    }
    let mut v = corpus[rng.gen_range(0..corpus.len())].clone();
    for _ in 0..rng.gen_range(1..=8) {
        mutate(rng, &mut v, corpus);
    }
    v.truncate(max_len);
    v
}

fn mutate(rng: &mut StdRng, v: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    if v.is_empty() {
        v.extend((0..rng.gen_range(1..=16)).map(|_| rng.gen::<u8>()));
        return;
    }
    let at = rng.gen_range(0..v.len());
    match rng.gen_range(0..8) {
        0 => v[at] ^= 1 << rng.gen_range(0..8),
        1 => v[at] = rng.gen(),
        2 => {
            // A special value, little or big endian, 1/2/4/8 bytes wide.
            let width = 1 << rng.gen_range(0..4);
            let x = SPECIAL[rng.gen_range(0..SPECIAL.len())];
            let bytes = if rng.gen() {
                x.to_le_bytes()
            } else {
                x.to_be_bytes()
            };
            let src = if bytes[0] == 0 && width < 8 {
                &bytes[8 - width..]
            } else {
                &bytes[..width]
            };
            let end = (at + width).min(v.len());
            v[at..end].copy_from_slice(&src[..end - at]);
        }
        3 => v.truncate(at),
        4 => {
            let len = rng.gen_range(1..=(v.len() - at).min(64));
            v.drain(at..at + len);
        }
        5 => {
            // Copy a piece of the input elsewhere in it.
            let from = rng.gen_range(0..v.len());
            let len = rng.gen_range(1..=(v.len() - from).min(64));
            let piece = v[from..from + len].to_vec();
            let to = rng.gen_range(0..=v.len());
            v.splice(to..to, piece);
        }
        6 => {
            // Splice: the tail of another corpus entry.
            let other = &corpus[rng.gen_range(0..corpus.len())];
            if !other.is_empty() {
                let from = rng.gen_range(0..other.len());
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
        }
        _ => {
            let n = rng.gen_range(1..=32);
            let to = rng.gen_range(0..=v.len());
            let fill: u8 = if rng.gen() { 0 } else { rng.gen() };
            v.splice(to..to, std::iter::repeat_n(fill, n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver finds a planted bug (a 4-byte magic the corpus lacks) from a seed, names
    /// the case and saves the input; and the same seed gives the same inputs.
    #[test]
    fn finds_a_planted_bug_and_reproduces_from_its_seed() {
        let body = |d: &[u8]| {
            if d.len() >= 6 && d[2..6] == 0xffff_ffffu32.to_le_bytes() {
                panic!("planted");
            }
        };
        let t = Target {
            name: "testkit-planted",
            seeds: vec![vec![0u8; 16]],
            max_len: 64,
            body: &body,
        };
        let r = catch_unwind(AssertUnwindSafe(|| {
            run_with(&t, 7, Duration::from_secs(600), 2_000_000)
        }));
        let msg = panic_text(&*r.expect_err("the planted bug is found"));
        assert!(msg.contains("fuzz testkit-planted: case"), "{msg}");
        assert!(msg.contains("of seed 0x7 failed: planted"), "{msg}");
        let saved = msg
            .split("saved to ")
            .nth(1)
            .unwrap()
            .split(';')
            .next()
            .unwrap();
        let input = std::fs::read(saved).unwrap();
        assert!(catch_unwind(|| body(&input)).is_err());

        let corpus = vec![b"hello world".to_vec()];
        let a: Vec<_> = {
            let mut rng = StdRng::seed_from_u64(3);
            (0..50).map(|_| generate(&mut rng, &corpus, 40)).collect()
        };
        let mut rng = StdRng::seed_from_u64(3);
        let b: Vec<_> = (0..50).map(|_| generate(&mut rng, &corpus, 40)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|x| x.len() <= 40));
    }

    #[test]
    fn a_clean_target_runs_its_cases_and_replays_the_corpus() {
        let t = Target {
            name: "testkit-no-corpus",
            seeds: vec![vec![1, 2, 3]],
            max_len: 8,
            body: &|d: &[u8]| assert!(d.len() <= 8),
        };
        let r = run_with(&t, 1, Duration::from_secs(600), 500);
        assert_eq!((r.cases, r.replayed_files), (500, 0));
    }
}
