//! Lost and misdirected writes: a member acknowledges a write and drops it, or stores it
//! at the wrong place. Without checksums no read can see either; md's expectations are
//! that `check` counts a mismatch in every unit they left inconsistent (nothing is called
//! clean that is not) and, for raid6, that `repair` puts the right data back (one bad
//! block per stripe is located from the P and Q syndromes). raid1/4/5/10 cannot tell
//! which block is right, so there the simulator rewrites the units (as a user restoring
//! them would) and the array must then be consistent again.

use super::*;

impl Simulator<'_> {
    pub(super) fn lost_or_misdirected_write(&mut self) -> Res {
        if self.personality.max_degraded() == 0 {
            return Ok(());
        }
        let units = layout::units(&self.personality);
        let u = self.lw.range(0, units);
        let members = layout::unit_members(&self.personality, u);
        let m = *self.lw.pick(&members);
        let Some((msec, sectors)) = layout::member_block(&self.personality, u, m) else {
            return Ok(());
        };
        let dob = self.data_offset_bytes;
        let range = (
            dob + msec * SECTOR_BYTES,
            dob + (msec + sectors) * SECTOR_BYTES,
        );
        // A misdirected write lands on the same member's block of another unit.
        let mut target = None;
        if self.lw.chance(50) {
            for _ in 0..8 {
                let u2 = self.lw.range(0, units);
                if u2 == u {
                    continue;
                }
                if let Some((ms2, n2)) = layout::member_block(&self.personality, u2, m) {
                    if n2 == sectors {
                        target = Some((u2, ms2));
                        break;
                    }
                }
            }
        }
        let (start, len) = layout::unit_span(&self.personality, u);
        let (off, bytes) = (start * SECTOR_BYTES, len * SECTOR_BYTES);
        // What the other unit holds now, to restore it where the level cannot.
        let other = match target {
            Some((u2, _)) => {
                let (s2, l2) = layout::unit_span(&self.personality, u2);
                let mut buf = vec![0u8; (l2 * SECTOR_BYTES) as usize];
                self.array()
                    .read(s2 * SECTOR_BYTES, &mut buf)
                    .map_err(|e| format!("read before a misdirected write failed: {e}"))?;
                self.model
                    .check(s2 * SECTOR_BYTES, &buf)
                    .map_err(|e| format!("read before a misdirected write: {e}"))?;
                Some((u2, s2 * SECTOR_BYTES, buf))
            }
            None => None,
        };
        let (effect, kind) = match target {
            Some((_, ms2)) => (
                Effect::Misdirect {
                    delta_bytes: (ms2 as i64 - msec as i64) * SECTOR_BYTES as i64,
                },
                FaultKind::MisdirectedWrite,
            ),
            None => (Effect::LoseWrite, FaultKind::LostWrite),
        };
        let disk = self.disk(m.0).clone();
        let fired_before = self.world.counts().get(kind);
        disk.add_rule(FaultRule {
            effect,
            ops: OpFilter::Write,
            from_io: disk.ios(),
            range: Some(range),
            times: Some(1),
        });
        let mut data = vec![0u8; bytes as usize];
        self.wl.fill(&mut data);
        self.stats.writes += 1;
        self.stats.bytes_written += bytes;
        let r = self.array().write(off, &data);
        disk.disarm(effect);
        r.map_err(|e| format!("write of unit {u} at {off}+{bytes} failed within budget: {e}"))?;
        self.model.write_ok(off, &data);
        if self.world.counts().get(kind) == fired_before {
            self.world.note(format!(
                "the write of unit {u} never reached member {m}'s block"
            ));
            return Ok(());
        }
        let mut hit = vec![u];
        hit.extend(other.as_ref().map(|o| o.0));
        for &x in &hit {
            self.budget.fault_unit(x, m.0);
        }
        let what = format!("{} on member {m} in unit {u}", kind.name());
        // Unit by unit: each one it made inconsistent must count.
        for &x in &hit {
            let (s, n) = layout::unit_span(&self.personality, x);
            match self.hooks.check_range(self.array(), s, n) {
                None => break,
                Some(Ok(0)) => {
                    return Err(format!(
                        "check of unit {x} found nothing after a {what}: an inconsistent \
                         unit was reported clean"
                    ))
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("check of unit {x} failed: {e}")),
            }
        }
        let Some(checked) = self.hooks.scrub(self.array(), false) else {
            return Ok(());
        };
        let checked = checked.map_err(|e| format!("check failed: {e}"))?;
        let bound = hit.len() as u64 * (sectors + 1024);
        if checked < hit.len() as u64 || checked > bound {
            return Err(format!(
                "check counted {checked} mismatched sectors after a {what} (units {hit:?}, at \
                 most {bound})"
            ));
        }
        self.stats.resyncs += 1;
        let raid6 = matches!(&self.personality, Personality::Parity(g) if g.parity_disks() == 2);
        if raid6 {
            let repaired = match self.hooks.scrub(self.array(), true) {
                Some(r) => r.map_err(|e| format!("repair failed: {e}"))?,
                None => return Ok(()),
            };
            if repaired != checked {
                return Err(format!(
                    "check counted {checked} mismatched sectors after a {what} but repair \
                     {repaired}"
                ));
            }
            self.stats.scrub_repairs += repaired;
            for &x in &hit {
                let (s, n) = layout::unit_span(&self.personality, x);
                self.read_check(s * SECTOR_BYTES, n * SECTOR_BYTES, "raid6 repair")
                    .map_err(|e| {
                        format!("after a {what}, raid6 repair did not put the data back: {e}")
                    })?;
            }
        } else {
            // Which block is right is unknowable here: write the units again.
            self.array()
                .write(off, &data)
                .map_err(|e| format!("rewrite of unit {u} failed: {e}"))?;
            if let Some((_, o2, buf)) = &other {
                self.array()
                    .write(*o2, buf)
                    .map_err(|e| format!("rewrite of the misdirected-to unit failed: {e}"))?;
            }
        }
        self.budget.units_repaired();
        match self.hooks.scrub(self.array(), false) {
            Some(Ok(0)) | None => {}
            Some(Ok(n)) => {
                return Err(format!(
                    "{n} mismatched sectors left after a {what} was {}",
                    if raid6 { "repaired" } else { "rewritten" }
                ))
            }
            Some(Err(e)) => return Err(format!("check after a {what} failed: {e}")),
        }
        self.verify_all("check after a lost or misdirected write")
    }
}
