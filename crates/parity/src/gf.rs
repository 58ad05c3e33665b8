//! GF(2^8) arithmetic with md's polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d).

pub const POLY: u16 = 0x11d;

const fn build_tables() -> ([u8; 256], [u8; 512]) {
    let mut log = [0u8; 256];
    let mut exp = [0u8; 512];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    exp[510] = exp[0];
    exp[511] = exp[1];
    (log, exp)
}

const TABLES: ([u8; 256], [u8; 512]) = build_tables();
/// log base {02}; `LOG[0]` is meaningless.
pub const LOG: [u8; 256] = TABLES.0;
/// {02}^i for i in 0..510.
pub const EXP: [u8; 512] = TABLES.1;

/// a * b in the field.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// Multiplicative inverse; `a` must not be zero.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "zero has no inverse");
    EXP[255 - LOG[a as usize] as usize]
}

/// {02}^n.
#[inline]
pub fn exp2(n: usize) -> u8 {
    EXP[n % 255]
}

/// A 256-entry table of c * x.
pub fn mul_table(c: u8) -> [u8; 256] {
    let mut t = [0u8; 256];
    for (x, v) in t.iter_mut().enumerate() {
        *v = mul(c, x as u8);
    }
    t
}

/// PSHUFB nibble tables for multiplying by `c`: `c * x == lo[x & 15] ^ hi[x >> 4]`
/// (multiplication distributes over the XOR of the two nibbles).
pub fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    for i in 0..16u8 {
        lo[i as usize] = mul(c, i);
        hi[i as usize] = mul(c, i << 4);
    }
    (lo, hi)
}

/// The 8x8 bit matrix for `gf2p8affineqb` that multiplies a byte by `c` in md's field.
///
/// Multiplication by a constant is linear over GF(2), so it is a bit matrix; `gf2p8mulb`
/// cannot be used because it reduces by the AES polynomial 0x11b. The instruction computes
/// output bit `i` as the parity of `x & matrix.byte[7 - i]`, so row `i` (which input bits
/// feed output bit `i`) goes into byte `7 - i`.
pub const fn affine_matrix(c: u8) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut row = 0u8;
        let mut j = 0;
        while j < 8 {
            if (mul_const(c, 1 << j) >> i) & 1 != 0 {
                row |= 1 << j;
            }
            j += 1;
        }
        m |= (row as u64) << (8 * (7 - i));
        i += 1;
    }
    m
}

/// Shift-and-add multiplication, usable in const context (tests check it against `mul`).
pub const fn mul_const(a: u8, b: u8) -> u8 {
    let mut a = a as u16;
    let mut b = b;
    let mut r = 0u16;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        a <<= 1;
        if a & 0x100 != 0 {
            a ^= POLY;
        }
        b >>= 1;
    }
    r as u8
}
