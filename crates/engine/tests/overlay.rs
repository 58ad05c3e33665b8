//! Rescue mode: arrays assembled, rebuilt and written through overlays leave the members
//! byte for byte as they were; a commit then gives the array the overlay showed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::overlay::{self, OverlayMember, OverlaySet, OverlayState, CHUNK_BYTES};
use uraid_engine::{
    AssembleOptions, CreateOptions, MemMember, Member, SlotState, SyncKind, ZeroHow,
};
use uraid_engine::{DirectMode, FileMember};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uraid-overlay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn whole(m: &dyn Member) -> Vec<u8> {
    let mut v = vec![0u8; m.size_bytes() as usize];
    m.read_at(&mut v, 0).unwrap();
    v
}

/// An overlay over a memory member agrees with a byte model under random writes, zeroings
/// and discards at sector granularity, never changes the member, and reads the same after
/// it is reopened from its files.
#[test]
fn overlay_member_agrees_with_a_model_and_never_writes_the_member() {
    let dir = temp_dir("model");
    for seed in 0..4u64 {
        eprintln!("seed {seed}");
        let size = 64 * CHUNK_BYTES + 1024; // a short last chunk
        let base = Arc::new(MemMember::new("mem", size));
        base.write_at(&noise(seed, size as usize), 0).unwrap();
        let original = base.snapshot();
        let mut model = original.clone();
        let (data, map) = (
            dir.join(format!("{seed}.data")),
            dir.join(format!("{seed}.map")),
        );
        let ov = OverlayMember::open(base.clone(), &data, &map).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        for op in 0..300 {
            let sectors = size / 512;
            let start = rng.gen_range(0..sectors);
            // Up to three chunks: partial and whole chunks, one and several.
            let most = 3 * CHUNK_BYTES / 512;
            let len = rng.gen_range(1..=(sectors - start).min(most)) * 512;
            let off = start * 512;
            match rng.gen_range(0..10) {
                0 => {
                    ov.write_zeroes(off, len, ZeroHow { unmap: true }).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                1 => {
                    ov.discard(off, len).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                2..=5 => {
                    let b = noise(seed * 1000 + op, len as usize);
                    ov.write_at(&b, off).unwrap();
                    model[off as usize..(off + len) as usize].copy_from_slice(&b);
                }
                _ => {
                    let mut got = vec![0u8; len as usize];
                    ov.read_at(&mut got, off).unwrap();
                    assert!(
                        got == model[off as usize..(off + len) as usize],
                        "seed {seed} op {op}: read {off}+{len} differs from the model"
                    );
                }
            }
        }
        assert!(whole(&ov) == model, "seed {seed}: whole overlay view");
        assert!(
            base.snapshot() == original,
            "seed {seed}: the member was written"
        );
        let held = ov.map().held();
        assert!(held > 0 && held <= ov.map().chunks());
        drop(ov);
        let again = OverlayMember::open(base.clone(), &data, &map).unwrap();
        assert_eq!(again.map().held(), held, "seed {seed}: map after reopening");
        assert!(whole(&again) == model, "seed {seed}: view after reopening");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const CRASH_ENV: &str = "URAID_OVERLAY_CRASH_CHILD";

/// The child side of the crash test: writes through an overlay, says which writes were
/// acknowledged, and dies without flushing or dropping anything.
fn crash_child(dir: &Path) -> ! {
    let set = OverlaySet::open(&dir.join("ov"), "crash test").unwrap();
    let m = set.member(&dir.join("m.img")).unwrap();
    for i in 0..16u64 {
        // Partial chunks (copy-up) and whole ones, new and already held.
        let off = i * CHUNK_BYTES * 5 / 8;
        m.write_at(&noise(100 + i, 2048), off).unwrap();
        // The harness may have begun a line ("test name ... "): start a new one.
        println!("\nacked {i}");
    }
    std::process::abort();
}

/// An acknowledged write survives a crash of the process: the data and the map are in the
/// files before write_at returns.
#[test]
fn an_acknowledged_write_survives_a_crash() {
    if let Some(d) = std::env::var_os(CRASH_ENV) {
        crash_child(Path::new(&d));
    }
    let dir = temp_dir("crash");
    let member = dir.join("m.img");
    std::fs::write(&member, noise(7, 1 << 20)).unwrap();
    let original = std::fs::read(&member).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "an_acknowledged_write_survives_a_crash",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_ENV, &dir)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child should have aborted");
    let acked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("acked "))
        .count() as u64;
    // Every write was acknowledged before the abort (so each one must have survived).
    assert_eq!(
        acked,
        16,
        "child output: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut model = original.clone();
    for i in 0..acked {
        let off = (i * CHUNK_BYTES * 5 / 8) as usize;
        model[off..off + 2048].copy_from_slice(&noise(100 + i, 2048));
    }
    let set = OverlaySet::open(&dir.join("ov"), "after the crash").unwrap();
    let m = set.member(&member).unwrap();
    assert!(whole(&*m) == model, "acknowledged writes lost in the crash");
    assert!(
        std::fs::read(&member).unwrap() == original,
        "the member was written"
    );
    drop((m, set));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The acceptance test of the issue: members whose events disagree are assembled by force,
/// a spare is rebuilt and data written, all through an overlay; the members stay byte for
/// byte as they were; a commit then gives, from the members alone, the array the overlay
/// showed.
#[test]
fn forced_assembly_rebuild_and_writes_through_an_overlay_then_commit() {
    let dir = temp_dir("array");
    let member_bytes: u64 = 12 << 20;
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("m{i}.img"))).collect();
    for p in &paths {
        std::fs::File::create(p)
            .unwrap()
            .set_len(member_bytes)
            .unwrap();
    }
    let open = |p: &PathBuf| -> Arc<dyn Member> {
        Arc::new(FileMember::open(p, DirectMode::Off).unwrap())
    };
    let plain =
        |idx: &[usize]| -> Vec<Arc<dyn Member>> { idx.iter().map(|&i| open(&paths[i])).collect() };
    // A raid5 with a bitmap, written whole.
    let mut o = CreateOptions::new(Level::Raid5);
    o.chunk_sectors = Some(64);
    o.bitmap = true;
    let a = uraid_engine::create(paths[..3].iter().map(|p| Some(open(p))).collect(), &o).unwrap();
    let size = a.size_bytes();
    a.write(0, &noise(1, size as usize)).unwrap();
    a.stop().unwrap();
    drop(a);
    // Member 0 goes missing and the array runs on (events move on without it); then
    // member 1 goes too: only {0, 2} are left, and 0 is stale.
    let (a, _) = uraid_engine::assemble(plain(&[1, 2]), &AssembleOptions::default()).unwrap();
    a.write(0, &noise(2, 1 << 20)).unwrap();
    a.stop().unwrap();
    drop(a);
    let err = uraid_engine::assemble(plain(&[0, 2]), &AssembleOptions::default())
        .err()
        .expect("a stale member and a missing one: refused without --force");
    assert!(err.to_string().contains("--force"), "{err}");
    let before: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();

    // The experiment, through the overlay.
    let ovdir = dir.join("ov");
    let set = OverlaySet::open(&ovdir, "test: force, rebuild, write").unwrap();
    let devs = set.members(
        &paths[..1]
            .iter()
            .chain(&paths[2..3])
            .cloned()
            .collect::<Vec<_>>(),
    );
    let force = AssembleOptions {
        force: true,
        ..Default::default()
    };
    let (a, rep) = uraid_engine::assemble(devs.unwrap(), &force).unwrap();
    assert!(rep
        .members
        .iter()
        .any(|m| matches!(m.outcome, uraid_engine::MemberOutcome::ForcedActive(_))));
    a.add_member(set.member(&paths[3]).unwrap()).unwrap();
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Recovering);
    a.run_sync(SyncKind::Recovery, |_| {}).unwrap();
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync);
    let written = noise(3, 3 << 20);
    a.write(1 << 20, &written).unwrap();
    a.discard(5 << 20, 1 << 20).unwrap();
    let mut got = vec![0u8; written.len()];
    a.read(1 << 20, &mut got).unwrap();
    assert!(
        got == written,
        "a read through the overlay does not see the write"
    );
    let mut shown = vec![0u8; size as usize];
    a.read(0, &mut shown).unwrap();
    a.stop().unwrap();
    drop(a);
    drop(set);
    let after: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(b == a, "member {i} changed under the overlay");
    }

    // The overlay again, as a later command would see it: the same array.
    let set = OverlaySet::open(&ovdir, "test: look again").unwrap();
    let devs = set.members(&[paths[0].clone(), paths[2].clone(), paths[3].clone()]);
    let (a, _) = uraid_engine::assemble(devs.unwrap(), &AssembleOptions::default()).unwrap();
    assert!(!a.is_degraded());
    let mut again = vec![0u8; size as usize];
    a.read(0, &mut again).unwrap();
    assert!(
        again == shown,
        "the overlay shows another array when opened again"
    );
    a.stop().unwrap();
    drop(a);
    drop(set);

    let st = overlay::status(&ovdir).unwrap();
    assert_eq!(st.manifest.state, OverlayState::Active);
    assert_eq!(st.members.len(), 3);
    assert!(st
        .members
        .iter()
        .all(|m| m.problem.is_none() && m.held_chunks > 0));

    // Commit: the members alone now give the array the overlay showed.
    let rep = overlay::commit(&ovdir).unwrap();
    assert_eq!(rep.written.len(), 3);
    assert!(
        !ovdir.exists(),
        "the overlay directory is left after the commit"
    );
    let (a, _) = uraid_engine::assemble(plain(&[0, 2, 3]), &AssembleOptions::default()).unwrap();
    assert!(!a.is_degraded());
    let mut committed = vec![0u8; size as usize];
    a.read(0, &mut committed).unwrap();
    assert!(
        committed == shown,
        "the committed members give another array"
    );
    assert_eq!(a.check().unwrap(), 0, "parity after the commit");
    a.stop().unwrap();
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An overlay is only ever applied to the devices it was made over.
#[test]
fn an_overlay_refuses_other_devices_naming_them() {
    let dir = temp_dir("identity");
    let (m0, m1, other) = (dir.join("m0.img"), dir.join("m1.img"), dir.join("x.img"));
    for (p, s) in [(&m0, 1), (&m1, 2), (&other, 3)] {
        std::fs::write(p, noise(s, 2 << 20)).unwrap();
    }
    let ovdir = dir.join("ov");
    let set = OverlaySet::open(&ovdir, "test").unwrap();
    let a = set.member(&m0).unwrap();
    a.write_at(&[7u8; 4096], 8192).unwrap();
    set.member(&m1).unwrap();
    // A second user of the same overlay is refused while the first holds it.
    let busy = OverlaySet::open(&ovdir, "second").err().unwrap();
    assert!(
        matches!(busy, overlay::OverlayError::InUse { .. }),
        "{busy}"
    );
    assert!(overlay::discard(&ovdir).is_err());
    assert!(overlay::status(&ovdir).unwrap().in_use);
    drop((a, set));

    // Another set of members.
    let set = OverlaySet::open(&ovdir, "test").unwrap();
    let e = set
        .members(std::slice::from_ref(&other))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("other members") && e.contains("m0.img"), "{e}");
    drop(set);

    // m1 written behind the overlay's back: named by status, commit and a new open.
    let f = std::fs::OpenOptions::new().write(true).open(&m1).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"changed", 100).unwrap();
    let st = overlay::status(&ovdir).unwrap();
    let bad: Vec<_> = st.members.iter().filter(|m| m.problem.is_some()).collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].entry.path, std::path::absolute(&m1).unwrap());
    let e = overlay::commit(&ovdir).unwrap_err().to_string();
    assert!(e.contains("m1.img") && e.contains("changed"), "{e}");
    let set = OverlaySet::open(&ovdir, "test").unwrap();
    let e = set.member(&m1).err().unwrap().to_string();
    assert!(e.contains("m1.img"), "{e}");
    drop(set);
    // A different file at a recorded path.
    std::fs::remove_file(&m1).unwrap();
    std::fs::copy(&other, &m1).unwrap();
    let set = OverlaySet::open(&ovdir, "test").unwrap();
    let e = set.member(&m1).err().unwrap().to_string();
    assert!(e.contains("m1.img") && e.contains("not the device"), "{e}");
    drop(set);
    // Nothing of m0 was written, and discard leaves it so.
    let m0_before = noise(1, 2 << 20);
    assert!(std::fs::read(&m0).unwrap() == m0_before);
    overlay::discard(&ovdir).unwrap();
    assert!(!ovdir.exists());
    assert!(std::fs::read(&m0).unwrap() == m0_before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A commit interrupted while writing the members is finished by running it again.
#[test]
fn an_interrupted_commit_is_finished_by_a_rerun() {
    let dir = temp_dir("rerun");
    let m = dir.join("m.img");
    std::fs::write(&m, noise(1, 1 << 20)).unwrap();
    let ovdir = dir.join("ov");
    let set = OverlaySet::open(&ovdir, "test").unwrap();
    let om = set.member(&m).unwrap();
    om.write_at(&noise(2, 8192), 4096 + 512).unwrap();
    let view = whole(&*om);
    drop((om, set));
    // As a commit that stopped part way: the manifest says committing, the member has
    // part of the writes (here: garbage where they go).
    let mp = ovdir.join("manifest");
    let text = std::fs::read_to_string(&mp).unwrap();
    std::fs::write(&mp, text.replace("state active", "state committing")).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&m).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xaa; 4096], 4096).unwrap();
    // Using it, or throwing it away, is refused until the commit is finished.
    let e = OverlaySet::open(&ovdir, "test").err().unwrap().to_string();
    assert!(e.contains("commit"), "{e}");
    let e = overlay::discard(&ovdir).unwrap_err().to_string();
    assert!(e.contains("interrupted"), "{e}");
    let rep = overlay::commit(&ovdir).unwrap();
    let chunks = overlay::ChunkMap::chunks_of(4096 + 512, 8192);
    assert_eq!(rep.written[0].1, (chunks.end - chunks.start) * CHUNK_BYTES);
    assert!(std::fs::read(&m).unwrap() == view);
    assert!(!ovdir.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The map file's bytes, as docs/FORMAT.md gives them.
#[test]
fn the_map_file_is_as_documented() {
    let dir = temp_dir("golden");
    let size = 10 * CHUNK_BYTES + 512;
    let base = Arc::new(MemMember::new("mem", size));
    let (data, map) = (dir.join("0.data"), dir.join("0.map"));
    let ov = OverlayMember::open(base, &data, &map).unwrap();
    ov.write_at(&[1u8; 512], CHUNK_BYTES + 512).unwrap(); // chunk 1
    ov.write_at(&[2u8; 512], 9 * CHUNK_BYTES).unwrap(); // chunk 9
    ov.write_at(&[3u8; 512], 10 * CHUNK_BYTES).unwrap(); // chunk 10, the short last one
    let bytes = std::fs::read(&map).unwrap();
    let mut want = Vec::new();
    want.extend_from_slice(b"URAIDOVM");
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&65536u32.to_le_bytes());
    want.extend_from_slice(&size.to_le_bytes());
    want.extend_from_slice(&11u64.to_le_bytes());
    want.resize(4096, 0);
    want.extend_from_slice(&[0b0000_0010, 0b0000_0110]);
    assert_eq!(bytes, want);
    // The data file is the member's size, the held bytes at their offsets.
    let d = std::fs::read(&data).unwrap();
    assert_eq!(d.len() as u64, size);
    assert_eq!(d[(CHUNK_BYTES + 512) as usize], 1);
    assert_eq!(d[(10 * CHUNK_BYTES) as usize], 3);
    drop(ov);
    let _ = std::fs::remove_dir_all(&dir);
}
