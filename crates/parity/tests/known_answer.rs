//! Hand-computed answers in md's field (0x11d), checked on every available implementation.

use uraid_parity::{available, gf, Implementation, Parity};

#[test]
fn hand_computed_products() {
    // {02}*{80}: x^8 reduces to x^4 + x^3 + x^2 + 1.
    assert_eq!(gf::mul(0x02, 0x80), 0x1d);
    // {02}*{8e} = x^8 + x^4 + x^3 + x^2 + x -> x (0x11c ^ 0x11d = 1): {8e} is {02}^-1.
    assert_eq!(gf::mul(0x02, 0x8e), 0x01);
    assert_eq!(gf::inv(0x02), 0x8e);
    // (x + 1)(x^2 + x + 1) = x^3 + 1.
    assert_eq!(gf::mul(0x03, 0x07), 0x09);
    // x^14 = x^4 + x + 1 after reduction.
    assert_eq!(gf::mul(0x80, 0x80), 0x13);
    // {02}^2 * {80} = {02} * {1d}.
    assert_eq!(gf::mul(0x04, 0x80), 0x3a);
    assert_eq!(gf::exp2(0), 1);
    assert_eq!(gf::exp2(8), 0x1d);
    assert_eq!(gf::exp2(255), 1);
}

#[test]
fn const_mul_and_tables_agree_with_mul() {
    for a in 0..=255u8 {
        let (lo, hi) = gf::nibble_tables(a);
        for b in 0..=255u8 {
            let m = gf::mul(a, b);
            assert_eq!(gf::mul_const(a, b), m, "{a:#x}*{b:#x}");
            assert_eq!(lo[(b & 15) as usize] ^ hi[(b >> 4) as usize], m);
        }
    }
}

/// What `gf2p8affineqb` computes for one byte (Intel SDM): bit i of the result is the parity
/// of `x & matrix.byte[7 - i]`.
fn affine_model(matrix: u64, x: u8) -> u8 {
    let mut r = 0u8;
    for i in 0..8 {
        let row = (matrix >> (8 * (7 - i))) as u8;
        r |= (((row & x).count_ones() & 1) as u8) << i;
    }
    r
}

#[test]
fn affine_matrices_multiply_in_md_field() {
    for c in 0..=255u8 {
        let m = gf::affine_matrix(c);
        for x in 0..=255u8 {
            assert_eq!(affine_model(m, x), gf::mul(c, x), "c={c:#x} x={x:#x}");
        }
    }
}

/// Three data blocks and their P and Q, worked out by hand from Q = D0 + {02}D1 + {04}D2:
/// column 2 is 80 ^ {02}*80 ^ {04}*01 = 80 ^ 1d ^ 04 = 99; column 4 is {04}*80 = 3a.
const D: [[u8; 5]; 3] = [
    [0x01, 0x02, 0x80, 0xff, 0x00],
    [0x01, 0x00, 0x80, 0x00, 0x00],
    [0x01, 0x00, 0x01, 0x00, 0x80],
];
const P: [u8; 5] = [0x01, 0x02, 0x01, 0xff, 0x80];
const Q: [u8; 5] = [0x07, 0x02, 0x99, 0xff, 0x3a];

fn tile(pattern: &[u8], len: usize) -> Vec<u8> {
    pattern.iter().copied().cycle().take(len).collect()
}

#[test]
fn golden_pq_on_every_implementation() {
    // 1003 bytes: whole vectors plus a ragged tail for every width.
    let len = 1003;
    let data: Vec<Vec<u8>> = D.iter().map(|d| tile(d, len)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let (want_p, want_q) = (tile(&P, len), tile(&Q, len));
    for imp in available() {
        let par = Parity::new(imp).unwrap();
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        par.gen_pq(&refs, &mut p, &mut q);
        assert_eq!(p, want_p, "{imp}");
        assert_eq!(q, want_q, "{imp}");
        let mut x = vec![0u8; len];
        par.xor_gen(&mut x, &refs);
        assert_eq!(x, want_p, "{imp}");

        // Lose D1 and D2 and get them back.
        let mut blocks = [data[0].clone(), vec![0xa5; len], vec![0x5a; len], p, q];
        let mut views: Vec<&mut [u8]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
        par.recover(&mut views, &[2, 1]);
        assert_eq!(blocks[1], data[1], "{imp}");
        assert_eq!(blocks[2], data[2], "{imp}");
    }
}

#[test]
fn implementation_names_round_trip() {
    for imp in Implementation::ALL {
        assert_eq!(Implementation::from_name(imp.name()), Some(imp));
    }
    assert_eq!(
        Implementation::from_name("GFNI"),
        Some(Implementation::Gfni)
    );
    assert_eq!(Implementation::from_name("sse9"), None);
    let avail = available();
    assert_eq!(avail[0], Implementation::Scalar);
    assert!(avail.contains(&uraid_parity::active()));
    for imp in Implementation::ALL {
        assert_eq!(Parity::new(imp).is_some(), avail.contains(&imp));
    }
}

// The length and argument checks guard data, so they hold on every path and in release.

#[test]
#[should_panic(expected = "equal lengths")]
fn gen_pq_rejects_unequal_lengths() {
    let best = *available().last().unwrap();
    let (a, b) = ([0u8; 128], [0u8; 127]);
    let (mut p, mut q) = ([0u8; 128], [0u8; 128]);
    Parity::new(best).unwrap().gen_pq(&[&a, &b], &mut p, &mut q);
}

#[test]
#[should_panic(expected = "equal lengths")]
fn xor_gen_rejects_unequal_lengths() {
    let best = *available().last().unwrap();
    let mut d = [0u8; 64];
    Parity::new(best).unwrap().xor_gen(&mut d, &[&[0u8; 65]]);
}

#[test]
#[should_panic(expected = "two losses at most")]
fn recover_rejects_three_losses() {
    let mut b = [[0u8; 64]; 5];
    let mut v: Vec<&mut [u8]> = b.iter_mut().map(|x| x.as_mut_slice()).collect();
    uraid_parity::recover(&mut v, &[0, 1, 2]);
}

#[test]
#[should_panic(expected = "bad lost set")]
fn recover_rejects_out_of_range() {
    let mut b = [[0u8; 64]; 4];
    let mut v: Vec<&mut [u8]> = b.iter_mut().map(|x| x.as_mut_slice()).collect();
    uraid_parity::recover(&mut v, &[4]);
}
