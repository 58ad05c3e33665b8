//! XOR and RAID6 P/Q syndrome generation and recovery in md's field: GF(2^8) with the
//! polynomial 0x11d and generator {02}; Q = sum over data slots k of {02}^k * D_k.
//!
//! All functions take data blocks in *syndrome order* (slot k gets coefficient {02}^k); the
//! geometry in `uraid-core` says which logical chunk sits in which slot.
//!
//! Every buffer passed to one call must have the same length. Lengths need not be multiples
//! of anything and buffers need not be aligned.

pub mod gf;
pub mod scalar;

/// XOR all `srcs` into `dst` (dst = srcs[0] ^ srcs[1] ^ ...). `srcs` must not be empty.
pub fn xor_gen(dst: &mut [u8], srcs: &[&[u8]]) {
    scalar::xor_gen(dst, srcs)
}

/// XOR each of `srcs` into `dst` (dst ^= srcs[0] ^ srcs[1] ^ ...).
pub fn xor_acc(dst: &mut [u8], srcs: &[&[u8]]) {
    scalar::xor_acc(dst, srcs)
}

/// Generate P and Q over `data` (syndrome order). Needs at least one data block.
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    scalar::gen_pq(data, p, q)
}

/// Read-modify-write update: fold `delta` = old ^ new data of syndrome slot `slot` into
/// P and Q (P ^= delta, Q ^= {02}^slot * delta).
pub fn update_pq(slot: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
    scalar::update_pq(slot, delta, p, q)
}

/// Q ^= {02}^slot * delta (the Q half of [`update_pq`], for callers that keep P apart).
pub fn update_q(slot: usize, delta: &[u8], q: &mut [u8]) {
    scalar::update_q(slot, delta, q)
}

/// Recover up to two lost blocks of a raid6 stripe in place.
///
/// `blocks` holds the data blocks in syndrome order, then P, then Q (`ndata + 2` blocks);
/// `lost` names one or two distinct indices into `blocks` whose contents are garbage on entry
/// and are rebuilt from the others. Every combination works: one or two data, data + P,
/// data + Q, P + Q, P alone, Q alone.
pub fn recover(blocks: &mut [&mut [u8]], lost: &[usize]) {
    scalar::recover(blocks, lost)
}
