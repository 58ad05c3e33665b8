//! Recovery over sparse file members: what was never written (a hole on every member that
//! holds it, as SEEK_DATA says) is zeroed on the new member, not read, rebuilt and written
//! (issue 18: "recovery skips what was never written when the array knows it"). The new
//! member starts full of garbage; after the recovery its unwritten ranges are holes again,
//! every byte reads as the model, parity and copies agree, and the rebuilt member carries
//! its share when another member fails.

use rand::Rng;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{CreateOptions, DirectMode, FileMember, Member, SlotState, SyncKind};
use uraid_testkit::engine::{read_all, rng, same};
use uraid_testkit::tmp::{TempDir, MIB};

fn open(p: &Path) -> Arc<dyn Member> {
    Arc::new(FileMember::open(p, DirectMode::Off).unwrap())
}

fn allocated_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn recovery_zeroes_what_was_never_written_instead_of_rebuilding_it() {
    const MEMBER_MIB: u64 = 16;
    for (level, disks) in [
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
    ] {
        let dir = TempDir::new(&format!("sparse-rec-{level}"));
        let paths = dir.images(disks, MEMBER_MIB, "m");
        let spare = dir.path("spare.img");
        // A used disk: every block allocated and not zero.
        std::fs::write(&spare, vec![0xa5u8; (MEMBER_MIB * MIB) as usize]).unwrap();
        let mut o = CreateOptions::new(level);
        if level != Level::Raid1 {
            o.chunk_sectors = Some(128);
        }
        o.assume_clean = true;
        let a = uraid_engine::create(paths.iter().map(|p| Some(open(p))).collect(), &o).unwrap();
        let size = a.size_bytes() as usize;
        let mut model = vec![0u8; size];
        let mut r = rng(18);
        for (at, len) in [(0usize, 1 << 20), (5 << 20, 192 << 10)] {
            r.fill(&mut model[at..at + len]);
            a.write(at as u64, &model[at..at + len]).unwrap();
        }
        a.flush().unwrap();

        a.fail_member(MemberIdx(1)).unwrap();
        a.remove_member(MemberIdx(1)).unwrap();
        a.add_member(open(&spare)).unwrap();
        a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
        assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync, "{level}");
        same(
            &read_all(&a, size),
            &model,
            &format!("{level}: after recovery"),
        );
        assert_eq!(a.check().unwrap(), 0, "{level}: check after recovery");

        // The unwritten ranges were zeroed as holes, not rewritten: the new member keeps
        // about its share of the 1.2 MiB written (and the superblock), far from all of it.
        let kept = allocated_bytes(&spare);
        assert!(
            kept < MEMBER_MIB * MIB / 4,
            "{level}: the new member has {kept} bytes allocated of {}",
            MEMBER_MIB * MIB
        );

        // The rebuilt member carries its share (zeros included) without member 0.
        a.fail_member(MemberIdx(0)).unwrap();
        same(
            &read_all(&a, size),
            &model,
            &format!("{level}: rebuilt member carrying data"),
        );
    }
}

/// A member that, when first asked whether a range is a hole, runs a hook (here: another
/// member of its array fails, as a write error on another thread would make it).
struct HookOnHole {
    inner: uraid_engine::MemMember,
    hook: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Member for HookOnHole {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn is_hole(&self, _offset: u64, _len: u64) -> std::io::Result<bool> {
        if let Some(hook) = self.hook.lock().unwrap().take() {
            hook();
        }
        Ok(false)
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

/// A mirror's sync piece looks at its copies (SEEK_DATA) before reading them; a copy whose
/// member fails in that moment is left out of the piece, the sync goes on with the others
/// and the array serves the same data (this lookup once expected the device still there and
/// would have panicked the sync).
#[test]
fn a_mirror_copy_that_fails_during_a_sync_piece_is_left_out() {
    for level in [Level::Raid1, Level::Raid10] {
        let disks = if level == Level::Raid1 { 3 } else { 4 };
        let first = Arc::new(HookOnHole {
            inner: uraid_engine::MemMember::new("m0", 4 * MIB),
            hook: std::sync::Mutex::new(None),
        });
        let mut devs: Vec<Option<Arc<dyn Member>>> = vec![Some(first.clone())];
        devs.extend((1..disks).map(|i| {
            Some(
                Arc::new(uraid_engine::MemMember::new(format!("m{i}"), 4 * MIB)) as Arc<dyn Member>,
            )
        }));
        let mut o = CreateOptions::new(level);
        if level == Level::Raid10 {
            o.chunk_sectors = Some(128);
        }
        o.assume_clean = true;
        let a = Arc::new(uraid_engine::create(devs, &o).unwrap());
        let size = a.size_bytes() as usize;
        let mut model = vec![0u8; size];
        rng(7).fill(&mut model[..]);
        a.write(0, &model).unwrap();
        // Member 1 holds a copy of the first piece beside member 0 (raid1: all of them;
        // raid10 near-2: members 0 and 1).
        let weak = Arc::downgrade(&a);
        *first.hook.lock().unwrap() = Some(Box::new(move || {
            if let Some(a) = weak.upgrade() {
                a.fail_member(MemberIdx(1)).unwrap();
            }
        }));
        let checked = a.check();
        assert_eq!(
            a.slot_state(MemberIdx(1)),
            SlotState::Faulty,
            "{level}: the hook ran"
        );
        // The check may stop (the array became degraded) but not panic, and nothing is lost.
        if let Ok(mismatches) = checked {
            assert_eq!(mismatches, 0, "{level}");
        }
        same(
            &read_all(&a, size),
            &model,
            &format!("{level}: after the check"),
        );
    }
}
