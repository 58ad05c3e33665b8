//! Width-generic parity loops, written once over a small [`Vector`] trait and instantiated per
//! instruction set (u8, u64, AVX2, AVX-512, GFNI).
//!
//! Every loop works on raw pointers that the safe front end in `lib.rs` has checked (equal
//! lengths, one pointer per block) and processes whole vectors from `start` on; it returns
//! where it stopped, and the caller finishes the tail with a narrower instance.
//!
//! The trait methods and loops are `#[inline(always)]` and carry no `target_feature` of
//! their own: they are inlined into one `#[target_feature]` wrapper per instruction set,
//! where the intrinsics inline too.

use crate::gf;

/// One register's worth of bytes and the field operations the loops need.
pub(crate) trait Vector: Copy {
    const BYTES: usize;
    /// Precomputed state for multiplying by one constant.
    type Mul: Copy;
    unsafe fn load(p: *const u8) -> Self;
    unsafe fn store(p: *mut u8, v: Self);
    unsafe fn zero() -> Self;
    unsafe fn xor(a: Self, b: Self) -> Self;
    #[inline(always)]
    unsafe fn xor3(a: Self, b: Self, c: Self) -> Self {
        Self::xor(Self::xor(a, b), c)
    }
    /// {02} * q.
    unsafe fn mul2(q: Self) -> Self;
    /// {02} * q ^ d: one Horner step.
    #[inline(always)]
    unsafe fn mul2_xor(q: Self, d: Self) -> Self {
        Self::xor(Self::mul2(q), d)
    }
    /// {04} * q ^ {02} * hi ^ lo: two Horner steps.
    #[inline(always)]
    unsafe fn horner2(q: Self, hi: Self, lo: Self) -> Self {
        Self::mul2_xor(Self::mul2_xor(q, hi), lo)
    }
    unsafe fn mul_prep(c: u8) -> Self::Mul;
    unsafe fn mul(v: Self, m: Self::Mul) -> Self;
    /// Hint that `p` will be read soon.
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
}

/// What a syndrome pass does with P and Q of the (surviving) data at each offset.
/// Pointers name whole blocks; data slots that are lost are null in the data list.
#[derive(Clone, Copy)]
pub(crate) enum Job {
    /// Store P and Q (generation, or rebuilding both parities).
    Pq { p: *mut u8, q: *mut u8 },
    /// Store Q only (Q lost alone).
    Q { q: *mut u8 },
    /// Data slots x and y lost: rebuild both from P and Q; `a`, `b` as in the scalar path.
    DataData {
        x: *mut u8,
        y: *mut u8,
        p: *const u8,
        q: *const u8,
        a: u8,
        b: u8,
    },
    /// Data slot x and P lost: Dx = inv_gx * (Q ^ Qx), then P = Px ^ Dx.
    DataP {
        x: *mut u8,
        p: *mut u8,
        q: *const u8,
        inv_gx: u8,
    },
    /// Data slot x and Q lost: Dx = P ^ Px, then Q = Qx ^ gx * Dx.
    DataQ {
        x: *mut u8,
        p: *const u8,
        q: *mut u8,
        gx: u8,
    },
}

/// Vectors per step of the main loops: enough independent chains to hide load and
/// multiply latency, few enough to stay in registers (4 x 2 accumulators of 32 registers).
const UNROLL: usize = 4;
/// Software prefetch distance for short blocks. A 4 KiB block is too short for the hardware
/// prefetcher to ramp up (it trains per stream and stops at page boundaries), so with eight
/// or more streams the P+Q loop waits on L2; prefetching ~1.5 KiB ahead took 8+2 x 4 KiB
/// from ~90 to ~120 GB/s on Zen 4. Longer blocks stream fine without it.
const PF_BYTES: usize = 1536;
const PF_MAX_LEN: usize = 16 << 10;

/// dst = first ^ rest[0] ^ rest[1] ^ ... over `[start, len)`, in whole vectors.
#[inline(always)]
pub(crate) unsafe fn xor<V: Vector>(
    dst: *mut u8,
    first: *const u8,
    rest: &[*const u8],
    start: usize,
    len: usize,
) -> usize {
    let w = V::BYTES;
    let mut off = start;
    while off + UNROLL * w <= len {
        let mut a = [V::zero(); UNROLL];
        for (j, a) in a.iter_mut().enumerate() {
            *a = V::load(first.add(off + j * w));
        }
        // Sources two at a time: one three-way XOR (vpternlog) per pair on AVX-512.
        let mut pairs = rest.chunks_exact(2);
        for s in &mut pairs {
            let (s0, s1) = (s[0].add(off), s[1].add(off));
            for (j, a) in a.iter_mut().enumerate() {
                *a = V::xor3(*a, V::load(s0.add(j * w)), V::load(s1.add(j * w)));
            }
        }
        if let [s] = pairs.remainder() {
            for (j, a) in a.iter_mut().enumerate() {
                *a = V::xor(*a, V::load(s.add(off + j * w)));
            }
        }
        for (j, a) in a.into_iter().enumerate() {
            V::store(dst.add(off + j * w), a);
        }
        off += UNROLL * w;
    }
    while off + w <= len {
        let mut a = V::load(first.add(off));
        for s in rest {
            a = V::xor(a, V::load(s.add(off)));
        }
        V::store(dst.add(off), a);
        off += w;
    }
    off
}

/// The last step of a syndrome pass, monomorphised per [`Job`] so the loop has no branches.
trait Finish<V: Vector> {
    unsafe fn finish(&self, off: usize, p: V, q: V);
}

struct FinPq(*mut u8, *mut u8);
impl<V: Vector> Finish<V> for FinPq {
    #[inline(always)]
    unsafe fn finish(&self, off: usize, p: V, q: V) {
        V::store(self.0.add(off), p);
        V::store(self.1.add(off), q);
    }
}

struct FinQ(*mut u8);
impl<V: Vector> Finish<V> for FinQ {
    #[inline(always)]
    unsafe fn finish(&self, off: usize, _p: V, q: V) {
        V::store(self.0.add(off), q);
    }
}

struct FinDataData<V: Vector> {
    x: *mut u8,
    y: *mut u8,
    p: *const u8,
    q: *const u8,
    a: V::Mul,
    b: V::Mul,
}
impl<V: Vector> Finish<V> for FinDataData<V> {
    #[inline(always)]
    unsafe fn finish(&self, off: usize, pxy: V, qxy: V) {
        let pd = V::xor(V::load(self.p.add(off)), pxy);
        let qd = V::xor(V::load(self.q.add(off)), qxy);
        let dx = V::xor(V::mul(pd, self.a), V::mul(qd, self.b));
        V::store(self.x.add(off), dx);
        V::store(self.y.add(off), V::xor(pd, dx));
    }
}

struct FinDataP<V: Vector> {
    x: *mut u8,
    p: *mut u8,
    q: *const u8,
    inv_gx: V::Mul,
}
impl<V: Vector> Finish<V> for FinDataP<V> {
    #[inline(always)]
    unsafe fn finish(&self, off: usize, px: V, qx: V) {
        let dx = V::mul(V::xor(V::load(self.q.add(off)), qx), self.inv_gx);
        V::store(self.x.add(off), dx);
        V::store(self.p.add(off), V::xor(px, dx));
    }
}

struct FinDataQ<V: Vector> {
    x: *mut u8,
    p: *const u8,
    q: *mut u8,
    gx: V::Mul,
}
impl<V: Vector> Finish<V> for FinDataQ<V> {
    #[inline(always)]
    unsafe fn finish(&self, off: usize, px: V, qx: V) {
        let dx = V::xor(V::load(self.p.add(off)), px);
        V::store(self.x.add(off), dx);
        V::store(self.q.add(off), V::xor(qx, V::mul(dx, self.gx)));
    }
}

/// P and Q of `data` (syndrome order, at least one slot) by Horner's rule from the top slot
/// down, two slots per step. With `SKIP`, null slots count as zero (lost blocks in a
/// recovery).
#[inline(always)]
unsafe fn syndrome_loop<V: Vector, F: Finish<V>, const SKIP: bool>(
    data: &[*const u8],
    start: usize,
    len: usize,
    fin: &F,
) -> usize {
    let w = V::BYTES;
    let (top, below) = data.split_last().expect("at least one data slot");
    let mut off = start;
    let pf = if len <= PF_MAX_LEN { PF_BYTES } else { 0 };
    while off + UNROLL * w <= len {
        let mut p = [V::zero(); UNROLL];
        if !(SKIP && top.is_null()) {
            for (j, p) in p.iter_mut().enumerate() {
                *p = V::load(top.add(off + j * w));
            }
        }
        let mut q = p;
        // Slots in descending order, two at a time: (hi, lo) = (k + 1, k).
        let mut pairs = below.rchunks_exact(2);
        for s in &mut pairs {
            let (lo, hi) = (s[0], s[1]);
            if SKIP && (lo.is_null() || hi.is_null()) {
                for d in [hi, lo] {
                    horner1::<V, SKIP>(&mut p, &mut q, d, off);
                }
                continue;
            }
            if pf != 0 && off + pf + UNROLL * w <= len {
                for j in (0..UNROLL * w).step_by(64) {
                    V::prefetch(hi.add(off + pf + j));
                    V::prefetch(lo.add(off + pf + j));
                }
            }
            for j in 0..UNROLL {
                let vh = V::load(hi.add(off + j * w));
                let vl = V::load(lo.add(off + j * w));
                p[j] = V::xor3(p[j], vh, vl);
                q[j] = V::horner2(q[j], vh, vl);
            }
        }
        if let [d] = pairs.remainder() {
            horner1::<V, SKIP>(&mut p, &mut q, *d, off);
        }
        for j in 0..UNROLL {
            fin.finish(off + j * w, p[j], q[j]);
        }
        off += UNROLL * w;
    }
    while off + w <= len {
        let mut p = [V::zero(); 1];
        if !(SKIP && top.is_null()) {
            p[0] = V::load(top.add(off));
        }
        let mut q = p;
        for &d in below.iter().rev() {
            horner1::<V, SKIP>(&mut p, &mut q, d, off);
        }
        fin.finish(off, p[0], q[0]);
        off += w;
    }
    off
}

/// One Horner step over `N` consecutive vectors of slot `d` (null: a lost slot, zero).
#[inline(always)]
unsafe fn horner1<V: Vector, const SKIP: bool>(p: &mut [V], q: &mut [V], d: *const u8, off: usize) {
    let w = V::BYTES;
    if SKIP && d.is_null() {
        for q in q.iter_mut() {
            *q = V::mul2(*q);
        }
    } else {
        for (j, (p, q)) in p.iter_mut().zip(q.iter_mut()).enumerate() {
            let v = V::load(d.add(off + j * w));
            *p = V::xor(*p, v);
            *q = V::mul2_xor(*q, v);
        }
    }
}

/// Run `job` over `[start, len)` in whole vectors.
#[inline(always)]
pub(crate) unsafe fn syndrome<V: Vector>(
    data: &[*const u8],
    job: &Job,
    start: usize,
    len: usize,
) -> usize {
    match *job {
        Job::Pq { p, q } => syndrome_loop::<V, _, false>(data, start, len, &FinPq(p, q)),
        Job::Q { q } => syndrome_loop::<V, _, false>(data, start, len, &FinQ(q)),
        Job::DataData { x, y, p, q, a, b } => {
            let fin = FinDataData::<V> {
                x,
                y,
                p,
                q,
                a: V::mul_prep(a),
                b: V::mul_prep(b),
            };
            syndrome_loop::<V, _, true>(data, start, len, &fin)
        }
        Job::DataP { x, p, q, inv_gx } => {
            let fin = FinDataP::<V> {
                x,
                p,
                q,
                inv_gx: V::mul_prep(inv_gx),
            };
            syndrome_loop::<V, _, true>(data, start, len, &fin)
        }
        Job::DataQ { x, p, q, gx } => {
            let fin = FinDataQ::<V> {
                x,
                p,
                q,
                gx: V::mul_prep(gx),
            };
            syndrome_loop::<V, _, true>(data, start, len, &fin)
        }
    }
}

/// q ^= c * delta, and p ^= delta when `p` is not null (read-modify-write of one slot).
#[inline(always)]
pub(crate) unsafe fn update<V: Vector>(
    c: u8,
    delta: *const u8,
    p: *mut u8,
    q: *mut u8,
    start: usize,
    len: usize,
) -> usize {
    let m = V::mul_prep(c);
    if p.is_null() {
        update_loop::<V, false>(m, delta, p, q, start, len)
    } else {
        update_loop::<V, true>(m, delta, p, q, start, len)
    }
}

#[inline(always)]
unsafe fn update_loop<V: Vector, const WITH_P: bool>(
    m: V::Mul,
    delta: *const u8,
    p: *mut u8,
    q: *mut u8,
    start: usize,
    len: usize,
) -> usize {
    let w = V::BYTES;
    let mut off = start;
    while off + UNROLL * w <= len {
        let mut d = [V::zero(); UNROLL];
        for (j, d) in d.iter_mut().enumerate() {
            *d = V::load(delta.add(off + j * w));
        }
        if WITH_P {
            for (j, d) in d.iter().enumerate() {
                let at = p.add(off + j * w);
                V::store(at, V::xor(V::load(at), *d));
            }
        }
        for (j, d) in d.iter().enumerate() {
            let at = q.add(off + j * w);
            V::store(at, V::xor(V::load(at), V::mul(*d, m)));
        }
        off += UNROLL * w;
    }
    while off + w <= len {
        let d = V::load(delta.add(off));
        if WITH_P {
            V::store(p.add(off), V::xor(V::load(p.add(off)), d));
        }
        V::store(q.add(off), V::xor(V::load(q.add(off)), V::mul(d, m)));
        off += w;
    }
    off
}

/// One byte at a time: finishes every tail.
#[derive(Clone, Copy)]
pub(crate) struct Byte(u8);

impl Vector for Byte {
    const BYTES: usize = 1;
    type Mul = u8;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Byte(*p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        *p = v.0;
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        Byte(0)
    }
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Byte(a.0 ^ b.0)
    }
    #[inline(always)]
    unsafe fn mul2(q: Self) -> Self {
        Byte((q.0 << 1) ^ if q.0 & 0x80 != 0 { 0x1d } else { 0 })
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> u8 {
        c
    }
    #[inline(always)]
    unsafe fn mul(v: Self, c: u8) -> Self {
        Byte(gf::mul(v.0, c))
    }
}

/// Eight bytes in a u64 (SWAR): the portable path, no SIMD needed.
#[derive(Clone, Copy)]
pub(crate) struct Word(u64);

const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const ONES: u64 = 0x0101_0101_0101_0101;

impl Vector for Word {
    const BYTES: usize = 8;
    /// Index of the constant in the log table; multiplication goes byte by byte.
    type Mul = u8;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Word(core::ptr::read_unaligned(p as *const u64))
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        core::ptr::write_unaligned(p as *mut u64, v.0)
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        Word(0)
    }
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Word(a.0 ^ b.0)
    }
    #[inline(always)]
    unsafe fn mul2(q: Self) -> Self {
        // Shift each byte left; bytes whose top bit fell out get the reduction 0x1d.
        let carry = (q.0 >> 7) & ONES;
        Word(((q.0 & LOW7) << 1) ^ (carry * 0x1d))
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> u8 {
        c
    }
    #[inline(always)]
    unsafe fn mul(v: Self, c: u8) -> Self {
        let b = v.0.to_le_bytes().map(|x| gf::mul(x, c));
        Word(u64::from_le_bytes(b))
    }
}

/// One instruction set's entry points; the front end in `lib.rs` calls these through a
/// `&'static Kernels` chosen once.
pub(crate) struct Kernels {
    pub(crate) xor: unsafe fn(*mut u8, *const u8, &[*const u8], usize, usize) -> usize,
    pub(crate) syndrome: unsafe fn(&[*const u8], &Job, usize, usize) -> usize,
    pub(crate) update: unsafe fn(u8, *const u8, *mut u8, *mut u8, usize, usize) -> usize,
}

/// Instantiate the generic loops for one [`Vector`] type inside functions that enable
/// `$feat` (or no feature for the portable types).
macro_rules! instantiate {
    ($name:ident, $v:ty $(, $feat:literal)?) => {
        pub(crate) mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::kernels::{self as k, Job, Kernels};

            $(#[target_feature(enable = $feat)])?
            unsafe fn xor(
                dst: *mut u8,
                first: *const u8,
                rest: &[*const u8],
                start: usize,
                len: usize,
            ) -> usize {
                k::xor::<$v>(dst, first, rest, start, len)
            }

            $(#[target_feature(enable = $feat)])?
            unsafe fn syndrome(data: &[*const u8], job: &Job, start: usize, len: usize) -> usize {
                k::syndrome::<$v>(data, job, start, len)
            }

            $(#[target_feature(enable = $feat)])?
            unsafe fn update(
                c: u8,
                delta: *const u8,
                p: *mut u8,
                q: *mut u8,
                start: usize,
                len: usize,
            ) -> usize {
                k::update::<$v>(c, delta, p, q, start, len)
            }

            pub(crate) static KERNELS: Kernels = Kernels {
                xor,
                syndrome,
                update,
            };
        }
    };
}
pub(crate) use instantiate;

instantiate!(byte, Byte);
instantiate!(word, Word);
