//! The state of a role's device (md's rdev flags, simplified; see [`crate::slot`]). A leaf
//! module, so that what only names a state (reports, [`crate::identity::Place`]) needs
//! nothing else of the slots.

/// The state of a role's member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// No member holds the role.
    Missing,
    /// The member holds every block of the role.
    InSync,
    /// The member is being rebuilt (up to its recovery cursor).
    Recovering,
    /// The member failed; it serves no IO.
    Faulty,
}

impl SlotState {
    pub(crate) fn from_u8(v: u8) -> SlotState {
        match v {
            1 => SlotState::InSync,
            2 => SlotState::Recovering,
            3 => SlotState::Faulty,
            _ => SlotState::Missing,
        }
    }

    pub(crate) fn as_u8(self) -> u8 {
        match self {
            SlotState::Missing => 0,
            SlotState::InSync => 1,
            SlotState::Recovering => 2,
            SlotState::Faulty => 3,
        }
    }

    /// mdadm --detail's words.
    pub fn describe(self) -> &'static str {
        match self {
            SlotState::Missing => "removed",
            SlotState::InSync => "active sync",
            SlotState::Recovering => "spare rebuilding",
            SlotState::Faulty => "faulty",
        }
    }
}
