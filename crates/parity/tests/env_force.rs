//! `URAID_PARITY_IMPL` picks the path of the free functions. Its own test binary, with one
//! test, so that the variable is set before anything in the process chooses.

use uraid_parity::{active, Implementation, IMPL_ENV};

#[test]
fn env_var_forces_scalar() {
    std::env::set_var(IMPL_ENV, "scalar");
    assert_eq!(active(), Implementation::Scalar);
    let d = [0x80u8; 100];
    let (mut p, mut q) = ([0u8; 100], [0u8; 100]);
    uraid_parity::gen_pq(&[&d, &d], &mut p, &mut q);
    // P = 80 ^ 80 = 0; Q = 80 ^ {02}*80 = 80 ^ 1d = 9d.
    assert_eq!(p, [0u8; 100]);
    assert_eq!(q, [0x9du8; 100]);
}
