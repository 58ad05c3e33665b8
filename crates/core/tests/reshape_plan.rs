//! The reshape planner (`ReshapeState::begin`, `next_step`, `advance`) against a model of the
//! members' rows: which stripe of which geometry each member sector holds. A reshape is run
//! to its end with power cuts possible after every step; at every instant each array sector
//! must be readable where the recorded (durable) position says it is: in the new geometry
//! from rows written before the last checkpoint, in the old from rows never overwritten.

use proptest::prelude::*;
use std::collections::HashMap;
use uraid_core::geometry::{
    ArrayGeometry, ParityGeometry, ReshapeState, ReshapeStep, ReshapeWalk, Side,
};
use uraid_core::Level;

fn geometry(level: Level, layout: u32, chunk: u64, disks: usize, dev: u64) -> ParityGeometry {
    ParityGeometry::new(&ArrayGeometry {
        level,
        layout,
        chunk_sectors: chunk,
        raid_disks: disks,
        dev_sectors: dev,
        member_sectors: Vec::new(),
    })
    .unwrap()
}

/// What a member row (one sector, counted from the old data offset) holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Old(u64),
    New(u64),
}

struct Model {
    rows: HashMap<i64, Row>,
    /// New-geometry stripes written since the last checkpoint (not yet durable).
    unflushed: Vec<u64>,
    /// New stripes durable (written before a checkpoint).
    durable: std::collections::HashSet<u64>,
}

impl Model {
    fn new(st: &ReshapeState) -> Model {
        let mut rows = HashMap::new();
        let old = &st.old;
        for r in 0..st.dev_sectors() {
            rows.insert(r as i64, Row::Old(r / old.chunk_sectors));
        }
        Model {
            rows,
            unflushed: Vec::new(),
            durable: Default::default(),
        }
    }

    /// Every sector of `[start, end)` is readable in `side` from rows holding it.
    fn check_readable(&self, st: &ReshapeState, start: u64, end: u64, side: Side) {
        let g = st.geometry(side);
        let old_end = st.old.stripes() * st.old.stripe_data_sectors();
        let mut s = start;
        while s < end {
            let stripe = s / g.stripe_data_sectors();
            match side {
                Side::Old => {
                    if s < old_end {
                        for k in 0..g.chunk_sectors {
                            let row = (stripe * g.chunk_sectors + k) as i64;
                            assert_eq!(
                                self.rows.get(&row),
                                Some(&Row::Old(stripe)),
                                "old stripe {stripe} (array sector {s}) overwritten at row {row}"
                            );
                        }
                    }
                }
                Side::New => assert!(
                    self.durable.contains(&stripe),
                    "array sector {s} is recorded as new but new stripe {stripe} is not durable"
                ),
            }
            s = (stripe + 1) * g.stripe_data_sectors();
        }
    }

    /// The state a power cut leaves: the recorded position `safe` says where each sector is.
    fn check_crash(&self, st: &ReshapeState, safe: u64) {
        let end = st.new_array_sectors().max(st.array_sectors());
        let (old, new) = if st.backwards {
            ((0, safe), (safe, st.array_sectors()))
        } else {
            ((safe, st.array_sectors()), (0, safe))
        };
        self.check_readable(st, old.0, old.1.max(old.0), Side::Old);
        self.check_readable(st, new.0, new.1.min(end).max(new.0), Side::New);
    }
}

fn run(st: &mut ReshapeState, max: u64) -> Result<usize, String> {
    let m = Model::new(st);
    run_from(st, max, m)
}

fn run_from(st: &mut ReshapeState, max: u64, mut m: Model) -> Result<usize, String> {
    let mut safe = st.position_sectors;
    let mut steps = 0;
    loop {
        steps += 1;
        assert!(steps < 1_000_000, "no progress");
        let step = st.next_step(safe, max).map_err(|e| e.to_string())?;
        match step {
            ReshapeStep::Done => break,
            ReshapeStep::Checkpoint => {
                let moved: Vec<u64> = std::mem::take(&mut m.unflushed);
                m.durable.extend(moved);
                safe = st.position_sectors;
            }
            ReshapeStep::Copy { start, sectors } => {
                assert_eq!(start % st.window_unit(), 0);
                assert_eq!(sectors % st.window_unit(), 0);
                assert!(sectors > 0);
                // The window is read from intact old rows first.
                m.check_readable(st, start, start + sectors, Side::Old);
                let g = st.new.clone();
                let first = start / g.stripe_data_sectors();
                let last = (start + sectors) / g.stripe_data_sectors();
                for stripe in first..last {
                    for k in 0..g.chunk_sectors {
                        let row = st.new_offset_sectors + (stripe * g.chunk_sectors + k) as i64;
                        m.rows.insert(row, Row::New(stripe));
                    }
                    m.unflushed.push(stripe);
                }
                st.advance(step);
            }
        }
        // A power cut here: the unflushed stripes may all have landed (the model wrote
        // them), and the superblocks say `safe`.
        m.check_crash(st, safe);
    }
    m.durable.extend(std::mem::take(&mut m.unflushed));
    m.check_readable(st, 0, st.new_array_sectors(), Side::New);
    Ok(steps)
}

fn shapes() -> impl Strategy<Value = (ParityGeometry, ParityGeometry)> {
    (
        prop_oneof![Just(Level::Raid5), Just(Level::Raid6), Just(Level::Raid4)],
        0u32..4,
        0u32..4,
        0usize..3,
        0usize..3,
        0usize..3,
        0usize..4,
        8u64..40,
    )
        .prop_map(|(level, la, lb, ca, cb, base, grow, rows)| {
            let chunks = [8u64, 16, 32];
            let min = if level == Level::Raid6 { 4 } else { 3 };
            let (oc, nc) = (chunks[ca], chunks[cb]);
            let dev = rows * 32;
            let layout = |l: u32| match level {
                Level::Raid4 => 5,
                _ => l,
            };
            (
                geometry(level, layout(la), oc, min + base, dev),
                geometry(level, layout(lb), nc, min + base + grow, dev),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Forwards (the data offset moves down): every grow or same-size restripe with at
    /// least one row of room finishes and is safe at every instant.
    #[test]
    fn forwards_is_safe_at_every_instant(
        (old, new) in shapes(),
        gap_rows in 1i64..6,
        max_units in 1u64..8,
    ) {
        let gap = gap_rows * old.chunk_sectors.max(new.chunk_sectors) as i64;
        let mut st = ReshapeState::begin(old, new, -gap).unwrap();
        prop_assert_eq!(st.position_sectors, 0);
        let max = max_units * st.window_unit();
        run(&mut st, max).unwrap();
        prop_assert!(st.is_done());
    }

    /// Backwards (the data offset moves up): a same-size restripe (chunk or layout) runs
    /// from the end down to 0, safe at every instant.
    #[test]
    fn backwards_is_safe_at_every_instant(
        (old, new) in shapes(),
        gap_rows in 1i64..6,
        max_units in 1u64..8,
    ) {
        let mut new = new;
        new.raid_disks = old.raid_disks;
        let gap = gap_rows * old.chunk_sectors.max(new.chunk_sectors) as i64;
        let mut st = ReshapeState::begin(old, new, gap).unwrap();
        prop_assert!(st.backwards);
        prop_assert_eq!(st.position_sectors, st.array_sectors());
        let max = max_units * st.window_unit();
        run(&mut st, max).unwrap();
        prop_assert_eq!(st.position_sectors, 0);
    }

    /// A reshape picked up mid-way from any recorded position (a crash, or Linux md
    /// stopped) runs on to the end, as safe as one started from 0.
    #[test]
    fn continuing_from_a_recorded_position_is_safe(
        (old, new) in shapes(),
        gap_rows in 1i64..6,
        cut in 0u64..1000,
    ) {
        let gap = gap_rows * old.chunk_sectors.max(new.chunk_sectors) as i64;
        let mut st = ReshapeState::begin(old, new, -gap).unwrap();
        let unit = st.window_unit();
        let mut safe = 0;
        // Run part of the way, checkpointing as the planner asks.
        for _ in 0..cut {
            match st.next_step(safe, unit).unwrap() {
                ReshapeStep::Done => break,
                ReshapeStep::Checkpoint => safe = st.position_sectors,
                s => st.advance(s),
            }
        }
        // The crash: the state as the superblocks record it.
        st.position_sectors = safe;
        st.check().unwrap();
        // The model starts from an array whose rows below `safe` are already new.
        let mut m = Model::new(&st);
        let g = st.new.clone();
        for stripe in 0..safe / g.stripe_data_sectors() {
            for k in 0..g.chunk_sectors {
                m.rows.insert(st.new_offset_sectors + (stripe * g.chunk_sectors + k) as i64, Row::New(stripe));
            }
            m.durable.insert(stripe);
        }
        m.check_crash(&st, safe);
        let mut rest = st.clone();
        run_from(&mut rest, 4 * unit, m).unwrap();
        prop_assert!(rest.is_done());
    }
}

/// No room to move (offset 0) is mdadm's backup-file case, refused by name.
#[test]
fn an_in_place_reshape_is_refused_with_the_reason() {
    let old = geometry(Level::Raid5, 2, 16, 3, 1024);
    let new = geometry(Level::Raid5, 2, 16, 4, 1024);
    let e = ReshapeState::begin(old.clone(), new.clone(), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("backup file"), "{e}");
    // Less than one row of the larger chunk: refused before anything moves.
    let e = ReshapeState::begin(old, geometry(Level::Raid5, 2, 64, 3, 1024), -8)
        .unwrap_err()
        .to_string();
    assert!(e.contains("less than the first stripe row"), "{e}");
}

/// A grow gains room as it goes: after the first windows it needs checkpoints ever more
/// rarely (md's reshape_safe), so a 3 -> 4 grow with 2 rows of room takes far fewer
/// checkpoints than windows.
#[test]
fn a_grow_needs_fewer_checkpoints_as_it_goes() {
    let old = geometry(Level::Raid5, 2, 8, 3, 8 * 512);
    let new = geometry(Level::Raid5, 2, 8, 4, 8 * 512);
    let mut st = ReshapeState::begin(old, new, -16).unwrap();
    let unit = st.window_unit();
    let (mut safe, mut copies, mut checkpoints) = (0, 0, 0);
    loop {
        match st.next_step(safe, unit).unwrap() {
            ReshapeStep::Done => break,
            ReshapeStep::Checkpoint => {
                checkpoints += 1;
                safe = st.position_sectors
            }
            s => {
                copies += 1;
                st.advance(s)
            }
        }
    }
    assert_eq!(copies, 512);
    assert!(
        checkpoints < copies / 4,
        "{checkpoints} checkpoints for {copies} windows"
    );
    assert!(checkpoints >= 2, "{checkpoints}");
}
