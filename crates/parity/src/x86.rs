//! x86-64 vectors: AVX2 (32 bytes), AVX-512BW (64 bytes) and AVX-512 + GFNI (64 bytes).
//!
//! AVX2 and AVX-512 multiply by {02} with add + sign mask + XOR 0x1d, and by any other
//! constant with two PSHUFB nibble lookups. GFNI does both with one `gf2p8affineqb` and the
//! bit matrix of the constant in md's field (0x11d); `gf2p8mulb` would reduce by 0x11b.

use crate::gf;
use crate::kernels::{instantiate, Vector};
use core::arch::x86_64::*;

#[derive(Clone, Copy)]
pub(crate) struct Avx2(__m256i);

impl Vector for Avx2 {
    const BYTES: usize = 32;
    type Mul = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Avx2(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        _mm256_storeu_si256(p as *mut __m256i, v.0)
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx2(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn splat(b: u8) -> Self {
        Avx2(_mm256_set1_epi8(b as i8))
    }
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Avx2(_mm256_xor_si256(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul2(q: Self) -> Self {
        // Bytes with the top bit set (negative as i8) get the reduction after the shift.
        let top = _mm256_cmpgt_epi8(_mm256_setzero_si256(), q.0);
        let red = _mm256_and_si256(top, _mm256_set1_epi8(0x1d));
        Avx2(_mm256_xor_si256(_mm256_add_epi8(q.0, q.0), red))
    }
    const BIASED: bool = true;
    const FIXED: bool = true;
    #[inline(always)]
    unsafe fn mul2_xor(q: Self, d: Self) -> Self {
        // Biased step: PSHUFB of a table of 0x1d yields 0x1d where the index byte is below
        // 0x80 and 0 where it is not, the opposite of the reduction; the loop corrects the
        // constant this leaves (kernels::horner_bias). Three ops and a data XOR instead of
        // four (compare, mask, add, XOR): AVX2 has no one-op sign-to-mask.
        let red = _mm256_shuffle_epi8(_mm256_set1_epi8(0x1d), q.0);
        Avx2(_mm256_xor_si256(
            _mm256_xor_si256(_mm256_add_epi8(q.0, q.0), d.0),
            red,
        ))
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    const STREAM: bool = true;
    #[inline(always)]
    unsafe fn stream(p: *mut u8, v: Self) {
        _mm256_stream_si256(p as *mut __m256i, v.0)
    }
    #[inline(always)]
    unsafe fn fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        let (lo, hi) = gf::nibble_tables(c);
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
        )
    }
    #[inline(always)]
    unsafe fn mul(v: Self, m: Self::Mul) -> Self {
        let nib = _mm256_set1_epi8(0x0f);
        let lo = _mm256_and_si256(v.0, nib);
        let hi = _mm256_and_si256(_mm256_srli_epi16(v.0, 4), nib);
        Avx2(_mm256_xor_si256(
            _mm256_shuffle_epi8(m.0, lo),
            _mm256_shuffle_epi8(m.1, hi),
        ))
    }
}

#[inline(always)]
unsafe fn load512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

#[inline(always)]
unsafe fn store512(p: *mut u8, v: __m512i) {
    _mm512_storeu_si512(p as *mut __m512i, v)
}

/// XOR of three vectors in one `vpternlog` (truth table 0x96 = a ^ b ^ c).
#[inline(always)]
unsafe fn xor3_512(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64::<0x96>(a, b, c)
}

#[derive(Clone, Copy)]
pub(crate) struct Avx512(__m512i);

impl Avx512 {
    /// (2q, the reduction 0x1d in bytes whose top bit was set).
    #[inline(always)]
    unsafe fn double(q: __m512i) -> (__m512i, __m512i) {
        let top = _mm512_movepi8_mask(q);
        let red = _mm512_maskz_mov_epi8(top, _mm512_set1_epi8(0x1d));
        (_mm512_add_epi8(q, q), red)
    }
}

impl Vector for Avx512 {
    const BYTES: usize = 64;
    type Mul = (__m512i, __m512i);
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Avx512(load512(p))
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        store512(p, v.0)
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx512(_mm512_setzero_si512())
    }
    #[inline(always)]
    unsafe fn splat(b: u8) -> Self {
        Avx512(_mm512_set1_epi8(b as i8))
    }
    const FIXED: bool = true;
    const STREAM: bool = true;
    #[inline(always)]
    unsafe fn stream(p: *mut u8, v: Self) {
        _mm512_stream_si512(p as *mut __m512i, v.0)
    }
    #[inline(always)]
    unsafe fn fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Avx512(_mm512_xor_si512(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn xor3(a: Self, b: Self, c: Self) -> Self {
        Avx512(xor3_512(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn mul2(q: Self) -> Self {
        let (d, red) = Self::double(q.0);
        Avx512(_mm512_xor_si512(d, red))
    }
    #[inline(always)]
    unsafe fn mul2_xor(q: Self, v: Self) -> Self {
        let (d, red) = Self::double(q.0);
        Avx512(xor3_512(d, red, v.0))
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        let (lo, hi) = gf::nibble_tables(c);
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
            _mm512_broadcast_i32x4(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
        )
    }
    #[inline(always)]
    unsafe fn mul(v: Self, m: Self::Mul) -> Self {
        let nib = _mm512_set1_epi8(0x0f);
        let lo = _mm512_and_si512(v.0, nib);
        let hi = _mm512_and_si512(_mm512_srli_epi16(v.0, 4), nib);
        Avx512(_mm512_xor_si512(
            _mm512_shuffle_epi8(m.0, lo),
            _mm512_shuffle_epi8(m.1, hi),
        ))
    }
}

const MUL2_MATRIX: u64 = gf::affine_matrix(2);
const MUL4_MATRIX: u64 = gf::affine_matrix(4);

#[derive(Clone, Copy)]
pub(crate) struct Gfni(__m512i);

impl Vector for Gfni {
    const BYTES: usize = 64;
    // 4 KiB gains from prefetch, 16 KiB loses a little (Vector::PREFETCH_MAX_LEN).
    const PREFETCH_MAX_LEN: usize = 8 << 10;
    type Mul = __m512i;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        Gfni(load512(p))
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        store512(p, v.0)
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        Gfni(_mm512_setzero_si512())
    }
    #[inline(always)]
    unsafe fn splat(b: u8) -> Self {
        Gfni(_mm512_set1_epi8(b as i8))
    }
    const FIXED: bool = true;
    const STREAM: bool = true;
    #[inline(always)]
    unsafe fn stream(p: *mut u8, v: Self) {
        _mm512_stream_si512(p as *mut __m512i, v.0)
    }
    #[inline(always)]
    unsafe fn fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(a: Self, b: Self) -> Self {
        Gfni(_mm512_xor_si512(a.0, b.0))
    }
    #[inline(always)]
    unsafe fn xor3(a: Self, b: Self, c: Self) -> Self {
        Gfni(xor3_512(a.0, b.0, c.0))
    }
    #[inline(always)]
    unsafe fn mul2(q: Self) -> Self {
        let m = _mm512_set1_epi64(MUL2_MATRIX as i64);
        Gfni(_mm512_gf2p8affine_epi64_epi8::<0>(q.0, m))
    }
    #[inline(always)]
    unsafe fn horner2(q: Self, hi: Self, lo: Self) -> Self {
        // Two independent multiplies instead of a chain of two: fewer ops, shorter latency.
        let m4 = _mm512_set1_epi64(MUL4_MATRIX as i64);
        let m2 = _mm512_set1_epi64(MUL2_MATRIX as i64);
        let q4 = _mm512_gf2p8affine_epi64_epi8::<0>(q.0, m4);
        let h2 = _mm512_gf2p8affine_epi64_epi8::<0>(hi.0, m2);
        Gfni(xor3_512(q4, h2, lo.0))
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        _mm512_set1_epi64(gf::affine_matrix(c) as i64)
    }
    #[inline(always)]
    unsafe fn mul(v: Self, m: Self::Mul) -> Self {
        Gfni(_mm512_gf2p8affine_epi64_epi8::<0>(v.0, m))
    }
}

instantiate!(avx2, Avx2, "avx2");
instantiate!(avx512, Avx512, "avx512f,avx512bw");
instantiate!(gfni, Gfni, "avx512f,avx512bw,gfni");
