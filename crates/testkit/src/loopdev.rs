//! Loop devices over image files, for tests that need a real block device (root only).

use std::path::Path;
use std::process::Command;

/// A loop device (its `/dev/loopN` path), detached on drop.
pub struct Loop(pub String);

impl Loop {
    /// Attaches `file` to the first free loop device; `None` where losetup cannot (not root,
    /// no loop driver). The test decides whether that is a skip.
    pub fn attach(file: &Path) -> Option<Loop> {
        Loop::attach_at(file, 0)
    }

    /// [`Loop::attach`] with the device starting `offset` bytes into `file` (losetup -o).
    pub fn attach_at(file: &Path, offset: u64) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show", "-o", &offset.to_string()])
            .arg(file)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| Loop(String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    /// [`Loop::attach`], or a [`skip`](crate::skip()) of `test` (a failure in CI, which runs as
    /// root) where no loop device can be attached.
    pub fn attach_or_skip(file: &Path, test: &str) -> Option<Loop> {
        Loop::attach_at_or_skip(file, 0, test)
    }

    /// [`Loop::attach_at`], or a skip of `test` as [`Loop::attach_or_skip`] does.
    pub fn attach_at_or_skip(file: &Path, offset: u64, test: &str) -> Option<Loop> {
        let lo = Loop::attach_at(file, offset);
        if lo.is_none() {
            crate::skip(test, "cannot attach a loop device (needs root)");
        }
        lo
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}
