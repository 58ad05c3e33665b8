//! `Array::dirty_extents` (issue 17, the NBD `qemu:dirty-bitmap:uraid` context): after
//! writes, exactly the units those writes mark are dirty, per level: one bitmap chunk of
//! array bytes for raid1/raid10, and for raid4/5/6 (whose bitmap counts chunk rows of
//! member sectors) max(bitmap chunk, chunk) times the data disks.

use uraid_core::Level;
use uraid_engine::DirtyExtent;
use uraid_testkit::engine::*;

/// Runs expected after `writes` (offset, len) with dirty units of `unit` bytes.
fn expected(size: u64, unit: u64, writes: &[(u64, u64)]) -> Vec<DirtyExtent> {
    let mut out: Vec<DirtyExtent> = Vec::new();
    let mut at = 0;
    while at < size {
        let next = (at + unit).min(size);
        let dirty = writes.iter().any(|&(o, l)| at < o + l && o < next);
        match out.last_mut() {
            Some(e) if e.dirty == dirty => e.len_bytes += next - at,
            _ => out.push(DirtyExtent {
                len_bytes: next - at,
                dirty,
            }),
        }
        at = next;
    }
    out
}

fn check(level: Level, disks: usize, data_disks: u64, bitmap_chunk: u32) {
    let c = Config {
        level,
        layout: None,
        disks,
        chunk_sectors: 16,
        member_bytes: vec![4 << 20; disks],
    };
    let mems = mem_members(&c, "dx");
    let mut o = create_opts(&c);
    o.bitmap = true;
    o.bitmap_chunk_bytes = Some(bitmap_chunk);
    o.data_offset_sectors = Some(2048);
    let a = uraid_engine::create(as_members(&mems), &o).unwrap();
    let size = a.size_bytes();
    let what = format!("{level:?} x{disks}, bitmap chunk {bitmap_chunk}");
    assert_eq!(
        a.dirty_extents(0, size).unwrap(),
        expected(size, size, &[]),
        "{what}: clean"
    );
    let unit = match level {
        Level::Raid1 | Level::Raid10 => u64::from(bitmap_chunk),
        _ => u64::from(bitmap_chunk).max(8192) * data_disks,
    };
    // One write inside a unit, one across a unit boundary, far apart.
    let writes = [(5 * unit + 512, 1024), (20 * unit - 512, 4096)];
    for &(off, len) in &writes {
        a.write(off, &vec![0x5a; len as usize]).unwrap();
    }
    let want = expected(size, unit, &writes);
    assert_eq!(want.iter().filter(|e| e.dirty).count(), 2, "{what}");
    assert_eq!(a.dirty_extents(0, size).unwrap(), want, "{what}");
    // A part: from inside the first dirty unit, covering exactly what was asked.
    let part = a.dirty_extents(5 * unit + unit / 2, unit).unwrap();
    let dirty_left = unit - unit / 2;
    assert_eq!(
        part,
        [
            DirtyExtent {
                len_bytes: dirty_left,
                dirty: true
            },
            DirtyExtent {
                len_bytes: unit / 2,
                dirty: false
            }
        ],
        "{what}: a part"
    );
}

#[test]
fn dirty_extents_follow_what_writes_mark_per_level() {
    for bitmap_chunk in [4096, 32768] {
        check(Level::Raid1, 2, 1, bitmap_chunk);
        check(Level::Raid10, 4, 2, bitmap_chunk);
        check(Level::Raid5, 4, 3, bitmap_chunk);
        check(Level::Raid6, 5, 3, bitmap_chunk);
    }
}

#[test]
fn no_bitmap_no_dirty_extents() {
    let c = Config::new(Level::Raid1, None, 2);
    let mems = mem_members(&c, "dn");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    assert!(!a.has_bitmap());
    assert_eq!(a.dirty_extents(0, a.size_bytes()), None);
}
