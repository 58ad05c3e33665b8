//! XOR and RAID6 P/Q syndrome generation and recovery in md's field: GF(2^8) with the
//! polynomial 0x11d and generator {02}; Q = sum over data slots k of {02}^k * D_k.
//!
//! All functions take data blocks in *syndrome order* (slot k gets coefficient {02}^k); the
//! geometry in `uraid-core` says which logical chunk sits in which slot.
//!
//! Every buffer passed to one call must have the same length. Lengths need not be multiples
//! of anything and buffers need not be aligned.
//!
//! # Implementations
//!
//! The free functions run on the fastest [`Implementation`] this CPU has, chosen once on
//! first use ([`active`]); the environment variable `URAID_PARITY_IMPL`
//! (`scalar|avx2|avx512|gfni`) forces one, and an unavailable or unknown choice falls back
//! silently to the best available. [`Parity::new`] runs any available implementation
//! explicitly, which is how the tests compare them all with the byte-wise reference in
//! [`scalar`].
//!
//! | implementation | needs | {02}·x (Horner step) | c·x (rmw, recovery) |
//! |---|---|---|---|
//! | `Scalar` | nothing (u64 words) | shift + mask + 0x1d | log/exp tables |
//! | `Avx2` | avx2 | add + PSHUFB of 0x1d (biased, corrected at the end) | PSHUFB nibble tables |
//! | `Avx512` | avx512f, avx512bw | add + k-mask + 0x1d | PSHUFB nibble tables |
//! | `Gfni` | avx512f, avx512bw, gfni | `gf2p8affineqb` | `gf2p8affineqb` |
//!
//! Every pass reads each source once: recovery of two data blocks computes the partial
//! syndromes of the survivors and solves for both lost blocks in the same loop. Outputs of
//! blocks of 256 KiB and more are written with non-temporal stores on x86. Whole
//! vectors go through the SIMD loops, a ragged tail byte by byte. Measurements against
//! ISA-L and the command to repeat them: `docs/PERFORMANCE.md` (Parity) and the
//! `parity-bench` binary.
//!
//! ```
//! use uraid_parity::{gen_pq, recover, Implementation, Parity};
//!
//! let data = [[1u8; 4096], [2u8; 4096], [3u8; 4096]];
//! let (mut p, mut q) = (vec![0u8; 4096], vec![0u8; 4096]);
//! gen_pq(&[&data[0], &data[1], &data[2]], &mut p, &mut q);
//!
//! // Lose data blocks 0 and 2 and rebuild them in place.
//! let mut blocks: Vec<Vec<u8>> = vec![vec![0; 4096], data[1].to_vec(), vec![0; 4096], p, q];
//! let mut views: Vec<&mut [u8]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
//! recover(&mut views, &[0, 2]);
//! assert_eq!(blocks[0], data[0]);
//! assert_eq!(blocks[2], data[2]);
//!
//! // Any implementation the CPU has can be called directly.
//! let scalar = Parity::new(Implementation::Scalar).unwrap();
//! let mut x = vec![0u8; 4096];
//! scalar.xor_gen(&mut x, &[&data[0], &data[1]]);
//! assert_eq!(x[0], 1 ^ 2);
//! ```

use std::sync::OnceLock;

pub mod gf;
mod kernels;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use kernels::{Job, Kernels};

/// The environment variable that forces an [`Implementation`] for the free functions.
pub const IMPL_ENV: &str = "URAID_PARITY_IMPL";

/// One code path for the parity math.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Implementation {
    /// Portable: eight bytes at a time in u64 words (the byte-wise reference is [`scalar`]).
    Scalar,
    /// 32-byte AVX2 vectors.
    Avx2,
    /// 64-byte AVX-512 (F + BW) vectors.
    Avx512,
    /// AVX-512 with GFNI affine multiplication.
    Gfni,
}

impl Implementation {
    /// All implementations, slowest first.
    pub const ALL: [Implementation; 4] = [Self::Scalar, Self::Avx2, Self::Avx512, Self::Gfni];

    /// The lower-case name used by `URAID_PARITY_IMPL`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Gfni => "gfni",
        }
    }

    /// Parse a name as printed by [`Implementation::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        self.kernels().is_some()
    }

    fn kernels(self) -> Option<&'static Kernels> {
        match self {
            Self::Scalar => Some(&kernels::word::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 if std::is_x86_feature_detected!("avx2") => Some(&x86::avx2::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 if has_avx512() => Some(&x86::avx512::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Self::Gfni if has_avx512() && std::is_x86_feature_detected!("gfni") => {
                Some(&x86::gfni::KERNELS)
            }
            _ => None,
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
}

impl std::fmt::Display for Implementation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The implementations this CPU can run, slowest first (always starts with `Scalar`).
pub fn available() -> Vec<Implementation> {
    Implementation::ALL
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
}

/// The implementation the free functions use.
pub fn active() -> Implementation {
    Parity::active().implementation()
}

static ACTIVE: OnceLock<Parity> = OnceLock::new();

fn choose() -> Parity {
    let forced = std::env::var(IMPL_ENV)
        .ok()
        .and_then(|v| Implementation::from_name(&v))
        .and_then(Parity::new);
    forced.unwrap_or_else(|| {
        let best = *available().last().expect("scalar is always available");
        Parity::new(best).expect("available implementation")
    })
}

/// The parity functions bound to one [`Implementation`].
#[derive(Clone, Copy)]
pub struct Parity {
    imp: Implementation,
    k: &'static Kernels,
}

impl std::fmt::Debug for Parity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Parity").field(&self.imp).finish()
    }
}

impl PartialEq for Parity {
    fn eq(&self, other: &Self) -> bool {
        self.imp == other.imp
    }
}

impl Eq for Parity {}

fn check_len(len: usize, other: usize) {
    assert_eq!(len, other, "parity buffers must have equal lengths");
}

impl Parity {
    /// `None` if this CPU cannot run `imp`.
    pub fn new(imp: Implementation) -> Option<Parity> {
        imp.kernels().map(|k| Parity { imp, k })
    }

    /// The implementation the free functions use (chosen once per process).
    pub fn active() -> Parity {
        *ACTIVE.get_or_init(choose)
    }

    pub fn implementation(&self) -> Implementation {
        self.imp
    }

    /// See [`xor_gen`].
    pub fn xor_gen(&self, dst: &mut [u8], srcs: &[&[u8]]) {
        assert!(!srcs.is_empty(), "xor_gen needs at least one source");
        for s in srcs {
            check_len(dst.len(), s.len());
        }
        with_ptrs(srcs[1..].iter().map(|s| s.as_ptr()), |rest| {
            // SAFETY: every pointer names a live slice of dst.len() bytes; dst is exclusive.
            unsafe { self.xor_raw(dst.as_mut_ptr(), srcs[0].as_ptr(), rest, dst.len()) }
        })
    }

    /// See [`xor_acc`].
    pub fn xor_acc(&self, dst: &mut [u8], srcs: &[&[u8]]) {
        for s in srcs {
            check_len(dst.len(), s.len());
        }
        if srcs.is_empty() {
            return;
        }
        let d = dst.as_mut_ptr();
        with_ptrs(srcs.iter().map(|s| s.as_ptr()), |rest| {
            // SAFETY: as in xor_gen; dst is read and written at the same offsets only.
            unsafe { self.xor_raw(d, d, rest, dst.len()) }
        })
    }

    unsafe fn xor_raw(&self, dst: *mut u8, first: *const u8, rest: &[*const u8], len: usize) {
        let done = (self.k.xor)(dst, first, rest, 0, len);
        if done < len {
            (kernels::byte::KERNELS.xor)(dst, first, rest, done, len);
        }
    }

    /// See [`gen_pq`].
    pub fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        assert!(!data.is_empty(), "gen_pq needs at least one data block");
        check_len(p.len(), q.len());
        for d in data {
            check_len(p.len(), d.len());
        }
        let job = Job::Pq {
            p: p.as_mut_ptr(),
            q: q.as_mut_ptr(),
        };
        with_ptrs(data.iter().map(|d| d.as_ptr()), |ptrs| {
            // SAFETY: all blocks have p.len() bytes; p and q are exclusive and not in `data`.
            unsafe { self.syndrome_raw(ptrs, &job, p.len()) }
        })
    }

    unsafe fn syndrome_raw(&self, data: &[*const u8], job: &Job, len: usize) {
        let done = (self.k.syndrome)(data, job, 0, len);
        if done < len {
            (kernels::byte::KERNELS.syndrome)(data, job, done, len);
        }
    }

    /// See [`update_pq`].
    pub fn update_pq(&self, slot: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
        check_len(delta.len(), p.len());
        check_len(delta.len(), q.len());
        // SAFETY: equal lengths; p and q are exclusive.
        unsafe { self.update_raw(slot, delta, p.as_mut_ptr(), q) }
    }

    /// See [`update_q`].
    pub fn update_q(&self, slot: usize, delta: &[u8], q: &mut [u8]) {
        check_len(delta.len(), q.len());
        // SAFETY: equal lengths; a null P means "Q only".
        unsafe { self.update_raw(slot, delta, std::ptr::null_mut(), q) }
    }

    unsafe fn update_raw(&self, slot: usize, delta: &[u8], p: *mut u8, q: &mut [u8]) {
        let (c, d, q, len) = (gf::exp2(slot), delta.as_ptr(), q.as_mut_ptr(), q.len());
        let done = (self.k.update)(c, d, p, q, 0, len);
        if done < len {
            (kernels::byte::KERNELS.update)(c, d, p, q, done, len);
        }
    }

    /// See [`recover`].
    pub fn recover(&self, blocks: &mut [&mut [u8]], lost: &[usize]) {
        let n = blocks.len();
        assert!(
            n >= 3,
            "a raid6 stripe has at least one data block, P and Q"
        );
        let ndata = n - 2;
        let (pi, qi) = (ndata, ndata + 1);
        let lost = sort_lost(lost, n);
        let len = blocks[0].len();
        for b in blocks.iter() {
            check_len(len, b.len());
        }
        let (p, q) = (blocks[pi].as_mut_ptr(), blocks[qi].as_mut_ptr());
        let lost_ptr = |blocks: &mut [&mut [u8]], i: Option<usize>| match i {
            Some(i) if i < ndata => blocks[i].as_mut_ptr(),
            _ => std::ptr::null_mut(),
        };
        let (xp, yp) = (lost_ptr(blocks, lost[0]), lost_ptr(blocks, lost[1]));
        let is_lost = |k: usize| lost.contains(&Some(k));
        let job = match lost {
            [None, _] => return,
            [Some(x), None] if x == pi => {
                // P alone: the XOR of all data.
                with_ptrs(blocks[1..ndata].iter().map(|b| b.as_ptr()), |rest| {
                    // SAFETY: distinct live blocks of `len` bytes; P is not among them.
                    unsafe { self.xor_raw(p, blocks[0].as_ptr(), rest, len) }
                });
                return;
            }
            [Some(_), None] if xp.is_null() => Job::Q { q },
            [Some(_), None] => {
                // One data block: P and the other data.
                let rest = (0..ndata)
                    .filter(|&k| !is_lost(k))
                    .map(|k| blocks[k].as_ptr());
                with_ptrs(rest, |rest| {
                    // SAFETY: distinct live blocks of `len` bytes; the lost one is not read.
                    unsafe { self.xor_raw(xp, p, rest, len) }
                });
                return;
            }
            [Some(_), Some(_)] if xp.is_null() => Job::Pq { p, q },
            [Some(x), Some(y)] if y == qi => Job::DataQ {
                x: xp,
                p,
                q,
                gx: gf::exp2(x),
            },
            [Some(x), Some(y)] if y == pi => Job::DataP {
                x: xp,
                p,
                q,
                inv_gx: gf::inv(gf::exp2(x)),
            },
            [Some(x), Some(y)] => {
                // Dx = A*(P^Pxy) ^ B*(Q^Qxy), A = g^(y-x)/(g^(y-x)+1), B = g^-x/(g^(y-x)+1).
                let gyx = gf::exp2(y - x);
                let denom = gf::inv(gyx ^ 1);
                Job::DataData {
                    x: xp,
                    y: yp,
                    p,
                    q,
                    a: gf::mul(gyx, denom),
                    b: gf::mul(gf::inv(gf::exp2(x)), denom),
                }
            }
        };
        let data = (0..ndata).map(|k| match is_lost(k) {
            true => std::ptr::null(),
            false => blocks[k].as_ptr(),
        });
        with_ptrs(data, |data| {
            // SAFETY: every pointer names a distinct live block of `len` bytes; lost data
            // slots are null in `data`, so no block is both read and written.
            unsafe { self.syndrome_raw(data, &job, len) }
        })
    }
}

/// The (at most two) distinct lost indices, in ascending order.
fn sort_lost(lost: &[usize], n: usize) -> [Option<usize>; 2] {
    let mut out = [None, None];
    let mut count = 0;
    for &i in lost {
        assert!(i < n, "bad lost set: index {i} of {n} blocks");
        if out[..count].contains(&Some(i)) {
            continue;
        }
        assert!(count < 2, "bad lost set: raid6 survives two losses at most");
        out[count] = Some(i);
        count += 1;
    }
    if let [Some(a), Some(b)] = out {
        if a > b {
            out.swap(0, 1);
        }
    }
    out
}

const STACK_PTRS: usize = 32;

/// Run `f` on the pointers from `it`, kept on the stack for ordinary stripe widths: the hot
/// calls (4 KiB blocks) should not pay for an allocation.
#[inline(always)]
fn with_ptrs<R>(it: impl Iterator<Item = *const u8>, f: impl FnOnce(&[*const u8]) -> R) -> R {
    let mut a = [std::ptr::null(); STACK_PTRS];
    let mut it = it;
    for (n, slot) in a.iter_mut().enumerate() {
        match it.next() {
            Some(x) => *slot = x,
            None => return f(&a[..n]),
        }
    }
    let mut v = a.to_vec();
    v.extend(it);
    f(&v)
}

/// XOR all `srcs` into `dst` (`dst = srcs[0] ^ srcs[1] ^ ...`). `srcs` must not be empty.
pub fn xor_gen(dst: &mut [u8], srcs: &[&[u8]]) {
    Parity::active().xor_gen(dst, srcs)
}

/// XOR each of `srcs` into `dst` (`dst ^= srcs[0] ^ srcs[1] ^ ...`).
pub fn xor_acc(dst: &mut [u8], srcs: &[&[u8]]) {
    Parity::active().xor_acc(dst, srcs)
}

/// Generate P and Q over `data` (syndrome order). Needs at least one data block.
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    Parity::active().gen_pq(data, p, q)
}

/// Read-modify-write update: fold `delta` = old ^ new data of syndrome slot `slot` into
/// P and Q (P ^= delta, Q ^= {02}^slot * delta).
pub fn update_pq(slot: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
    Parity::active().update_pq(slot, delta, p, q)
}

/// Q ^= {02}^slot * delta (the Q half of [`update_pq`], for callers that keep P apart).
pub fn update_q(slot: usize, delta: &[u8], q: &mut [u8]) {
    Parity::active().update_q(slot, delta, q)
}

/// Recover up to two lost blocks of a raid6 stripe in place.
///
/// `blocks` holds the data blocks in syndrome order, then P, then Q (`ndata + 2` blocks);
/// `lost` names one or two distinct indices into `blocks` whose contents are garbage on entry
/// and are rebuilt from the others. Every combination works: one or two data, data + P,
/// data + Q, P + Q, P alone, Q alone.
pub fn recover(blocks: &mut [&mut [u8]], lost: &[usize]) {
    Parity::active().recover(blocks, lost)
}
