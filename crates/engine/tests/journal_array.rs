//! The write journal inside the array: create with a journal, writes logged before they
//! reach the members, replay on assembly after a crash, and a missing journal refused.

mod common;

use common::*;
use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::{assemble, AssembleOptions, MemMember, Member};

fn setup(level: Level, disks: usize) -> (Vec<Arc<MemMember>>, Arc<MemMember>, uraid_engine::Array) {
    let c = Config {
        level,
        layout: None,
        disks,
        chunk_sectors: 16,
        member_bytes: vec![2 << 20; disks],
    };
    let mems = mem_members(&c, "jr");
    let journal = Arc::new(MemMember::new("journal", 4 << 20));
    let mut o = create_opts(&c);
    o.journal = Some(journal.clone());
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    assert!(a.has_journal());
    (mems, journal, a)
}

fn all(m: &[Arc<MemMember>], j: &Arc<MemMember>) -> Vec<Arc<dyn Member>> {
    let mut v: Vec<Arc<dyn Member>> = m.iter().map(|x| x.clone() as Arc<dyn Member>).collect();
    v.push(j.clone());
    v
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
        let (b, _) = assemble(all(&mems, &journal), &AssembleOptions::default()).unwrap();
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
    let e = assemble(members.clone(), &AssembleOptions::default())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("journal"), "{e}");
    let (b, _) = assemble(
        members,
        &AssembleOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!b.has_journal());
    let mut got = vec![0u8; 65536];
    b.read(0, &mut got).unwrap();
    assert_eq!(got, vec![1u8; 65536]);
    drop(b);
    // With the journal it assembles normally and keeps writing through it.
    let (c, _) = assemble(all(&mems, &journal), &AssembleOptions::default()).unwrap();
    assert!(c.has_journal());
    c.write(4096, &[2u8; 4096]).unwrap();
    assert_eq!(c.check().unwrap(), 0);
}
