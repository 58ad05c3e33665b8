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

use crate::array::Array;
use crate::member::Member;
use crate::meta::Meta;
use crate::slot::SlotState;
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
    /// The device a path names (through symlinks), as [`Member::device_id`] of a file
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
    /// The identity of an opened member (reads its superblock, if any, for the device UUID).
    pub fn of(dev: &dyn Member) -> Identity {
        Identity {
            device: dev.device_id(),
            device_uuid: crate::meta::superblock_if_any(dev).map(|sb| sb.device_uuid),
        }
    }

    /// The identity of a member whose superblock the caller already holds.
    pub fn with_uuid(dev: &dyn Member, device_uuid: [u8; 16]) -> Identity {
        Identity {
            device: dev.device_id(),
            device_uuid: Some(device_uuid),
        }
    }

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

/// Where the member `id` already is in the array, with the name it is known by there and
/// why it counts as the same (see [`Identity::why_same`]).
pub(crate) fn locate(a: &Array, meta: &Meta, id: &Identity) -> Option<(Place, String, String)> {
    let hit = |dev: &dyn Member, uuid: Option<[u8; 16]>| {
        let known = Identity {
            device: dev.device_id(),
            device_uuid: uuid,
        };
        known
            .same_member(id)
            .then(|| (dev.name(), known.why_same(id)))
    };
    for r in (0..a.raid_disks()).map(MemberIdx) {
        let slot = a.slot(r);
        if let Some(d) = slot.device() {
            let uuid = meta.member_sb(r).map(|sb| sb.device_uuid);
            if let Some((n, why)) = hit(d.as_ref(), uuid) {
                return Some((Place::Member(r, slot.state()), n, why));
            }
        }
        if let Some(rep) = slot.replacement() {
            let uuid = meta
                .replacements
                .get(r.0)
                .and_then(|s| s.as_ref())
                .map(|sb| sb.device_uuid);
            if let Some((n, why)) = hit(rep.new.as_ref(), uuid) {
                return Some((Place::Replacement(r), n, why));
            }
        }
    }
    for (d, sb) in &meta.spares {
        if let Some((n, why)) = hit(d.as_ref(), Some(sb.device_uuid)) {
            return Some((Place::Spare(n.clone()), n, why));
        }
    }
    if let Some((d, sb)) = &meta.journal {
        if let Some((n, why)) = hit(d.as_ref(), Some(sb.device_uuid)) {
            return Some((Place::Journal(n.clone()), n, why));
        }
    }
    None
}

impl Array {
    /// Where `dev` (whatever path opened it) already is in this array, if anywhere.
    pub fn locate_device(&self, dev: &dyn Member) -> Option<Place> {
        let id = Identity::of(dev);
        let meta = self.meta();
        locate(self, &meta, &id).map(|(p, _, _)| p)
    }

    /// Where the device a path names already is in this array, if anywhere: the same
    /// file or block device under any name (hard link, bind mount, another node).
    pub fn locate_path(&self, p: &std::path::Path) -> Option<Place> {
        let id = Identity {
            device: DeviceId::of_path(p).ok()?,
            device_uuid: None,
        };
        let meta = self.meta();
        locate(self, &meta, &id).map(|(p, _, _)| p)
    }
}

/// The first pair of devices in `devs` that are the same device: (earlier index, later).
pub fn first_duplicate(devs: &[&dyn Member]) -> Option<(usize, usize)> {
    let ids: Vec<DeviceId> = devs.iter().map(|d| d.device_id()).collect();
    for (j, id) in ids.iter().enumerate() {
        if let Some(i) = ids[..j].iter().position(|o| o == id) {
            return Some((i, j));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{DirectMode, FileMember};
    use crate::member::MemMember;

    fn open(p: &std::path::Path) -> FileMember {
        FileMember::open(p, DirectMode::Off).unwrap()
    }

    #[test]
    fn one_file_under_many_names_is_one_device() {
        let dir = std::env::temp_dir().join(format!("uraid-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.img");
        std::fs::write(&a, vec![0u8; 8192]).unwrap();
        let link = dir.join("link.img");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let hard = dir.join("hard.img");
        std::fs::hard_link(&a, &hard).unwrap();
        let dotted = dir.join(".").join("a.img");
        let fa = open(&a);
        for other in [&link, &hard, &dotted] {
            let fo = open(other);
            assert_eq!(fa.device_id(), fo.device_id(), "{}", other.display());
            assert_eq!(first_duplicate(&[&fa, &fo]), Some((0, 1)));
        }
        let file = std::fs::File::open(&a).unwrap();
        let by_fd = std::path::PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::unix::io::AsRawFd::as_raw_fd(&file)
        ));
        assert_eq!(open(&by_fd).device_id(), fa.device_id());
        let b = dir.join("b.img");
        std::fs::write(&b, vec![0u8; 8192]).unwrap();
        assert_ne!(open(&b).device_id(), fa.device_id());
        assert_eq!(first_duplicate(&[&fa, &open(&b)]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_copy_with_the_same_device_uuid_is_the_same_member() {
        let m0 = MemMember::new("m0", 4096);
        let m1 = MemMember::new("m1", 4096);
        let a = Identity::with_uuid(&m0, [7; 16]);
        let b = Identity::with_uuid(&m1, [7; 16]);
        assert!(!a.same_device(&b));
        assert!(a.same_member(&b));
        let c = Identity::with_uuid(&m1, [8; 16]);
        assert!(!a.same_member(&c));
        assert!(Identity::of(&m0).same_member(&Identity::of(&MemMember::new("m0", 1))));
    }
}
