//! Issue 15: a raid4/5/6 reshape that rebuilds a member, left by Linux md mid-way. md's
//! `raid5_start_reshape` puts a spare into an empty role below the old device count with
//! `recovery_offset` 0 (not in sync), the reshape writes every new stripe whole to it, and
//! each checkpoint moves its `recovery_offset` to the position (new-geometry member
//! sectors). The commonest case is mdadm's raid5 -> raid6 (`--level=6 --raid-devices=5`
//! on a raid5 of 4 with a spare: md's takeover to the `-6` layout with its Q role empty,
//! then the restripe to left-symmetric); the other is a degraded array grown with spares.
//!
//! The members are written here as md leaves them (the new stripes below the position
//! at `data_offset + new_offset`, the old ones above it, the rebuilt member's old area
//! never written, every superblock as md's `super_1_sync` writes it). uraid must read the
//! data (the rebuilt member only in the new geometry, below its recovery_offset), refuse
//! by name what it cannot do, and finish the reshape offline, served with writers, and
//! after a power cut at any write, with the rebuilt member in sync and md's check clean.

use rand::Rng;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid_core::geometry::raid5::{ALGORITHM_LEFT_SYMMETRIC, ALGORITHM_LEFT_SYMMETRIC_6};
use uraid_core::geometry::{ReshapeState, Side};
use uraid_core::superblock::*;
use uraid_core::{Level, MemberIdx, SECTOR_BYTES};
use uraid_engine::{
    assemble, continue_reshape, create, read_superblock, write_superblock, Array, AssembleOptions,
    CreateOptions, MemMember, Member, ReshapeOptions, SlotState, SyncKind,
};
use uraid_testkit::engine::{
    model_writers, read_all, rng, same, same_but_unsure, serve_reshape, wait_reshaped,
    writes_until_cut,
};

const MEMBER_BYTES: u64 = 2 << 20;
const DATA_OFFSET: u64 = 256;
const CHUNK: u64 = 32;
const NEW_OFFSET: i32 = -128;

/// Which of md's reshapes rebuilds a member.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// mdadm's raid5 of 4 -> raid6 of 5: the old geometry a raid6 in the `-6` layout whose
    /// Q role (4) the reshape rebuilds, the new one left-symmetric over the same 5.
    Raid5ToRaid6,
    /// A raid5 of 4 whose role `.0` is missing, grown to 5 with two spares: md puts one in
    /// the empty role (rebuilt by the reshape) and the other in the new role 4 (in sync).
    DegradedGrow(usize),
}

impl Kind {
    fn rebuilt_role(self) -> usize {
        match self {
            Kind::Raid5ToRaid6 => 4,
            Kind::DegradedGrow(m) => m,
        }
    }

    /// (level, old layout, delta_disks) of the reshape record.
    fn record(self) -> (Level, u32, i32) {
        match self {
            Kind::Raid5ToRaid6 => (Level::Raid6, ALGORITHM_LEFT_SYMMETRIC_6, 0),
            Kind::DegradedGrow(_) => (Level::Raid5, ALGORITHM_LEFT_SYMMETRIC, 1),
        }
    }
}

/// A reshape as md leaves it: the members (device `r` holds role `r`), the array's bytes,
/// the recorded position and the reshape.
struct Fixture {
    devs: Vec<Arc<MemMember>>,
    data: Vec<u8>,
    position: u64,
    state: ReshapeState,
    kind: Kind,
}

impl Fixture {
    fn members(&self) -> Vec<Arc<dyn Member>> {
        self.devs
            .iter()
            .map(|d| d.clone() as Arc<dyn Member>)
            .collect()
    }

    fn images(&self) -> Vec<Vec<u8>> {
        self.devs.iter().map(|d| d.snapshot()).collect()
    }
}

fn garbage(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng(seed).fill(&mut v[..]);
    v
}

/// Members left by md mid-way through the reshape of `kind` at `rows` window units
/// (`max(chunk) x new data disks`), the rebuilt member's recovery_offset `lag_rows` chunk
/// rows behind the position (0: as md writes it; more: a superblock that missed the last
/// checkpoint, its rows above the recovery_offset never written).
fn like_md(kind: Kind, rows: u64, lag_rows: u64, tag: &str, seed: u64) -> Fixture {
    let devs: Vec<Arc<MemMember>> = (0..5)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), MEMBER_BYTES)))
        .collect();
    let mut o = CreateOptions::new(Level::Raid5);
    o.layout = Some(ALGORITHM_LEFT_SYMMETRIC);
    o.chunk_sectors = Some(CHUNK);
    o.assume_clean = true;
    o.data_offset_sectors = Some(DATA_OFFSET);
    let a = create(devs[..4].iter().map(|d| Some(d.clone() as _)).collect(), &o).unwrap();
    let mut data = garbage(a.size_bytes() as usize, seed);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    let sb0 = read_superblock(devs[0].as_ref()).unwrap();
    // The rebuilt member is a fresh spare: its data area was never written by the old
    // geometry (the degraded grow's role `m` lost its old device; this one replaces it).
    let rebuilt = kind.rebuilt_role();
    let meta_bytes = ((DATA_OFFSET as i64 + i64::from(NEW_OFFSET)) as u64 * SECTOR_BYTES) as usize;
    let mut fresh = vec![0u8; meta_bytes];
    fresh.extend(garbage(MEMBER_BYTES as usize - meta_bytes, seed ^ 0xf00d));
    devs[rebuilt].write_at(&fresh, 0).unwrap();
    if let Kind::DegradedGrow(_) = kind {
        devs[4]
            .write_at(&vec![0u8; MEMBER_BYTES as usize], 0)
            .unwrap();
    }
    // The reshape record every superblock carries (md's super_1_sync).
    let (level, old_layout, delta) = kind.record();
    let mut rec = sb0.clone();
    rec.level = level.md_level();
    rec.layout = old_layout;
    rec.raid_disks = 5;
    rec.delta_disks = delta;
    rec.new_level = rec.level;
    rec.new_layout = ALGORITHM_LEFT_SYMMETRIC;
    rec.new_chunk = CHUNK as u32;
    rec.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
    rec.new_offset = NEW_OFFSET;
    rec.reshape_position = 0;
    let state = ReshapeState::from_superblock(&rec).unwrap().unwrap();
    let position = rows * state.window_unit();
    assert!(position <= state.array_sectors(), "position past the end");
    rec.reshape_position = position;
    let state = ReshapeState::from_superblock(&rec).unwrap().unwrap();
    data.truncate((state.array_sectors() * SECTOR_BYTES) as usize);
    let recovery_offset =
        (position / state.new.data_disks() as u64).saturating_sub(lag_rows * CHUNK);
    // The new stripes below the position, whole (md's expand writes every device), on
    // the rebuilt member only below its recovery_offset.
    let new = &state.new;
    let base = state.data_offset_sectors(Side::New, sb0.data_offset);
    let cb = (CHUNK * SECTOR_BYTES) as usize;
    for stripe in 0..position / new.stripe_data_sectors() {
        let map = new.stripe_map(stripe);
        let chunks: Vec<Vec<u8>> = (0..new.data_disks())
            .map(|k| {
                let at = (new.array_sector(stripe, k) * SECTOR_BYTES) as usize;
                data.get(at..at + cb)
                    .map(|d| d.to_vec())
                    .unwrap_or_else(|| vec![0; cb])
            })
            .collect();
        let mut p = vec![0u8; cb];
        let mut q = vec![0u8; cb];
        if map.q.is_some() {
            let ordered: Vec<&[u8]> = map.syndrome_order.iter().map(|&k| &chunks[k][..]).collect();
            uraid_parity::gen_pq(&ordered, &mut p, &mut q);
        } else {
            let srcs: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
            uraid_parity::xor_gen(&mut p, &srcs);
        }
        let row = new.member_sector(stripe, 0);
        let put = |role: MemberIdx, bytes: &[u8]| {
            if role.0 == rebuilt && row + CHUNK > recovery_offset {
                return;
            }
            devs[role.0]
                .write_at(bytes, (base + row) * SECTOR_BYTES)
                .unwrap();
        };
        for (k, c) in chunks.iter().enumerate() {
            put(map.data[k], c);
        }
        put(map.p, &p);
        if let Some(qr) = map.q {
            put(qr, &q);
        }
    }
    // Device numbers as md gives them: the degraded grow's lost device keeps its number
    // (removed), the spare that fills its role and the one for the new role come after.
    let numbers: Vec<u32> = match kind {
        Kind::Raid5ToRaid6 => (0..5).collect(),
        Kind::DegradedGrow(m) => (0..5)
            .map(|r| match r {
                r if r == m => 4,
                4 => 5,
                r => r as u32,
            })
            .collect(),
    };
    let mut roles = sb0.dev_roles.clone();
    roles.resize(roles.len().max(6), ROLE_SPARE);
    for r in roles.iter_mut().take(6) {
        *r = ROLE_SPARE;
    }
    for (role, &n) in numbers.iter().enumerate() {
        roles[n as usize] = role as u16;
    }
    for (role, d) in devs.iter().enumerate() {
        let mut sb = rec.clone();
        sb.dev_number = numbers[role];
        sb.device_uuid = [role as u8 + 0x40; 16];
        sb.dev_roles = roles.clone();
        sb.events += 1;
        if role == rebuilt {
            sb.feature_map |= FEATURE_RECOVERY_OFFSET;
            sb.recovery_offset = recovery_offset;
        }
        write_superblock(d.as_ref(), &sb).unwrap();
    }
    Fixture {
        devs,
        data,
        position,
        state,
        kind,
    }
}

fn open(devs: &[Arc<dyn Member>]) -> Array {
    assemble(devs.to_vec(), &AssembleOptions::default())
        .unwrap_or_else(|e| panic!("assemble: {e}"))
        .0
}

/// The finished array: raid6 (or raid5) left-symmetric of 5, every role in sync, the
/// bytes, md's check clean, and no superblock with a reshape or a recovery_offset.
fn verify_finished(devs: &[Arc<dyn Member>], want: &[u8], kind: Kind, what: &str) {
    let a = open(devs);
    assert!(!a.is_reshaping(), "{what}: still reshaping");
    assert_eq!(a.level(), kind.record().0, "{what}");
    assert_eq!(
        (a.raid_disks(), a.geometry().layout),
        (5, ALGORITHM_LEFT_SYMMETRIC),
        "{what}"
    );
    assert!(
        a.missing_roles().is_empty() && a.recovering_roles().is_empty(),
        "{what}: missing {:?}, recovering {:?}",
        a.missing_roles(),
        a.recovering_roles()
    );
    same(&read_all(&a, want.len()), want, what);
    assert_eq!(
        a.run_sync(SyncKind::Check, |_| {}).unwrap(),
        0,
        "{what}: check"
    );
    a.stop().unwrap();
    // The newest superblocks, as read (a power cut between the reshape's end recorded as
    // its position and the finishing rewrite leaves superblocks that read as finished).
    let sbs: Vec<_> = devs
        .iter()
        .map(|d| {
            let mut sb = read_superblock(d.as_ref()).unwrap();
            uraid_core::geometry::reshape::fold_finished(&mut sb);
            sb
        })
        .collect();
    let newest = sbs.iter().map(|s| s.events).max().unwrap();
    for (d, sb) in devs.iter().zip(&sbs).filter(|(_, s)| s.events == newest) {
        assert_eq!(
            sb.feature_map & (FEATURE_RESHAPE_ACTIVE | FEATURE_RECOVERY_OFFSET),
            0,
            "{what}: {}",
            d.name()
        );
    }
}

/// The rebuilt member's superblock records md's recovery_offset for the recorded
/// position: the new geometry's member sectors below it.
fn recovery_offset_follows(devs: &[Arc<dyn Member>], kind: Kind, what: &str) {
    let sb = read_superblock(devs[kind.rebuilt_role()].as_ref()).unwrap();
    assert_ne!(sb.feature_map & FEATURE_RESHAPE_ACTIVE, 0, "{what}");
    assert_ne!(sb.feature_map & FEATURE_RECOVERY_OFFSET, 0, "{what}");
    let nd: u64 = match kind {
        Kind::Raid5ToRaid6 => 3,
        Kind::DegradedGrow(_) => 4,
    };
    assert_eq!(
        sb.recovery_offset,
        sb.reshape_position / nd,
        "{what}: recovery_offset against reshape_position {}",
        sb.reshape_position
    );
}

fn kinds() -> [Kind; 3] {
    [
        Kind::Raid5ToRaid6,
        Kind::DegradedGrow(1),
        Kind::DegradedGrow(3),
    ]
}

/// Read mid-way: every byte, with the rebuilt member read only in the new geometry below
/// its recovery_offset. Its old area is garbage (it is missing there); a new stripe whose
/// parity is spoiled still reads right (its chunk comes from it, not from parity); and
/// with its recovery_offset behind the position the rows it missed come from parity. Also
/// with another member missing where the old geometry can spare it (raid6).
#[test]
fn a_member_rebuilt_by_the_reshape_is_read_in_the_new_geometry_only() {
    let ro = AssembleOptions {
        readonly: true,
        ..Default::default()
    };
    for kind in kinds() {
        for (rows, lag) in [(0, 0), (1, 0), (9, 0), (20, 0), (20, 5)] {
            let f = like_md(kind, rows, lag, "rd", 7 + rows);
            let what = format!("{kind:?} at {} (lag {lag})", f.position);
            let before = f.images();
            let (a, _) = assemble(f.members(), &ro).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(a.is_reshaping(), "{what}");
            assert_eq!(
                a.recovering_roles(),
                vec![MemberIdx(kind.rebuilt_role())],
                "{what}"
            );
            same(&read_all(&a, f.data.len()), &f.data, &what);
            // md runs no check while it reshapes; a check here would compare nothing and
            // say 0 mismatches: refused by name instead.
            let e = a.check().expect_err("a check mid-reshape");
            assert!(
                e.to_string().contains("a reshape is in progress"),
                "{what}: {e}"
            );
            a.stop().unwrap();
            if let Kind::Raid5ToRaid6 = kind {
                for gone in 0..4 {
                    let less: Vec<Arc<dyn Member>> = f
                        .members()
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| *i != gone)
                        .map(|(_, d)| d)
                        .collect();
                    let (a, _) = assemble(less, &ro).unwrap();
                    same(
                        &read_all(&a, f.data.len()),
                        &f.data,
                        &format!("{what} without role {gone}"),
                    );
                    a.stop().unwrap();
                }
            }
            assert!(f.images() == before, "{what}: a read-only assembly wrote");
        }
        // A new stripe below the recovery_offset with a data chunk on the rebuilt member:
        // its P and Q spoiled, it still reads right.
        let f = like_md(kind, 20, 0, "sp", 3);
        let new = &f.state.new;
        let rebuilt = MemberIdx(kind.rebuilt_role());
        let stripe = (0..f.position / new.stripe_data_sectors())
            .find(|&s| new.stripe_map(s).data.contains(&rebuilt))
            .expect("a stripe with data on the rebuilt member");
        let map = new.stripe_map(stripe);
        let at = (f.state.data_offset_sectors(Side::New, DATA_OFFSET)
            + new.member_sector(stripe, 0))
            * SECTOR_BYTES;
        for r in std::iter::once(map.p).chain(map.q) {
            f.devs[r.0]
                .write_at(&garbage((CHUNK * SECTOR_BYTES) as usize, 99), at)
                .unwrap();
        }
        let (a, _) = assemble(f.members(), &ro).unwrap();
        same(
            &read_all(&a, f.data.len()),
            &f.data,
            &format!("{kind:?}: parity spoiled under the rebuilt member's chunk"),
        );
        a.stop().unwrap();
    }
}

/// What uraid cannot do safely is refused by name at assembly, and nothing is written: a
/// rebuilt member of a reshape running backwards (md records no progress for it), more
/// members missing in the old geometry than its parity covers, a replacement.
#[test]
fn what_is_not_safe_is_refused_by_name_before_anything_is_written() {
    // Backwards: the record of a layout change whose data moves up.
    let f = like_md(Kind::Raid5ToRaid6, 0, 0, "bk", 1);
    for d in &f.devs {
        let mut sb = read_superblock(d.as_ref()).unwrap();
        sb.feature_map |= FEATURE_RESHAPE_BACKWARDS;
        sb.new_offset = 128;
        sb.reshape_position = f.state.array_sectors();
        write_superblock(d.as_ref(), &sb).unwrap();
    }
    let before = f.images();
    let e = assemble(f.members(), &AssembleOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("backwards") && e.contains("rebuilt"), "{e}");
    assert!(continue_reshape(f.members(), ReshapeOptions::default()).is_err());
    assert!(f.images() == before, "a refusal wrote");
    // A degraded grow whose old geometry would miss two roles: the rebuilt one and one
    // more.
    let f = like_md(Kind::DegradedGrow(1), 9, 0, "two", 2);
    let less: Vec<Arc<dyn Member>> = f
        .members()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, d)| d)
        .collect();
    let before = f.images();
    let e = assemble(less.clone(), &AssembleOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("rebuilt") && e.contains("missing"), "{e}");
    assert!(continue_reshape(less, ReshapeOptions::default()).is_err());
    assert!(f.images() == before, "a refusal wrote");
    // A replacement mid-reshape (md: "cannot handle concurrent replacement and reshape").
    let f = like_md(Kind::Raid5ToRaid6, 9, 0, "rp", 4);
    let extra = Arc::new(MemMember::new("rp-extra", MEMBER_BYTES));
    let mut sb = read_superblock(f.devs[0].as_ref()).unwrap();
    sb.dev_number = 7;
    sb.device_uuid = [0x77; 16];
    sb.feature_map |= FEATURE_REPLACEMENT | FEATURE_RECOVERY_OFFSET;
    sb.recovery_offset = 0;
    let mut roles = sb.dev_roles.clone();
    roles.resize(8, ROLE_SPARE);
    roles[7] = 0;
    for d in &f.devs {
        let mut s = read_superblock(d.as_ref()).unwrap();
        s.dev_roles = roles.clone();
        write_superblock(d.as_ref(), &s).unwrap();
    }
    sb.dev_roles = roles;
    write_superblock(extra.as_ref(), &sb).unwrap();
    let mut all = f.members();
    all.push(extra.clone());
    let before = f.images();
    let e = assemble(all.clone(), &AssembleOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("replaced"), "{e}");
    assert!(f.images() == before, "a refusal wrote");
}

/// uraid grow --continue finishes it: stopped part-way, the rebuilt member's
/// recovery_offset follows the recorded position as md's does; at the end the new shape,
/// every byte, the rebuilt member in sync and md's check clean. One whose recovery_offset
/// is behind the position (it missed rows) finishes recovering from there.
#[test]
fn continued_offline_the_rebuilt_member_ends_in_sync() {
    for kind in kinds() {
        let f = like_md(kind, 9, 0, "co", 11);
        let what = format!("{kind:?}");
        let r = continue_reshape(
            f.members(),
            ReshapeOptions {
                stop_at: Some(f.position + 40 * f.state.window_unit()),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            !r.finished && r.position_sectors > f.position,
            "{what}: {r:?}"
        );
        recovery_offset_follows(&f.members(), kind, &what);
        let a = open(&f.members());
        same(
            &read_all(&a, f.data.len()),
            &f.data,
            &format!("{what}: stopped"),
        );
        a.stop().unwrap();
        let r = continue_reshape(f.members(), ReshapeOptions::default()).unwrap();
        assert!(r.finished, "{what}: {r:?}");
        verify_finished(&f.members(), &f.data, kind, &what);
    }
    // raid5 -> raid6 with a member missing too: the old geometry reads it from P, the new
    // one leaves it missing, and the rebuilt member still ends in sync.
    let f = like_md(Kind::Raid5ToRaid6, 9, 0, "co-1", 13);
    let less: Vec<Arc<dyn Member>> = f
        .members()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, d)| d)
        .collect();
    let r = continue_reshape(less.clone(), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    let a = open(&less);
    assert!(!a.is_reshaping() && a.geometry().layout == ALGORITHM_LEFT_SYMMETRIC);
    assert_eq!(
        (a.missing_roles(), a.recovering_roles()),
        (vec![MemberIdx(1)], vec![])
    );
    same(
        &read_all(&a, f.data.len()),
        &f.data,
        "without role 1, finished",
    );
    a.stop().unwrap();
    // Behind: its rows between its recovery_offset and the position come from parity,
    // and after the reshape a recovery rebuilds them.
    let kind = Kind::Raid5ToRaid6;
    let f = like_md(kind, 20, 5, "lag", 12);
    let r = continue_reshape(f.members(), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    let a = open(&f.members());
    assert!(!a.is_reshaping());
    assert_eq!(a.recovering_roles(), vec![MemberIdx(4)]);
    same(&read_all(&a, f.data.len()), &f.data, "behind, finished");
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    a.stop().unwrap();
    verify_finished(&f.members(), &f.data, kind, "behind, recovered");
}

/// Served: the reshape goes on in the background while writers write and read back
/// through both geometries; stopped part-way, the rebuilt member's recovery_offset is md's;
/// served again to the end, every acknowledged byte, the rebuilt member in sync, md's
/// check clean (a write below the in-memory position that skipped the rebuilt member would
/// leave its blocks stale, and check would find them).
#[test]
fn served_with_writers_the_rebuilt_member_ends_in_sync() {
    for kind in [Kind::Raid5ToRaid6, Kind::DegradedGrow(2)] {
        let f = like_md(kind, 3, 0, "sv", 21);
        let what = format!("{kind:?}");
        let model = Arc::new(Mutex::new(f.data.clone()));
        // A first run, stopped part-way.
        let (a, d) = serve(&f.members(), 1024);
        let t = Instant::now();
        let a2 = a.clone();
        model_writers(&a, &model, 1, &|| {
            t.elapsed() > Duration::from_millis(800) || !a2.is_reshaping()
        });
        d.stop();
        assert!(a.is_reshaping(), "{what}: finished before the stop");
        a.stop().unwrap();
        drop(a);
        recovery_offset_follows(&f.members(), kind, &what);
        // Then to the end.
        let (a, d) = serve(&f.members(), 0);
        let a2 = a.clone();
        let n = model_writers(&a, &model, 2, &|| !a2.is_reshaping());
        assert!(
            wait_reshaped(&a, Duration::from_secs(120)),
            "{what}: not done"
        );
        let model = model.lock().unwrap().clone();
        same(
            &read_all(&a, model.len()),
            &model,
            &format!("{what}: served at the end"),
        );
        d.stop();
        a.stop().unwrap();
        let _ = n;
        verify_finished(&f.members(), &model, kind, &what);
    }
}

/// A power cut after every write of uraid grow --continue (then sparser): the durable
/// images assemble with every byte, and continue to the end with the rebuilt member in
/// sync and md's check clean.
#[test]
fn a_power_cut_anywhere_in_the_continue_loses_nothing() {
    use uraid_sim::disk::{Power, SimDisk};
    for kind in [Kind::Raid5ToRaid6, Kind::DegradedGrow(1)] {
        let f = like_md(kind, 9, 0, "pc", 31);
        let images = f.images();
        let mut ops = 0i64;
        let (mut saw_mid, mut rounds) = (false, 0);
        loop {
            let what = format!("{kind:?}: cut after {ops} writes");
            let power = Power::new(ops);
            let cut = SimDisk::crash_set("pc", &power, &images);
            let devs: Vec<Arc<dyn Member>> = cut.iter().map(|d| d.clone() as _).collect();
            let _ = continue_reshape(devs, ReshapeOptions::default());
            let finished = power.on();
            let after = SimDisk::after_cut(&cut);
            let a = open(&after);
            same(&read_all(&a, f.data.len()), &f.data, &what);
            let mid = a.is_reshaping();
            a.stop().unwrap();
            if mid {
                saw_mid = true;
                let r = continue_reshape(after.clone(), ReshapeOptions::default())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(r.finished, "{what}");
            }
            verify_finished(&after, &f.data, kind, &what);
            rounds += 1;
            if finished {
                break;
            }
            ops += 1 + ops / 6;
        }
        assert!(saw_mid && rounds > 10, "{kind:?}: {rounds} cuts");
    }
}

/// A power cut at growing points of the served reshape, with a writer that flushes after
/// every write: every acknowledged write reads back after the cut, the reshape is served
/// to its end from there, and the rebuilt member ends in sync with md's check clean (its
/// superblock is written first at each checkpoint, so no cut leaves it behind the
/// position the others record).
#[test]
fn a_power_cut_during_the_served_reshape_loses_no_acknowledged_write() {
    use uraid_sim::disk::{Power, SimDisk};
    let kind = Kind::Raid5ToRaid6;
    let f = like_md(kind, 3, 0, "spc", 51);
    let images = f.images();
    let mut r = rng(0x5eed);
    let mut ops = 4i64;
    let mut saw_mid = false;
    loop {
        let what = format!("cut after {ops} IOs");
        let power = Power::new(ops);
        let cut = SimDisk::crash_set("spc", &power, &images);
        let devs: Vec<Arc<dyn Member>> = cut.iter().map(|d| d.clone() as _).collect();
        let mut model = f.data.clone();
        let unsure = {
            let (a, d) = serve(&devs, 0);
            let unsure = writes_until_cut(&a, &mut model, &mut r, &|| power.on());
            d.stop();
            unsure
        };
        let finished = power.on();
        let after = SimDisk::after_cut(&cut);
        let check = |a: &Array, when: &str| {
            same_but_unsure(a, &model, unsure, &format!("{what}: {when}"));
        };
        let a = open(&after);
        check(&a, "after the cut");
        let mid = a.is_reshaping();
        a.stop().unwrap();
        if mid {
            saw_mid = true;
            let (a, d) = serve(&after, 0);
            assert!(
                wait_reshaped(&a, Duration::from_secs(60)),
                "{what}: not done"
            );
            d.stop();
            check(&a, "served to the end");
            a.stop().unwrap();
        }
        let a = open(&after);
        check(&a, "in the new shape");
        if a.meta().needs_resync() {
            a.run_sync(SyncKind::Resync, |_| {}).unwrap();
        }
        let got = read_all(&a, model.len());
        a.stop().unwrap();
        verify_finished(&after, &got, kind, &what);
        if finished {
            break;
        }
        ops = ops * 3 / 2 + 1;
    }
    assert!(saw_mid, "no cut fell mid-reshape");
}

/// Served mid-reshape with the daemons: the reshape runs at `max_kib_s` (0: no limit).
fn serve(devs: &[Arc<dyn Member>], max_kib_s: u64) -> (Arc<Array>, uraid_engine::Daemons) {
    let a = Arc::new(open(devs));
    let d = serve_reshape(&a, max_kib_s);
    (a, d)
}

/// The slot states the engine exposes: the rebuilt member is recovering mid-reshape.
#[test]
fn the_rebuilt_member_is_recovering_while_the_reshape_runs() {
    let f = like_md(Kind::Raid5ToRaid6, 9, 0, "st", 41);
    let a = open(&f.members());
    assert_eq!(a.slot(MemberIdx(4)).state(), SlotState::Recovering);
    assert_eq!(a.missing_roles(), vec![MemberIdx(4)]);
    // md runs no recovery while a reshape runs: it is refused, nothing marked in sync.
    assert!(a.run_sync(SyncKind::Recovery, |_| {}).is_err());
    assert_eq!(a.slot(MemberIdx(4)).state(), SlotState::Recovering);
    a.stop().unwrap();
    let _ = f.kind;
}
