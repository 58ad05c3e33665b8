//! The recycled-buffer pool gives its memory back when the last array goes. Its own test
//! binary (a process of its own): other tests' arrays would keep the pool in use.

use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::{AlignedBuf, CreateOptions, MemMember, Member};

/// Whether a buffer of `len` dropped now is the next one `scratch` gives: a recycled
/// buffer keeps its contents and a new one is zeroed, so a mark tells them apart.
fn came_back(len: usize) -> bool {
    let mut b = AlignedBuf::scratch(len);
    b.fill(0x5a);
    drop(b);
    AlignedBuf::scratch(len).iter().all(|&x| x == 0x5a)
}

#[test]
fn the_pool_is_emptied_when_the_last_array_goes() {
    const LEN: usize = 192 << 10;
    let array = |tag: &str| {
        let devs = (0..3)
            .map(
                |i| Some(Arc::new(MemMember::new(format!("{tag}{i}"), 8 << 20)) as Arc<dyn Member>),
            )
            .collect();
        let mut opts = CreateOptions::new(Level::Raid5);
        opts.assume_clean = true;
        uraid_engine::create(devs, &opts).expect("create")
    };
    let (first, second) = (array("a"), array("b"));
    // While arrays live, a dropped buffer is kept for the next one of its size.
    assert!(
        came_back(LEN),
        "a buffer was not recycled while arrays live"
    );
    drop(first);
    assert!(
        came_back(LEN),
        "the pool was emptied while an array still lives"
    );
    // Marked and kept, then the last array goes: the next buffer is a new (zeroed) one.
    let mut b = AlignedBuf::scratch(LEN);
    b.fill(0x5a);
    drop(b);
    drop(second);
    assert!(
        AlignedBuf::scratch(LEN).iter().all(|&x| x == 0),
        "the pool kept its buffers after the last array went"
    );
}
