//! Every level and layout against a naive byte model: random writes read back equal; then
//! with any set of members failed within the level's tolerance, reads still match, more
//! writes land, and a re-assembly from the superblocks sees the same bytes.
//!
//! Seeds: `URAID_SEED=n` replays one seed; `URAID_FULL=1` runs more seeds per config.

use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::Arc;
use uraid_core::{Level, MemberIdx};
use uraid_engine::{assemble, Array, AssembleOptions, Member};
use uraid_testkit::engine::*;

fn check_all(a: &Array, model: &[u8], ctx: &str) {
    let mut got = vec![0u8; model.len()];
    a.read(0, &mut got)
        .unwrap_or_else(|e| panic!("{ctx}: full read failed: {e}"));
    if got != model {
        let first = got.iter().zip(model).position(|(x, y)| x != y).unwrap();
        panic!(
            "{ctx}: array differs from the model at byte {first} (sector {})",
            first / 512
        );
    }
}

fn run_one(cfg: &Config, seed: u64) {
    run_tuned(cfg, seed, &[])
}

/// `tunables`: md sysfs knobs set on raid4/5/6 arrays after create.
fn run_tuned(cfg: &Config, seed: u64, tunables: &[(&str, &str)]) {
    let ctx = format!("{cfg:?} seed {seed}");
    let mut rng = rng(seed);
    let mems = mem_members(cfg, "m");
    let a = uraid_engine::create(as_members(&mems), &create_opts(cfg))
        .unwrap_or_else(|e| panic!("{ctx}: create: {e}"));
    if matches!(cfg.level, Level::Raid4 | Level::Raid5 | Level::Raid6) {
        for (k, v) in tunables {
            a.set_tunable(k, v)
                .unwrap_or_else(|e| panic!("{ctx}: {k}={v}: {e}"));
        }
    }
    let size = a.size_bytes();
    assert!(size > 0, "{ctx}: empty array");
    let mut model = vec![0u8; size as usize];
    let max_len = (cfg.chunk_sectors.max(8) * 512 * cfg.disks as u64 * 3).min(size);
    let apply =
        |a: &Array, model: &mut Vec<u8>, rng: &mut rand::rngs::StdRng, n: usize, phase: &str| {
            for i in 0..n {
                let (off, data) = random_write(rng, size, max_len);
                a.write(off, &data).unwrap_or_else(|e| {
                    panic!("{ctx}: {phase} write {i} at {off}+{}: {e}", data.len())
                });
                model[off as usize..off as usize + data.len()].copy_from_slice(&data);
                // Spot-check a random range now and then.
                if i % 4 == 0 {
                    let (roff, rdata) = random_write(rng, size, max_len);
                    let mut got = vec![0u8; rdata.len()];
                    a.read(roff, &mut got)
                        .unwrap_or_else(|e| panic!("{ctx}: {phase} read: {e}"));
                    assert!(
                        got[..] == model[roff as usize..roff as usize + got.len()],
                        "{ctx}: {phase} read at {roff}+{} differs",
                        got.len()
                    );
                }
            }
        };
    apply(&a, &mut model, &mut rng, 24, "healthy");
    check_all(&a, &model, &format!("{ctx} healthy"));

    // Fail a random set of members within tolerance.
    let mut roles: Vec<usize> = (0..cfg.disks).collect();
    roles.shuffle(&mut rng);
    let want = rng.gen_range(0..=a.personality().max_degraded());
    let mut failed: Vec<MemberIdx> = Vec::new();
    for r in roles {
        if failed.len() == want {
            break;
        }
        let mut trial = failed.clone();
        trial.push(MemberIdx(r));
        if a.personality().survives(&trial) {
            a.fail_member(MemberIdx(r))
                .unwrap_or_else(|e| panic!("{ctx}: fail {r}: {e}"));
            failed = trial;
        }
    }
    check_all(&a, &model, &format!("{ctx} degraded {failed:?}"));
    apply(&a, &mut model, &mut rng, 16, "degraded");
    check_all(
        &a,
        &model,
        &format!("{ctx} degraded {failed:?} after writes"),
    );
    a.stop().unwrap_or_else(|e| panic!("{ctx}: stop: {e}"));
    drop(a);

    // Re-assemble from every member, failed ones included: their superblocks are stale or
    // marked faulty by the others, so assembly must leave them out.
    let devs: Vec<Arc<dyn Member>> = mems.iter().map(|m| m.clone() as Arc<dyn Member>).collect();
    let (b, _rep) = assemble(devs, &AssembleOptions::default())
        .unwrap_or_else(|e| panic!("{ctx}: re-assemble: {e}"));
    failed.sort();
    assert_eq!(
        b.missing_roles(),
        failed,
        "{ctx}: re-assembly picked other members"
    );
    check_all(&b, &model, &format!("{ctx} re-assembled"));
    assert!(
        !b.meta().is_dirty(),
        "{ctx}: clean stop left the array dirty"
    );
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("URAID_SEED") {
        return vec![s.parse().expect("URAID_SEED is a number")];
    }
    let n = if std::env::var("URAID_FULL").is_ok() {
        8
    } else {
        1
    };
    let base: u64 = rand::random::<u16>() as u64;
    (0..n).map(|i| base * 1000 + i).collect()
}

#[test]
fn every_level_and_layout_matches_the_model() {
    for cfg in all_configs() {
        for seed in seeds() {
            let r = std::panic::catch_unwind(|| run_one(&cfg, seed));
            if r.is_err() {
                panic!("failed: {cfg:?} with seed {seed} (replay: URAID_SEED={seed})");
            }
        }
    }
}

/// Every raid4/5/6 knob away from its default, one setting per run.
#[test]
fn raid456_matches_the_model_with_every_knob_setting() {
    let settings: &[&[(&str, &str)]] = &[
        &[
            ("group_thread_cnt", "2"),
            ("skip_copy", "1"),
            ("stripe_cache_size", "8"),
        ],
        &[("rmw_level", "0"), ("batching", "0")],
        &[
            ("rmw_level", "2"),
            ("stripe_cache_size", "4096"),
            ("group_thread_cnt", "1"),
        ],
    ];
    for cfg in all_configs()
        .into_iter()
        .filter(|c| matches!(c.level, Level::Raid4 | Level::Raid5 | Level::Raid6))
    {
        for seed in seeds() {
            for t in settings {
                let r = std::panic::catch_unwind(|| run_tuned(&cfg, seed, t));
                if r.is_err() {
                    panic!("failed: {cfg:?} {t:?} with seed {seed} (replay: URAID_SEED={seed})");
                }
            }
        }
    }
}
