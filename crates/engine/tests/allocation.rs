//! Block status (`Array::allocation`, the export's `base:allocation`) of raid10 over members
//! that say where they were never written (memory): each array chunk is a hole exactly when
//! all its in-sync copies are, wherever md's near, far and offset layouts put them.

use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{CreateOptions, MemMember, Member};

const CHUNK: u64 = 64 << 10;

/// (length, hole) runs of the whole array.
fn runs(a: &uraid_engine::Array) -> Vec<(u64, bool)> {
    let (mut out, mut at) = (Vec::new(), 0);
    while at < a.size_bytes() {
        for e in a.allocation(at, a.size_bytes() - at) {
            assert!(!e.hole || e.zero, "a hole reads zeros");
            out.push((e.len_bytes, e.hole));
            at += e.len_bytes;
        }
    }
    out
}

#[test]
fn raid10_chunks_are_holes_where_all_their_copies_are_in_every_layout() {
    for (name, layout) in [
        ("n2", 0x102),
        ("f2", 0x201),
        ("o2", 0x1_0201),
        ("n3", 0x103),
    ] {
        let devs: Vec<Option<Arc<dyn Member>>> = (0..4)
            .map(|i| Some(Arc::new(MemMember::new(format!("m{i}"), 16 << 20)) as Arc<dyn Member>))
            .collect();
        let mut o = CreateOptions::new(Level::Raid10);
        o.layout = Some(layout);
        o.chunk_sectors = Some(CHUNK / 512);
        o.assume_clean = true;
        let a = uraid_engine::create(devs, &o).unwrap();
        let size = a.size_bytes();
        assert_eq!(runs(&a), [(size, true)], "{name}: nothing written");
        // Chunk 5 written: it alone is data, on every copy.
        a.write(5 * CHUNK, &vec![0x3cu8; CHUNK as usize]).unwrap();
        let want = [(5 * CHUNK, true), (CHUNK, false), (size - 6 * CHUNK, true)];
        assert_eq!(runs(&a), want, "{name}");
        // With a copy's member failed, the others still say so.
        a.fail_member(MemberIdx(1)).unwrap();
        assert_eq!(runs(&a), want, "{name}, member 1 failed");
    }
}
