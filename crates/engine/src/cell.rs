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
use crate::restripe::{reshape_members, ReshapeOptions, ReshapeRequest};
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
    /// served. md's changes of two or three steps (a level change with a restripe, a raid0
    /// growing through raid4, a rotating raid6 becoming a raid5) are one request: the
    /// first step now, the others started by a thread of the cell's as each step before
    /// them ends.
    pub fn grow(self: &Arc<Self>, req: &GrowRequest) -> Result<GrowReport, ArrayError> {
        self.grow_adding(req, Vec::new())
    }

    /// [`ArrayCell::grow`] with devices to add, as `mdadm --grow --add` sequences them:
    /// added first (as spares, or into missing roles), then the grow; a raid0's new
    /// devices join after its takeover to raid4, as a raid0 has no room for a spare.
    pub fn grow_adding(
        self: &Arc<Self>,
        req: &GrowRequest,
        mut add: Vec<Arc<dyn Member>>,
    ) -> Result<GrowReport, ArrayError> {
        let a = self.current();
        a.check_writable("grow")?;
        let events = a.meta().events();
        if let Some(r) = self.array_size(&a, req, &add, events) {
            return r;
        }
        // md's sequence for a shrink: --array-size first, then --raid-devices, which
        // takes the size set as its confirmation.
        let with_size;
        let req = match a.array_size_limit() {
            Some(l)
                if req.array_sectors.is_none()
                    && req.raid_disks.is_some_and(|d| d < a.raid_disks())
                    && (a.level().has_parity()
                        || matches!(
                            a.level(),
                            uraid_core::Level::Raid10 | uraid_core::Level::Raid0
                        )) =>
            {
                with_size = GrowRequest {
                    array_sectors: Some(l / uraid_core::SECTOR_BYTES),
                    ..req.clone()
                };
                &with_size
            }
            _ => req,
        };
        let st = a.grow_state();
        let level = a.level();
        drop(a);
        let raid0 = matches!(
            crate::grow::plan(&st, req),
            Ok(Plan::Raid0Grow(..) | Plan::Raid0Shrink(..))
        );
        if !raid0 {
            self.add_devices(std::mem::take(&mut add))?;
        }
        let st = if raid0 {
            st
        } else {
            self.current().grow_state()
        };
        if crate::grow::raid6_needs_restripe_to_become_raid5(level, &st, req) {
            return self.restripe_then_takeover(&st, req);
        }
        let plan = crate::grow::plan(&st, req)?;
        if let Plan::Restripe(r) = &plan {
            // A raid10 restripe is started as a raid4/5/6 one (start_restripe): its checks
            // are plan_start10's, made by reshape_members before anything is written.
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
            Plan::Restripe(r) => self.start_restripe(&r, false),
            Plan::Raid0Grow(want, chunk) => self.grow_raid0(&st, (want, chunk), add),
            Plan::Raid0Shrink(want, keep) => self.shrink_raid0(&st, (want, keep), add),
            Plan::Superblocks(_) => {
                let (rep, _) =
                    self.replace(|devs| grow_members_with(devs, req, ReshapeOptions::default()))?;
                Ok(rep)
            }
        }
    }

    /// `--array-size` on its own (md's in-memory `array_size`): the size the served array is
    /// exported at from now on, or all of it again (`max`); `None` for any other request.
    fn array_size(
        &self,
        a: &Array,
        req: &GrowRequest,
        add: &[Arc<dyn Member>],
        events: u64,
    ) -> Option<Result<GrowReport, ArrayError>> {
        let sectors = req.array_sectors?;
        if !req.only_array_size() || !add.is_empty() {
            return None;
        }
        let bytes = (sectors != crate::grow::ARRAY_SIZE_MAX)
            .then(|| sectors.saturating_mul(uraid_core::SECTOR_BYTES));
        Some(a.set_array_size_limit(bytes).map(|()| {
            let size = a.exported_bytes();
            GrowReport {
                summary: match bytes {
                    Some(_) => format!(
                        "array size {}K (of {}K; in memory, as md's array_size: the members are \
                         unchanged and a restart serves all of it)",
                        size / 1024,
                        a.size_bytes() / 1024
                    ),
                    None => format!("array size {}K: all of it", size / 1024),
                },
                events,
                missing_roles: Vec::new(),
                restripe: false,
                reshape: None,
            }
        }))
    }

    /// `add` added to the served array (into missing roles, or as spares), the recovery
    /// of the roles they took started.
    fn add_devices(&self, add: Vec<Arc<dyn Member>>) -> Result<(), ArrayError> {
        if add.is_empty() {
            return Ok(());
        }
        for dev in add {
            self.current().add_member(dev)?;
        }
        self.with_daemons(|d| d.start_recovery());
        Ok(())
    }

    /// The restripe `r` started on the served array (its superblocks written, nothing
    /// moved); `force`: it may leave new roles missing where md allows (mdadm --force).
    fn start_restripe(&self, r: &ReshapeRequest, force: bool) -> Result<GrowReport, ArrayError> {
        let (rep, _) = self.replace(|devs| {
            reshape_members(
                devs,
                r,
                ReshapeOptions {
                    start_only: true,
                    force,
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

    /// The takeover `take`, planned on the array as it is, or md's reason there is none.
    fn takeover_change(
        st: &crate::grow::GrowState,
        take: &GrowRequest,
        what: &str,
    ) -> Result<crate::grow::Change, ArrayError> {
        match crate::grow::plan(st, take)? {
            Plan::Superblocks(c) => Ok(c),
            _ => Err(ArrayError::Refused(format!(
                "md has no takeover to {} to {what} from: nothing was written",
                take.level
                    .map_or("this level".to_string(), |l| l.to_string())
            ))),
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
        let change = Self::takeover_change(st, &take, "start this restripe")?;
        let restripe = match crate::grow::plan(st, req)? {
            Plan::Restripe(r) => ReshapeRequest { level: None, ..r },
            _ => unreachable!("planned as a restripe by the caller"),
        };
        self.precheck_restripe_after(&restripe, &[], change.shape(), (false, true))?;
        let took = self.grow(&take)?;
        self.then(
            vec![Step::Whole, Step::Restripe(restripe, false)],
            &took.summary,
        )?;
        Ok(GrowReport {
            summary: format!(
                "{}; the restripe starts once the new role(s) are rebuilt",
                took.summary
            ),
            restripe: true,
            ..took
        })
    }

    /// What the restripe `r` will check after a takeover to `after`, checked against the
    /// array as it is now (with `add` to come), before the takeover is written.
    fn precheck_restripe_after(
        &self,
        r: &ReshapeRequest,
        add: &[Arc<dyn Member>],
        after: (uraid_core::Level, u32, usize),
        force_fill: (bool, bool),
    ) -> Result<(), ArrayError> {
        // The report of the members as they are, for the restripe's checks.
        let ((), report) = self.replace(|_| Ok(()))?;
        crate::restripe::precheck_after_takeover(
            &self.current(),
            &report,
            r,
            add,
            after,
            force_fill,
        )
    }

    /// mdadm's raid0 growth on the served array, its three steps from one request: the
    /// takeover to a raid4 whose parity role is missing, the new devices added (the first
    /// rebuilds that parity, as uraid does it offline), the restripe of the raid4 to the
    /// new count of data roles with its new parity role left missing, and the takeover
    /// back to raid0. Everything is checked before the first takeover is written.
    fn grow_raid0(
        self: &Arc<Self>,
        st: &crate::grow::GrowState,
        (want, chunk): (usize, Option<u64>),
        add: Vec<Arc<dyn Member>>,
    ) -> Result<GrowReport, ArrayError> {
        let n = st.template.raid_disks as usize;
        let needed = want - n;
        if add.len() < needed {
            return Err(crate::grow::raid0_lacks_devices(n, want, add.len()));
        }
        if add.len() > needed {
            return Err(ArrayError::Refused(format!(
                "growing a raid0 from {n} to {want} devices takes {needed} new device(s) and {} \
                 were given with --add; a raid0 keeps no spares: give {needed}, nothing was \
                 written",
                add.len()
            )));
        }
        let take = GrowRequest {
            level: Some(uraid_core::Level::Raid4),
            ..Default::default()
        };
        let change = Self::takeover_change(st, &take, "grow this raid0 through")?;
        let restripe = ReshapeRequest {
            raid_disks: Some(want + 1),
            chunk_sectors: chunk,
            ..Default::default()
        };
        // The degraded raid4 the restripe leaves is md's way, not a choice: forced.
        self.precheck_restripe_after(&restripe, &add, change.shape(), (true, needed > 0))?;
        let took = self.grow(&take)?;
        self.add_devices(add)?;
        let back = GrowRequest {
            level: Some(uraid_core::Level::Raid0),
            ..Default::default()
        };
        // Only a growth gives the parity a device (rebuilt first); a chunk change
        // restripes the raid4 with its parity role missing, as md does.
        let mut steps = if needed > 0 {
            vec![Step::Whole]
        } else {
            Vec::new()
        };
        steps.extend([
            Step::Restripe(restripe, true),
            Step::Reshaped,
            Step::Grow(back),
        ]);
        self.then(steps, &took.summary)?;
        let what = match (needed > 0, chunk) {
            (true, _) => format!(
                "its parity is rebuilt onto the first new device, then the restripe to {want} \
                 data devices"
            ),
            (false, Some(c)) => format!(
                "the restripe to a {}K chunk with its parity role missing",
                c / 2
            ),
            (false, None) => "the restripe".into(),
        };
        Ok(GrowReport {
            summary: format!("{}; {what}, then md's takeover back to raid0", took.summary),
            restripe: true,
            ..took
        })
    }

    /// mdadm's raid0 shrink on the served array, from one request (`--raid-devices` fewer
    /// with `--array-size`, or after an `--array-size` alone): the served size limited to
    /// the kept sectors at once (md's array_size: nothing past them is acknowledged from
    /// then on, so nothing the shrink drops was written after the request), the takeover to
    /// a raid4 whose parity role is missing, the shrink of that raid4 (md's backwards
    /// reshape, run by the daemons while it serves), and the takeover back to raid0, the
    /// parity member leaving the array. Everything is checked before the first takeover is
    /// written.
    fn shrink_raid0(
        self: &Arc<Self>,
        st: &crate::grow::GrowState,
        (want, keep): (usize, u64),
        add: Vec<Arc<dyn Member>>,
    ) -> Result<GrowReport, ArrayError> {
        if !add.is_empty() {
            return Err(ArrayError::Refused(
                "a raid0 shrink takes no new devices (--add), and a raid0 keeps no spares: \
                 nothing was written"
                    .into(),
            ));
        }
        let take = GrowRequest {
            level: Some(uraid_core::Level::Raid4),
            ..Default::default()
        };
        let change = Self::takeover_change(st, &take, "shrink this raid0 through")?;
        let restripe = ReshapeRequest {
            raid_disks: Some(want + 1),
            array_sectors: Some(keep),
            ..Default::default()
        };
        self.precheck_restripe_after(&restripe, &[], change.shape(), (false, false))?;
        let a = self.current();
        let before = a.array_size_limit();
        let bytes = keep * uraid_core::SECTOR_BYTES;
        if before.is_none_or(|l| l > bytes) {
            a.set_array_size_limit(Some(bytes))?;
        }
        drop(a);
        let took = match self.grow(&take) {
            Ok(t) => t,
            Err(e) => {
                // Nothing was written: the size the array had is served again.
                let _ = self.current().set_array_size_limit(before);
                return Err(e);
            }
        };
        let back = GrowRequest {
            level: Some(uraid_core::Level::Raid0),
            ..Default::default()
        };
        self.then(
            vec![
                Step::Restripe(restripe, false),
                Step::Reshaped,
                Step::Grow(back),
            ],
            &took.summary,
        )?;
        Ok(GrowReport {
            summary: format!(
                "{}; the raid4 shrinks to {} devices keeping {}K, then md's takeover back to \
                 raid0 of {want} (the parity member leaves)",
                took.summary,
                want + 1,
                keep / 2
            ),
            restripe: true,
            ..took
        })
    }

    /// A rotating raid6 asked to become a raid5 on the served array: the restripe within
    /// raid6 to the matching `-6` layout now, and md's takeover to raid5 (Q's device becomes
    /// a spare) started by a thread of the cell's when it has finished. The takeover is
    /// planned on the state the restripe leaves before anything is written.
    fn restripe_then_takeover(
        self: &Arc<Self>,
        st: &crate::grow::GrowState,
        req: &GrowRequest,
    ) -> Result<GrowReport, ArrayError> {
        let (l6, take) = crate::grow::plan_raid6_to_raid5(st, req)?;
        let started = self.start_restripe(
            &ReshapeRequest {
                layout: Some(l6),
                ..Default::default()
            },
            false,
        )?;
        self.then(vec![Step::Reshaped, Step::Grow(take)], &started.summary)?;
        Ok(GrowReport {
            summary: format!(
                "{}; md's takeover to raid5 follows once it finishes",
                started.summary
            ),
            ..started
        })
    }

    /// Runs `steps` on a thread of the cell's, in order (see [`Step`]); `took`: what the
    /// request did already, for the log.
    fn then(self: &Arc<Self>, steps: Vec<Step>, took: &str) -> Result<(), ArrayError> {
        let cell = self.clone();
        let took = took.to_string();
        std::thread::Builder::new()
            .name("grow-steps".into())
            .spawn(move || cell.run_steps(steps, &took))
            .map(drop)
            .map_err(|e| ArrayError::Failed(format!("starting the grow's next steps: {e}")))
    }

    fn run_steps(self: Arc<Self>, steps: Vec<Step>, took: &str) {
        for step in steps {
            let done = match &step {
                Step::Whole => self.wait_whole(took),
                Step::Reshaped => self.wait_reshaped(took),
                Step::Restripe(r, force) => self.start_restripe(r, *force).map(|_| ()),
                Step::Grow(g) => self.grow(g).map(|_| ()),
            };
            if let Err(e) = done {
                tracing::error!(
                    "grow: after \"{took}\", the next step ({}) did not start: {e}; the \
                     array is served as it is now, and uraid grow can take it on from there",
                    step.name()
                );
                return;
            }
            tracing::info!("grow: after \"{took}\": {} done", step.name());
        }
    }

    /// Waits until `f` is true of the array served; refused when the cell stops first.
    fn wait_for(&self, took: &str, mut f: impl FnMut(&Array) -> bool) -> Result<(), ArrayError> {
        loop {
            if *self.replacing.lock().unwrap_or_else(|e| e.into_inner()) {
                return Err(ArrayError::Refused(format!(
                    "the array stopped before the steps after \"{took}\" were done"
                )));
            }
            if f(&self.current()) {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Waits for the array to be whole (the roles a takeover made rebuilt); refused when a
    /// role stays missing, with no spare to rebuild it, for 30 s.
    fn wait_whole(&self, took: &str) -> Result<(), ArrayError> {
        let mut idle = 0u32;
        let mut stuck = None;
        self.wait_for(took, |a| {
            let (missing, recovering) = (a.missing_roles(), a.recovering_roles());
            if missing.is_empty() && recovering.is_empty() {
                return true;
            }
            // A spare that is there is taken by the daemons first.
            idle = if recovering.is_empty() && a.spares().is_empty() {
                idle + 1
            } else {
                0
            };
            if idle >= 300 {
                stuck = Some(missing);
                return true;
            }
            false
        })?;
        match stuck {
            Some(missing) => Err(ArrayError::Refused(format!(
                "role(s) {missing:?} are missing with no spare to rebuild them: add a device \
                 (uraid add), then uraid grow again"
            ))),
            None => Ok(()),
        }
    }

    /// Waits for the array's reshape to finish and the array to be served in its new shape.
    fn wait_reshaped(&self, took: &str) -> Result<(), ArrayError> {
        self.wait_for(took, |a| {
            a.reshaping().is_none() && a.reshaping10().is_none()
        })
    }

    /// Serve the shape the superblocks say now: after a reshape finished while served,
    /// the array is assembled again in its new shape (the personality of the new level,
    /// the new size).
    pub fn reload(&self) -> Result<AssembleReport, ArrayError> {
        self.replace(|_| Ok(())).map(|((), r)| r)
    }
}

/// A step of a grow that md does as several (see [`ArrayCell::grow`]).
enum Step {
    /// The array whole: the role(s) a takeover made rebuilt.
    Whole,
    /// The reshape finished, and the array served in its new shape.
    Reshaped,
    /// This restripe started (`true`: it may leave roles missing, mdadm's --force).
    Restripe(ReshapeRequest, bool),
    /// This grow (a takeover).
    Grow(GrowRequest),
}

impl Step {
    fn name(&self) -> &'static str {
        match self {
            Step::Whole => "the rebuild of the new role(s)",
            Step::Reshaped => "the end of the reshape",
            Step::Restripe(..) => "the restripe",
            Step::Grow(_) => "the takeover",
        }
    }
}
