//! Deterministic test data, and what a command wrote to files.

use std::path::{Path, PathBuf};

/// `len` pseudo-random bytes from `seed` (xorshift64, eight bytes a step), the same on every
/// run so that a failure reproduces.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// `len` pseudo-random bytes from `seed`, one byte (the low one) a xorshift64 step: the data
/// the command-line tests of create/examine and of output have always written, kept so
/// that their images stay byte for byte what they were.
pub fn byte_pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Every byte of every file, to compare before and after a command.
pub fn snapshot(files: &[PathBuf]) -> Vec<Vec<u8>> {
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// FNV-1a of every file: equal before and after means nothing was written.
pub fn checksums(files: &[PathBuf]) -> Vec<u64> {
    files
        .iter()
        .map(|f| {
            std::fs::read(f)
                .unwrap()
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
                })
        })
        .collect()
}

/// Writes `bytes` into the existing file `path` at byte `offset` (to corrupt a member).
pub fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_repeat_per_seed_and_differ_between_seeds() {
        assert_eq!(pattern(100, 7), pattern(100, 7));
        assert_ne!(pattern(100, 7), pattern(100, 8));
        assert_eq!(pattern(13, 7)[..], pattern(100, 7)[..13]);
        assert_eq!(byte_pattern(100, 7), byte_pattern(100, 7));
        assert_ne!(byte_pattern(100, 7), byte_pattern(100, 8));
        // Pinned: the first bytes of each, so that a test's images do not change under it.
        assert_eq!(byte_pattern(4, 1), [0x41, 0x41, 0x29, 0x25]);
        assert_eq!(pattern(4, 0), [0x41, 0x20, 0x82, 0x40]);
    }

    #[test]
    fn write_at_shows_in_snapshots_and_checksums() {
        let d = crate::TempDir::new("tk-data");
        let files = d.images(2, 1, "f");
        let (snap, sums) = (snapshot(&files), checksums(&files));
        assert_eq!(sums[0], sums[1]);
        write_at(&files[1], 4096, b"x");
        assert_eq!(snap[0], snapshot(&files)[0]);
        assert_ne!(snap[1], snapshot(&files)[1]);
        assert_ne!(sums[1], checksums(&files)[1]);
    }
}
