//! The write journal inside the array: create with a journal, writes logged before they
//! reach the members, replay on assembly after a crash, and a missing journal refused.

use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::{assemble, AssembleOptions, MemMember, Member};
use uraid_testkit::engine::*;

fn setup(level: Level, disks: usize) -> (Vec<Arc<MemMember>>, Arc<MemMember>, uraid_engine::Array) {
    let (mems, journal, a) = journaled_array(level, disks, 4 << 20, "jr");
    assert!(a.has_journal());
    (mems, journal, a)
}

#[test]
fn a_crash_after_the_journal_write_is_repaired_by_replay() {
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let (mems, journal, a) = setup(level, disks);
        let data = vec![0x3cu8; 4096];
        // A partial-stripe write: data and parity go to the journal, then to the members.
        a.write(8192, &data).unwrap();
        // Crash: no clean stop. The member writes were lost in the crash: undo them on
        // every member (stripe 0, first 4 KiB row, just after the 64-sector data offset).
        std::mem::forget(a);
        for m in &mems {
            m.write_at(&[0u8; 4096], 64 * 512).unwrap();
        }
        let (b, _) = assemble(with_journal(&mems, &journal), &AssembleOptions::default()).unwrap();
        assert!(b.has_journal());
        let mut got = vec![0u8; 4096];
        b.read(8192, &mut got).unwrap();
        assert_eq!(
            got, data,
            "{level}: replay did not bring the logged write back"
        );
        assert_eq!(
            b.check().unwrap(),
            0,
            "{level}: parity does not match after replay"
        );
    }
}

#[test]
fn a_missing_journal_needs_force() {
    let (mems, journal, a) = setup(Level::Raid5, 4);
    a.write(0, &[1u8; 65536]).unwrap();
    a.stop().unwrap();
    drop(a);
    let members: Vec<Arc<dyn Member>> = mems.iter().map(|x| x.clone() as Arc<dyn Member>).collect();
    let b = assemble_needs_force(members, "journal");
    assert!(!b.has_journal());
    let mut got = vec![0u8; 65536];
    b.read(0, &mut got).unwrap();
    assert_eq!(got, vec![1u8; 65536]);
    drop(b);
    // With the journal it assembles normally and keeps writing through it.
    let (c, _) = assemble(with_journal(&mems, &journal), &AssembleOptions::default()).unwrap();
    assert!(c.has_journal());
    c.write(4096, &[2u8; 4096]).unwrap();
    assert_eq!(c.check().unwrap(), 0);
}
