//! `AssembleOptions::readonly`: every writing entry point of the engine is refused with
//! EROFS and no member byte changes; reads and md's check still work.

use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::{
    assemble, ArrayError, AssembleOptions, CreateOptions, MemMember, Member, SyncKind,
};
use uraid_testkit::engine::as_members;

#[test]
fn a_readonly_array_refuses_every_write_and_changes_no_byte() {
    let devs: Vec<Arc<MemMember>> = (0..4)
        .map(|i| Arc::new(MemMember::new(format!("m{i}"), 4 << 20)))
        .collect();
    let mut opts = CreateOptions::new(Level::Raid5);
    opts.chunk_sectors = Some(16);
    opts.bitmap = true;
    let a = uraid_engine::create(as_members(&devs), &opts).unwrap();
    let data: Vec<u8> = (0..a.size_bytes() as usize)
        .map(|i| (i * 7) as u8)
        .collect();
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    drop(a);
    let before: Vec<Vec<u8>> = devs.iter().map(|d| d.snapshot()).collect();
    let members: Vec<Arc<dyn Member>> = devs.iter().map(|d| d.clone() as Arc<dyn Member>).collect();
    let ro = AssembleOptions {
        readonly: true,
        ..Default::default()
    };
    let (b, _) = assemble(members, &ro).unwrap();
    assert!(b.is_read_only());
    let mut got = vec![0u8; data.len()];
    b.read(0, &mut got).unwrap();
    assert!(got == data);
    let is_ro = |r: Result<(), ArrayError>| match r {
        Err(e @ ArrayError::ReadOnly(_)) => assert_eq!(e.errno(), libc::EROFS),
        other => panic!("expected a read-only refusal, got {other:?}"),
    };
    is_ro(b.write(0, &data[..4096]));
    is_ro(b.write_zeroes(0, 4096));
    is_ro(b.discard(0, 4096));
    is_ro(b.run_sync(SyncKind::Resync, |_| {}).map(|_| ()));
    is_ro(b.run_sync(SyncKind::Repair, |_| {}).map(|_| ()));
    is_ro(
        b.add_member(Arc::new(MemMember::new("new", 4 << 20)))
            .map(|_| ()),
    );
    assert_eq!(b.check().unwrap(), 0);
    b.bitmap_daemon().unwrap();
    b.stop().unwrap();
    for (d, old) in devs.iter().zip(&before) {
        assert!(
            d.snapshot() == *old,
            "{} changed under --readonly",
            d.name()
        );
    }
}
