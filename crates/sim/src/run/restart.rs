//! Restarts: clean stop and re-assembly with stale, missing and old disks, the power cut,
//! and assembly over budget.

use super::*;

impl Simulator<'_> {
    // ----- stop and assemble ----------------------------------------------------------

    fn events_of(disk: &SimDisk) -> Option<u64> {
        let mut buf = vec![0u8; 4096];
        disk.peek(4096, &mut buf);
        Superblock::decode(&buf).ok().map(|sb| sb.events)
    }

    /// Stop cleanly, then assemble again from the disks in a shuffled order: failed
    /// members come back stale or stay away, a healthy member may be left out or be
    /// replaced by an old image of itself, old replaced disks may be offered too, all
    /// within budget. Assembly must pick exactly the members that are current.
    pub(super) fn reassemble(&mut self) -> Res {
        self.stats.reassemblies += 1;
        let stopped = self.array().stop();
        if let Err(e) = &stopped {
            if !self.over {
                return Err(format!("stop failed within budget: {e}"));
            }
        }
        // The stop may have failed a member and given its role to a spare.
        self.sync_roles();
        let a = self.array.take().expect("assembled");
        let mut engine_missing: BTreeSet<usize> = a.missing_roles().iter().map(|r| r.0).collect();
        drop(a);
        if self.over {
            return self.assemble_over_budget();
        }
        for r in 0..self.cfg.disks {
            if self.disk(r).is_gone() && !engine_missing.contains(&r) {
                // Only a superblock write can have seen it go: the stop's own update.
                self.finding(
                    "superblock-write-error-ignored",
                    format!(
                        "member {r} vanished during the superblock update of a clean stop and \
                     the engine kept it active: a superblock write error does not fail the \
                     member (md fails it)"
                    ),
                )?;
                engine_missing.insert(r);
            }
        }
        // Disk indices to offer, and roles that must not come back active.
        let mut give: Vec<usize> = Vec::new();
        let mut expect_out = BTreeSet::new();
        for r in 0..self.cfg.disks {
            let d = self.role_disk[r];
            let disk = self.disks[d].clone();
            if give.contains(&d) || self.spares.contains(&d) {
                // An empty role still names its last disk, which may have moved on.
                expect_out.insert(r);
                continue;
            }
            if engine_missing.contains(&r) {
                expect_out.insert(r);
                if disk.is_gone() {
                    if self.fr.chance(60) {
                        disk.come_back();
                        give.push(d);
                    }
                } else if self.fr.chance(70) {
                    give.push(d);
                }
                continue;
            }
            if self.budget.can_fault_member(r) && self.fr.chance(6) {
                self.budget.fault_member(r);
                self.world.count(FaultKind::MissingAtAssemble);
                self.world.note(format!("member {r} left out of assembly"));
                expect_out.insert(r);
                continue;
            }
            let stale = self.saved_images[r].as_ref().is_some_and(|img| {
                let mut sb = vec![0u8; 4096];
                sb.copy_from_slice(&img[4096..8192]);
                let old = Superblock::decode(&sb).ok().map(|s| s.events);
                // md takes a member one event behind (a crash in a superblock update
                // leaves those): an old image is detectable only two events back.
                old.map(|e| e + 1) < Self::events_of(&disk)
            });
            if stale && self.budget.can_fault_member(r) && self.fr.chance(10) {
                self.budget.fault_member(r);
                let img = self.saved_images[r].take().expect("image");
                disk.restore_image(&img);
                expect_out.insert(r);
            }
            give.push(d);
        }
        let spares: Vec<usize> = self.spares.clone();
        for d in spares {
            if !self.fr.chance(20) && !give.contains(&d) {
                give.push(d);
            }
        }
        // Disks that left the array (replaced members) may be offered by mistake.
        // (An old spare whose device number a new spare took once got in as a second
        // claimant of one role: tests/sim_regressions.rs.)
        let detached: Vec<usize> = (0..self.disks.len())
            .filter(|d| !self.role_disk.contains(d) && !self.spares.contains(d))
            .filter(|&d| !self.disks[d].is_gone() && !give.contains(&d))
            .collect();
        if !detached.is_empty() && self.fr.chance(30) {
            give.push(*self.fr.pick(&detached));
        }
        for r in 0..self.cfg.disks {
            if self.fr.chance(15) {
                self.saved_images[r] = Some(self.disk(r).image());
            }
        }
        self.fr.shuffle(&mut give);
        let (b, rep) = match self.try_assemble(&give) {
            Ok(x) => x,
            Err(e) => {
                // mdadm too aborts when a listed device cannot be read; the admin then
                // leaves out the failing disks. Those are within budget by construction.
                let failing: Vec<usize> = give
                    .iter()
                    .copied()
                    .filter(|&d| self.disks[d].ever_faulted())
                    .collect();
                if failing.is_empty() {
                    return Err(format!("assembly within budget failed: {e}"));
                }
                self.world.note(format!(
                    "assembly failed ({e}); again without disks {failing:?}"
                ));
                give.retain(|d| !failing.contains(d));
                for r in 0..self.cfg.disks {
                    if failing.contains(&self.role_disk[r]) {
                        self.budget.fault_member(r);
                        expect_out.insert(r);
                    }
                }
                self.try_assemble(&give)
                    .map_err(|e| format!("assembly within budget failed: {e}"))?
            }
        };
        if rep.unclean {
            return Err(format!(
                "a clean stop came back as unclean (report {:?})",
                rep.members
            ));
        }
        self.check_assembly(&b, &give, &engine_missing, &expect_out, &rep)?;
        self.array = Some(b);
        self.sync_roles();
        self.verify_all("check after re-assembly")
    }

    fn try_assemble(
        &self,
        give: &[usize],
    ) -> Result<(Array, uraid_engine::AssembleReport), String> {
        let devs: Vec<Arc<dyn Member>> = give
            .iter()
            .map(|&d| self.disks[d].clone() as Arc<dyn Member>)
            .collect();
        self.world.note(format!("assembling from disks {give:?}"));
        assemble(
            devs,
            &AssembleOptions {
                clock: self.world.engine_clock(),
                ..Default::default()
            },
        )
        .map_err(|e| {
            let events: Vec<(usize, Option<u64>)> = give
                .iter()
                .map(|&d| (d, Self::events_of(&self.disks[d])))
                .collect();
            format!("{e} (disks and events {events:?})")
        })
    }

    /// Every role is filled by the disk that should fill it, and by nothing else.
    fn check_assembly(
        &mut self,
        b: &Array,
        give: &[usize],
        engine_missing: &BTreeSet<usize>,
        expect_out: &BTreeSet<usize>,
        rep: &uraid_engine::AssembleReport,
    ) -> Res {
        let events: Vec<Option<u64>> = (0..self.disks.len())
            .map(|d| Self::events_of(&self.disks[d]))
            .collect();
        let newest = give.iter().filter_map(|&d| events[d]).max();
        for r in 0..self.cfg.disks {
            let d = self.role_disk[r];
            let name = b.slot(MemberIdx(r)).device_name();
            let holder = name.as_deref().and_then(Self::disk_index);
            if let Some(h) = holder {
                if h != d {
                    return Err(format!(
                        "assembly put disk {h} in role {r}, which belongs to disk {d} \
                         (report {:?})",
                        rep.members
                    ));
                }
            }
            let active = b.slot(MemberIdx(r)).in_sync().is_some();
            let given = give.contains(&d);
            let want = given && !expect_out.contains(&r);
            if active == want {
                continue;
            }
            if active && engine_missing.contains(&r) && events[d].map(|e| e + 1) >= newest {
                // Left out earlier while (as far as events tell) nothing was written: md
                // takes it back too, one event behind included. Whether its data is
                // really current is checked next, byte for byte.
                continue;
            }
            if !active
                && given
                && !engine_missing.contains(&r)
                && !expect_out.contains(&r)
                && events[d] < newest
            {
                self.finding(
                    "superblock-write-error-ignored",
                    format!(
                        "member {r} was active until the stop but its superblock is behind \
                     (events {:?} < {newest:?}), so assembly left it out: a superblock \
                     write failed without failing the member",
                        events[d]
                    ),
                )?;
                continue;
            }
            if !active && given && b.slot_state(MemberIdx(r)) == SlotState::Recovering {
                // A rebuild interrupted by the stop resumes: not active yet, as in md.
                continue;
            }
            return Err(format!(
                "assembly made member {r} {} (disk {d} given {given}, engine had it {}, \
                 events {:?}, newest {newest:?}, report {:?})",
                if active { "active" } else { "absent" },
                if engine_missing.contains(&r) {
                    "missing"
                } else {
                    "active"
                },
                events[d],
                rep.members
            ));
        }
        Ok(())
    }

    /// Over budget, the array must refuse to start from what is left, with a message.
    fn assemble_over_budget(&mut self) -> Res {
        let give: Vec<Arc<dyn Member>> = (0..self.cfg.disks)
            .filter(|&r| !self.disk(r).is_gone())
            .map(|r| self.disk(r).clone() as Arc<dyn Member>)
            .collect();
        if give.is_empty() {
            return Ok(());
        }
        let opts = AssembleOptions {
            clock: self.world.engine_clock(),
            ..Default::default()
        };
        match assemble(give, &opts) {
            Ok((b, _)) if b.personality().survives(&b.missing_roles()) => {
                // It may start only if what is left really holds everything.
                let gone: Vec<MemberIdx> = (0..self.cfg.disks)
                    .filter(|&r| self.disk(r).is_gone())
                    .map(MemberIdx)
                    .collect();
                if !self.personality.survives(&gone) {
                    return Err(format!(
                        "over budget (gone {gone:?}) the array still assembled with missing {:?}",
                        b.missing_roles()
                    ));
                }
                self.array = Some(b);
                Ok(())
            }
            Ok((b, _)) => Err(format!(
                "assembly returned an array that cannot run: missing {:?}",
                b.missing_roles()
            )),
            Err(e) => {
                if e.to_string().is_empty() {
                    return Err("assembly failed without a message".into());
                }
                self.stats.expected_errors += 1;
                Ok(())
            }
        }
    }

    // ----- power cut ------------------------------------------------------------------

    /// Cut the power in the middle of a write on a whole array, bring it back, assemble,
    /// resync: every byte of that write is old or new, everything else is intact.
    pub(super) fn crash(&mut self) -> Res {
        self.crashed = true;
        if !self.budget.is_clear() || self.array().is_degraded() {
            return Ok(());
        }
        self.stats.crashes += 1;
        let (off, len) = self.random_range();
        let mut data = vec![0u8; len as usize];
        self.wl.fill(&mut data);
        let window = 4 * self.cfg.disks as u64 + 8;
        let at = self.world.io_seq() + self.fr.range_incl(1, window);
        self.world.arm_power_cut(at);
        let r = self.array().write(off, &data);
        let cut_during = !self.world.is_powered();
        self.world.cut_power();
        // A write acknowledged before the cut must come back whole. One acknowledged while
        // the cut failed members whose failure could not be recorded anywhere is checked
        // after recovery (md would not have acknowledged it).
        let acked_in_cut = match (&r, cut_during) {
            (Ok(()), false) => {
                self.model.write_ok(off, &data);
                false
            }
            (Ok(()), true) => {
                self.model.write_uncertain(off, &data);
                true
            }
            (Err(_), _) => {
                self.model.write_uncertain(off, &data);
                false
            }
        };
        self.world.note(format!(
            "write {off}+{len} in the power cut: {:?}, cut during it: {cut_during}",
            r.as_ref().map_err(|e| e.to_string())
        ));
        let acked_in_cut = acked_in_cut.then_some((off, data));
        self.after_power_cut(acked_in_cut)
    }

    /// md's MD_SB_CHANGE_PENDING under a power cut: a member fails and its superblock
    /// update is slow (held open on every other disk) while writes that skip the member
    /// run; the power goes out before the update lands. A write acknowledged before the
    /// cut must survive it, although the failed member comes back looking in sync.
    ///
    /// The engine is driven from threads here, one step at a time (each writer finishes
    /// or waits for the superblocks before the next starts), so the IO sequence replays.
    pub(super) fn crash_during_failure_update(&mut self) -> Res {
        self.crashed = true;
        // With a bitmap a write waits for the superblock lock the update holds, before
        // any member IO: nothing to race. A clean array's first write does the same.
        if !self.budget.is_clear()
            || self.array().is_degraded()
            || self.personality.max_degraded() == 0
            || self.cfg.bitmap
        {
            return Ok(());
        }
        self.op_write()?;
        if !self.array().is_dirty() {
            return Ok(());
        }
        self.stats.crashes += 1;
        let victim = self.fr.index(self.cfg.disks);
        let n = self.fr.range_incl(1, 3);
        let writes: Vec<(u64, Vec<u8>)> = (0..n)
            .map(|_| {
                let (off, len) = self.random_range();
                let mut data = vec![0u8; len as usize];
                self.wl.fill(&mut data);
                (off, data)
            })
            .collect();
        let disks: Vec<Arc<SimDisk>> = (0..self.cfg.disks).map(|r| self.disk(r).clone()).collect();
        for (r, d) in disks.iter().enumerate() {
            if r != victim {
                d.hold_writes((0, self.data_offset_bytes));
            }
        }
        self.world.note(format!(
            "failing member {victim} with its superblock update held; writes {:?}",
            writes
                .iter()
                .map(|(o, d)| (*o, d.len()))
                .collect::<Vec<_>>()
        ));
        let a = self.array.as_ref().expect("array is assembled");
        // The writes below run at once on threads: a raid4/5/6 partial-stripe write that
        // leads a join would wait real time for joiners, and what the others did meanwhile
        // would differ between two runs of a seed. Joining has its own tests (join.rs).
        let _ = a.set_tunable("join_wait_us", "0");
        let world = self.world.clone();
        let release = || disks.iter().for_each(|d| d.release_writes());
        // Per write: finished before the cut, and its result.
        let outcome: Vec<(bool, Result<(), String>)> = std::thread::scope(|sc| {
            let failing = sc.spawn(|| a.fail_member(MemberIdx(victim)));
            while disks.iter().map(|d| d.held_writes()).sum::<u32>() == 0 && !failing.is_finished()
            {
                std::thread::yield_now();
            }
            let mut waiting = 0;
            let mut running = Vec::new();
            for (off, data) in &writes {
                let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let flag = done.clone();
                let h = sc.spawn(move || {
                    let r = a.write(*off, data).map_err(|e| e.to_string());
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                    r
                });
                // No timing: it finishes, or it waits for the superblocks (for good).
                while !done.load(std::sync::atomic::Ordering::SeqCst)
                    && a.writes_waiting_for_superblocks() <= waiting
                {
                    std::thread::yield_now();
                }
                if !done.load(std::sync::atomic::Ordering::SeqCst) {
                    waiting += 1;
                }
                running.push((done, h));
            }
            world.cut_power();
            let before: Vec<bool> = running
                .iter()
                .map(|(d, _)| d.load(std::sync::atomic::Ordering::SeqCst))
                .collect();
            release();
            let _ = failing.join().expect("fail_member panicked");
            running
                .into_iter()
                .zip(before)
                .map(|((_, h), b)| (b, h.join().expect("a write panicked")))
                .collect()
        });
        let mut acked = Vec::new();
        for ((off, data), (before_cut, r)) in writes.into_iter().zip(outcome) {
            match (before_cut, r) {
                (true, Ok(())) => {
                    acked.push(off);
                    self.model.write_ok(off, &data);
                }
                (true, Err(e)) => {
                    return Err(format!(
                        "write at {off}+{} failed before the power cut, within the fault                          budget: {e}",
                        data.len()
                    ))
                }
                (false, _) => self.model.write_uncertain(off, &data),
            }
        }
        self.world.note(format!(
            "power cut during member {victim}'s failure update; acknowledged before it:              {acked:?}"
        ));
        self.after_power_cut(None)
    }

    /// The power is out: the array dies with it, comes back on what the disks hold, is
    /// resynced and checked. `acked_in_cut`: a write acknowledged while the cut failed
    /// members, which must have survived.
    fn after_power_cut(&mut self, acked_in_cut: Option<(u64, Vec<u8>)>) -> Res {
        // The array object dies with the power; its drop sees only dead disks.
        drop(self.array.take());
        self.world.power_on();
        let mut order: Vec<usize> = (0..self.cfg.disks).collect();
        self.fr.shuffle(&mut order);
        let clock = self.world.engine_clock();
        let devs = |force: bool| AssembleOptions {
            force,
            clock: clock.clone(),
            ..Default::default()
        };
        let list: Vec<Arc<dyn Member>> = order
            .iter()
            .map(|&r| self.disk(r).clone() as Arc<dyn Member>)
            .collect();
        let events: Vec<Option<u64>> = (0..self.cfg.disks)
            .map(|r| Self::events_of(self.disk(r)))
            .collect();
        let (b, rep) = match assemble(list.clone(), &devs(false)) {
            Ok((b, rep)) if !b.is_degraded() => (b, rep),
            other => {
                let what = match other {
                    Ok((b, _)) => format!("left out members {:?}", b.missing_roles()),
                    Err(e) => format!("failed: {e}"),
                };
                self.finding(
                    "events-off-by-one-refused",
                    format!(
                        "after a power cut during a superblock update, assembly {what} (events \
                     {events:?}); md and mdadm accept members one event behind"
                    ),
                )?;
                let (b, rep) = assemble(list, &devs(true))
                    .map_err(|e| format!("forced assembly after a power cut failed: {e}"))?;
                if b.is_degraded() {
                    // md would have taken every member and resynced; from here the run
                    // would test the engine's deviation, not the array. End it.
                    self.array = Some(b);
                    self.ended = true;
                    return Ok(());
                }
                (b, rep)
            }
        };
        self.array = Some(b);
        {
            // raid0 too: it clears the unclean mark (there is nothing to compare).
            self.stats.resyncs += 1;
            let n = self
                .array()
                .resync()
                .map_err(|e| format!("resync after the power cut failed: {e}"))?;
            self.world.note(format!(
                "after the power cut: unclean {}, resync found {n} mismatched sectors",
                rep.unclean
            ));
            if !rep.unclean && n > 0 {
                return Err(format!(
                    "assembly said the array was clean after the power cut, but resync \
                     found {n} mismatches"
                ));
            }
        }
        // Every byte the cut write touched is now one of its legal values; take what the
        // (consistent) array says as the truth.
        for (s, e) in self.model.uncertain_ranges() {
            let mut buf = vec![0u8; (e - s) as usize];
            self.array()
                .read(s, &mut buf)
                .map_err(|e| format!("read after the power cut failed: {e}"))?;
            self.model
                .check(s, &buf)
                .map_err(|e| format!("after the power cut: {e}"))?;
            self.model.settle(s, &buf);
        }
        if let Some((off, data)) = acked_in_cut {
            let len = data.len();
            let mut got = vec![0u8; data.len()];
            self.array()
                .read(off, &mut got)
                .map_err(|e| format!("read after the power cut failed: {e}"))?;
            if got != data {
                let first = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
                self.finding(
                    "acked-write-lost-in-power-cut",
                    format!(
                        "a write acknowledged during a power cut ({off}+{len}) was lost from \
                     byte {} on: it was acknowledged although the member failures it saw \
                     could not be recorded in any superblock",
                        off + first as u64
                    ),
                )?;
            }
        }
        // The resync (bitmap-guided where there is a bitmap) must have covered every
        // stripe the cut left inconsistent.
        self.full_check_clean("the resync after a power cut")?;
        if self.cfg.level != Level::Raid0 {
            match self.array().resync() {
                Ok(0) => {}
                Ok(n) => return Err(format!("second resync after the power cut found {n}")),
                Err(e) => return Err(format!("second resync after the power cut failed: {e}")),
            }
        }
        self.verify_all("check after the power cut")
    }
}
