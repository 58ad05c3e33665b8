//! systemd's notify protocol for `uraid serve` under a `Type=notify` unit
//! (contrib/systemd/uraid@.service): READY=1 once every export listens and the control
//! socket answers, STOPPING=1 when a stop begins. Without NOTIFY_SOCKET (not started by
//! systemd) each call does nothing.

use sd_notify::NotifyState;

/// Tells the service manager the array is served. `status` is what `systemctl status`
/// shows.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager a stop began (after SIGTERM or `uraid stop`).
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn send(state: &[NotifyState<'_>]) {
    // NOTIFY_SOCKET stays set: READY and STOPPING come from this process at different
    // times. A manager that cannot be told is no reason to stop serving.
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!("telling systemd ({state:?}) failed: {e}");
    }
}
