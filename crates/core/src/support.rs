//! What uraid can honour in a v1 superblock, and the refusal for everything else.
//!
//! Every `feature_map` bit, device flag and state field is either implemented by the engine
//! or refused here, by name, before any member is written. Pure: the engine calls
//! [`check`] on every superblock it assembles from.

use crate::superblock::*;

/// Feature bits the engine implements (or, for `RECOVERY_BITMAP`, honours conservatively:
/// a recovery resumes over everything above `recovery_offset`, a superset of the chunks a
/// bitmap-based recovery would copy).
pub const FEATURES_IMPLEMENTED: u32 = FEATURE_BITMAP_OFFSET
    | FEATURE_RECOVERY_OFFSET
    | FEATURE_BAD_BLOCKS
    | FEATURE_REPLACEMENT
    | FEATURE_RECOVERY_BITMAP
    | FEATURE_JOURNAL
    | FEATURE_RAID0_LAYOUT
    | FEATURE_PPL
    | FEATURE_MULTIPLE_PPLS;

/// Every feature bit md defines (md_p.h's MD_FEATURE_ALL).
pub const FEATURES_KNOWN: u32 = FEATURES_IMPLEMENTED
    | FEATURE_RESHAPE_ACTIVE
    | FEATURE_RESHAPE_BACKWARDS
    | FEATURE_NEW_OFFSET
    | FEATURE_CLUSTERED;

/// Device flags md defines, all honoured: write-mostly (raid1 read balancing) and failfast
/// (raid1/raid10 fail the member on its first IO error while redundancy remains).
pub const DEVFLAGS_KNOWN: u8 = DEVFLAG_WRITE_MOSTLY | DEVFLAG_FAILFAST;

/// Logical block sizes uraid serves (it exports 512-byte blocks; 0 = not recorded).
pub const LOGICAL_BLOCK_SIZES_SERVED: [u32; 2] = [0, 512];

/// Something in a superblock that uraid cannot honour, with what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// md's name for it, e.g. "FEATURE_RESHAPE_ACTIVE".
    pub feature: &'static str,
    /// What the superblock says, in words, with the values.
    pub detail: String,
    /// What the user can do.
    pub advice: &'static str,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}); {}", self.detail, self.feature, self.advice)
    }
}

const ADVICE_RESHAPE: &str = "assemble it with Linux md / mdadm to finish the reshape, or wait \
     for uraid's reshape support (reading it with either geometry alone would return mixed data)";
const ADVICE_LINUX: &str = "assemble it with Linux md / mdadm";

/// Checks one superblock; the first thing uraid cannot honour is returned.
pub fn check(sb: &Superblock) -> Result<(), Unsupported> {
    let fm = sb.feature_map;
    let refuse = |feature, detail: String, advice| {
        Err(Unsupported {
            feature,
            detail,
            advice,
        })
    };
    let unknown = fm & !FEATURES_KNOWN;
    if unknown != 0 {
        return refuse(
            "unknown feature bit",
            format!("feature_map {fm:#x} has bit(s) {unknown:#x} that md did not define when uraid was written"),
            "it was written by a newer md: assemble it with Linux md / mdadm",
        );
    }
    if fm & FEATURE_CLUSTERED != 0 {
        return refuse(
            "FEATURE_CLUSTERED",
            "a clustered md array (shared by several nodes, one bitmap per node)".into(),
            "assemble it with mdadm on the cluster's nodes: uraid has no cluster locking",
        );
    }
    // A raid4/5/6 restripe and a raid10 near/offset reshape are read through both
    // geometries; any other reshape is refused with what it is.
    if fm & FEATURE_RESHAPE_ACTIVE != 0 {
        let read = if sb.level == 10 {
            crate::geometry::Raid10Reshape::from_superblock(sb).map(|_| ())
        } else {
            crate::geometry::ReshapeState::from_superblock(sb).map(|_| ())
        };
        if let Err(e) = read {
            return refuse(
                "FEATURE_RESHAPE_ACTIVE",
                format!(
                    "a reshape is in progress at sector {} (level {} -> {}, layout {} -> {}, chunk {} -> {} sectors, {:+} disks) that uraid cannot read: {e}",
                    sb.reshape_position,
                    sb.level,
                    sb.new_level,
                    sb.layout,
                    sb.new_layout,
                    sb.chunksize,
                    sb.new_chunk,
                    sb.delta_disks
                ),
                ADVICE_RESHAPE,
            );
        }
    }
    if fm & FEATURE_RESHAPE_BACKWARDS != 0 && fm & FEATURE_RESHAPE_ACTIVE == 0 {
        return refuse(
            "FEATURE_RESHAPE_BACKWARDS",
            "a reshape running from the end of the array towards the start".into(),
            ADVICE_RESHAPE,
        );
    }
    if fm & FEATURE_NEW_OFFSET != 0 && fm & FEATURE_RESHAPE_ACTIVE == 0 {
        return refuse(
            "FEATURE_NEW_OFFSET",
            format!(
                "a reshape moving the data to new_offset {} sectors from data_offset {}",
                sb.new_offset, sb.data_offset
            ),
            ADVICE_RESHAPE,
        );
    }
    if fm & (FEATURE_PPL | FEATURE_MULTIPLE_PPLS) != 0 {
        let (offset, size) = sb.ppl();
        let name = if fm & FEATURE_MULTIPLE_PPLS != 0 {
            "FEATURE_MULTIPLE_PPLS"
        } else {
            "FEATURE_PPL"
        };
        // md: PPL is for raid5 only, never with a bitmap or a journal.
        let why = if sb.level != 5 {
            Some(format!(
                "a partial parity log on raid level {} (md has PPL only for raid5)",
                sb.level
            ))
        } else if fm & (FEATURE_BITMAP_OFFSET | FEATURE_JOURNAL) != 0 {
            Some(
                "a partial parity log together with a bitmap or a journal (md never writes both)"
                    .into(),
            )
        } else if crate::ppl::PplArea::new(u64::from(size)).is_none()
            || (0..8).contains(&i32::from(offset))
            || (offset < 0 && i32::from(offset) + i32::from(size) > 0)
        {
            Some(format!(
                "a PPL area of {size} sectors at {offset} sectors from the superblock, which \
                 overlaps the superblock or cannot hold a header and one page"
            ))
        } else {
            None
        };
        if let Some(detail) = why {
            return refuse(name, detail, ADVICE_LINUX);
        }
    }
    if fm & FEATURE_JOURNAL != 0 {
        if !matches!(sb.level, 4..=6) {
            return refuse(
                "FEATURE_JOURNAL",
                format!(
                    "a write journal on raid level {} (md has journals only for raid4/5/6)",
                    sb.level
                ),
                ADVICE_LINUX,
            );
        }
        if fm & FEATURE_BITMAP_OFFSET != 0 {
            return refuse(
                "FEATURE_JOURNAL",
                "a write journal together with an internal bitmap (md never writes both)".into(),
                ADVICE_LINUX,
            );
        }
    }
    if sb.role_of_this_device() == Some(ROLE_JOURNAL) {
        if fm & FEATURE_JOURNAL == 0 {
            return refuse(
                "FEATURE_JOURNAL",
                "a journal device of an array whose feature_map has no journal".into(),
                ADVICE_LINUX,
            );
        }
        // journal_tail shares recovery_offset's bytes and counts sectors of the journal area.
        if sb.recovery_offset >= sb.data_size {
            return refuse(
                "FEATURE_JOURNAL",
                format!(
                    "a journal whose journal_tail {} is not inside its {} sectors",
                    sb.recovery_offset, sb.data_size
                ),
                ADVICE_LINUX,
            );
        }
    }
    // The data area must not hold the superblock (1.0 keeps it after the data, 1.1/1.2
    // before): a superblock update would overwrite data.
    let data_end = sb.data_offset.saturating_add(sb.data_size);
    if (sb.data_offset..data_end).contains(&sb.super_offset) {
        return refuse(
            "super_offset",
            format!(
                "the superblock at sector {} lies inside the data area (sectors {}..{data_end})",
                sb.super_offset, sb.data_offset
            ),
            "the superblock is damaged or was hand-edited: check it with mdadm --examine",
        );
    }
    let flags = sb.devflags & !DEVFLAGS_KNOWN;
    if flags != 0 {
        return refuse(
            "devflags",
            format!(
                "device flag bit(s) {flags:#04x} that md did not define when uraid was written"
            ),
            "it was written by a newer md: assemble it with Linux md / mdadm",
        );
    }
    if !LOGICAL_BLOCK_SIZES_SERVED.contains(&sb.logical_block_size) {
        return refuse(
            "logical_block_size",
            format!(
                "a logical block size of {} bytes; uraid serves 512-byte blocks only",
                sb.logical_block_size
            ),
            ADVICE_LINUX,
        );
    }
    Ok(())
}

/// Checks a 0.90 record for what its v1 model cannot say and uraid does not do; [`check`]
/// then runs on the model (a reshape, minor 91, is FEATURE_RESHAPE_ACTIVE there).
pub fn check090(rec: &crate::superblock090::Superblock090) -> Result<(), Unsupported> {
    use crate::superblock090::ByteOrder;
    let refuse = |feature, detail: String, advice| {
        Err(Unsupported {
            feature,
            detail,
            advice,
        })
    };
    // Reading it is safe (the decoder knows the order); writing it back in this host's
    // order would make it unreadable where it was written, and md itself only converts it
    // when asked.
    if rec.byte_order == ByteOrder::Big {
        return refuse(
            "0.90 byte order",
            "a 0.90 superblock in big-endian byte order, written on a machine of the other \
             byte order"
                .into(),
            "assemble it where it was written, or convert it with mdadm --assemble \
             --update=byteorder",
        );
    }
    // A 0.91 record (a reshape in place) is checked on the model, as a v1 reshape without
    // FEATURE_NEW_OFFSET: a grow past its critical section is read, the rest refused with
    // the backup-file reason.
    if rec.not_persistent != 0 {
        return refuse(
            "not_persistent",
            "a 0.90 superblock marked not persistent".into(),
            ADVICE_LINUX,
        );
    }
    Ok(())
}
