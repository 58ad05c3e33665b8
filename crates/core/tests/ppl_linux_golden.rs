//! Golden bytes from the real thing: the superblock and the PPL header of member 0 of a raid5
//! that Linux 6.12 made (`mdadm --create -l5 -n3 -c64 --consistency-policy=ppl
//! --assume-clean`, 24 MiB members, then 44 MiB written and `mdadm --stop`), taken from the
//! image after the VM powered off (tests/vm). Bytes 0..4096: the v1.2 superblock (at sector 8);
//! 4096..8192: the PPL header (8 sectors after the superblock).

use uraid_core::ppl::{signature, PplEntry, PplHeader};
use uraid_core::superblock::{Superblock, FEATURE_MULTIPLE_PPLS, FEATURE_PPL};

const BYTES: &[u8] = include_bytes!("data/ppl-linux-6.12-member0.bin");

#[test]
fn linux_writes_feature_multiple_ppls_alone_and_uraid_accepts_it() {
    let sb = Superblock::decode(&BYTES[..4096]).unwrap();
    // md's superblock update writes FEATURE_MULTIPLE_PPLS without FEATURE_PPL.
    assert_eq!(sb.feature_map, FEATURE_MULTIPLE_PPLS);
    assert_eq!(sb.feature_map & FEATURE_PPL, 0);
    assert!(sb.has_ppl());
    // mdadm --examine: "PPL : 2048 sectors at offset 8 sectors from superblock".
    assert_eq!(sb.ppl(), (8, 2048));
    assert_eq!((sb.level, sb.raid_disks, sb.chunksize), (5, 3, 128));
    assert_eq!(uraid_core::support::check(&sb), Ok(()));
}

#[test]
fn linux_ppl_header_decodes_with_the_arrays_signature_and_checksum() {
    let sb = Superblock::decode(&BYTES[..4096]).unwrap();
    let at = (sb.ppl().0 as usize) * 512;
    let raw = &BYTES[at..at + 4096];
    let h = PplHeader::decode_for(raw, signature(&sb.set_uuid)).unwrap();
    assert_eq!(h.signature, 0xfb09_3d55);
    // The last PPL md wrote before the clean stop: the 5th, one full-stripe-row entry
    // (no partial parity: every data chunk of the row was written).
    assert_eq!(h.generation, 5);
    assert_eq!(
        h.entries,
        vec![PplEntry {
            data_sector: 512,
            pp_size: 0,
            data_size: 65536,
            parity_disk: 0,
            checksum: 0,
        }]
    );
    // Our encoder writes the same 4 KiB for the same header.
    assert_eq!(&h.encode()[..], raw);
    // A flipped bit anywhere is caught by the checksum.
    let mut bad = raw.to_vec();
    bad[600] ^= 1;
    assert!(PplHeader::decode(&bad).is_err());
}
