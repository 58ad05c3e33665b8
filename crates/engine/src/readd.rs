//! Re-adding a lost host's member when the host is back (mdadm's incremental re-add of a
//! device that reappears, its `POLICY action=re-add`, done by the re-add daemon).
//!
//! A member that failed with its connection lost and can be opened anew
//! ([`Member::reopen`]: a remote member, by a new connection) is tried on each pass; one
//! failed by request (`uraid fail`, its connection up) is left alone. Once it opens, it is re-added only if what it
//! holds is this array's member in that same role (its superblock's set UUID and role):
//! then the role's bitmap makes the recovery copy only what it missed. Anything else (a
//! host back with an empty disk, or another array's disk) is left for the user to add, as
//! mdadm's re-add policy leaves a blank device alone: adding it rebuilds it whole.

use crate::array::Array;
use crate::member::{Member, RemoteConnection};
use crate::recovery::AddOutcome;
use crate::slot::SlotState;
use std::sync::Arc;
use uraid_core::MemberIdx;

/// What a pass did with one failed member that opened again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readd {
    /// Re-added in its role: recovery (from its bitmap where it has one) is due.
    Readded { role: MemberIdx, device: String },
    /// It opens but is not this array's member in that role (why); left faulty.
    Refused {
        role: MemberIdx,
        device: String,
        why: String,
    },
    /// The re-add itself failed (the role may now be empty).
    Failed {
        role: MemberIdx,
        device: String,
        error: String,
    },
}

impl Array {
    /// One pass of the re-add daemon: every faulty member that reopens is re-added or
    /// refused (see the module's notes); those that do not open stay as they are, their
    /// attempt counted on them.
    pub(crate) fn readd_pass(&self) -> Vec<Readd> {
        let mut out = Vec::new();
        for r in 0..self.raid_disks() {
            let role = MemberIdx(r);
            if self.slot_state(role) != SlotState::Faulty {
                continue;
            }
            let Some(old) = self.slot(role).device() else {
                continue;
            };
            // Only a member that failed with its connection: one failed by request
            // (`uraid fail`, its connection up) is the administrator's to bring back.
            if old
                .remote()
                .is_none_or(|r| r.connection == RemoteConnection::Up)
            {
                continue;
            }
            let Some(Ok(new)) = old.reopen() else {
                continue;
            };
            let device = new.name();
            if let Err(why) = self.same_member(role, new.as_ref()) {
                out.push(Readd::Refused { role, device, why });
                continue;
            }
            let flags = self.slot(role).member_flags();
            let done = self
                .remove_member(role)
                .and_then(|()| self.add_member_with(new, flags));
            out.push(match done {
                Ok(AddOutcome::Recovering(_)) | Ok(AddOutcome::Spare) => {
                    Readd::Readded { role, device }
                }
                Err(e) => Readd::Failed {
                    role,
                    device,
                    error: e.to_string(),
                },
            });
        }
        out
    }

    /// Whether `dev` holds this array's member `role` (set UUID and role in its superblock).
    fn same_member(&self, role: MemberIdx, dev: &dyn Member) -> Result<(), String> {
        let Some(sb) = crate::meta::superblock_if_any(dev) else {
            return Err("it has no superblock (a new disk?): add it to rebuild it".into());
        };
        if sb.set_uuid != self.meta().template.set_uuid {
            return Err("its superblock is another array's".into());
        }
        let was = sb.dev_roles.get(sb.dev_number as usize).copied();
        if was != Some(role.0 as u16) {
            return Err(format!(
                "its superblock gives it another role ({was:?}), not {role}"
            ));
        }
        Ok(())
    }
}

/// The re-add daemon: a pass every `every` until `stopping`, on its own thread (a connect
/// to a lost host may wait a whole timeout), each outcome given to `note`.
pub(crate) fn readd_thread(
    array: Arc<Array>,
    every: std::time::Duration,
    stopping: impl Fn() -> bool,
    mut note: impl FnMut(Readd),
) {
    let step = std::time::Duration::from_millis(50).min(every);
    let mut waited = std::time::Duration::ZERO;
    while !stopping() {
        std::thread::sleep(step);
        waited += step;
        if waited < every {
            continue;
        }
        waited = std::time::Duration::ZERO;
        for r in array.readd_pass() {
            note(r);
        }
    }
}
