//! Progress of long sync work on the terminal: percent, speed and time left, redrawn in
//! place on a terminal and printed every 10% otherwise.

use anyhow::Result;
use std::io::{IsTerminal, Write};
use std::time::Instant;
use uraid_engine::{Array, SyncKind, SyncLimits, SyncProgress, Throttle};

pub struct Bar {
    label: String,
    tty: bool,
    last_draw: Option<Instant>,
    last_decile: u32,
    quiet: bool,
}

fn hms(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

impl Bar {
    pub fn new(label: &str, quiet: bool) -> Bar {
        Bar {
            label: label.to_string(),
            tty: std::io::stderr().is_terminal(),
            last_draw: None,
            last_decile: 0,
            quiet,
        }
    }

    pub fn update(&mut self, p: &SyncProgress, bytes_per_s: f64) {
        if self.quiet {
            return;
        }
        let pct = p.percent();
        let left = (p.total_units - p.done_units.min(p.total_units)) as f64 * p.unit_bytes as f64;
        let eta = if bytes_per_s > 0.0 {
            left / bytes_per_s
        } else {
            0.0
        };
        let mb_s = bytes_per_s / 1e6;
        if self.tty {
            if self
                .last_draw
                .is_some_and(|t| t.elapsed().as_millis() < 200)
                && pct < 100.0
            {
                return;
            }
            self.last_draw = Some(Instant::now());
            let width = 30;
            let filled = ((pct / 100.0) * width as f64) as usize;
            let bar: String = (0..width)
                .map(|i| {
                    if i < filled {
                        '='
                    } else if i == filled {
                        '>'
                    } else {
                        ' '
                    }
                })
                .collect();
            eprint!(
                "\r{} [{bar}] {pct:5.1}% {mb_s:8.1} MB/s  ETA {}  ",
                self.label,
                hms(eta)
            );
            let _ = std::io::stderr().flush();
        } else {
            let decile = (pct / 10.0) as u32;
            if decile > self.last_decile {
                self.last_decile = decile;
                eprintln!(
                    "{}: {pct:.0}% ({mb_s:.1} MB/s, {} left)",
                    self.label,
                    hms(eta)
                );
            }
        }
    }

    pub fn finish(&self, msg: &str) {
        if self.quiet {
            return;
        }
        if self.tty {
            eprintln!();
        }
        eprintln!("{}: {msg}", self.label);
    }
}

/// Run a sync pass with md's speed limits and a progress bar; returns mismatched sectors.
pub fn run_sync(array: &Array, kind: SyncKind, limits: SyncLimits, quiet: bool) -> Result<u64> {
    let mut bar = Bar::new(kind.name(), quiet);
    let mut throttle = Throttle::new(limits);
    let started = Instant::now();
    let mut zero_bytes = 0;
    let r = array.run_sync(kind, |p| {
        let speed = throttle.pace(array, p);
        bar.update(p, speed);
        zero_bytes = p.zero_bytes;
    });
    match &r {
        Ok(m) => bar.finish(&format!(
            "done in {:.1} s{}{}",
            started.elapsed().as_secs_f64(),
            if matches!(kind, SyncKind::Check | SyncKind::Repair | SyncKind::Resync) {
                format!(", {m} mismatched sectors")
            } else {
                String::new()
            },
            if zero_bytes >= 1 << 20 {
                format!(", {} MiB skipped (zeros on every member)", zero_bytes >> 20)
            } else {
                String::new()
            }
        )),
        // The caller reports the error itself; just end the bar's line.
        Err(_) if bar.tty && !bar.quiet => eprintln!(),
        Err(_) => {}
    }
    Ok(r?)
}
