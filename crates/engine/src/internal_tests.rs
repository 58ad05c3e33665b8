//! Tests of internal functions that integration tests (`tests/`) can no longer reach now
//! that the engine's modules are private. Each names where it came from.

/// raid6 check's search for the one bad data block (from `tests/recovery.rs`).
mod raid5 {
    use crate::raid5::locate_bad_data;

    #[test]
    fn locate_bad_data_finds_the_slot() {
        // dq = {02}^z * dp for z = 3.
        let dp = [1u8, 7, 0, 0x80];
        let dq: Vec<u8> = dp
            .iter()
            .map(|&x| uraid_parity::gf::mul(x, uraid_parity::gf::exp2(3)))
            .collect();
        assert_eq!(locate_bad_data(&dp, &dq, 4), Some(3));
        assert_eq!(locate_bad_data(&dp, &dq, 3), None);
        let mut bad = dq.clone();
        bad[0] ^= 1;
        assert_eq!(locate_bad_data(&dp, &bad, 8), None);
    }
}
