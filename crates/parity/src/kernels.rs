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
    /// Every byte `b`.
    unsafe fn splat(b: u8) -> Self;
    unsafe fn xor(a: Self, b: Self) -> Self;
    #[inline(always)]
    unsafe fn xor3(a: Self, b: Self, c: Self) -> Self {
        Self::xor(Self::xor(a, b), c)
    }
    /// {02} * q.
    unsafe fn mul2(q: Self) -> Self;
    /// Whether [`Vector::mul2_xor`] and [`Vector::horner2`] are *biased*: each step may
    /// leave Q off by a constant byte in every lane, which depends only on the number of
    /// steps and which the loop removes at the end ([`horner_bias`]). It lets AVX2 drop one
    /// of the four operations of {02}·x (see `x86.rs`).
    const BIASED: bool = false;
    /// {02} * q ^ d: one Horner step (biased when [`Vector::BIASED`]).
    #[inline(always)]
    unsafe fn mul2_xor(q: Self, d: Self) -> Self {
        Self::xor(Self::mul2(q), d)
    }
    /// {04} * q ^ {02} * hi ^ lo: two Horner steps (biased when [`Vector::BIASED`]).
    #[inline(always)]
    unsafe fn horner2(q: Self, hi: Self, lo: Self) -> Self {
        Self::mul2_xor(Self::mul2_xor(q, hi), lo)
    }
    unsafe fn mul_prep(c: u8) -> Self::Mul;
    unsafe fn mul(v: Self, m: Self::Mul) -> Self;
    /// Whether syndrome passes get loops specialised per number of data slots
    /// ([`syndrome_fixed`]): for the SIMD types, not for the portable ones, which finish
    /// tails and would only grow the code.
    const FIXED: bool = false;
    /// Blocks up to this long get software prefetch ([`PF_BYTES`] ahead) in syndrome passes.
    /// A 4 KiB block is too short for the hardware prefetcher to ramp up (it trains per
    /// stream and stops at page boundaries), so with eight or more streams a fast loop waits
    /// on L2: prefetching takes GFNI 8+2 x 4 KiB from ~90 to ~120 GB/s on Zen 4. A loop that
    /// issues more ops per byte (AVX2, AVX-512 BW) hides that latency itself and the
    /// prefetches only take load slots and L1 lines: on Zen 4 they cost AVX2 8+2 ~10 % at
    /// 4 KiB and ~30 % at 16 KiB, and GFNI a little at 16 KiB. Hence off (0) by default.
    const PREFETCH_MAX_LEN: usize = 0;
    /// Hint that `p` will be read soon.
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
    /// Whether [`Vector::stream`] bypasses the cache (then it needs `BYTES`-aligned `p`, and
    /// [`Vector::fence`] after the last one).
    const STREAM: bool = false;
    /// Store that does not keep `p` in the cache (non-temporal), for outputs too big for it.
    #[inline(always)]
    unsafe fn stream(p: *mut u8, v: Self) {
        Self::store(p, v)
    }
    /// Order earlier [`Vector::stream`] stores before the stores that follow.
    #[inline(always)]
    unsafe fn fence() {}
}

/// The byte a biased Horner chain is off by after `steps` steps, from an exact start. The
/// biased step computes `2s ^ r(s) ^ d` where `r(s)` is 0x1d for bytes *below* 0x80 (the
/// opposite of the exact reduction); with `s = q ^ e` that is the exact next Q xor
/// `e' = 2e ^ (0x1d if e < 0x80)`, since doubling is linear and `r` flips with the top bit
/// of `e`.
pub(crate) fn horner_bias(steps: usize) -> u8 {
    let mut e = 0u8;
    for _ in 0..steps {
        e = (e << 1) ^ if e & 0x80 == 0 { 0x1d } else { 0 };
    }
    e
}

/// Blocks at least this long are written with non-temporal stores where the instruction
/// set has them: a stripe of such blocks (4+ of them, 1 MiB and up) overflows L2, so the
/// output would be evicted before anyone reads it, and the cache would first read every
/// output line for ownership. Shorter blocks are left in the cache, where the engine (and
/// the next parity pass) find them. ISA-L streams at every size, which costs it at 4 KiB.
pub(crate) const STREAM_MIN_LEN: usize = 256 << 10;

/// Whether a pass over `[start, len)` may stream its stores to `outs`.
#[inline(always)]
fn may_stream<V: Vector>(outs: &[*mut u8], start: usize, len: usize) -> bool {
    V::STREAM
        && len >= STREAM_MIN_LEN
        && outs
            .iter()
            .all(|&p| (p as usize).wrapping_add(start).is_multiple_of(V::BYTES))
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
/// multiply latency, few enough to stay in registers (4 x 2 accumulators, plus the
/// constants and temporaries, fit AVX2's 16 registers as well as AVX-512's 32).
const UNROLL: usize = 4;
/// Vectors per step of the XOR loop: one accumulator per vector, so registers allow more
/// than in a syndrome pass, and the longer run per source (256 bytes on AVX2) helped XOR
/// 8+1 x 1 MiB by ~10 % on Zen 4, where that pass streams from L3.
const XOR_UNROLL: usize = 8;
/// Software prefetch distance for short blocks (see [`Vector::PREFETCH_MAX_LEN`]).
const PF_BYTES: usize = 1536;

/// dst = first ^ rest[0] ^ rest[1] ^ ... over `[start, len)`, in whole vectors.
#[inline(always)]
pub(crate) unsafe fn xor<V: Vector>(
    dst: *mut u8,
    first: *const u8,
    rest: &[*const u8],
    start: usize,
    len: usize,
) -> usize {
    if may_stream::<V>(&[dst], start, len) {
        let done = xor_loop::<V, true>(dst, first, rest, start, len);
        V::fence();
        done
    } else {
        xor_loop::<V, false>(dst, first, rest, start, len)
    }
}

#[inline(always)]
unsafe fn put<V: Vector, const NT: bool>(p: *mut u8, v: V) {
    if NT {
        V::stream(p, v)
    } else {
        V::store(p, v)
    }
}

#[inline(always)]
unsafe fn xor_loop<V: Vector, const NT: bool>(
    dst: *mut u8,
    first: *const u8,
    rest: &[*const u8],
    start: usize,
    len: usize,
) -> usize {
    let w = V::BYTES;
    let mut off = start;
    while off + XOR_UNROLL * w <= len {
        let mut a = [V::zero(); XOR_UNROLL];
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
            put::<V, NT>(dst.add(off + j * w), a);
        }
        off += XOR_UNROLL * w;
    }
    while off + w <= len {
        let mut a = V::load(first.add(off));
        for s in rest {
            a = V::xor(a, V::load(s.add(off)));
        }
        put::<V, NT>(dst.add(off), a);
        off += w;
    }
    off
}

/// The last step of a syndrome pass, monomorphised per [`Job`] so the loop has no branches.
trait Finish<V: Vector> {
    unsafe fn finish(&self, off: usize, p: V, q: V);
}

/// Store P and Q, non-temporal with `NT`.
struct FinPq<const NT: bool>(*mut u8, *mut u8);
impl<V: Vector, const NT: bool> Finish<V> for FinPq<NT> {
    #[inline(always)]
    unsafe fn finish(&self, off: usize, p: V, q: V) {
        put::<V, NT>(self.0.add(off), p);
        put::<V, NT>(self.1.add(off), q);
    }
}

struct FinQ<const NT: bool>(*mut u8);
impl<V: Vector, const NT: bool> Finish<V> for FinQ<NT> {
    #[inline(always)]
    unsafe fn finish(&self, off: usize, _p: V, q: V) {
        put::<V, NT>(self.0.add(off), q);
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
    let pf = if len <= V::PREFETCH_MAX_LEN {
        PF_BYTES
    } else {
        0
    };
    // Every slot below the top is one Horner step, lost or not.
    let bias = match V::BIASED {
        true => V::splat(horner_bias(below.len())),
        false => V::zero(),
    };
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
            let q = if V::BIASED { V::xor(q[j], bias) } else { q[j] };
            fin.finish(off + j * w, p[j], q);
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
        let q = if V::BIASED { V::xor(q[0], bias) } else { q[0] };
        fin.finish(off, p[0], q);
        off += w;
    }
    off
}

/// [`syndrome_loop`] for exactly `N` data slots, none lost (generation and the Q-only pass):
/// with `N` known the slot loop unrolls and the slot pointers stay in registers, so a step
/// is its vector ops without loop and pointer bookkeeping, which matters where the loop is
/// bound by the number of ops it issues (AVX2 in L1: ~5-10 % at 4 KiB on Zen 4).
#[inline(always)]
unsafe fn syndrome_fixed<V: Vector, F: Finish<V>, const N: usize>(
    data: &[*const u8],
    start: usize,
    len: usize,
    fin: &F,
) -> usize {
    let w = V::BYTES;
    let d: [*const u8; N] = data.try_into().expect("N data slots");
    let pf = if len <= V::PREFETCH_MAX_LEN {
        PF_BYTES
    } else {
        0
    };
    let bias = match V::BIASED {
        true => V::splat(horner_bias(N - 1)),
        false => V::zero(),
    };
    let mut off = start;
    while off + UNROLL * w <= len {
        if pf != 0 && off + pf + UNROLL * w <= len {
            for s in d {
                for j in (0..UNROLL * w).step_by(64) {
                    V::prefetch(s.add(off + pf + j));
                }
            }
        }
        let mut p = [V::zero(); UNROLL];
        for (j, p) in p.iter_mut().enumerate() {
            *p = V::load(d[N - 1].add(off + j * w));
        }
        let mut q = p;
        // Slots N-2 down to 0, two at a time; the odd one out (slot 0) alone.
        let mut k = N - 1;
        while k >= 2 {
            let (hi, lo) = (d[k - 1], d[k - 2]);
            for j in 0..UNROLL {
                let vh = V::load(hi.add(off + j * w));
                let vl = V::load(lo.add(off + j * w));
                p[j] = V::xor3(p[j], vh, vl);
                q[j] = V::horner2(q[j], vh, vl);
            }
            k -= 2;
        }
        if k == 1 {
            horner1::<V, false>(&mut p, &mut q, d[0], off);
        }
        for j in 0..UNROLL {
            let q = if V::BIASED { V::xor(q[j], bias) } else { q[j] };
            fin.finish(off + j * w, p[j], q);
        }
        off += UNROLL * w;
    }
    off
}

/// [`syndrome_loop`], through [`syndrome_fixed`] for the common widths when nothing is lost.
#[inline(always)]
unsafe fn syndrome_pass<V: Vector, F: Finish<V>, const SKIP: bool>(
    data: &[*const u8],
    start: usize,
    len: usize,
    fin: &F,
) -> usize {
    let mut off = start;
    if V::FIXED && !SKIP {
        off = match data.len() {
            2 => syndrome_fixed::<V, F, 2>(data, start, len, fin),
            3 => syndrome_fixed::<V, F, 3>(data, start, len, fin),
            4 => syndrome_fixed::<V, F, 4>(data, start, len, fin),
            5 => syndrome_fixed::<V, F, 5>(data, start, len, fin),
            6 => syndrome_fixed::<V, F, 6>(data, start, len, fin),
            7 => syndrome_fixed::<V, F, 7>(data, start, len, fin),
            8 => syndrome_fixed::<V, F, 8>(data, start, len, fin),
            _ => start,
        };
    }
    // The rest: other widths, lost slots, and the last whole vectors.
    syndrome_loop::<V, F, SKIP>(data, off, len, fin)
}

/// One Horner step over `N` consecutive vectors of slot `d` (null: a lost slot, zero).
#[inline(always)]
unsafe fn horner1<V: Vector, const SKIP: bool>(p: &mut [V], q: &mut [V], d: *const u8, off: usize) {
    let w = V::BYTES;
    if SKIP && d.is_null() {
        for q in q.iter_mut() {
            // A biased chain must take the biased step here too.
            *q = match V::BIASED {
                true => V::mul2_xor(*q, V::zero()),
                false => V::mul2(*q),
            };
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
        Job::Pq { p, q } if may_stream::<V>(&[p, q], start, len) => {
            let done = syndrome_pass::<V, _, false>(data, start, len, &FinPq::<true>(p, q));
            V::fence();
            done
        }
        Job::Pq { p, q } => syndrome_pass::<V, _, false>(data, start, len, &FinPq::<false>(p, q)),
        Job::Q { q } if may_stream::<V>(&[q], start, len) => {
            let done = syndrome_pass::<V, _, false>(data, start, len, &FinQ::<true>(q));
            V::fence();
            done
        }
        Job::Q { q } => syndrome_pass::<V, _, false>(data, start, len, &FinQ::<false>(q)),
        Job::DataData { x, y, p, q, a, b } => {
            let fin = FinDataData::<V> {
                x,
                y,
                p,
                q,
                a: V::mul_prep(a),
                b: V::mul_prep(b),
            };
            syndrome_pass::<V, _, true>(data, start, len, &fin)
        }
        Job::DataP { x, p, q, inv_gx } => {
            let fin = FinDataP::<V> {
                x,
                p,
                q,
                inv_gx: V::mul_prep(inv_gx),
            };
            syndrome_pass::<V, _, true>(data, start, len, &fin)
        }
        Job::DataQ { x, p, q, gx } => {
            let fin = FinDataQ::<V> {
                x,
                p,
                q,
                gx: V::mul_prep(gx),
            };
            syndrome_pass::<V, _, true>(data, start, len, &fin)
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
    unsafe fn splat(b: u8) -> Self {
        Byte(b)
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
    unsafe fn splat(b: u8) -> Self {
        Word(u64::from_ne_bytes([b; 8]))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The biased step of `x86.rs` in bytes: `2s ^ (0x1d if s < 0x80) ^ d`.
    fn biased_step(s: u8, d: u8) -> u8 {
        (s << 1) ^ if s < 0x80 { 0x1d } else { 0 } ^ d
    }

    #[test]
    fn horner_bias_corrects_a_biased_chain() {
        for start in 0..=255u8 {
            let (mut exact, mut biased) = (start, start);
            for steps in 1..300usize {
                let d = (steps as u8).wrapping_mul(37) ^ start;
                exact = gf::mul(exact, 2) ^ d;
                biased = biased_step(biased, d);
                assert_eq!(
                    biased ^ horner_bias(steps),
                    exact,
                    "start {start}, {steps} steps"
                );
            }
        }
    }
}
