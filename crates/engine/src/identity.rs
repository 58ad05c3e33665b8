//! What a member device *is*, as opposed to how its path is spelt.
//!
//! A relative path, a symlink, `/proc/self/fd/N`, a bind mount or a hard link can all name
//! one file; comparing path strings lets the same file become an active member and a spare
//! at once (its superblock rewritten as a spare, a later rebuild onto it destroying the
//! data it holds). md binds block devices, so it compares the device itself; we compare
//! what the kernel says about the open descriptor: (st_dev, st_ino) for a file, st_rdev
//! (major:minor) for a block device. A device without either (memory, simulated disks)
//! is known by its name. The superblock's device UUID is kept beside it: a different
//! device carrying an active member's device UUID is a copy of that member.

use crate::slot_state::SlotState;
use uraid_core::superblock::uuid_string;
use uraid_core::MemberIdx;

/// The device under a member, from the kernel's view of its open descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceId {
    /// A regular file: the file system's device and the inode.
    File {
        /// st_dev of the file.
        dev: u64,
        /// st_ino of the file.
        ino: u64,
    },
    /// A block device: its major:minor.
    Block {
        /// st_rdev of the device node.
        rdev: u64,
    },
    /// No kernel identity (memory or simulated members): the name is all there is.
    Named(String),
}

impl DeviceId {
    /// The device a path names (through symlinks), as [`Member::device_id`](crate::Member::device_id) of a file
    /// member opened from it would say.
    pub fn of_path(p: &std::path::Path) -> std::io::Result<DeviceId> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = std::fs::metadata(p)?;
        Ok(if m.file_type().is_block_device() {
            DeviceId::Block { rdev: m.rdev() }
        } else {
            DeviceId::File {
                dev: m.dev(),
                ino: m.ino(),
            }
        })
    }
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceId::File { dev, ino } => write!(
                f,
                "inode {ino} on device {}:{}",
                libc::major(*dev as libc::dev_t),
                libc::minor(*dev as libc::dev_t)
            ),
            DeviceId::Block { rdev } => write!(
                f,
                "block device {}:{}",
                libc::major(*rdev as libc::dev_t),
                libc::minor(*rdev as libc::dev_t)
            ),
            DeviceId::Named(n) => write!(f, "{n}"),
        }
    }
}

/// A member's identity: the device, and the device UUID of its md superblock if it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The device it is.
    pub device: DeviceId,
    /// The md device UUID in its superblock, if it has one.
    pub device_uuid: Option<[u8; 16]>,
}

impl Identity {
    /// Whether two identities are one device (whatever the paths that opened them).
    pub fn same_device(&self, other: &Identity) -> bool {
        self.device == other.device
    }

    /// Whether `other` is this device, or a different device carrying this one's
    /// superblock identity (a copy: using both would mix two histories of one member).
    pub fn same_member(&self, other: &Identity) -> bool {
        self.same_device(other)
            || matches!((self.device_uuid, other.device_uuid), (Some(a), Some(b)) if a == b)
    }

    /// Why `other` counts as this member, for messages.
    pub fn why_same(&self, other: &Identity) -> String {
        if self.same_device(other) {
            format!("the same device ({})", self.device)
        } else {
            format!(
                "a copy carrying its device UUID {}",
                uuid_string(&self.device_uuid.unwrap_or_default())
            )
        }
    }
}

/// Where a device already is in an array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// The device of a role, in this state.
    Member(MemberIdx, SlotState),
    /// The replacement being rebuilt for a role (md's --replace).
    Replacement(MemberIdx),
    /// A spare, under the name the array knows it by.
    Spare(String),
    /// The write journal.
    Journal(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Member(r, s) => write!(f, "member {r} ({})", s.describe()),
            Place::Replacement(r) => write!(f, "the replacement being rebuilt for member {r}"),
            Place::Spare(n) => write!(f, "a spare ({n})"),
            Place::Journal(n) => write!(f, "the write journal ({n})"),
        }
    }
}
