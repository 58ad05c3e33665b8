//! Every feature bit, device flag and state of the v1 superblock is either honoured or
//! refused by name (`uraid_core::support::check`), on superblocks that went through the
//! codec (encoded, then decoded as assembly would read them).

use uraid_core::superblock::*;
use uraid_core::support::{check, FEATURES_IMPLEMENTED, FEATURES_KNOWN};

fn raid5() -> Superblock {
    let spec = CreateSpec {
        set_uuid: [0x42; 16],
        set_name: "host:shelf".into(),
        ctime_secs: 1_700_000_000,
        level: 5,
        layout: 2,
        chunk_sectors: 128,
        raid_disks: 3,
        spares: 0,
        missing: vec![],
        size_sectors: 16_384,
        data_offset_sectors: 2048,
        internal_bitmap: None,
        bad_block_log: true,
        clean: true,
        version: MetadataVersion::V1_2,
    };
    Superblock::new_for_create(&spec, 0, [9; 16], 20_480).unwrap()
}

/// Through the codec, as a member's bytes would be read.
fn read_back(sb: &Superblock) -> Superblock {
    Superblock::decode(&sb.encode()).unwrap()
}

fn refused(edit: impl FnOnce(&mut Superblock)) -> (String, String) {
    let mut sb = raid5();
    edit(&mut sb);
    let e = check(&read_back(&sb)).expect_err("must be refused");
    (e.feature.to_string(), e.to_string())
}

#[test]
fn plain_members_of_every_version_are_accepted() {
    let sb = raid5();
    assert_eq!(check(&read_back(&sb)), Ok(()));
    for bits in [
        FEATURE_BITMAP_OFFSET,
        FEATURE_RECOVERY_OFFSET,
        FEATURE_BAD_BLOCKS,
        FEATURE_REPLACEMENT | FEATURE_RECOVERY_OFFSET,
        FEATURE_RECOVERY_BITMAP | FEATURE_RECOVERY_OFFSET,
        FEATURE_RAID0_LAYOUT,
    ] {
        let mut s = raid5();
        s.feature_map = bits;
        assert_eq!(check(&read_back(&s)), Ok(()), "feature_map {bits:#x}");
    }
    let mut s = raid5();
    s.devflags = DEVFLAG_WRITE_MOSTLY | DEVFLAG_FAILFAST;
    s.logical_block_size = 512;
    assert_eq!(check(&read_back(&s)), Ok(()));
}

/// A raid4/5/6 restripe (disks, chunk or layout) is read through both geometries: the
/// engine takes it (read-only), so the check lets it through.
#[test]
fn a_raid5_restripe_in_progress_is_accepted() {
    let mut sb = raid5();
    sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_NEW_OFFSET;
    sb.reshape_position = 4096;
    sb.delta_disks = 1;
    sb.new_layout = 2;
    sb.new_chunk = 128;
    sb.new_level = 5;
    sb.new_offset = -1024;
    assert_eq!(check(&read_back(&sb)), Ok(()));
    sb.feature_map |= FEATURE_RESHAPE_BACKWARDS;
    assert_eq!(check(&read_back(&sb)), Ok(()));
    // Off md's stripe boundary: md would not start it either.
    sb.reshape_position = 4096 + 128;
    let e = check(&read_back(&sb)).expect_err("misaligned position");
    assert_eq!(e.feature, "FEATURE_RESHAPE_ACTIVE");
    assert!(e.to_string().contains("not on a stripe boundary"), "{e}");
}

#[test]
fn a_reshape_in_progress_is_refused_with_what_to_do() {
    let (feature, msg) = refused(|sb| {
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE;
        sb.reshape_position = 4096;
        sb.delta_disks = 1;
        sb.new_layout = 2;
        sb.new_chunk = 128;
        // A raid5 -> raid6 reshape: uraid reads only restripes within one level.
        sb.new_level = 6;
    });
    assert_eq!(feature, "FEATURE_RESHAPE_ACTIVE");
    assert!(msg.contains("changes the level from 5 to 6"), "{msg}");
    assert!(
        msg.contains("reshape is in progress at sector 4096"),
        "{msg}"
    );
    assert!(msg.contains("+1 disks"), "{msg}");
    assert!(
        msg.contains("Linux md / mdadm to finish the reshape"),
        "{msg}"
    );
    assert!(msg.contains("uraid's reshape support"), "{msg}");
    // Also with the companions md sets alongside it, and each of them alone.
    let (f, _) = refused(|sb| {
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE | FEATURE_RESHAPE_BACKWARDS | FEATURE_NEW_OFFSET
    });
    assert_eq!(f, "FEATURE_RESHAPE_ACTIVE");
    let (f, m) = refused(|sb| sb.feature_map |= FEATURE_RESHAPE_BACKWARDS);
    assert_eq!(f, "FEATURE_RESHAPE_BACKWARDS");
    assert!(m.contains("finish the reshape"), "{m}");
    let (f, m) = refused(|sb| {
        sb.feature_map |= FEATURE_NEW_OFFSET;
        sb.new_offset = -1024;
    });
    assert_eq!(f, "FEATURE_NEW_OFFSET");
    assert!(m.contains("new_offset -1024"), "{m}");
}

#[test]
fn clustered_ppl_and_unknown_bits_are_refused_by_name() {
    let (f, m) = refused(|sb| sb.feature_map |= FEATURE_CLUSTERED);
    assert_eq!(f, "FEATURE_CLUSTERED");
    assert!(m.contains("cluster"), "{m}");
    // PPL is implemented for raid5 (md has it for raid5 only): a valid area is accepted,
    // everything md would not start is refused by name.
    let ppl_8_248 = (8u32 | (248u32 << 16)) as i32;
    let mut sb = raid5();
    sb.feature_map |= FEATURE_PPL;
    sb.bitmap_offset = ppl_8_248;
    assert_eq!(check(&read_back(&sb)), Ok(()));
    let (f, m) = refused(|sb| {
        sb.feature_map |= FEATURE_PPL;
        sb.bitmap_offset = ppl_8_248;
        sb.level = 6;
    });
    assert_eq!(f, "FEATURE_PPL");
    assert!(m.contains("only for raid5"), "{m}");
    let (f, m) = refused(|sb| {
        sb.feature_map |= FEATURE_PPL | FEATURE_MULTIPLE_PPLS;
        sb.bitmap_offset = (8u32 | (4u32 << 16)) as i32;
    });
    assert_eq!(f, "FEATURE_MULTIPLE_PPLS");
    assert!(m.contains("PPL area of 4 sectors at 8"), "{m}");
    let (f, _) = refused(|sb| sb.feature_map |= FEATURE_MULTIPLE_PPLS);
    assert_eq!(f, "FEATURE_MULTIPLE_PPLS");
    // Linux 6.12 writes FEATURE_MULTIPLE_PPLS alone (0x800) on every superblock update of an
    // array with several PPLs per area: a valid area with it alone is a PPL array.
    let mut sb = raid5();
    sb.feature_map |= FEATURE_MULTIPLE_PPLS;
    sb.bitmap_offset = (8u32 | (2048u32 << 16)) as i32;
    assert!(sb.has_ppl());
    assert_eq!(check(&read_back(&sb)), Ok(()));
    // Every bit md does not define, one at a time.
    for bit in 0..32 {
        let b = 1u32 << bit;
        if FEATURES_KNOWN & b != 0 {
            continue;
        }
        let (f, m) = refused(|sb| sb.feature_map |= b);
        assert_eq!(f, "unknown feature bit", "bit {bit}");
        assert!(m.contains(&format!("{b:#x}")), "{m}");
    }
    // And every known bit that uraid does not implement is refused too.
    for bit in 0..32 {
        let b = 1u32 << bit;
        if FEATURES_KNOWN & b != 0 && FEATURES_IMPLEMENTED & b == 0 {
            let mut sb = raid5();
            sb.feature_map |= b;
            assert!(
                check(&read_back(&sb)).is_err(),
                "bit {b:#x} must be refused"
            );
        }
    }
}

#[test]
fn journal_states_flags_and_block_sizes_uraid_cannot_honour() {
    let (f, m) = refused(|sb| {
        sb.feature_map |= FEATURE_JOURNAL;
        sb.level = 1;
        sb.chunksize = 0;
    });
    assert_eq!(f, "FEATURE_JOURNAL");
    assert!(m.contains("raid level 1"), "{m}");
    let (f, m) = refused(|sb| sb.feature_map |= FEATURE_JOURNAL | FEATURE_BITMAP_OFFSET);
    assert_eq!(f, "FEATURE_JOURNAL");
    assert!(m.contains("bitmap"), "{m}");
    // A journal device: role 0xfffd, journal_tail in recovery_offset.
    let journal = |sb: &mut Superblock| {
        sb.feature_map |= FEATURE_JOURNAL;
        sb.dev_roles[0] = ROLE_JOURNAL;
    };
    let mut ok = raid5();
    journal(&mut ok);
    ok.recovery_offset = 8;
    assert_eq!(check(&read_back(&ok)), Ok(()));
    let (f, m) = refused(|sb| {
        journal(sb);
        sb.recovery_offset = sb.data_size;
    });
    assert_eq!(f, "FEATURE_JOURNAL");
    assert!(m.contains("journal_tail"), "{m}");
    let (f, _) = refused(|sb| sb.dev_roles[0] = ROLE_JOURNAL);
    assert_eq!(
        f, "FEATURE_JOURNAL",
        "a journal device of an array without a journal"
    );
    let (f, m) = refused(|sb| sb.devflags |= 0x80);
    assert_eq!(f, "devflags");
    assert!(m.contains("0x80"), "{m}");
    let (f, m) = refused(|sb| sb.logical_block_size = 4096);
    assert_eq!(f, "logical_block_size");
    assert!(m.contains("4096 bytes"), "{m}");
    let (f, _) = refused(|sb| sb.super_offset = 4096);
    assert_eq!(f, "super_offset", "a superblock inside its own data area");
}

/// write-mostly (bit 0) and failfast (bit 1) of `devflags` come back through the codec as
/// the member's flags, with mdadm's words; other bits stay refused by name.
#[test]
fn member_flags_round_trip_through_the_codec() {
    for bits in 0u8..4 {
        let mut s = raid5();
        s.devflags = bits;
        let back = read_back(&s);
        assert_eq!(back.encode()[184], bits, "devflags byte");
        let f = back.member_flags();
        assert_eq!(f.write_mostly, bits & 1 != 0, "{bits:#x}");
        assert_eq!(f.failfast, bits & 2 != 0, "{bits:#x}");
        assert_eq!(f.devflags(), bits);
        assert_eq!(MemberFlags::from_devflags(bits), f);
        assert_eq!(check(&back), Ok(()), "{bits:#x} is honoured");
    }
    let both = MemberFlags {
        write_mostly: true,
        failfast: true,
    };
    assert_eq!(both.examine_words(), "write-mostly failfast");
    assert_eq!(both.detail_words(), "writemostly failfast");
    assert_eq!(MemberFlags::default().examine_words(), "");
    let (f, _) = refused(|sb| sb.devflags = DEVFLAG_WRITE_MOSTLY | 4);
    assert_eq!(f, "devflags");
}
