//! The IO engine is chosen per file member at open: pread/pwrite on tmpfs (and for buffered
//! files), io_uring for O_DIRECT files and block devices; a forced engine wins. One test in
//! its own binary, because the forced engine is process-wide.

use std::path::{Path, PathBuf};
use uraid_engine::io::{execute, uring_ios_on_this_thread, Op};
use uraid_engine::{
    io_engine_forced, set_io_engine, set_io_engine_per_member, AlignedBuf, DirectMode, FileMember,
    IoEngine, Member,
};

const TEST: &str = "io_engine_is_chosen_per_member";

fn members(dir: &Path, mode: DirectMode) -> Vec<FileMember> {
    std::fs::create_dir_all(dir).unwrap();
    (0..2)
        .map(|i| {
            let p = dir.join(format!("m{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
            FileMember::open(&p, mode).unwrap()
        })
        .collect()
}

/// Writes a pattern to both members in one batch and reads it back in another; returns how
/// many of those four IOs ran on this thread's io_uring.
fn ring_ios(m: &[FileMember], seed: u8) -> u64 {
    let mut w = AlignedBuf::new(8192);
    for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
    let before = uring_ios_on_this_thread();
    let mut ops = vec![Op::write(&m[0], 4096, &w), Op::write(&m[1], 0, &w)];
    assert!(execute(&mut ops).iter().all(|r| r.is_ok()));
    let (mut r0, mut r1) = (AlignedBuf::new(8192), AlignedBuf::new(8192));
    let mut ops = vec![
        Op::read(&m[0], 4096, r0.as_mut_slice()),
        Op::read(&m[1], 0, r1.as_mut_slice()),
    ];
    assert!(execute(&mut ops).iter().all(|r| r.is_ok()));
    assert_eq!(&r0[..], &w[..]);
    assert_eq!(&r1[..], &w[..]);
    uring_ios_on_this_thread() - before
}

#[test]
fn io_engine_is_chosen_per_member() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        uraid_testkit::skip(TEST, "no /dev/shm (tmpfs) here");
        return;
    }
    let pid = std::process::id();
    let tmpfs_dir = shm.join(format!("uraid-engine-choice-{pid}"));
    let disk_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("engine-{pid}"));
    let on_tmpfs = members(&tmpfs_dir, DirectMode::Auto);
    let direct = members(&disk_dir, DirectMode::Auto);
    let buffered = members(&disk_dir.join("buffered"), DirectMode::Off);

    assert_eq!(io_engine_forced(), None, "nothing forced by default");
    for m in on_tmpfs.iter().chain(&buffered) {
        assert_eq!(m.engine(), IoEngine::Sync, "{}", m.name());
        assert_eq!(Member::io_engine(m), Some(IoEngine::Sync));
    }
    assert_eq!(ring_ios(&on_tmpfs, 1), 0, "tmpfs members ran pread/pwrite");
    assert_eq!(
        ring_ios(&buffered, 2),
        0,
        "buffered members ran pread/pwrite"
    );
    let have_direct = direct[0].uses_direct();
    if have_direct {
        assert_eq!(direct[0].engine(), IoEngine::Uring);
        let n = ring_ios(&direct, 3);
        if io_engine_forced() == Some(IoEngine::Sync) {
            uraid_testkit::skip(TEST, "io_uring cannot be set up here");
        } else {
            assert_eq!(n, 4, "O_DIRECT members ran on io_uring");
            // The override wins, both ways.
            set_io_engine(IoEngine::Uring);
            assert_eq!(on_tmpfs[0].engine(), IoEngine::Uring);
            assert_eq!(ring_ios(&on_tmpfs, 4), 4, "forced io_uring on tmpfs");
        }
    } else {
        uraid_testkit::skip(TEST, "the target dir's file system refuses O_DIRECT");
    }
    set_io_engine(IoEngine::Sync);
    assert_eq!(direct[0].engine(), IoEngine::Sync);
    assert_eq!(ring_ios(&direct, 5), 0, "forced sync");
    set_io_engine_per_member();
    assert_eq!(
        on_tmpfs[0].engine(),
        IoEngine::Sync,
        "back to the member's choice"
    );
    drop((on_tmpfs, direct, buffered));
    std::fs::remove_dir_all(&tmpfs_dir).unwrap();
    std::fs::remove_dir_all(&disk_dir).unwrap();
}
