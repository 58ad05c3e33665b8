//! Every available implementation against the byte-wise reference in `uraid_parity::scalar`,
//! on random lengths (0..=9000), unaligned starts and 1..=24 data blocks.
//!
//! Quick by default; `URAID_FULL=1` runs more cases and every lost combination everywhere.

use proptest::prelude::*;
use uraid_parity::{available, scalar, Parity};

fn full() -> bool {
    std::env::var_os("URAID_FULL").is_some_and(|v| v != "0")
}

fn cases(quick: u32) -> ProptestConfig {
    ProptestConfig::with_cases(if full() { quick * 16 } else { quick })
}

fn impls() -> Vec<Parity> {
    available()
        .into_iter()
        .map(|i| Parity::new(i).expect("available"))
        .collect()
}

/// xorshift64*: cheap deterministic bytes from the proptest seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// `n` blocks of `len` random bytes, each starting at its own offset (0..64) inside an
/// allocation, so that no two blocks share an alignment by design.
struct Blocks {
    bufs: Vec<Vec<u8>>,
    offs: Vec<usize>,
    len: usize,
}

impl Blocks {
    fn new(rng: &mut Rng, n: usize, len: usize) -> Blocks {
        let mut bufs = Vec::new();
        let mut offs = Vec::new();
        for _ in 0..n {
            let off = rng.below(64);
            let mut b = vec![0u8; off + len];
            rng.fill(&mut b);
            bufs.push(b);
            offs.push(off);
        }
        Blocks { bufs, offs, len }
    }
    fn get(&self, i: usize) -> &[u8] {
        &self.bufs[i][self.offs[i]..self.offs[i] + self.len]
    }
    fn all(&self) -> Vec<&[u8]> {
        (0..self.bufs.len()).map(|i| self.get(i)).collect()
    }
    fn all_mut(&mut self) -> Vec<&mut [u8]> {
        let len = self.len;
        self.bufs
            .iter_mut()
            .zip(&self.offs)
            .map(|(b, &o)| &mut b[o..o + len])
            .collect()
    }
}

fn seed_len_disks() -> impl Strategy<Value = (u64, usize, usize)> {
    (any::<u64>(), 0usize..=9000, 1usize..=24).prop_map(|(s, len, n)| (s | 1, len, n))
}

proptest! {
    #![proptest_config(cases(48))]

    #[test]
    fn xor_matches_reference((seed, len, n) in seed_len_disks()) {
        let mut rng = Rng(seed);
        // Source blocks, plus two outputs at their own offsets.
        let mut b = Blocks::new(&mut rng, n + 2, len);
        let srcs: Vec<Vec<u8>> = (0..n).map(|i| b.get(i).to_vec()).collect();
        let srcs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
        let mut want_gen = vec![0u8; len];
        scalar::xor_gen(&mut want_gen, &srcs);
        let start = b.get(n).to_vec();
        let mut want_acc = start.clone();
        scalar::xor_acc(&mut want_acc, &srcs);
        for par in impls() {
            let mut views = b.all_mut();
            let (ins, outs) = views.split_at_mut(n);
            let ins: Vec<&[u8]> = ins.iter().map(|s| &**s).collect();
            outs[1].fill(0x77);
            par.xor_gen(outs[1], &ins);
            prop_assert_eq!(&*outs[1], &want_gen[..], "xor_gen {}", par.implementation());
            outs[0].copy_from_slice(&start);
            par.xor_acc(outs[0], &ins);
            prop_assert_eq!(&*outs[0], &want_acc[..], "xor_acc {}", par.implementation());
            par.xor_acc(outs[0], &[]);
            prop_assert_eq!(&*outs[0], &want_acc[..], "xor_acc of nothing");
        }
    }

    #[test]
    fn gen_pq_matches_reference((seed, len, n) in seed_len_disks()) {
        let mut rng = Rng(seed);
        let mut b = Blocks::new(&mut rng, n + 2, len);
        let (mut wp, mut wq) = (vec![0u8; len], vec![0u8; len]);
        scalar::gen_pq(&b.all()[..n], &mut wp, &mut wq);
        for par in impls() {
            let mut views = b.all_mut();
            let (data, pq) = views.split_at_mut(n);
            let data: Vec<&[u8]> = data.iter().map(|s| &**s).collect();
            let (p, q) = pq.split_at_mut(1);
            p[0].fill(0x11);
            q[0].fill(0x22);
            par.gen_pq(&data, p[0], q[0]);
            prop_assert_eq!(&*p[0], &wp[..], "P {}", par.implementation());
            prop_assert_eq!(&*q[0], &wq[..], "Q {}", par.implementation());
        }
    }

    #[test]
    fn update_pq_matches_regeneration((seed, len, n) in seed_len_disks()) {
        let mut rng = Rng(seed);
        let b = Blocks::new(&mut rng, n + 1, len);
        let old: Vec<&[u8]> = b.all()[..n].to_vec();
        let slot = rng.below(n);
        let new_block = b.get(n);
        let (mut p0, mut q0) = (vec![0u8; len], vec![0u8; len]);
        scalar::gen_pq(&old, &mut p0, &mut q0);
        let mut new = old.clone();
        new[slot] = new_block;
        let (mut wp, mut wq) = (vec![0u8; len], vec![0u8; len]);
        scalar::gen_pq(&new, &mut wp, &mut wq);
        let delta: Vec<u8> = old[slot].iter().zip(new_block).map(|(a, b)| a ^ b).collect();
        // Unaligned copies of P, Q and delta.
        let o = 1 + rng.below(63);
        for par in impls() {
            let (mut p, mut q) = (vec![0u8; len + o], vec![0u8; len + o]);
            let mut d = vec![0u8; len + o];
            p[o..].copy_from_slice(&p0);
            q[o..].copy_from_slice(&q0);
            d[o..].copy_from_slice(&delta);
            par.update_pq(slot, &d[o..], &mut p[o..], &mut q[o..]);
            prop_assert_eq!(&p[o..], &wp[..], "P {}", par.implementation());
            prop_assert_eq!(&q[o..], &wq[..], "Q {}", par.implementation());
            q[o..].copy_from_slice(&q0);
            par.update_q(slot, &d[o..], &mut q[o..]);
            prop_assert_eq!(&q[o..], &wq[..], "update_q {}", par.implementation());
        }
    }

    #[test]
    fn recover_restores_lost_blocks((seed, len, n) in seed_len_disks()) {
        let mut rng = Rng(seed);
        let mut b = Blocks::new(&mut rng, n + 2, len);
        {
            let mut views = b.all_mut();
            let (data, pq) = views.split_at_mut(n);
            let data: Vec<&[u8]> = data.iter().map(|s| &**s).collect();
            let (p, q) = pq.split_at_mut(1);
            scalar::gen_pq(&data, p[0], q[0]);
        }
        let want: Vec<Vec<u8>> = b.all().iter().map(|s| s.to_vec()).collect();
        let mut sets = lost_sets(n + 2);
        // Quick mode: all sets for narrow stripes, a random dozen for wide ones.
        if !full() && sets.len() > 12 {
            for i in 0..12 {
                let j = i + rng.below(sets.len() - i);
                sets.swap(i, j);
            }
            sets.truncate(12);
        }
        for par in impls() {
            for lost in &sets {
                check_recover(&par, &mut b, &want, lost, &mut rng)?;
            }
        }
    }
}

/// Every set of one or two distinct block indices out of `n`.
fn lost_sets(n: usize) -> Vec<Vec<usize>> {
    let mut v: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    for i in 0..n {
        for j in i + 1..n {
            // Both orders are legal input; alternate them.
            v.push(if (i + j) % 2 == 0 {
                vec![i, j]
            } else {
                vec![j, i]
            });
        }
    }
    v
}

fn check_recover(
    par: &Parity,
    b: &mut Blocks,
    want: &[Vec<u8>],
    lost: &[usize],
    rng: &mut Rng,
) -> Result<(), TestCaseError> {
    let mut views = b.all_mut();
    for &i in lost {
        rng.fill(views[i]);
    }
    par.recover(&mut views, lost);
    for (i, (got, want)) in views.iter().zip(want).enumerate() {
        prop_assert_eq!(
            &**got,
            &want[..],
            "{} lost {:?}, block {}",
            par.implementation(),
            lost,
            i
        );
    }
    Ok(())
}

/// Every lost combination, for a range of stripe widths, at a ragged length.
#[test]
fn recover_every_combination() {
    let mut rng = Rng(0x5eed);
    for n in [1usize, 2, 3, 4, 7, 8, 16, 24] {
        let len = 64 * 3 + 37;
        let mut b = Blocks::new(&mut rng, n + 2, len);
        {
            let mut views = b.all_mut();
            let (data, pq) = views.split_at_mut(n);
            let data: Vec<&[u8]> = data.iter().map(|s| &**s).collect();
            let (p, q) = pq.split_at_mut(1);
            scalar::gen_pq(&data, p[0], q[0]);
        }
        let want: Vec<Vec<u8>> = b.all().iter().map(|s| s.to_vec()).collect();
        for par in impls() {
            for lost in lost_sets(n + 2) {
                check_recover(&par, &mut b, &want, &lost, &mut rng).unwrap();
            }
            // Nothing lost, and a repeated index, are legal too.
            check_recover(&par, &mut b, &want, &[], &mut rng).unwrap();
            check_recover(&par, &mut b, &want, &[0, 0], &mut rng).unwrap();
        }
    }
}

#[test]
fn scalar_recover_agrees_with_fast_paths() {
    // The reference `recover` is itself a model; pin it on one stripe too.
    let mut rng = Rng(0xfeed);
    let n = 6;
    let len = 300;
    let mut b = Blocks::new(&mut rng, n + 2, len);
    {
        let mut views = b.all_mut();
        let (data, pq) = views.split_at_mut(n);
        let data: Vec<&[u8]> = data.iter().map(|s| &**s).collect();
        let (p, q) = pq.split_at_mut(1);
        scalar::gen_pq(&data, p[0], q[0]);
    }
    let want: Vec<Vec<u8>> = b.all().iter().map(|s| s.to_vec()).collect();
    for lost in lost_sets(n + 2) {
        let mut views = b.all_mut();
        for &i in &lost {
            rng.fill(views[i]);
        }
        scalar::recover(&mut views, &lost);
        for (got, want) in views.iter().zip(&want) {
            assert_eq!(&**got, &want[..], "lost {lost:?}");
        }
    }
}

/// Every stripe width that has a loop of its own in the SIMD paths (2..=8 data blocks; 1 and
/// 9..=10 take the generic loop) at lengths around the step sizes (whole steps of 4 vectors,
/// single vectors and a byte tail, for 32- and 64-byte vectors), data and outputs at odd
/// offsets: P+Q generation, and Q alone and P+Q rebuilt by `recover` (the Q-only and P+Q
/// passes), against the reference.
#[test]
fn every_fixed_width_and_tail() {
    let mut rng = Rng(0xf1ed);
    let lens = [
        0usize, 1, 31, 32, 63, 64, 95, 127, 128, 129, 255, 256, 257, 300, 511, 512,
    ];
    let lens = lens
        .into_iter()
        .chain([513, 767, 1023, 1024, 1057, 4096 + 96 + 7]);
    for len in lens {
        for n in 1..=10usize {
            let mut b = Blocks::new(&mut rng, n + 2, len);
            let (mut wp, mut wq) = (vec![0u8; len], vec![0u8; len]);
            scalar::gen_pq(&b.all()[..n], &mut wp, &mut wq);
            for par in impls() {
                let name = par.implementation();
                let mut views = b.all_mut();
                let (data, pq) = views.split_at_mut(n);
                let data: Vec<&[u8]> = data.iter().map(|s| &**s).collect();
                let (p, q) = pq.split_at_mut(1);
                p[0].fill(0x11);
                q[0].fill(0x22);
                par.gen_pq(&data, p[0], q[0]);
                assert_eq!(&*p[0], &wp[..], "P {name}, {n} data, {len} bytes");
                assert_eq!(&*q[0], &wq[..], "Q {name}, {n} data, {len} bytes");
            }
            let want: Vec<Vec<u8>> = b.all().iter().map(|s| s.to_vec()).collect();
            for par in impls() {
                for lost in [vec![n + 1], vec![n, n + 1]] {
                    check_recover(&par, &mut b, &want, &lost, &mut rng).unwrap();
                }
            }
        }
    }
}

/// More blocks than the front end keeps on the stack (it falls back to the heap).
#[test]
fn wide_stripes() {
    let mut rng = Rng(0x71de);
    let n = 40;
    let len = 64 * 4 + 9;
    let mut b = Blocks::new(&mut rng, n + 2, len);
    let mut want_x = vec![0u8; len];
    scalar::xor_gen(&mut want_x, &b.all()[..n]);
    let (mut wp, mut wq) = (vec![0u8; len], vec![0u8; len]);
    scalar::gen_pq(&b.all()[..n], &mut wp, &mut wq);
    for par in impls() {
        let mut x = vec![0u8; len];
        par.xor_gen(&mut x, &b.all()[..n]);
        assert_eq!(x, want_x, "{}", par.implementation());
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        par.gen_pq(&b.all()[..n], &mut p, &mut q);
        assert_eq!((&p, &q), (&wp, &wq), "{}", par.implementation());
    }
    {
        let mut views = b.all_mut();
        views[n].copy_from_slice(&wp);
        views[n + 1].copy_from_slice(&wq);
    }
    let want: Vec<Vec<u8>> = b.all().iter().map(|s| s.to_vec()).collect();
    for par in impls() {
        for lost in [
            vec![3],
            vec![n],
            vec![0, 39],
            vec![5, n],
            vec![7, n + 1],
            vec![n, n + 1],
        ] {
            check_recover(&par, &mut b, &want, &lost, &mut rng).unwrap();
        }
    }
}

/// Blocks long enough for the non-temporal store path (256 KiB and up) with a ragged tail;
/// outputs 64-byte aligned (streamed), 32-byte aligned (streamed by AVX2 only) and
/// misaligned (never streamed), data at odd offsets. Every path against the reference.
#[test]
fn long_blocks_every_output_alignment() {
    let mut rng = Rng(0x10c6);
    let n = 5;
    let len = (256 << 10) + 64 * 3 + 5;
    for out_misalign in [0usize, 32, 1] {
        // Data blocks at random offsets, the outputs (n..n+3) at `out_misalign` past 64.
        let mut b = Blocks::new(&mut rng, n + 3, len);
        for i in n..n + 3 {
            let mut buf = vec![0u8; len + 128];
            let off = buf.as_ptr().align_offset(64) + out_misalign;
            rng.fill(&mut buf);
            b.bufs[i] = buf;
            b.offs[i] = off;
        }
        let data: Vec<Vec<u8>> = b.all()[..n].iter().map(|s| s.to_vec()).collect();
        let data: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let mut want_x = vec![0u8; len];
        scalar::xor_gen(&mut want_x, &data);
        let (mut wp, mut wq) = (vec![0u8; len], vec![0u8; len]);
        scalar::gen_pq(&data, &mut wp, &mut wq);
        for par in impls() {
            let what = format!("{} misalign {out_misalign}", par.implementation());
            let mut views = b.all_mut();
            let (_, outs) = views.split_at_mut(n);
            let (x, pq) = outs.split_at_mut(1);
            let (p, q) = pq.split_at_mut(1);
            par.xor_gen(x[0], &data);
            assert!(*x[0] == want_x[..], "xor_gen, {what}");
            par.gen_pq(&data, p[0], q[0]);
            assert!(*p[0] == wp[..] && *q[0] == wq[..], "gen_pq, {what}");
            // Q alone and P alone through recover (the Q-only syndrome pass and the XOR).
            let mut stripe: Vec<&mut [u8]> = Vec::new();
            let (d, rest) = views.split_at_mut(n);
            stripe.extend(d.iter_mut().map(|s| &mut **s));
            let (_, pq) = rest.split_at_mut(1);
            stripe.extend(pq.iter_mut().map(|s| &mut **s));
            for lost in [n + 1, n] {
                stripe[lost].fill(0xee);
                par.recover(&mut stripe, &[lost]);
                assert!(*stripe[n] == wp[..], "recover {lost}: P, {what}");
                assert!(*stripe[n + 1] == wq[..], "recover {lost}: Q, {what}");
            }
        }
    }
}
