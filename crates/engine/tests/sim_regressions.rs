//! Engine deviations found by the simulator (tests/sim_ci.rs), each reduced to a small
//! deterministic case on simulated disks. They are `#[ignore]`d until the engine is fixed:
//! run them with `cargo test -p uraid-engine --test sim_regressions -- --ignored`.

use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::sim::{Effect, FaultRule, OpFilter, SimDisk, SimWorld};
use uraid_engine::{assemble, create, AssembleOptions, CreateOptions, Member, SlotState};

const MEMBER_BYTES: u64 = 64 * 1024 + 32 * 4096;

fn disks(world: &Arc<SimWorld>, names: &[&str]) -> Vec<Arc<SimDisk>> {
    names
        .iter()
        .map(|n| Arc::new(SimDisk::new(*n, MEMBER_BYTES, world.clone())))
        .collect()
}

fn opts(level: Level) -> CreateOptions {
    let mut o = CreateOptions::new(level);
    o.chunk_sectors = Some(8);
    o.assume_clean = true;
    o.data_offset_sectors = Some(128);
    o.uuid = Some([7; 16]);
    o.name = "sim:regress".into();
    o
}

fn members(d: &[Arc<SimDisk>]) -> Vec<Arc<dyn Member>> {
    d.iter().map(|d| d.clone() as Arc<dyn Member>).collect()
}

/// Simulator seed 207 (raid6, 4 disks, left-symmetric, 8 KiB chunks): an old spare
/// offered at assembly is taken as a spare although its device number now belongs to a
/// newer spare; once both are in, the superblocks give two devices the same role and the
/// array no longer assembles. md refuses to bind two devices with one device number.
#[test]
#[ignore = "engine bug: assembly takes a stale spare whose device number was reused"]
fn a_stale_spare_with_a_reused_device_number_is_not_taken() {
    let world = SimWorld::new();
    let d = disks(&world, &["r0", "r1", "r2", "r3", "oldspare", "newspare"]);
    let a = create(
        d[..4]
            .iter()
            .map(|d| Some(d.clone() as Arc<dyn Member>))
            .collect(),
        &opts(Level::Raid6),
    )
    .unwrap();
    a.add_member(d[4].clone()).unwrap();
    a.write(0, &[1u8; 4096]).unwrap();
    a.stop().unwrap();
    drop(a);
    // Assemble without the old spare, give the array a new one.
    let (a, _) = assemble(members(&d[..4]), &AssembleOptions::default()).unwrap();
    a.add_member(d[5].clone()).unwrap();
    a.stop().unwrap();
    drop(a);
    // Offer everything, the old spare included.
    // Today both come in as spares with one device number.
    let (a, _) = assemble(members(&d), &AssembleOptions::default()).unwrap();
    a.fail_member(MemberIdx(1)).unwrap();
    a.run_sync(uraid_engine::SyncKind::Recovery, |_| {})
        .unwrap();
    a.stop().unwrap();
    drop(a);
    let (a, _) = assemble(members(&d), &AssembleOptions::default())
        .expect("the array must assemble after a rebuild onto a spare");
    let mut got = vec![0u8; 4096];
    a.read(0, &mut got).unwrap();
    assert_eq!(got, vec![1u8; 4096]);
}

/// Simulator seeds with a write error in a member's superblock area: the engine logs the
/// failed superblock write and keeps the member active, so at the next assembly its
/// superblock is behind and it is left out unannounced. md fails a member whose superblock
/// write fails.
#[test]
#[ignore = "engine bug: a superblock write error does not fail the member"]
fn a_superblock_write_error_fails_the_member() {
    let world = SimWorld::new();
    let d = disks(&world, &["m0", "m1", "m2"]);
    let a = create(
        d.iter()
            .map(|d| Some(d.clone() as Arc<dyn Member>))
            .collect(),
        &opts(Level::Raid5),
    )
    .unwrap();
    d[1].add_rule(FaultRule {
        effect: Effect::Error,
        ops: OpFilter::Write,
        from_io: 0,
        range: Some((4096, 8192)),
        times: None,
    });
    // The first write marks the array dirty: a superblock update on every member.
    a.write(0, &[5u8; 8192]).unwrap();
    let kept_active = a.slot_state(MemberIdx(1)) == SlotState::InSync;
    a.stop().unwrap();
    drop(a);
    let (b, _) = assemble(members(&d), &AssembleOptions::default()).unwrap();
    let back = b.slot_state(MemberIdx(1)) == SlotState::InSync;
    assert!(
        !kept_active || back,
        "member 1 was active until the stop but assembly left it out: its superblock \
         write failed without failing it"
    );
}

/// Simulator crash seeds: a power cut in the middle of the superblock update that marks
/// the array dirty leaves members one event behind; md and mdadm accept a difference of
/// one event at assembly, the engine kicks those members out (here: raid5 cannot start).
#[test]
#[ignore = "engine deviation: assembly needs equal events where md allows one behind"]
fn a_power_cut_during_the_dirty_mark_leaves_an_array_that_assembles() {
    let world = SimWorld::new();
    let d = disks(&world, &["p0", "p1", "p2"]);
    let a = create(
        d.iter()
            .map(|d| Some(d.clone() as Arc<dyn Member>))
            .collect(),
        &opts(Level::Raid5),
    )
    .unwrap();
    a.stop().unwrap();
    drop(a);
    let (a, _) = assemble(members(&d), &AssembleOptions::default()).unwrap();
    // The first write updates the superblocks: member 0 (write, flush), then member 1.
    world.arm_power_cut(world.io_seq() + 2);
    assert!(a.write(0, &[9u8; 4096]).is_err());
    drop(a);
    world.power_on();
    let (b, _) = assemble(members(&d), &AssembleOptions::default())
        .expect("md would assemble: the others are one event behind");
    assert!(
        b.missing_roles().is_empty(),
        "left out {:?}",
        b.missing_roles()
    );
}

/// The same device offered twice at assembly is refused (the simulator once did this by
/// mistake; the engine was right).
#[test]
fn the_same_device_twice_is_refused_at_assembly() {
    let world = SimWorld::new();
    let d = disks(&world, &["t0", "t1", "t2"]);
    let a = create(
        d.iter()
            .map(|d| Some(d.clone() as Arc<dyn Member>))
            .collect(),
        &opts(Level::Raid5),
    )
    .unwrap();
    a.stop().unwrap();
    drop(a);
    let mut list = members(&d);
    list.push(d[2].clone());
    assert!(
        assemble(list, &AssembleOptions::default()).is_err(),
        "a device listed twice must be refused"
    );
}
