//! FaultMember over a file keeps the batched (io_uring) path, and still fails exactly the
//! ops its switch and range hit.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use uraid_engine::io::{execute, io_engine, uring_ios_on_this_thread, IoEngine, Op};
use uraid_engine::Member;
use uraid_engine::{DirectMode, FileMember};
use uraid_sim::FaultMember;

/// A buffered file member, with io_uring forced: by default a buffered file runs
/// pread/pwrite, and these tests are about the batched path through the wrapper.
fn file(tag: &str) -> Arc<dyn Member> {
    uraid_engine::set_io_engine(IoEngine::Uring);
    let dir = std::env::temp_dir().join(format!("uraid-sim-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(tag);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(1 << 20).unwrap();
    Arc::new(FileMember::open(&p, DirectMode::Off).unwrap())
}

#[test]
fn fault_member_over_files_runs_on_the_ring_and_fails_per_op() {
    let (fa, fb) = (file("a"), file("b"));
    fa.write_at(&[0xa5; 8192], 0).unwrap();
    fb.write_at(&[0x5a; 4096], 0).unwrap();
    let a = FaultMember::new(fa.clone());
    let b = FaultMember::new(fb.clone());
    a.set_range(4096, 8192);
    a.fail_reads.store(true, Ordering::SeqCst);
    b.fail_writes.store(true, Ordering::SeqCst);

    let before = uring_ios_on_this_thread();
    let (mut r0, mut r1, mut r2) = (vec![0u8; 4096], vec![0u8; 4096], vec![0u8; 4096]);
    let w = vec![0x77u8; 4096];
    let mut ops = vec![
        Op::read(&a, 0, &mut r0),    // outside the bad range: reaches the file
        Op::read(&a, 4096, &mut r1), // inside: injected EIO
        Op::read(&b, 0, &mut r2),    // b fails writes only
        Op::write(&b, 8192, &w),     // injected EIO, never written
        Op::write(&a, 65536, &w),    // a fails reads only: written
    ];
    let res = execute(&mut ops);
    drop(ops);
    let errs: Vec<bool> = res.iter().map(|r| r.is_err()).collect();
    assert_eq!(errs, [false, true, false, true, false], "{res:?}");
    assert!(res[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("injected read"));
    assert_eq!(r0, [0xa5; 4096]);
    assert_eq!(r1, [0u8; 4096], "a failed read transfers nothing");
    assert_eq!(r2, [0x5a; 4096]);
    let mut raw = vec![1u8; 4096];
    fb.read_at(&mut raw, 8192).unwrap();
    assert_eq!(raw, [0u8; 4096], "the failed write did not reach the file");
    fa.read_at(&mut raw, 65536).unwrap();
    assert_eq!(raw, [0x77; 4096]);
    assert_eq!(a.reads.load(Ordering::Relaxed), 2);
    assert_eq!(a.writes.load(Ordering::Relaxed), 1);
    assert_eq!(b.writes.load(Ordering::Relaxed), 1);
    if io_engine() == IoEngine::Uring {
        assert_eq!(
            uring_ios_on_this_thread() - before,
            3,
            "the three ops not failed by the wrapper ran on io_uring"
        );
    } else {
        uraid_testkit::skip("fault_member_over_files", "io_uring unavailable");
    }
}

#[test]
fn a_hook_sees_every_op_of_a_batch_and_may_lose_or_fail_it() {
    use std::sync::Mutex;
    use uraid_sim::{HookIo, Verdict};
    let f = file("hook");
    let seen: Arc<Mutex<Vec<HookIo>>> = Arc::default();
    let s2 = seen.clone();
    let m = FaultMember::new(f.clone()).with_hook(move |io| {
        s2.lock().unwrap().push(io);
        match io.offset {
            0 => Verdict::Lose,
            4096 => Verdict::Fail(std::io::Error::other("hooked")),
            _ => Verdict::Pass,
        }
    });
    let (w0, w1, w2) = (vec![1u8; 4096], vec![2u8; 4096], vec![3u8; 4096]);
    let before = uring_ios_on_this_thread();
    let mut ops = vec![
        Op::write(&m, 0, &w0),
        Op::write(&m, 4096, &w1),
        Op::write(&m, 8192, &w2),
        Op::write(&m, 12288, &w2),
    ];
    let res = execute(&mut ops);
    drop(ops);
    assert!(res[0].is_ok(), "a lost write reports success");
    assert_eq!(res[1].as_ref().unwrap_err().to_string(), "hooked");
    assert!(res[2].is_ok() && res[3].is_ok());
    let offs: Vec<u64> = seen.lock().unwrap().iter().map(|io| io.offset).collect();
    assert_eq!(offs, [0, 4096, 8192, 12288]);
    let mut raw = vec![9u8; 16384];
    f.read_at(&mut raw, 0).unwrap();
    assert_eq!(
        &raw[..8192],
        &[0u8; 8192][..],
        "lost and failed writes stored nothing"
    );
    assert_eq!(&raw[8192..], &[3u8; 8192][..]);
    if io_engine() == IoEngine::Uring {
        assert_eq!(
            uring_ios_on_this_thread() - before,
            2,
            "only the passed writes"
        );
    } else {
        uraid_testkit::skip("a_hook_sees_every_op_of_a_batch", "io_uring unavailable");
    }
}
