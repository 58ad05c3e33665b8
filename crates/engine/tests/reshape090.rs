//! A 0.90 raid5 that Linux md left in the middle of a grow (md's 0.91 superblock: minor
//! version 91, reshape_position, delta_disks, the new shape; no new_offset, so the grow
//! runs in place): uraid reads it through both geometries, writes to it, continues it
//! offline and while served, every checkpoint a valid 0.91 record and the end a 0.90 one
//! of the new shape that `mdadm --examine` reads the same; what needs mdadm's backup file
//! (the critical section, a shrink, a start) is refused by name with nothing written.

use rand::Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uraid_core::geometry::raid5::ALGORITHM_LEFT_SYMMETRIC;
use uraid_core::superblock::{Superblock, FEATURE_RESHAPE_ACTIVE};
use uraid_core::superblock090::{sb090_offset_sectors, Sb090Context, Superblock090, SB090_BYTES};
use uraid_core::Level;
use uraid_engine::{
    assemble, continue_reshape, create, read_superblock, reshape_members, Array, AssembleOptions,
    CreateOptions, DaemonOptions, MemMember, Member, ReshapeOptions, ReshapeRequest, SyncKind,
};
use uraid_testkit::engine::{read_all, rng, same};

const MB: u64 = 1 << 20;
/// Chunk in sectors (32 KiB).
const CHUNK: u64 = 64;

fn mems(n: usize, tag: &str) -> Vec<Arc<MemMember>> {
    (0..n)
        .map(|i| Arc::new(MemMember::new(format!("{tag}{i}"), 4 * MB)))
        .collect()
}

fn dyns(m: &[Arc<MemMember>]) -> Vec<Arc<dyn Member>> {
    m.iter().map(|d| d.clone() as Arc<dyn Member>).collect()
}

fn opts090() -> CreateOptions {
    let mut o = CreateOptions::new(Level::Raid5);
    o.metadata = uraid_engine::Metadata::V0_90;
    o.layout = Some(ALGORITHM_LEFT_SYMMETRIC);
    o.chunk_sectors = Some(CHUNK);
    o.assume_clean = true;
    o
}

fn place(m: &dyn Member) -> u64 {
    sb090_offset_sectors(m.size_bytes() / 512).unwrap() * 512
}

/// The member's 0.90 record, decoded with its checksum checked.
fn record(m: &MemMember) -> Superblock090 {
    let at = place(m) as usize;
    Superblock090::decode(&m.snapshot()[at..at + SB090_BYTES]).unwrap()
}

fn open(devs: &[Arc<MemMember>]) -> Array {
    assemble(dyns(devs), &AssembleOptions::default()).unwrap().0
}

/// A 3-disk 0.90 raid5 on the first three of `devs`, filled with seeded bytes, then the
/// state Linux md leaves when a grow to 4 (`mdadm --grow --raid-devices=4 --backup-file`)
/// stops at array sector `position`: the first `position` sectors restriped in place in
/// the 4-disk geometry (written here by the engine's own raid5 on copies of the members),
/// the rest still in the 3-disk one, and every member's record 0.91 with the grow. The
/// bytes of the array.
fn left_mid_grow_by_md(devs: &[Arc<MemMember>], position: u64, seed: u64) -> Vec<u8> {
    let a = create(dyns(&devs[..3]).into_iter().map(Some).collect(), &opts090()).unwrap();
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut data[..]);
    a.write(0, &data).unwrap();
    a.stop().unwrap();
    // The new geometry's stripes of [0, position), as md's reshape writes them.
    let copies = mems(4, "copy");
    let b = create(dyns(&copies).into_iter().map(Some).collect(), &opts090()).unwrap();
    b.write(0, &data[..(position * 512) as usize]).unwrap();
    b.stop().unwrap();
    assert_eq!(position % (3 * CHUNK), 0, "md stops on a whole new stripe");
    let rows_bytes = (position / 3 * 512) as usize;
    for (d, c) in devs.iter().zip(&copies) {
        d.write_at(&c.snapshot()[..rows_bytes], 0).unwrap();
    }
    write_091(devs, position);
    data
}

/// Every member's record as md's super_90_sync writes it mid-grow from 3 to 4 devices at
/// `position`: minor 91, raid_disks 4, delta_disks 1, the new device in sync in role 3.
fn write_091(devs: &[Arc<MemMember>], position: u64) {
    let rec0 = record(&devs[0]);
    let sb0 = read_superblock(devs[0].as_ref()).unwrap();
    let cx = Sb090Context {
        present: vec![0, 1, 2, 3],
        ..Sb090Context::from_record(&rec0)
    };
    for (n, d) in devs.iter().enumerate() {
        let mut sb: Superblock = sb0.clone();
        sb.dev_number = n as u32;
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE;
        sb.raid_disks = 4;
        sb.delta_disks = 1;
        sb.new_level = sb.level;
        sb.new_layout = sb.layout;
        sb.new_chunk = sb.chunksize;
        sb.reshape_position = position;
        sb.dev_roles[3] = 3;
        sb.events += 1;
        let rec = Superblock090::from_v1(&sb, &cx).unwrap();
        assert_eq!(rec.minor_version, 91);
        d.write_at(&rec.encode(), place(d.as_ref())).unwrap();
    }
}

/// `mdadm --examine` on each member's bytes, where mdadm is installed: the checksum
/// correct, and the lines it prints for `want` (field, value) in each.
fn mdadm_agrees(devs: &[Arc<MemMember>], want: &[(&str, String)], test: &str) {
    let Some(md) = uraid_testkit::tool_path("mdadm", test) else {
        return;
    };
    let dir = uraid_testkit::TempDir::new("r091");
    for d in devs {
        let img = dir.path(&d.name());
        std::fs::write(&img, d.snapshot()).unwrap();
        let out = std::process::Command::new(&md)
            .arg("--examine")
            .arg(&img)
            .env("TZ", "UTC")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "mdadm --examine {}: {text}", d.name());
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("Checksum :") && l.ends_with("- correct")),
            "{}: md's checksum in\n{text}",
            d.name()
        );
        for (k, v) in want {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{k} :")))
                .unwrap_or_else(|| panic!("{}: no {k} in\n{text}", d.name()));
            // mdadm adds a human size after a size, and the checksum's value differs per
            // member: the words given must start the value.
            let got = line.split_once(" : ").unwrap().1.trim();
            assert!(
                got == v || got.starts_with(&format!("{v} ")),
                "{}: {k} is {got:?}, not {v:?}, in\n{text}",
                d.name()
            );
        }
    }
}

/// The finished array: 4 disks, minor 90 records without reshape fields, the model's bytes
/// and zeros after them, md's check clean.
fn verify_finished(devs: &[Arc<MemMember>], model: &[u8], events_above: u64, test: &str) {
    for d in devs {
        let rec = record(d);
        assert_eq!(rec.minor_version, 90, "{}", d.name());
        assert_eq!(rec.raid_disks, 4);
        assert_eq!(
            (
                rec.reshape_position,
                rec.delta_disks,
                rec.new_level,
                rec.new_chunk
            ),
            (0, 0, 0, 0),
            "md zeroes the reshape fields of a 0.90 record"
        );
        assert!(rec.events > events_above);
    }
    let a = open(devs);
    assert!(!a.is_reshaping());
    assert_eq!(a.raid_disks(), 4);
    let all = read_all(&a, a.size_bytes() as usize);
    assert_eq!(all.len(), model.len() / 2 * 3, "three data disks now");
    same(&all[..model.len()], model, "the bytes after the grow");
    assert!(
        all[model.len()..].iter().all(|&b| b == 0),
        "grown part zeros"
    );
    assert_eq!(
        a.run_sync(SyncKind::Check, |_| {}).unwrap(),
        0,
        "check mismatches"
    );
    a.stop().unwrap();
    mdadm_agrees(
        devs,
        &[
            ("Version", "0.90.00".into()),
            ("Raid Devices", "4".into()),
            ("State", "clean".into()),
            ("Events", record(&devs[0]).events.to_string()),
        ],
        test,
    );
}

/// Linux md's grow of a 0.90 raid5 from 3 to 4, stopped past its critical section: read
/// with the same bytes, written below and above the position, continued offline to a
/// checkpoint (a valid 0.91 record at the new position, as mdadm reads it) and to the end.
#[test]
fn a_0_91_grow_from_md_reads_writes_and_continues_offline() {
    const TEST: &str = "a_0_91_grow_from_md_reads_writes_and_continues_offline";
    let devs = mems(4, "g");
    let position = 40 * 3 * CHUNK;
    let mut model = left_mid_grow_by_md(&devs, position, 91);
    let before = record(&devs[0]);
    mdadm_agrees(
        &devs,
        &[
            ("Version", "0.91.00".into()),
            ("Reshape pos'n", format!("{}", position / 2)),
            ("Delta Devices", "1 (3->4)".into()),
            ("Raid Devices", "4".into()),
        ],
        TEST,
    );
    let a = open(&devs);
    assert!(a.is_reshaping());
    assert!(!a.is_read_only(), "{:?}", a.read_only_reason());
    same(
        &read_all(&a, model.len()),
        &model,
        "mid-grow, as md left it",
    );
    // Writes below the position (the new geometry), across it, and above it (the old).
    let mut r = rng(9100);
    for at in [8 * 512, (position - 16) * 512, (position + 4096) * 512] {
        let mut buf = vec![0u8; 64 * 1024];
        r.fill(&mut buf[..]);
        a.write(at, &buf).unwrap();
        model[at as usize..at as usize + buf.len()].copy_from_slice(&buf);
    }
    same(&read_all(&a, model.len()), &model, "after the writes");
    a.stop().unwrap();
    for d in &devs {
        let rec = record(d);
        assert_eq!(rec.minor_version, 91, "still mid-grow");
        assert_eq!(rec.reshape_position, position);
    }
    // A checkpoint part way: the records say the new position, checksummed, events up.
    let stop_at = position + 60 * 3 * CHUNK;
    let r = continue_reshape(
        dyns(&devs),
        ReshapeOptions {
            stop_at: Some(stop_at),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!r.finished, "{r:?}");
    let mid = record(&devs[0]);
    assert_eq!(mid.minor_version, 91);
    assert!(mid.reshape_position > position && mid.reshape_position == r.position_sectors);
    assert!(mid.events > before.events);
    assert_eq!((mid.delta_disks, mid.raid_disks), (1, 4));
    for d in &devs {
        assert_eq!(record(d).reshape_position, mid.reshape_position);
    }
    mdadm_agrees(
        &devs,
        &[
            ("Version", "0.91.00".into()),
            ("Reshape pos'n", format!("{}", mid.reshape_position / 2)),
            ("Events", mid.events.to_string()),
        ],
        TEST,
    );
    let a = open(&devs);
    same(&read_all(&a, model.len()), &model, "at the checkpoint");
    a.stop().unwrap();
    let r = continue_reshape(dyns(&devs), ReshapeOptions::default()).unwrap();
    assert!(r.finished, "{r:?}");
    verify_finished(&devs, &model, mid.events, TEST);
}

/// The same grow served read-write: the daemons finish it while a write lands, and the
/// records end as 0.90 of the new shape.
#[test]
fn a_0_91_grow_from_md_is_served_and_finished() {
    const TEST: &str = "a_0_91_grow_from_md_is_served_and_finished";
    let devs = mems(4, "s");
    let position = 20 * 3 * CHUNK;
    let mut model = left_mid_grow_by_md(&devs, position, 92);
    let events = record(&devs[0]).events;
    let a = Arc::new(open(&devs));
    assert!(a.is_reshaping());
    assert!(!a.is_read_only(), "{:?}", a.read_only_reason());
    let mut buf = vec![0u8; 128 * 1024];
    rng(9200).fill(&mut buf[..]);
    let at = (position + 2048) * 512;
    a.write(at, &buf).unwrap();
    model[at as usize..at as usize + buf.len()].copy_from_slice(&buf);
    let d = a.start_daemons(DaemonOptions::default()).unwrap();
    let t = Instant::now();
    while a.is_reshaping() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the served grow did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    same(&read_all(&a, model.len()), &model, "served, after the grow");
    drop(d);
    Arc::try_unwrap(a).ok().expect("one owner").stop().unwrap();
    verify_finished(&devs, &model, events, TEST);
}

/// What lives in mdadm's backup file is refused by name, nothing written: a 0.91 grow
/// still in its critical section, a 0.91 shrink, and the start of a reshape of a 0.90
/// array.
#[test]
fn what_needs_mdadms_backup_file_is_refused_and_nothing_written() {
    let snap = |d: &[Arc<MemMember>]| d.iter().map(|m| m.snapshot()).collect::<Vec<_>>();
    // In the critical section: the first new stripes still overlap old rows not copied.
    let devs = mems(4, "c");
    left_mid_grow_by_md(&devs, 3 * CHUNK, 93);
    let before = snap(&devs);
    let e = assemble(dyns(&devs), &AssembleOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("critical section") && e.contains("--backup-file"),
        "{e}"
    );
    let e = continue_reshape(dyns(&devs), ReshapeOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("critical section"), "{e}");
    assert!(snap(&devs) == before, "a refusal wrote");
    // A shrink from 4 to 3 recorded in 0.91 (md runs it backwards).
    let devs = mems(4, "k");
    let a = create(dyns(&devs).into_iter().map(Some).collect(), &opts090()).unwrap();
    a.stop().unwrap();
    let cx = Sb090Context {
        present: vec![0, 1, 2, 3],
        ..Sb090Context::from_record(&record(&devs[0]))
    };
    for (n, d) in devs.iter().enumerate() {
        let mut sb = read_superblock(d.as_ref()).unwrap();
        assert_eq!(sb.dev_number, n as u32);
        sb.feature_map |=
            FEATURE_RESHAPE_ACTIVE | uraid_core::superblock::FEATURE_RESHAPE_BACKWARDS;
        (sb.raid_disks, sb.delta_disks) = (3, -1);
        (sb.new_level, sb.new_layout, sb.new_chunk) = (sb.level, sb.layout, sb.chunksize);
        sb.reshape_position = 120 * CHUNK;
        sb.events += 1;
        let rec = Superblock090::from_v1(&sb, &cx).unwrap();
        assert_eq!((rec.minor_version, rec.delta_disks), (91, -1));
        d.write_at(&rec.encode(), place(d.as_ref())).unwrap();
    }
    let before = snap(&devs);
    let e = assemble(dyns(&devs), &AssembleOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("a shrink in place") && e.contains("--backup-file"),
        "{e}"
    );
    assert!(snap(&devs) == before, "a refusal wrote");
    // Starting one: 0.90 cannot move its data offset.
    let devs = mems(4, "n");
    let a = create(dyns(&devs[..3]).into_iter().map(Some).collect(), &opts090()).unwrap();
    a.stop().unwrap();
    let before = snap(&devs);
    let e = reshape_members(
        dyns(&devs[..3]),
        &ReshapeRequest {
            raid_disks: Some(4),
            ..Default::default()
        },
        ReshapeOptions {
            add: vec![devs[3].clone() as Arc<dyn Member>],
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("0.90") && e.contains("data offset") && e.contains("mdadm --grow --backup-file"),
        "{e}"
    );
    assert!(e.contains("nothing was written"), "{e}");
    let e = uraid_engine::grow_members(
        dyns(&devs[..3]),
        &uraid_engine::GrowRequest {
            raid_disks: Some(4),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("mdadm --grow --backup-file"), "{e}");
    assert!(snap(&devs) == before, "a refusal wrote");
}
