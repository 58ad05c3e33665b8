//! The array a server serves, replaceable while it is served: md changes a running
//! array's shape in place (`mdadm --grow` through sysfs), and uraid does the same by
//! building the array again from the same member handles and swapping it in.
//!
//! An [`Array`] is built once with its geometry, slots and personality, and the fast path
//! reads them without locks. A change of shape (a restripe starting or finishing, a raid1
//! gaining mirrors, a larger size, a bitmap added or dropped) would have to change all of
//! them at once; instead [`ArrayCell::replace`] quiesces the running array (requests in
//! flight finish, new ones wait at its door), stops it cleanly, lets the change rewrite
//! the superblocks on the members (the offline code: [`grow_members_with`],
//! [`reshape_members`](crate::reshape_members)), assembles the members again, and swaps
//! the new array in. The old one is *retired*: a request that was waiting at its door, or
//! that loaded it just before the swap, gets [`ArrayError::Replaced`] and
//! [`ArrayCell::run`] runs it again on the new array, so the users of the export see a
//! pause, not an error.
//!
//! What the users of the array see continues across the swap: its event subscribers (a
//! monitor), its counters and its run-time knobs move to the new array. The NBD export's
//! size is read per connection, so a client that connects after a grow sees the new size
//! (NBD cannot tell a connected client its export grew).

use crate::array::Array;
use crate::assemble::{assemble, AssembleOptions, AssembleReport};
use crate::daemon::{DaemonNote, DaemonOptions, Daemons};
use crate::error::ArrayError;
use crate::grow::{grow_members_with, GrowReport, GrowRequest, Plan};
use crate::member::Member;
use crate::restripe::{reshape_members, ReshapeOptions};
use arc_swap::{ArcSwap, Guard};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// An [`Array`] that can be replaced while served (see the module docs).
pub struct ArrayCell {
    cur: ArcSwap<Array>,
    /// How the array was assembled; a replacement is assembled the same way.
    opts: AssembleOptions,
    /// One replacement at a time; `true` once the cell is stopped (no more replacements).
    replacing: Mutex<bool>,
    /// md's daemons for the array, started again on each replacement.
    daemons: Mutex<Option<(Daemons, DaemonOptions)>>,
}

impl ArrayCell {
    /// A cell holding `array`. Its replacements are assembled as it was: read-only if the
    /// user asked for that, with its clock, and started even when dirty and degraded (it
    /// runs already, so that risk was taken when it started).
    pub fn new(array: Arc<Array>) -> Arc<ArrayCell> {
        let opts = AssembleOptions {
            readonly: array.is_read_only() && array.read_only_reason().is_none(),
            clock: array.clock().clone(),
            start_dirty_degraded: true,
            force: false,
        };
        Arc::new(ArrayCell {
            cur: ArcSwap::new(array),
            opts,
            replacing: Mutex::new(false),
            daemons: Mutex::new(None),
        })
    }

    /// Start md's daemons for the array ([`Daemons::start`]), and again on every
    /// replacement. When a reshape they run finishes, the array is assembled again in its
    /// new shape ([`ArrayCell::reload`]).
    pub fn start_daemons(self: &Arc<Self>, mut opts: DaemonOptions) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        let user = opts
            .notify
            .clone()
            .unwrap_or_else(|| Arc::new(crate::daemon::trace_note));
        opts.notify = Some(Arc::new(move |n: &DaemonNote| {
            user(n);
            if matches!(n, DaemonNote::ReshapeFinished) {
                if let Some(cell) = weak.upgrade() {
                    // Not on the reshape thread: the reload stops the daemons, it among them.
                    let spawned =
                        std::thread::Builder::new()
                            .name("md-reload".into())
                            .spawn(move || match cell.reload() {
                                // Refused: the server is stopping; its next start serves the
                                // new shape.
                                Ok(_) | Err(ArrayError::Refused(_)) => {}
                                Err(e) => tracing::error!(
                                    "the reshape finished but the array could not be assembled \
                                 in its new shape: {e}; it is served in its reshaping form \
                                 until it is started again"
                                ),
                            });
                    if let Err(e) = spawned {
                        tracing::error!("cannot start the thread that serves the new shape: {e}");
                    }
                }
            }
        }));
        let d = Daemons::start(self.current(), opts.clone())?;
        let old = self.lock_daemons().replace((d, opts));
        if let Some((d, _)) = old {
            d.stop();
        }
        Ok(())
    }

    /// The clean stop of the served array: after any replacement under way, the daemons,
    /// then [`Array::stop`] on the array served now (given back, for its last report). No
    /// replacement starts after this.
    pub fn stop(&self) -> (Arc<Array>, Result<(), ArrayError>) {
        let mut one = self.replacing.lock().unwrap_or_else(|e| e.into_inner());
        *one = true;
        self.stop_daemons();
        let a = self.current();
        let r = a.stop();
        (a, r)
    }

    /// Run `f` on the array's daemons, if they run.
    pub fn with_daemons<R>(&self, f: impl FnOnce(&Daemons) -> R) -> Option<R> {
        self.lock_daemons().as_ref().map(|(d, _)| f(d))
    }

    /// Stop the daemons (before the array is stopped; see [`Daemons::stop`]); they are not
    /// started again.
    pub fn stop_daemons(&self) {
        let d = self.lock_daemons().take();
        if let Some((d, _)) = d {
            d.stop();
        }
    }

    fn lock_daemons(&self) -> std::sync::MutexGuard<'_, Option<(Daemons, DaemonOptions)>> {
        self.daemons.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The array now; cheap, for one request. A request that gets
    /// [`ArrayError::Replaced`] from it loads again ([`ArrayCell::run`] does).
    pub fn get(&self) -> Guard<Arc<Array>> {
        self.cur.load()
    }

    /// The array now, as an owned handle (for a command or a report).
    pub fn current(&self) -> Arc<Array> {
        self.cur.load_full()
    }

    /// Run `f` on the array, again on its replacement if it was replaced meanwhile.
    pub fn run<R>(
        &self,
        mut f: impl FnMut(&Array) -> Result<R, ArrayError>,
    ) -> Result<R, ArrayError> {
        loop {
            let a = self.cur.load();
            match f(&a) {
                Err(ArrayError::Replaced) => continue,
                r => return r,
            }
        }
    }

    /// Replace the array: quiesce and stop it, let `change` rewrite the members'
    /// superblocks (it gets every device: the members in role order, then the spares and
    /// the journal), assemble them again and serve the result. Requests wait meanwhile.
    ///
    /// Whatever `change` returns, the members are assembled again from what their
    /// superblocks say, so the served array is always the one on disk; the error of a
    /// change that failed is returned after that. Only when that assembly fails is the old
    /// array kept (it was stopped cleanly and goes on serving). The daemons
    /// ([`ArrayCell::start_daemons`]) are stopped first and started again on the result.
    pub fn replace<T>(
        &self,
        change: impl FnOnce(Vec<Arc<dyn Member>>) -> Result<T, ArrayError>,
    ) -> Result<(T, AssembleReport), ArrayError> {
        let one = self.replacing.lock().unwrap_or_else(|e| e.into_inner());
        if *one {
            return Err(ArrayError::Refused(
                "the array is stopping: nothing was changed".into(),
            ));
        }
        // The daemons first, as md stops its sync thread before it changes the array: a
        // reshape or sync records where it got to.
        let daemons = self.lock_daemons().take();
        let opts = daemons.map(|(d, o)| {
            d.stop();
            o
        });
        let r = self.replace_quiesced(change);
        if let Some(o) = opts {
            let d = Daemons::start(self.current(), o.clone()).map_err(ArrayError::Io);
            match d {
                Ok(d) => *self.lock_daemons() = Some((d, o)),
                Err(e) => {
                    tracing::error!("md's daemons could not be started again: {e}");
                    return Err(e);
                }
            }
        }
        r
    }

    fn replace_quiesced<T>(
        &self,
        change: impl FnOnce(Vec<Arc<dyn Member>>) -> Result<T, ArrayError>,
    ) -> Result<(T, AssembleReport), ArrayError> {
        let old = self.current();
        let devs = old.devices();
        let quiet = old.quiesce();
        old.stop_quiesced()?;
        let changed = change(devs.clone());
        let (new, report) = match assemble(devs, &self.opts) {
            Ok(r) => r,
            Err(e) => {
                drop(quiet);
                return Err(match changed {
                    Err(c) => c,
                    Ok(_) => ArrayError::Failed(format!(
                        "the members could not be assembled again after the change, so the \
                         array goes on in its old shape: {e}"
                    )),
                });
            }
        };
        new.adopt(&old);
        let new = Arc::new(new);
        // The new array first: a request that finds the old one retired and loads again
        // gets the new one, never the old one a second time.
        self.cur.store(new);
        old.retired.store(true, Ordering::SeqCst);
        drop(quiet);
        tracing::info!("array replaced (events {})", report.events);
        changed.map(|t| (t, report))
    }

    /// `mdadm --grow` on the served array: planned against it (refusals before anything
    /// is written), then applied through [`ArrayCell::replace`]: a change of superblocks
    /// ([`grow_members_with`]) is served at once in its new shape; a restripe
    /// ([`reshape_members`]) is started (its superblocks written, nothing moved) and the
    /// array comes back as a reshaping one, whose reshape the daemons run while it is
    /// served.
    pub fn grow(self: &Arc<Self>, req: &GrowRequest) -> Result<GrowReport, ArrayError> {
        let a = self.current();
        a.check_writable("grow")?;
        let events = a.meta().events();
        let st = a.grow_state();
        let level = a.level();
        drop(a);
        if crate::grow::raid6_needs_restripe_to_become_raid5(level, &st, req) {
            return Err(ArrayError::Refused(
                "a raid6 in a rotating layout becomes a raid5 in two steps on a served array: \
                 restripe it to the matching -6 layout first (uraid grow --layout \
                 left-symmetric-6), then, when that reshape has finished, uraid grow --level 5: \
                 nothing was written"
                    .into(),
            ));
        }
        let plan = crate::grow::plan(&st, req)?;
        if let Plan::Restripe(r) = &plan {
            if level == uraid_core::Level::Raid10 {
                return Err(ArrayError::Refused(
                    "a raid10 reshape runs on the members of a stopped array in this build \
                     (uraid grow --raid-devices/--layout/--chunk MEMBERS; a served raid10 \
                     mid-reshape is read-only): nothing was written"
                        .into(),
                ));
            }
            if let Some(to) = r.level.filter(|&l| l != level) {
                return self.takeover_then_restripe(&st, req, to);
            }
        }
        match plan {
            Plan::Nothing(why) => Ok(GrowReport {
                summary: format!("nothing to change: {why}"),
                events,
                missing_roles: Vec::new(),
                restripe: false,
                reshape: None,
            }),
            Plan::Restripe(r) => {
                let (rep, _) = self.replace(|devs| {
                    reshape_members(
                        devs,
                        &r,
                        ReshapeOptions {
                            stop_at: Some(0),
                            ..ReshapeOptions::default()
                        },
                    )
                })?;
                Ok(GrowReport {
                    summary: format!("reshape started: {}", rep.summary),
                    events: rep.events,
                    missing_roles: Vec::new(),
                    restripe: true,
                    reshape: Some(rep),
                })
            }
            Plan::Raid0Grow(_) => Err(ArrayError::Refused(
                "a raid0 grows (through raid4, as mdadm) on the members of a stopped array in \
                 this build: stop the server, then uraid grow --raid-devices N --add DEV... \
                 MEMBERS: nothing was written"
                    .into(),
            )),
            Plan::Superblocks(_) => {
                let (rep, _) =
                    self.replace(|devs| grow_members_with(devs, req, ReshapeOptions::default()))?;
                Ok(rep)
            }
        }
    }

    /// A level change with a restripe (`--level 6 --layout left-symmetric` on a raid5), md's
    /// two steps as one command: the takeover now (its superblocks; the new role(s) it
    /// makes are rebuilt onto the array's spares while served), and the restripe, started
    /// by a thread of the cell's once that rebuild has finished. Everything the restripe
    /// will check (spares for the takeover's roles and for the restripe's, the new shape)
    /// is checked first, against the array as it is, so that a refusal comes before the
    /// takeover is written; what can still stop the restripe after (a member failing
    /// during the rebuild) leaves a whole array at the takeover's level, said in the log.
    fn takeover_then_restripe(
        self: &Arc<Self>,
        st: &crate::grow::GrowState,
        req: &GrowRequest,
        to: uraid_core::Level,
    ) -> Result<GrowReport, ArrayError> {
        let take = GrowRequest {
            level: Some(to),
            ..Default::default()
        };
        let then = GrowRequest {
            level: None,
            ..req.clone()
        };
        let change = match crate::grow::plan(st, &take)? {
            Plan::Superblocks(c) => c,
            _ => {
                return Err(ArrayError::Refused(format!(
                    "md has no takeover to {to} to start this restripe from: nothing was written"
                )))
            }
        };
        let restripe = match crate::grow::plan(st, req)? {
            Plan::Restripe(r) => crate::restripe::ReshapeRequest { level: None, ..r },
            _ => unreachable!("planned as a restripe by the caller"),
        };
        // The report of the members as they are, for the restripe's checks.
        let ((), report) = self.replace(|_| Ok(()))?;
        crate::restripe::precheck_after_takeover(
            &self.current(),
            &report,
            &restripe,
            &[],
            change.shape(),
            false,
        )?;
        let took = self.grow(&take)?;
        let cell = self.clone();
        let summary = took.summary.clone();
        std::thread::Builder::new()
            .name("grow-restripe".into())
            .spawn(move || cell.restripe_after_rebuild(then, summary))
            .map_err(|e| ArrayError::Failed(format!("starting the restripe's thread: {e}")))?;
        Ok(GrowReport {
            summary: format!(
                "{}; the restripe starts once the new role(s) are rebuilt",
                took.summary
            ),
            restripe: true,
            ..took
        })
    }

    /// The second step of [`ArrayCell::takeover_then_restripe`]: waits for the array to be
    /// whole (its new roles rebuilt), then starts the restripe; gives up, said in the log,
    /// when the cell stops or a role stays missing with no spare to rebuild it.
    fn restripe_after_rebuild(self: Arc<Self>, then: GrowRequest, took: String) {
        let mut idle = 0u32;
        loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            if *self.replacing.lock().unwrap_or_else(|e| e.into_inner()) {
                tracing::warn!(
                    "grow: the array stopped before the restripe after \"{took}\" started; \
                     start it with uraid grow once the array is whole"
                );
                return;
            }
            let a = self.current();
            let (missing, recovering) = (a.missing_roles(), a.recovering_roles());
            if missing.is_empty() && recovering.is_empty() {
                break;
            }
            // A missing role not being rebuilt, with no spare for it, for 30 s: nothing
            // will fill it (a spare that is there is taken by the daemons first).
            idle = if recovering.is_empty() && a.spares().is_empty() {
                idle + 1
            } else {
                0
            };
            if idle >= 300 {
                tracing::error!(
                    "grow: role(s) {missing:?} are missing with no spare to rebuild them \
                     after \"{took}\", so the restripe was not started: add a device (uraid \
                     add), then uraid grow again"
                );
                return;
            }
        }
        match self.grow(&then) {
            Ok(r) => tracing::info!("grow: {}", r.summary),
            Err(e) => tracing::error!(
                "grow: the restripe after \"{took}\" could not start: {e}; the array is whole \
                 at its new level"
            ),
        }
    }

    /// Serve the shape the superblocks say now: after a reshape finished while served,
    /// the array is assembled again in its new shape (the personality of the new level,
    /// the new size).
    pub fn reload(&self) -> Result<AssembleReport, ArrayError> {
        self.replace(|_| Ok(())).map(|((), r)| r)
    }
}
