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
/// log base {02}; LOG[0] is meaningless.
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
