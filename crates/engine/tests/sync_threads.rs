//! Sync passes (raid4/5/6) and pieces (raid1, raid10) run side by side on `sync_threads`
//! threads: one pass's member IO runs while another's parity is computed or its write
//! goes out. These tests show that passes really overlap (and cannot with one thread),
//! that the result is the same as one thread's (rebuilt blocks, mismatch counts), and that
//! a read error inside a pass that runs beside another falls back to the stripe-by-stripe
//! path without losing anything.

use rand::Rng;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{Array, CreateOptions, MemMember, Member, SlotState, SyncKind};
use uraid_testkit::engine::{read_all, rng, same};
use uraid_testkit::tmp::MIB;

/// 64 KiB chunks: a 1 MiB pass (`sync_batch_bytes`) is 16 stripes.
const CHUNK_SECTORS: u64 = 128;
const PASS_BYTES: u64 = MIB;

/// What a [`Probe`] does with a read while armed.
#[derive(Clone, Copy)]
enum Trap {
    /// The first read at or after `from` waits until a later read of this member arrives
    /// (it can only come from another thread: this one waits), or until the timeout;
    /// `overlapped` says which.
    WaitForNextPass { from: u64, timeout: Duration },
    /// Reads overlapping [at, at + 4 KiB) fail, once.
    FailOnce { at: u64 },
}

/// A memory member that can hold back or fail reads.
struct Probe {
    inner: MemMember,
    armed: AtomicBool,
    trap: Mutex<Option<Trap>>,
    /// Member offset of the held read (u64::MAX: none yet).
    held_at: AtomicU64,
    released: Mutex<bool>,
    wake: Condvar,
    overlapped: AtomicBool,
    failed_reads: AtomicU64,
}

impl Probe {
    fn new(name: &str, size: u64) -> Arc<Probe> {
        Arc::new(Probe {
            inner: MemMember::new(name, size),
            armed: AtomicBool::new(false),
            trap: Mutex::new(None),
            held_at: AtomicU64::new(u64::MAX),
            released: Mutex::new(false),
            wake: Condvar::new(),
            overlapped: AtomicBool::new(false),
            failed_reads: AtomicU64::new(0),
        })
    }

    fn arm(&self, trap: Trap) {
        *self.trap.lock().unwrap() = Some(trap);
        self.armed.store(true, Ordering::SeqCst);
    }

    fn on_read(&self, offset: u64, len: u64) -> std::io::Result<()> {
        if !self.armed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let trap = *self.trap.lock().unwrap();
        match trap {
            Some(Trap::WaitForNextPass { from, timeout }) => {
                let held = self.held_at.load(Ordering::SeqCst);
                if offset < from {
                    return Ok(());
                }
                if held == u64::MAX {
                    self.held_at.store(offset, Ordering::SeqCst);
                    let released = self.released.lock().unwrap();
                    let (released, _) = self
                        .wake
                        .wait_timeout_while(released, timeout, |r| !*r)
                        .unwrap();
                    self.overlapped.store(*released, Ordering::SeqCst);
                    // One hold per recovery: every later read goes straight through.
                    self.armed.store(false, Ordering::SeqCst);
                } else if offset > held {
                    *self.released.lock().unwrap() = true;
                    self.wake.notify_all();
                }
                Ok(())
            }
            Some(Trap::FailOnce { at }) => {
                if offset < at + 4096 && offset + len > at {
                    self.armed.store(false, Ordering::SeqCst);
                    self.failed_reads.fetch_add(1, Ordering::SeqCst);
                    return Err(std::io::Error::other("injected read error"));
                }
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl Member for Probe {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.on_read(offset, buf.len() as u64)?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

/// An array whose member 0 is a [`Probe`], filled with random data; returns it with the
/// data written.
fn array(
    level: Level,
    disks: usize,
    threads: usize,
    seed: u64,
) -> (Arc<Array>, Arc<Probe>, Vec<u8>) {
    let size = 24 * MIB;
    let probe = Probe::new("m0", size);
    let mut devs: Vec<Option<Arc<dyn Member>>> = vec![Some(probe.clone())];
    devs.extend(
        (1..disks)
            .map(|i| Some(Arc::new(MemMember::new(format!("m{i}"), size)) as Arc<dyn Member>)),
    );
    let mut o = CreateOptions::new(level);
    if level != Level::Raid1 {
        o.chunk_sectors = Some(CHUNK_SECTORS);
    }
    o.assume_clean = true;
    let a = Arc::new(uraid_engine::create(devs, &o).unwrap());
    a.set_tunable("sync_threads", &threads.to_string()).unwrap();
    let mut model = vec![0u8; a.size_bytes() as usize];
    rng(seed).fill(&mut model[..]);
    a.write(0, &model).unwrap();
    (a, probe, model)
}

/// Fail member 1, add a fresh one, arm the probe and rebuild member 1.
fn rebuild_member_1(a: &Array, probe: &Probe, trap: Trap) -> Result<u64, uraid_engine::ArrayError> {
    a.fail_member(MemberIdx(1)).unwrap();
    a.remove_member(MemberIdx(1)).unwrap();
    a.add_member(Arc::new(MemMember::new("new", probe.size_bytes())))
        .unwrap();
    probe.arm(trap);
    a.run_sync(SyncKind::Recovery, |_| {})
}

/// Where member 0's data area starts.
fn data_start(a: &Array) -> u64 {
    a.slot(MemberIdx(0)).data_offset_bytes()
}

/// The rebuilt member holds the right blocks: with every other parity member failed the
/// array still reads the model (raid5 and the two-disk mirrors: member 0 failed; raid6:
/// members 0 and 2).
fn rebuilt_blocks_are_right(a: &Array, model: &[u8], what: &str) {
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::InSync, "{what}");
    same(
        &read_all(a, model.len()),
        model,
        &format!("{what}: after the rebuild"),
    );
    a.fail_member(MemberIdx(0)).unwrap();
    if a.geometry().level == Level::Raid6 {
        a.fail_member(MemberIdx(2)).unwrap();
    }
    same(
        &read_all(a, model.len()),
        model,
        &format!("{what}: served by the rebuilt member"),
    );
}

#[test]
fn a_recovery_runs_its_passes_side_by_side_and_rebuilds_the_same_blocks() {
    // The mirrors on two disks: member 0 is read for every piece of member 1.
    for (level, disks) in [
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid1, 2),
        (Level::Raid10, 2),
    ] {
        let (a, probe, model) = array(level, disks, 2, 11);
        // The recovery's first read of member 0 is held until a read a pass further on
        // comes: only a second thread running the next pass can send it.
        let trap = Trap::WaitForNextPass {
            from: data_start(&a),
            timeout: Duration::from_secs(60),
        };
        rebuild_member_1(&a, &probe, trap).unwrap();
        assert!(
            probe.overlapped.load(Ordering::SeqCst),
            "{level}: the next pass's reads did not come while the first pass's read waited"
        );
        rebuilt_blocks_are_right(&a, &model, &format!("{level}, 2 threads"));
    }
}

/// The control: with one thread no pass starts before the one before it is done, so the
/// held read times out (this is what the test above would see without the threads).
#[test]
fn with_one_sync_thread_passes_do_not_overlap() {
    for (level, disks) in [(Level::Raid5, 4), (Level::Raid1, 2)] {
        let (a, probe, model) = array(level, disks, 1, 12);
        let trap = Trap::WaitForNextPass {
            from: data_start(&a),
            timeout: Duration::from_millis(500),
        };
        rebuild_member_1(&a, &probe, trap).unwrap();
        assert!(!probe.overlapped.load(Ordering::SeqCst), "{level}");
        rebuilt_blocks_are_right(&a, &model, &format!("{level}, 1 thread"));
    }
}

/// A read error in a pass that runs beside another: that pass goes stripe by stripe on the
/// heads it holds, rebuilds around the bad block and repairs it; the cursor still moves
/// in order and the recovery finishes.
#[test]
fn a_read_error_in_a_pass_beside_another_is_answered_and_repaired() {
    let (a, probe, model) = array(Level::Raid6, 5, 2, 13);
    // In the third pass, inside the data area (member offsets count from the device start).
    let at = data_start(&a) + 2 * PASS_BYTES + 5 * 64 * 1024 + 8192;
    rebuild_member_1(&a, &probe, Trap::FailOnce { at }).unwrap();
    assert_eq!(
        probe.failed_reads.load(Ordering::SeqCst),
        1,
        "the error was injected"
    );
    assert_eq!(
        a.slot_state(MemberIdx(0)),
        SlotState::InSync,
        "a read error is repaired, not a failure"
    );
    rebuilt_blocks_are_right(&a, &model, "raid6, read error");
}

/// check counts the same mismatched sectors with one thread and with two, for bad blocks
/// spread over many passes; repair with two threads makes a second check find none.
/// (raid6 counts 8 sectors per bad page; the mirrors count whole pieces, so there only
/// the two counts are compared.)
#[test]
fn check_counts_the_same_mismatches_on_one_and_two_threads() {
    for (level, disks) in [(Level::Raid6, 5), (Level::Raid1, 2), (Level::Raid10, 4)] {
        mismatches_on_one_and_two_threads(level, disks);
    }
}

fn mismatches_on_one_and_two_threads(level: Level, disks: usize) {
    let mut counts = Vec::new();
    for threads in [1, 2] {
        let (a, _probe, _model) = array(level, disks, threads, 14);
        // A data or parity block (raid6), or a copy (the mirrors).
        let bad = MemberIdx(if level == Level::Raid6 { 2 } else { 1 });
        let m2 = a.slot(bad).device().unwrap();
        let base = a.slot(bad).data_offset_bytes();
        let data_bytes = a.geometry().dev_sectors * 512;
        let mut r = rng(99);
        let mut pages = std::collections::BTreeSet::new();
        while pages.len() < 40 {
            pages.insert(r.gen_range(0..data_bytes / 4096));
        }
        for p in &pages {
            let mut junk = vec![0u8; 4096];
            r.fill(&mut junk[..]);
            m2.write_at(&junk, base + p * 4096).unwrap();
        }
        let found = a.check().unwrap();
        if level == Level::Raid6 {
            assert_eq!(
                found,
                pages.len() as u64 * 8,
                "{threads} threads: 8 sectors per bad page"
            );
        } else {
            assert!(
                found >= pages.len() as u64 * 8,
                "{level}, {threads} threads: {found}"
            );
        }
        counts.push(found);
        if threads == 2 {
            a.repair().unwrap();
            assert_eq!(
                a.check().unwrap(),
                0,
                "{level}: after repair on two threads"
            );
        }
    }
    assert_eq!(counts[0], counts[1], "{level}");
}
