//! Finding a device in an array by what it is (see [`crate::identity`]): the identity of
//! an opened member, duplicates among devices, and where a device already is in an array
//! (a role, a replacement, a spare, the journal). Above the lower layer: it reads the
//! superblocks and the slots, so `identity` itself stays a leaf that members can name.

use crate::array::Array;
use crate::identity::{DeviceId, Identity, Place};
use crate::member::Member;
use crate::meta::Meta;
use uraid_core::MemberIdx;

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
                .get(r)
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
