//! `uraid_engine::nbd::ArrayBackend`, the one NBD adapter (`uraid serve` and embedders use
//! it): what a client sees for each request, called through `uraid_nbd::Backend` as the
//! server calls it.

use std::sync::Arc;
use uraid_core::Level;
use uraid_engine::nbd::ArrayBackend;
use uraid_engine::{assemble, AssembleOptions, Member};
use uraid_nbd::{Backend, ZeroFlags};
use uraid_testkit::engine::*;

fn raid5() -> (Vec<Arc<uraid_engine::MemMember>>, ArrayBackend) {
    let c = Config::new(Level::Raid5, None, 4);
    let mems = mem_members(&c, "nbd");
    let a = uraid_engine::create(as_members(&mems), &create_opts(&c)).unwrap();
    (mems, ArrayBackend::new(Arc::new(a)))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn zero(fast: bool, no_hole: bool) -> ZeroFlags {
    ZeroFlags {
        fast,
        no_hole,
        ..ZeroFlags::default()
    }
}

#[test]
fn requests_reach_the_array() {
    let (_m, b) = raid5();
    assert_eq!(b.size_bytes(), b.cell.get().size_bytes());
    assert!(!b.read_only());
    assert_eq!(b.block_size(), 4096);
    let data = pattern(96 << 10, 5);
    b.write(12288, &data, false).unwrap();
    b.write(200 << 10, &data[..4096], true).unwrap(); // FUA
    let mut back = vec![0u8; data.len()];
    b.read(12288, &mut back).unwrap();
    assert_eq!(back, data);
    b.cell.get().read(12288, &mut back).unwrap();
    assert_eq!(back, data, "the array itself holds what the client wrote");

    // Memory members zero without writing: fast zeroing is advertised and honoured on
    // whole stripes (24 KiB of data here); the partial stripes around them are written.
    assert!(b.can_fast_zero());
    let stripe = 3 * 8192;
    b.write_zeroes(stripe, 3 * stripe, zero(true, false))
        .unwrap();
    b.write_zeroes(12288, stripe - 12288, zero(false, true))
        .unwrap();
    b.write_zeroes(
        4 * stripe,
        12288 + (96 << 10) - 4 * stripe,
        zero(false, false),
    )
    .unwrap();
    b.read(12288, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0), "write_zeroes left data");
    b.trim(0, 1 << 20).unwrap();
    b.flush().unwrap();
}

#[test]
fn array_errors_reach_the_client_as_their_errno() {
    let (_m, b) = raid5();
    let size = b.size_bytes();
    let e = b.write(size, &[1u8; 512], false).expect_err("past the end");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    let mut buf = [0u8; 512];
    let e = b.read(size, &mut buf).expect_err("past the end");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
}

#[test]
fn fast_zero_is_refused_with_enotsup_and_changes_nothing() {
    // A journal must log every write: no zeroing is fast.
    let (_m, _j, a) = journaled_array(Level::Raid5, 4, 8 << 20, "nbdj");
    let b = ArrayBackend::new(Arc::new(a));
    assert!(!b.can_fast_zero());
    let data = pattern(16 << 10, 9);
    b.write(8192, &data, false).unwrap();
    let e = b
        .write_zeroes(8192, 16 << 10, zero(true, false))
        .expect_err("fast zeroing through a journal");
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    let mut back = vec![0u8; data.len()];
    b.read(8192, &mut back).unwrap();
    assert_eq!(back, data, "a refused fast zero changed data");
    // Without `fast` it zeroes (the client's fallback).
    b.write_zeroes(8192, 16 << 10, zero(false, false)).unwrap();
    b.read(8192, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0));
}

#[test]
fn a_read_only_array_is_a_read_only_export() {
    let (mems, b) = raid5();
    let data = pattern(8192, 3);
    b.write(0, &data, false).unwrap();
    b.cell.get().stop().unwrap();
    drop(b);
    let devs: Vec<Arc<dyn Member>> = mems.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
    let (a, _) = assemble(
        devs,
        &AssembleOptions {
            readonly: true,
            ..Default::default()
        },
    )
    .unwrap();
    let b = ArrayBackend::new(Arc::new(a));
    assert!(
        b.read_only(),
        "the server says NBD_FLAG_READ_ONLY from this"
    );
    // The server refuses writes itself; a write that gets through is still refused.
    let e = b.write(0, &[0u8; 4096], false).expect_err("write");
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = b.trim(0, 4096).expect_err("trim");
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let mut back = vec![0u8; data.len()];
    b.read(0, &mut back).unwrap();
    assert_eq!(back, data);
}
