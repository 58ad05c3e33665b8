//! Plain, obviously-correct reference implementations; every SIMD path is tested against these.

use crate::gf;

fn check_len(len: usize, other: usize) {
    assert_eq!(len, other, "parity buffers must have equal lengths");
}

pub fn xor_gen(dst: &mut [u8], srcs: &[&[u8]]) {
    assert!(!srcs.is_empty(), "xor_gen needs at least one source");
    check_len(dst.len(), srcs[0].len());
    dst.copy_from_slice(srcs[0]);
    xor_acc(dst, &srcs[1..]);
}

pub fn xor_acc(dst: &mut [u8], srcs: &[&[u8]]) {
    for s in srcs {
        check_len(dst.len(), s.len());
        for (d, x) in dst.iter_mut().zip(s.iter()) {
            *d ^= *x;
        }
    }
}

pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    assert!(!data.is_empty(), "gen_pq needs at least one data block");
    let len = p.len();
    check_len(len, q.len());
    for d in data {
        check_len(len, d.len());
    }
    for i in 0..len {
        let mut pp = 0u8;
        let mut qq = 0u8;
        for d in data.iter().rev() {
            pp ^= d[i];
            qq = gf::mul(qq, 2) ^ d[i];
        }
        p[i] = pp;
        q[i] = qq;
    }
}

pub fn update_q(slot: usize, delta: &[u8], q: &mut [u8]) {
    check_len(delta.len(), q.len());
    let t = gf::mul_table(gf::exp2(slot));
    for (qq, d) in q.iter_mut().zip(delta) {
        *qq ^= t[*d as usize];
    }
}

pub fn update_pq(slot: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
    xor_acc(p, &[delta]);
    update_q(slot, delta, q);
}

pub fn recover(blocks: &mut [&mut [u8]], lost: &[usize]) {
    let n = blocks.len();
    assert!(
        n >= 3,
        "a raid6 stripe has at least one data block, P and Q"
    );
    let ndata = n - 2;
    let (pi, qi) = (ndata, ndata + 1);
    let mut lost: Vec<usize> = lost.to_vec();
    lost.sort_unstable();
    lost.dedup();
    assert!(
        lost.len() <= 2 && lost.iter().all(|&i| i < n),
        "bad lost set"
    );
    let len = blocks[0].len();
    for b in blocks.iter() {
        check_len(len, b.len());
    }
    match lost.as_slice() {
        [] => {}
        [x] if *x >= ndata => regen(blocks, ndata),
        [x] => {
            // A data block alone: XOR of P and the other data.
            rebuild_from_p(blocks, *x, ndata);
        }
        [x, y] if *x == pi && *y == qi => regen(blocks, ndata),
        [x, y] if *y == qi => {
            rebuild_from_p(blocks, *x, ndata);
            regen(blocks, ndata);
        }
        [x, y] if *y == pi => {
            // Data x and P: Dx = (Q ^ Q_without_x) / {02}^x.
            let x = *x;
            let mut qx = vec![0u8; len];
            syndrome_without(blocks, ndata, &[x], None, Some(&mut qx));
            let inv = gf::mul_table(gf::inv(gf::exp2(x)));
            for i in 0..len {
                blocks[x][i] = inv[(qx[i] ^ blocks[qi][i]) as usize];
            }
            regen(blocks, ndata);
        }
        [x, y] => {
            let (x, y) = (*x, *y);
            let mut pxy = vec![0u8; len];
            let mut qxy = vec![0u8; len];
            syndrome_without(blocks, ndata, &[x, y], Some(&mut pxy), Some(&mut qxy));
            // Dx = A*(P^Pxy) ^ B*(Q^Qxy), with A = g^(y-x)/(g^(y-x)+1), B = g^-x/(g^(y-x)+1).
            let gyx = gf::exp2(y - x);
            let denom = gf::inv(gyx ^ 1);
            let a = gf::mul_table(gf::mul(gyx, denom));
            let b = gf::mul_table(gf::mul(gf::inv(gf::exp2(x)), denom));
            for i in 0..len {
                let pd = blocks[pi][i] ^ pxy[i];
                let qd = blocks[qi][i] ^ qxy[i];
                let dx = a[pd as usize] ^ b[qd as usize];
                blocks[x][i] = dx;
                blocks[y][i] = pd ^ dx;
            }
        }
        _ => unreachable!(),
    }
}

fn rebuild_from_p(blocks: &mut [&mut [u8]], x: usize, ndata: usize) {
    let len = blocks[0].len();
    let mut acc = blocks[ndata].to_vec();
    for (k, b) in blocks[..ndata].iter().enumerate() {
        if k != x {
            for i in 0..len {
                acc[i] ^= b[i];
            }
        }
    }
    blocks[x].copy_from_slice(&acc);
}

/// P and/or Q over the data blocks, treating the ones in `skip` as zero.
fn syndrome_without(
    blocks: &[&mut [u8]],
    ndata: usize,
    skip: &[usize],
    mut p: Option<&mut [u8]>,
    mut q: Option<&mut [u8]>,
) {
    let len = blocks[0].len();
    for i in 0..len {
        let mut pp = 0u8;
        let mut qq = 0u8;
        for k in (0..ndata).rev() {
            let v = if skip.contains(&k) { 0 } else { blocks[k][i] };
            pp ^= v;
            qq = gf::mul(qq, 2) ^ v;
        }
        if let Some(p) = p.as_deref_mut() {
            p[i] = pp;
        }
        if let Some(q) = q.as_deref_mut() {
            q[i] = qq;
        }
    }
}

fn regen(blocks: &mut [&mut [u8]], ndata: usize) {
    let len = blocks[0].len();
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    {
        let data: Vec<&[u8]> = blocks[..ndata].iter().map(|b| &**b).collect();
        gen_pq(&data, &mut p, &mut q);
    }
    blocks[ndata].copy_from_slice(&p);
    blocks[ndata + 1].copy_from_slice(&q);
}
