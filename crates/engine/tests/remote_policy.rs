//! The array's policy for members on other hosts, without a network (so it runs on every
//! machine; `crates/cli/tests/remote_hosts.rs` does the same over real NBD servers in
//! network namespaces). A fake remote member (memory underneath, a switch for the network,
//! a connection that stays dead once an IO found the network down) records what the array
//! tells it and can be reopened.
//! - md's failfast is on only while the array keeps its data without the member.
//! - The re-add daemon re-adds a member lost with its connection once it reopens, and the
//!   bitmap makes that recovery partial.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid_core::{Level, MemberIdx};
use uraid_engine::{
    read_superblock, Array, DaemonNote, DaemonOptions, MemMember, Member, RemoteConnection,
    RemoteStatus, SlotState,
};
use uraid_testkit::engine::as_members;
use uraid_testkit::engine::*;

struct FakeRemote {
    disk: Arc<MemMember>,
    /// The network to the host (shared by every connection to it).
    network: Arc<AtomicBool>,
    /// This connection died (an IO found the network down); it never comes back.
    dead: AtomicBool,
    failfast: AtomicBool,
    reopens: AtomicU64,
}

impl FakeRemote {
    fn new(disk: Arc<MemMember>, network: Arc<AtomicBool>) -> FakeRemote {
        FakeRemote {
            disk,
            network,
            dead: AtomicBool::new(false),
            // What an NbdMember starts with: failfast until the array says otherwise.
            failfast: AtomicBool::new(true),
            reopens: AtomicU64::new(0),
        }
    }

    fn check(&self) -> io::Result<()> {
        if !self.network.load(Ordering::SeqCst) {
            self.dead.store(true, Ordering::SeqCst);
        }
        if self.dead.load(Ordering::SeqCst) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "host lost"));
        }
        Ok(())
    }

    fn failfast(&self) -> bool {
        self.failfast.load(Ordering::SeqCst)
    }
}

impl Member for FakeRemote {
    fn size_bytes(&self) -> u64 {
        self.disk.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check()?;
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check()?;
        self.disk.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.check()
    }
    fn name(&self) -> String {
        format!("nbd://{}/", self.disk.name())
    }
    fn remote(&self) -> Option<RemoteStatus> {
        Some(RemoteStatus {
            uri: self.name(),
            connection: if self.dead.load(Ordering::SeqCst) {
                RemoteConnection::Lost
            } else {
                RemoteConnection::Up
            },
            error: None,
            latency_us: None,
            latency_buckets: Vec::new(),
            latency_sum_us: 0,
            connections: 1,
            tls: false,
            reconnect_attempts: self.reopens.load(Ordering::SeqCst),
            reconnect_error: None,
        })
    }
    fn reopen(&self) -> Option<io::Result<Arc<dyn Member>>> {
        self.reopens.fetch_add(1, Ordering::SeqCst);
        if !self.network.load(Ordering::SeqCst) {
            return Some(Err(io::Error::new(io::ErrorKind::TimedOut, "no route")));
        }
        let new = FakeRemote::new(self.disk.clone(), self.network.clone());
        Some(Ok(Arc::new(new)))
    }
    fn set_failfast(&self, failfast: bool) {
        self.failfast.store(failfast, Ordering::SeqCst);
    }
}

struct Hosts {
    disks: Vec<Arc<MemMember>>,
    networks: Vec<Arc<AtomicBool>>,
    members: Vec<Arc<FakeRemote>>,
}

fn hosts(c: &Config, tag: &str) -> Hosts {
    let disks = mem_members(c, tag);
    let networks: Vec<_> = disks
        .iter()
        .map(|_| Arc::new(AtomicBool::new(true)))
        .collect();
    let members = disks
        .iter()
        .zip(&networks)
        .map(|(d, n)| Arc::new(FakeRemote::new(d.clone(), n.clone())))
        .collect();
    Hosts {
        disks,
        networks,
        members,
    }
}

fn create(c: &Config, h: &Hosts, bitmap: bool) -> Array {
    let mut o = create_opts(c);
    o.bitmap = bitmap;
    o.bitmap_chunk_bytes = bitmap.then_some(1 << 20);
    o.data_offset_sectors = Some(2048);
    let devs = as_members(&h.members);
    uraid_engine::create(devs, &o).unwrap()
}

fn config(level: Level, disks: usize) -> Config {
    Config {
        level,
        layout: None,
        disks,
        chunk_sectors: 128,
        member_bytes: vec![8 << 20; disks],
    }
}

#[test]
fn failfast_only_while_the_array_keeps_its_data_without_the_member() {
    let failfast = |h: &Hosts| h.members.iter().map(|m| m.failfast()).collect::<Vec<_>>();

    let c = config(Level::Raid1, 2);
    let h = hosts(&c, "ff1");
    let a = create(&c, &h, false);
    assert_eq!(failfast(&h), [true, true], "raid1 whole");
    a.fail_member(MemberIdx(1)).unwrap();
    assert!(!h.members[0].failfast(), "raid1's last copy is failfast");

    let c = config(Level::Raid5, 3);
    let h = hosts(&c, "ff5");
    let a = create(&c, &h, false);
    assert_eq!(failfast(&h), [true, true, true], "raid5 whole");
    // A member lost on a write: the others now hold the last copies.
    h.networks[2].store(false, Ordering::SeqCst);
    a.write(0, &vec![7u8; 256 << 10]).unwrap();
    assert_eq!(a.slot_state(MemberIdx(2)), SlotState::Faulty);
    assert_eq!(failfast(&h)[..2], [false, false], "degraded raid5");

    let c = config(Level::Raid0, 2);
    let h = hosts(&c, "ff0");
    let _a = create(&c, &h, false);
    assert_eq!(failfast(&h), [false, false], "raid0 has no redundancy");
}

/// Waits (bounded, so a hang fails instead of blocking) until `done` holds.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_member_lost_with_its_connection_is_readded_when_its_host_is_back() {
    let c = config(Level::Raid1, 2);
    let h = hosts(&c, "readd");
    let a = Arc::new(create(&c, &h, true));
    let notes = Arc::new(Mutex::new(Vec::new()));
    let n = notes.clone();
    let d = a
        .start_daemons(DaemonOptions {
            notify: Some(Arc::new(move |note: &DaemonNote| {
                n.lock().unwrap().push(note.clone())
            })),
            readd_interval: Some(Duration::from_millis(20)),
            ..DaemonOptions::default()
        })
        .unwrap();
    let off = read_superblock(h.disks[1].as_ref()).unwrap().data_offset * 512;

    // Host 1 is lost during a write to the first MiB (bitmap chunk 0).
    h.networks[1].store(false, Ordering::SeqCst);
    let data = vec![0x5au8; 512 << 10];
    a.write(0, &data).unwrap();
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Faulty);
    wait_for("an attempt to reopen host 1", || {
        h.members[1].reopens.load(Ordering::SeqCst) > 0
    });
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Faulty);

    // A marker on host 1 in a chunk nobody wrote (chunk 5): a full rebuild would erase it.
    let marker = vec![0xc3u8; 4096];
    h.disks[1].write_at(&marker, off + (5 << 20)).unwrap();
    h.networks[1].store(true, Ordering::SeqCst);
    wait_for("host 1 re-added and recovered", || {
        !a.is_degraded() && a.slot_state(MemberIdx(1)) == SlotState::InSync
    });
    let device = h.members[1].name();
    assert!(
        notes.lock().unwrap().contains(&DaemonNote::MemberReadded {
            role: MemberIdx(1),
            device
        }),
        "{:?}",
        notes.lock().unwrap()
    );
    d.stop();
    let mut got = vec![0u8; data.len()];
    h.disks[1].read_at(&mut got, off).unwrap();
    assert!(got == data, "host 1 did not get what it missed");
    let mut kept = vec![0u8; marker.len()];
    h.disks[1].read_at(&mut kept, off + (5 << 20)).unwrap();
    assert!(kept == marker, "the recovery copied a clean chunk");
}

/// A member failed by request (`uraid fail`: its connection up) is the administrator's to
/// bring back: the re-add daemon never reopens it, while it keeps trying a member lost with
/// its connection (each pass visits the roles in order, so two tries of role 2 mean two
/// passes went past role 1).
#[test]
fn a_member_failed_by_request_is_not_readded() {
    let c = config(Level::Raid1, 3);
    let h = hosts(&c, "byhand");
    let a = Arc::new(create(&c, &h, true));
    let d = a
        .start_daemons(DaemonOptions {
            readd_interval: Some(Duration::from_millis(20)),
            ..DaemonOptions::default()
        })
        .unwrap();
    a.fail_member(MemberIdx(1)).unwrap();
    h.networks[2].store(false, Ordering::SeqCst);
    a.write(0, &vec![1u8; 64 << 10]).unwrap();
    assert_eq!(a.slot_state(MemberIdx(2)), SlotState::Faulty);
    wait_for("two passes of the re-add daemon", || {
        h.members[2].reopens.load(Ordering::SeqCst) >= 2
    });
    assert_eq!(h.members[1].reopens.load(Ordering::SeqCst), 0);
    assert_eq!(a.slot_state(MemberIdx(1)), SlotState::Faulty);
    d.stop();
}

/// A host lost while the array is clean is found by the superblock update that the first
/// write makes (the array marked dirty before any data goes out): the member is failed
/// there, told as a failure (`Fail`), and a waiting spare takes its role, as it does when a
/// data write finds the host gone.
#[test]
fn a_member_failed_by_its_superblock_write_gives_a_spare_its_role() {
    let c = config(Level::Raid1, 2);
    let h = hosts(&c, "sbfail");
    let a = Arc::new(create(&c, &h, true));
    let spare = Arc::new(MemMember::new("spare", 8 << 20));
    assert_eq!(
        a.add_member(spare.clone()).unwrap(),
        uraid_engine::AddOutcome::Spare
    );
    let events = a.subscribe();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let n = notes.clone();
    let d = a
        .start_daemons(DaemonOptions {
            notify: Some(Arc::new(move |note: &DaemonNote| {
                n.lock().unwrap().push(note.clone())
            })),
            ..DaemonOptions::default()
        })
        .unwrap();
    wait_for("the array clean (safe mode)", || {
        read_superblock(h.disks[0].as_ref()).unwrap().is_clean() && !a.is_dirty()
    });
    let before = read_superblock(h.disks[1].as_ref()).unwrap().events;

    h.networks[1].store(false, Ordering::SeqCst);
    let data = vec![0x6bu8; 256 << 10];
    a.write(0, &data).unwrap();
    // The member is failed by then; its slot may already hold the spare (recovering), so
    // the failure is asserted by its event below, not by the slot's state now.
    // Nothing reached host 1 after the network went: not even the dirty superblock.
    assert_eq!(read_superblock(h.disks[1].as_ref()).unwrap().events, before);
    // The events until the failure's (60 s each: a hang bound).
    let fail = loop {
        match events.recv_timeout(Duration::from_secs(60)) {
            Ok(e @ uraid_engine::Event::Fail { .. }) => break e,
            Ok(_) => {}
            Err(e) => panic!("no Fail event: {e}"),
        }
    };
    assert!(
        matches!(&fail, uraid_engine::Event::Fail { role, .. } if *role == MemberIdx(1)),
        "{fail:?}"
    );
    wait_for("the spare rebuilt in role 1", || {
        !a.is_degraded() && a.slot_state(MemberIdx(1)) == SlotState::InSync
    });
    assert!(
        notes
            .lock()
            .unwrap()
            .contains(&DaemonNote::SpareTookFailedRole { role: MemberIdx(1) }),
        "{:?}",
        notes.lock().unwrap()
    );
    d.stop();
    let off = read_superblock(spare.as_ref()).unwrap().data_offset * 512;
    let mut got = vec![0u8; data.len()];
    spare.read_at(&mut got, off).unwrap();
    assert!(got == data, "the spare holds the data");
}
