//! Temporary folders for tests, and sparse member images in them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;

/// A fresh folder under the system's temp folder, removed on drop. Its name holds the tag,
/// the process id and a counter, so that tests running in parallel (in one binary or
/// several) never share one.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Makes `uraid-{tag}-{pid}-{n}`, emptied first if a crashed run left it behind.
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("uraid-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// `name` inside the folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The run dir for servers started by this test (index files and default sockets).
    pub fn run_dir(&self) -> PathBuf {
        self.0.join("run")
    }

    /// A sparse file `name` of `mib` MiB (all zeroes), replacing any file of that name.
    pub fn image(&self, name: &str, mib: u64) -> PathBuf {
        let p = self.path(name);
        std::fs::File::create(&p)
            .unwrap()
            .set_len(mib * MIB)
            .unwrap();
        p
    }

    /// `n` sparse member files `{prefix}{i}.img` of `mib` MiB each.
    pub fn images(&self, n: usize, mib: u64, prefix: &str) -> Vec<PathBuf> {
        (0..n)
            .map(|i| self.image(&format!("{prefix}{i}.img"), mib))
            .collect()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_distinct_hold_sparse_images_and_go_on_drop() {
        let a = TempDir::new("tk");
        let b = TempDir::new("tk");
        assert_ne!(a.0, b.0);
        let imgs = a.images(2, 3, "m");
        assert_eq!(imgs, vec![a.path("m0.img"), a.path("m1.img")]);
        assert_eq!(std::fs::metadata(&imgs[1]).unwrap().len(), 3 * MIB);
        let kept = a.0.clone();
        drop(a);
        assert!(!kept.exists());
        assert!(b.0.is_dir());
    }
}
