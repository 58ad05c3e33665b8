//! The subcommands.

use crate::grow_request::parse_layout;
use crate::open::{open_all, open_member};
use crate::report;
use crate::Paths;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Read, Write};
use std::sync::Arc;
use uraid_core::geometry::{parse_chunk, parse_size_bytes};
use uraid_core::Level;
use uraid_engine::{assemble as engine_assemble, Array, AssembleOptions, CreateOptions, Member};

#[derive(Args)]
pub struct CreateArgs {
    /// RAID level: 0, 1, 4, 5, 6, 10 (raid5, mirror, stripe... as mdadm spells them).
    #[arg(short, long)]
    pub level: String,
    /// Layout: raid5/6 left-asymmetric, right-asymmetric, left-symmetric (default),
    /// right-symmetric, parity-first, parity-last (raid6 also the *-6 forms);
    /// raid10 n2 (default), f2, o2, n3...; raid0 original or alternate.
    #[arg(short = 'p', long)]
    pub layout: Option<String>,
    /// Chunk size (K, M suffixes; a bare number is KiB, as in mdadm). Default 512K.
    #[arg(short, long)]
    pub chunk: Option<String>,
    /// Number of member roles; defaults to the number of devices given (less the spares).
    #[arg(short = 'n', long)]
    pub raid_devices: Option<usize>,
    /// The last N devices given are spares (mdadm's -x): each takes a role that fails,
    /// as a spare added later does.
    #[arg(short = 'x', long, value_name = "N", default_value_t = 0)]
    pub spare_devices: usize,
    /// Space to use on each member (K, M, G suffixes; a bare number is KiB).
    #[arg(short = 'z', long)]
    pub size: Option<String>,
    /// Array name.
    #[arg(short = 'N', long, default_value = "uraid")]
    pub name: String,
    /// Write-intent bitmap: internal or none.
    #[arg(short, long, default_value = "none")]
    pub bitmap: String,
    /// Bytes of array data one bitmap bit covers (K, M suffixes; a bare number is KiB, as
    /// in mdadm); default: mdadm's choice (at least 64M).
    #[arg(long)]
    pub bitmap_chunk: Option<String>,
    /// Seconds between bitmap daemon passes, which clear idle bits (mdadm's --delay).
    #[arg(short = 'd', long)]
    pub delay: Option<u32>,
    /// Do not compute parity or copy mirrors at creation (the members are known consistent).
    #[arg(long)]
    pub assume_clean: bool,
    /// Zero every member's data area first (the device's write-zeroes offload where it has
    /// one, all members at once), as mdadm's --write-zeroes: no initial sync is needed,
    /// and the array knows it was never written, so a recovery passes over what is still
    /// unwritten, on disks too.
    #[arg(long)]
    pub write_zeroes: bool,
    /// Set UUID (default: random).
    #[arg(long)]
    pub uuid: Option<String>,
    /// A write journal device for raid4/5/6 (md's raid5-cache, write-through): closes the
    /// write hole.
    #[arg(long, value_name = "DEV")]
    pub write_journal: Option<std::path::PathBuf>,
    /// How the array stays consistent after a crash, as mdadm's -k: resync, bitmap (an
    /// internal bitmap), journal (with --write-journal) or ppl (md's partial parity log on
    /// each member: closes the raid5 write hole without a journal device; raid5 only).
    #[arg(short = 'k', long, value_name = "POLICY")]
    pub consistency_policy: Option<String>,
    /// Superblock version, as mdadm's -e: 1.2 (4 KiB from the start, the default), 1.1 (at
    /// the start), 1.0 (at the end: the data starts at sector 0) or 0.90 (in the last
    /// 64 KiB-aligned 64 KiB, data from sector 0; at most 27 devices and 2 TiB per member).
    #[arg(short = 'e', long, default_value = "1.2")]
    pub metadata: String,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Create even if a device holds an array, a file system or a partition table, or
    /// the sizes differ, without asking (mdadm --run).
    #[arg(short = 'R', long)]
    pub run: bool,
    /// The same as --run for create (mdadm accepts either).
    #[arg(short, long)]
    pub force: bool,
    /// Flag member DEV write-mostly (md's devflags): raid1 reads go to the other members
    /// whenever one is in sync. Repeat it for more members. Unlike mdadm's -W, which
    /// applies to the devices after it, it names its device, which stays in the member
    /// list: `uraid create -l1 a.img b.img --write-mostly b.img`.
    #[arg(short = 'W', long = "write-mostly", value_name = "DEV")]
    pub write_mostly: Vec<String>,
    /// Flag member DEV failfast (md's devflags): raid1/raid10 fail it on its first IO error
    /// instead of repairing and retrying, unless it holds the last copy. Named as with
    /// --write-mostly.
    #[arg(long, value_name = "DEV")]
    pub failfast: Vec<String>,
    /// Member devices or files, in role order; `missing` leaves a role empty.
    #[arg(required = true)]
    pub devices: Vec<String>,
}

/// Each member's md flags from create's --write-mostly and --failfast, by position in
/// `devices`; a named device must be one of them (by path, as spelt or canonical).
fn create_member_flags(a: &CreateArgs) -> Result<Vec<uraid_engine::MemberFlags>> {
    let mut flags = vec![uraid_engine::MemberFlags::default(); a.devices.len()];
    let position = |name: &str, opt: &str| -> Result<usize> {
        let want = crate::locks::canonical(std::path::Path::new(name));
        a.devices
            .iter()
            .position(|d| {
                d != "missing"
                    && (d == name || crate::locks::canonical(std::path::Path::new(d)) == want)
            })
            .with_context(|| {
                format!(
                    "{opt} {name}: not one of the member devices given; list every member in \
                     role order and name the flagged ones with {opt} DEV"
                )
            })
    };
    for d in &a.write_mostly {
        flags[position(d, "--write-mostly")?].write_mostly = true;
    }
    for d in &a.failfast {
        flags[position(d, "--failfast")?].failfast = true;
    }
    Ok(flags)
}

#[derive(Args)]
pub struct ExamineArgs {
    #[arg(long)]
    pub json: bool,
    /// Print one mdadm.conf ARRAY line per array found (mdadm --examine --scan): on the
    /// devices given, else on those of the config's DEVICE lines (or /proc/partitions).
    #[arg(short, long)]
    pub scan: bool,
    #[command(flatten)]
    pub scan_args: crate::scan::ScanArgs,
    #[arg(required_unless_present = "scan")]
    pub devices: Vec<std::path::PathBuf>,
}

#[derive(Args)]
pub struct AssembleArgs {
    /// Start even with stale members, disagreeing superblocks, or dirty and degraded
    /// (raid4/5/6 not stopped cleanly with a member missing: stripes written at the crash
    /// may be wrong).
    #[arg(short, long)]
    pub force: bool,
    /// Open read-only (mdadm's -o): nothing is written to any member, not even the dirty
    /// flag; writes fail with EROFS.
    #[arg(short = 'o', long)]
    pub readonly: bool,
    /// Resync if the array was not stopped cleanly.
    #[arg(long)]
    pub resync: bool,
    #[arg(long)]
    pub json: bool,
    /// Find the members (mdadm --assemble --scan): the arrays of the config's ARRAY lines,
    /// or without any every array of this host on the DEVICE lines' devices (or those of
    /// /proc/partitions). Arguments then name the arrays to assemble (name or UUID).
    #[arg(short, long)]
    pub scan: bool,
    #[command(flatten)]
    pub scan_args: crate::scan::ScanArgs,
    /// Member devices or files; with --scan, the arrays' names or UUIDs.
    #[arg(required_unless_present = "scan")]
    pub devices: Vec<std::path::PathBuf>,
}

#[derive(Args)]
pub struct DetailArgs {
    #[arg(short, long)]
    pub force: bool,
    /// Open read-only (mdadm's -o): nothing is written to any member, not even the dirty
    /// flag; writes fail with EROFS.
    #[arg(short = 'o', long)]
    pub readonly: bool,
    #[arg(long)]
    pub json: bool,
    /// A running array: any of its member paths (--array) or its control socket.
    #[command(flatten)]
    pub target: crate::control::ArrayArgs,
    /// Member devices: of a running array (one is enough), else all of them, to assemble
    /// here and report.
    pub devices: Vec<std::path::PathBuf>,
}

#[derive(Args)]
pub struct ReadArgs {
    /// Byte offset in the array.
    #[arg(long, default_value = "0")]
    pub offset: String,
    /// Bytes to read (default: to the end of the array).
    #[arg(long)]
    pub length: Option<String>,
    /// Output file (default: stdout).
    #[arg(short, long)]
    pub output: Option<std::path::PathBuf>,
    /// Start even with stale members, or dirty and degraded (see assemble --force).
    #[arg(short, long)]
    pub force: bool,
    /// Open read-only (mdadm's -o; here only the long form, -o is --output): nothing is
    /// written to any member, not even the dirty flag.
    #[arg(long)]
    pub readonly: bool,
    #[arg(required = true)]
    pub devices: Vec<std::path::PathBuf>,
}

#[derive(Args)]
pub struct WriteArgs {
    /// Byte offset in the array.
    #[arg(long, default_value = "0")]
    pub offset: String,
    /// Input file (default: stdin).
    #[arg(short, long)]
    pub input: Option<std::path::PathBuf>,
    /// Start even with stale members, or dirty and degraded (see assemble --force).
    #[arg(short, long)]
    pub force: bool,
    /// Open read-only (mdadm's -o): nothing is written to any member, not even the dirty
    /// flag; writes fail with EROFS.
    #[arg(short = 'o', long)]
    pub readonly: bool,
    /// Write through the journal in this mode (write-through or write-back).
    #[arg(long, value_name = "MODE")]
    pub journal_mode: Option<String>,
    /// Testing: after the write, flush and exit as a crash would (no write-out of the
    /// write-back cache, no clean stop), so that the next assembly must replay the journal.
    #[arg(long, hide = true)]
    pub crash_after: bool,
    #[arg(required = true)]
    pub devices: Vec<std::path::PathBuf>,
}

#[derive(Args)]
pub struct ResyncArgs {
    /// Start even with stale members, or dirty and degraded (see assemble --force).
    #[arg(short, long)]
    pub force: bool,
    /// Open read-only (mdadm's -o): nothing is written to any member, not even the dirty
    /// flag; writes fail with EROFS.
    #[arg(short = 'o', long)]
    pub readonly: bool,
    #[arg(required = true)]
    pub devices: Vec<std::path::PathBuf>,
}

fn parse_bytes(s: &str) -> Result<u64> {
    parse_size_bytes(s, 1).with_context(|| format!("bad byte count {s:?}"))
}

pub fn create(a: CreateArgs) -> Result<()> {
    let level =
        Level::parse(&a.level).with_context(|| format!("unknown raid level {:?}", a.level))?;
    let given = a.devices.len();
    let n = a
        .raid_devices
        .unwrap_or(given.saturating_sub(a.spare_devices));
    if n + a.spare_devices != given {
        bail!(
            "--raid-devices={n} and --spare-devices={} need {} devices, but {given} were given \
             (the members first, then the spares)",
            a.spare_devices,
            n + a.spare_devices
        );
    }
    let (member_names, spare_names) = a.devices.split_at(n);
    if spare_names.iter().any(|d| d == "missing") {
        bail!("a spare cannot be \"missing\": name a device, or give fewer --spare-devices");
    }
    let mut opts = CreateOptions::new(level);
    if let Some(l) = &a.layout {
        opts.layout = Some(parse_layout(level, l)?);
    }
    if let Some(c) = &a.chunk {
        opts.chunk_sectors = Some(parse_chunk(c).with_context(|| format!("bad chunk size {c:?}"))?);
    }
    if let Some(z) = &a.size {
        opts.size_sectors =
            Some(parse_size_bytes(z, 1024).with_context(|| format!("bad size {z:?}"))? / 512);
    }
    opts.name = a.name.clone();
    opts.bitmap = match a.bitmap.as_str() {
        "internal" => true,
        "none" => false,
        other => bail!("--bitmap must be internal or none, not {other:?}"),
    };
    if (a.bitmap_chunk.is_some() || a.delay.is_some()) && !opts.bitmap {
        bail!("--bitmap-chunk and --delay need --bitmap internal");
    }
    if let Some(c) = &a.bitmap_chunk {
        let bytes = parse_size_bytes(c, 1024)
            .and_then(|b| u32::try_from(b).ok())
            .with_context(|| format!("bad bitmap chunk {c:?} (say e.g. 64K or 64M)"))?;
        opts.bitmap_chunk_bytes = Some(bytes);
    }
    if let Some(d) = a.delay {
        if d == 0 {
            bail!("--delay must be at least 1 second");
        }
        opts.bitmap_daemon_sleep_secs = Some(d);
    }
    opts.assume_clean = a.assume_clean;
    opts.write_zeroes = a.write_zeroes;
    match a.consistency_policy.as_deref() {
        None => {}
        Some("resync") if !opts.bitmap && a.write_journal.is_none() => {}
        Some("bitmap") if a.write_journal.is_none() => opts.bitmap = true,
        Some("journal") if a.write_journal.is_some() && !opts.bitmap => {}
        Some("journal") if a.write_journal.is_none() => {
            bail!("--consistency-policy=journal needs --write-journal DEV")
        }
        Some("ppl") if level != Level::Raid5 => {
            bail!("--consistency-policy=ppl is for raid5 only (as in md), not {level}")
        }
        Some("ppl") if !opts.bitmap && a.write_journal.is_none() => opts.ppl = true,
        Some(p @ ("resync" | "bitmap" | "journal" | "ppl")) => bail!(
            "--consistency-policy={p} does not go with {}: give one way of keeping the array \
             consistent",
            if a.write_journal.is_some() {
                "--write-journal"
            } else {
                "--bitmap=internal"
            }
        ),
        Some(other) => {
            bail!("--consistency-policy must be resync, bitmap, journal or ppl, not {other:?}")
        }
    }
    // mdadm's spellings of 0.90 ("0" too) and of 1.x.
    opts.metadata = uraid_engine::Metadata::parse(&a.metadata).with_context(|| {
        format!(
            "--metadata {:?}: uraid writes 0.90, 1.0, 1.1 or 1.2 (external metadata is not supported)",
            a.metadata
        )
    })?;
    if let Some(u) = &a.uuid {
        opts.uuid =
            Some(uraid_core::superblock::parse_uuid(u).with_context(|| format!("bad uuid {u:?}"))?);
    }
    if let Some(j) = &a.write_journal {
        opts.journal = Some(open_member(j)?);
    }
    // Flags by position: the members', then the spares' (they go with the device).
    let mut member_flags = create_member_flags(&a)?;
    let spare_flags = member_flags.split_off(n);
    opts.member_flags = member_flags;
    let mut devs: Vec<Option<Arc<dyn Member>>> = Vec::new();
    for d in member_names {
        if d == "missing" {
            devs.push(None);
        } else {
            let p = std::path::Path::new(d);
            if !p.exists() && !crate::locks::is_remote(p) {
                bail!("{d}: no such file or device (create member files first, e.g. truncate -s 1G {d})");
            }
            devs.push(Some(open_member(p)?));
        }
    }
    let mut spares: Vec<Arc<dyn Member>> = Vec::new();
    for d in spare_names {
        let p = std::path::Path::new(d);
        if !p.exists() && !crate::locks::is_remote(p) {
            bail!("spare {d}: no such file or device");
        }
        spares.push(open_member(p)?);
    }
    // A spare must be able to take any role: refused before anything is written.
    let smallest = devs.iter().flatten().map(|d| d.size_bytes()).min();
    if let (Some(min), Some(s)) = (smallest, spares.iter().min_by_key(|s| s.size_bytes())) {
        if s.size_bytes() < min {
            bail!(
                "spare {} has {} bytes, less than the smallest member's {min}: it could not \
                 take a role; give a larger device",
                s.name(),
                s.size_bytes()
            );
        }
    }
    // Asked once the engine has validated everything, before it writes.
    let journal = opts.journal.clone();
    let array = uraid_engine::create_confirmed(devs.clone(), &opts, &mut || {
        let mut all: Vec<&dyn Member> = devs.iter().flatten().map(|d| d.as_ref()).collect();
        all.extend(spares.iter().map(|d| d.as_ref()));
        let members = all.len();
        all.extend(journal.as_deref());
        confirm_create(level, &all[..members], &all[members..], a.run || a.force)
            .map_err(|e| uraid_engine::ArrayError::Create(format!("{e:#}")))?;
        if a.write_zeroes {
            let slow: Vec<String> = devs
                .iter()
                .flatten()
                .filter(|d| !d.zeroes_fast(true))
                .map(|d| d.name())
                .collect();
            eprintln!(
                "uraid: zeroing the data area of {} members (--write-zeroes){}",
                devs.iter().flatten().count(),
                if slow.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} without a zeroing offload: zeros are written there, which \
                         takes as long as writing the whole member",
                        slow.join(", ")
                    )
                }
            );
        }
        Ok(())
    })?;
    if a.write_zeroes {
        eprintln!("uraid: zeroed: no initial sync needed");
    }
    // What the new array knows was never written (--write-zeroes, or members that read
    // zeros) is kept for `uraid serve`, as a clean stop of the server keeps it.
    let dir = crate::locks::state_dir();
    if let Err(e) = array.keep_written_in(&dir) {
        eprintln!(
            "uraid: never-written map ({}): {e}; the array counts every region as written",
            dir.display()
        );
    }
    // Written as md writes a spare added to the new array; with a "missing" member the
    // first spare takes that role, and its recovery runs when the array is served.
    for (s, flags) in spares.iter().zip(spare_flags) {
        if let Err(e) = array.add_member_with(s.clone(), flags) {
            bail!("spare {}: {e}; the array was created without it", s.name());
        }
    }
    array.stop()?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::detail_json(&array))?
        );
    } else {
        eprintln!(
            "uraid: array {} created: {}, {} bytes",
            uraid_core::superblock::uuid_string(&array.meta().template().set_uuid),
            array.level(),
            array.size_bytes()
        );
    }
    Ok(())
}

/// mdadm's care before create: say what each device already holds (an array of any
/// metadata version, a file system, a partition table) and whether the member sizes
/// differ, then ask on a terminal; without one, refuse unless `--run`. Nothing has been
/// written when this returns an error.
fn confirm_create(
    level: Level,
    members: &[&dyn Member],
    journal: &[&dyn Member],
    run: bool,
) -> Result<()> {
    let mut warned = false;
    for d in members.iter().chain(journal) {
        for s in uraid_engine::existing_signatures(*d)? {
            let when = match &s {
                uraid_core::signature::Signature::Md { ctime_secs, .. } => {
                    format!(" ctime={}", crate::timefmt::ctime(*ctime_secs))
                }
                _ => String::new(),
            };
            eprintln!("uraid: {} {}{when}", d.name(), s.describe());
            warned = true;
        }
    }
    // mdadm: the largest member exceeding the smallest by more than 1% wastes space
    // (raid0 uses each member whole, in zones).
    let members = if level == Level::Raid0 {
        &[][..]
    } else {
        members
    };
    let smallest = members.iter().min_by_key(|d| d.size_bytes());
    let largest = members.iter().max_by_key(|d| d.size_bytes());
    if let (Some(s), Some(l)) = (smallest, largest) {
        if l.size_bytes() - s.size_bytes() > s.size_bytes() / 100 {
            eprintln!(
                "uraid: members differ in size: {} has {} bytes, {} only {}; the array is \
                 sized by the smallest, the rest of the larger ones is unused",
                l.name(),
                l.size_bytes(),
                s.name(),
                s.size_bytes()
            );
            warned = true;
        }
    }
    if !warned || run {
        return Ok(());
    }
    // SAFETY: isatty only inspects the descriptor.
    if unsafe { libc::isatty(0) } != 1 {
        bail!(
            "not creating the array: the devices above hold data or differ in size, and \
             there is no terminal to ask; give --run (or --force) to create anyway. \
             Nothing was written"
        );
    }
    eprint!("Continue creating array? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if !matches!(answer.trim(), "y" | "Y" | "yes" | "Yes" | "YES") {
        bail!("create aborted: nothing was written");
    }
    Ok(())
}

pub fn examine(a: ExamineArgs) -> Result<()> {
    if a.scan {
        return crate::scan::examine_scan(&a.scan_args, &a.devices);
    }
    let mut out = Vec::new();
    let mut failed = 0;
    let mut untrusted = Vec::new();
    let homehost = report::hostname();
    for p in &a.devices {
        let name = p.display().to_string();
        let dev = match open_member(p) {
            Ok(d) => d,
            Err(e) if a.devices.len() > 1 => {
                eprintln!("uraid: {}", crate::error_text(&e));
                failed += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        match uraid_engine::read_superblock_with_090(dev.as_ref()) {
            // 0.90: mdadm's own layout, from the record itself.
            Ok((_, computed_csum, Some(rec))) => {
                if rec.sb_csum != computed_csum {
                    untrusted.push(format!(
                        "{name}: 0.90 superblock checksum mismatch: stored {:08x}, expected \
                         {:08x}; its fields are printed as found and are not to be trusted",
                        rec.sb_csum, computed_csum
                    ));
                }
                if a.json {
                    out.push(crate::report090::examine_json(&name, &rec, computed_csum));
                } else {
                    print!(
                        "{}",
                        crate::report090::examine_human(&name, &rec, computed_csum)
                    );
                }
            }
            Ok((sb, computed_csum, None)) => {
                // The bitmap's size counts in "Unused Space"; a superblock that is not
                // trusted does not get its bitmap read.
                let bitmap_sectors = (sb.sb_csum == computed_csum)
                    .then(|| uraid_engine::BitmapState::load(dev.as_ref(), &sb).ok())
                    .flatten()
                    .flatten()
                    .map(|b| b.sb.space_bytes() / 512);
                let cx = report::ExamineContext {
                    computed_csum,
                    device_sectors: dev.size_bytes() / 512,
                    bitmap_sectors,
                    homehost: homehost.clone(),
                };
                if sb.sb_csum != computed_csum {
                    untrusted.push(format!(
                        "{name}: superblock checksum mismatch: stored {:08x}, expected {:08x}; \
                         its fields are printed as found and are not to be trusted",
                        sb.sb_csum, computed_csum
                    ));
                }
                if a.json {
                    out.push(report::examine_json(&name, &sb, &cx));
                } else {
                    print!("{}", report::examine_human(&name, &sb, &cx));
                }
            }
            Err(e) if a.devices.len() == 1 => return Err(e.into()),
            Err(e) => {
                eprintln!("uraid: {}", crate::error_text(&anyhow::Error::new(e)));
                failed += 1;
            }
        }
    }
    if a.json {
        let v = if out.len() == 1 {
            out.pop().expect("one")
        } else {
            serde_json::Value::Array(out)
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    // As mdadm does, the superblock is shown; unlike it, the exit status says it is bad.
    match untrusted.len() {
        0 if failed > 0 => bail!(
            "{failed} of {} devices have no valid md superblock (each is named above)",
            a.devices.len()
        ),
        0 => Ok(()),
        _ => {
            for u in &untrusted[..untrusted.len() - 1] {
                eprintln!("uraid: {u}");
            }
            bail!("{}", untrusted.last().expect("one"))
        }
    }
}

pub fn open_array(
    paths: &Paths,
    force: bool,
    readonly: bool,
) -> Result<(Array, uraid_engine::AssembleReport)> {
    let devs = open_all(paths)?;
    let r = engine_assemble(
        devs,
        &AssembleOptions {
            force,
            readonly,
            ..Default::default()
        },
    )?;
    Ok(r)
}

/// For commands that only report (detail): a dirty degraded raid4/5/6 is opened too, as
/// mdadm --detail describes an array md would not start; nothing is written.
fn open_array_to_report(paths: &Paths, force: bool, readonly: bool) -> Result<Array> {
    let devs = open_all(paths)?;
    let (array, _) = engine_assemble(
        devs,
        &AssembleOptions {
            force,
            readonly,
            start_dirty_degraded: true,
            ..Default::default()
        },
    )?;
    Ok(array)
}

pub fn assemble(a: AssembleArgs) -> Result<()> {
    assemble_paths(&a.devices, &a)
}

/// `assemble --scan`: each array chosen ([`crate::scan::plans`]) under its members' locks;
/// one that fails is said and the others go on.
pub fn assemble_scan(a: AssembleArgs) -> Result<()> {
    let wanted: Vec<String> = a.devices.iter().map(|p| p.display().to_string()).collect();
    let plans = crate::scan::plans(&a.scan_args, &wanted)?;
    let mut failed = Vec::new();
    let n = plans.len();
    for p in plans {
        let paths = p.found.paths();
        let what = p.found.describe();
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let listed = p
            .line
            .as_ref()
            .map_or(String::new(), |l| format!(" (ARRAY line {})", l.line));
        eprintln!("uraid: array {what}{listed}: found {}", names.join(" "));
        let r = crate::locks::guard(&paths).and_then(|_l| assemble_paths(&paths, &a));
        if let Err(e) = r {
            eprintln!("uraid: array {what}: {}", crate::error_text(&e));
            failed.push(what);
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {n} arrays not assembled: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

fn assemble_paths(paths: &Paths, a: &AssembleArgs) -> Result<()> {
    let (array, rep) = open_array(paths, a.force, a.readonly)?;
    if rep.unclean && a.resync {
        let n = crate::progress::run_sync(
            &array,
            uraid_engine::SyncKind::Resync,
            uraid_engine::SyncLimits::default(),
            false,
        )?;
        eprintln!("uraid: resync done, {n} mismatched sectors rewritten");
    }
    if a.resync && !array.recovering_roles().is_empty() {
        crate::progress::run_sync(
            &array,
            uraid_engine::SyncKind::Recovery,
            uraid_engine::SyncLimits::default(),
            false,
        )?;
    }
    if a.json {
        let mut v = report::detail_json(&array);
        v["assembly"] = serde_json::json!(rep
            .members
            .iter()
            .map(|m| serde_json::json!({"device": m.name, "events": m.events, "outcome": format!("{:?}", m.outcome)}))
            .collect::<Vec<_>>());
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for m in &rep.members {
            eprintln!("uraid: {} (events {}): {:?}", m.name, m.events, m.outcome);
        }
        eprintln!(
            "uraid: array {} assembled: {}, {} of {} members{}{}",
            rep.uuid,
            array.level(),
            array.raid_disks() - array.missing_roles().len(),
            array.raid_disks(),
            if array.is_degraded() {
                ", degraded"
            } else {
                ""
            },
            if rep.unclean && !a.resync {
                ", not stopped cleanly (use --resync)"
            } else {
                ""
            }
        );
    }
    array.stop()?;
    Ok(())
}

/// `uraid detail`: through the control socket when a server holds the members, else by
/// assembling them here (under the member locks).
pub fn detail_any(mut a: DetailArgs) -> Result<()> {
    a.devices.extend(a.target.array.take());
    let found = match &a.target.control {
        Some(c) => Some(crate::locks::Found {
            pid: 0,
            control: c.clone(),
        }),
        None => crate::locks::find_server(&a.devices),
    };
    if a.devices.is_empty() && found.is_none() {
        bail!("name the array: its member paths, --array MEMBER, or --control PATH");
    }
    if let Some(found) = found {
        let v = crate::control::request(&found.control, &serde_json::json!({"cmd": "detail"}))?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&v["detail"])?);
        } else {
            print!("{}", v["human"].as_str().unwrap_or(""));
            let pid = v["detail"]["serve"]["pid"]
                .as_u64()
                .unwrap_or(found.pid.into());
            println!(
                "\n  Served by pid {pid} (control {})",
                found.control.display()
            );
        }
        return Ok(());
    }
    let _locks = crate::locks::guard(&a.devices)?;
    detail(a)
}

pub fn detail(a: DetailArgs) -> Result<()> {
    let array = open_array_to_report(&a.devices, a.force, a.readonly)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::detail_json(&array))?
        );
    } else {
        print!("{}", report::detail_human(&array, None));
    }
    Ok(())
}

const IO_STEP: usize = 1 << 20;

pub fn read(a: ReadArgs) -> Result<()> {
    let (array, _) = open_array(&a.devices, a.force, a.readonly)?;
    let offset = parse_bytes(&a.offset)?;
    let size = array.size_bytes();
    if offset > size {
        bail!("offset {offset} is beyond the end of the array ({size} bytes)");
    }
    let length = match &a.length {
        Some(l) => parse_bytes(l)?,
        None => size - offset,
    };
    if offset + length > size {
        bail!("range {offset}+{length} is beyond the end of the array ({size} bytes)");
    }
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => Box::new(std::fs::File::create(p).with_context(|| format!("{}", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut buf = vec![0u8; IO_STEP];
    let mut done = 0u64;
    while done < length {
        let n = (length - done).min(IO_STEP as u64) as usize;
        array.read(offset + done, &mut buf[..n])?;
        out.write_all(&buf[..n]).context("writing output")?;
        done += n as u64;
    }
    out.flush()?;
    Ok(())
}

pub fn write(a: WriteArgs) -> Result<()> {
    let (array, _) = open_array(&a.devices, a.force, a.readonly)?;
    if let Some(m) = &a.journal_mode {
        let mode: uraid_engine::JournalMode = m.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        array.set_journal_mode(mode)?;
    }
    let offset = parse_bytes(&a.offset)?;
    let size = array.size_bytes();
    let mut input: Box<dyn Read> = match &a.input {
        Some(p) => {
            let f = std::fs::File::open(p).with_context(|| format!("{}", p.display()))?;
            let len = f.metadata()?.len();
            if offset.checked_add(len).is_none_or(|e| e > size) {
                bail!(
                    "{} ({len} bytes) at offset {offset} does not fit in the array ({size} bytes)",
                    p.display()
                );
            }
            Box::new(f)
        }
        None => Box::new(std::io::stdin().lock()),
    };
    let mut buf = vec![0u8; IO_STEP];
    let mut pos = offset;
    loop {
        // Fill the buffer so that writes stay large and aligned.
        let mut n = 0;
        while n < buf.len() {
            let r = input.read(&mut buf[n..]).context("reading input")?;
            if r == 0 {
                break;
            }
            n += r;
        }
        if n == 0 {
            break;
        }
        if pos + n as u64 > size {
            bail!("input runs past the end of the array ({size} bytes) at offset {pos}");
        }
        array.write(pos, &buf[..n])?;
        pos += n as u64;
    }
    if a.crash_after {
        array.flush()?;
        let cached = array.writeback_stats().map_or(0, |s| s.cached_pages);
        eprintln!(
            "uraid: exiting without a clean stop, {cached} pages left in the write-back cache"
        );
        std::process::exit(0);
    }
    array.stop()?;
    Ok(())
}

pub fn resync(a: ResyncArgs) -> Result<()> {
    let (array, _) = open_array(&a.devices, a.force, a.readonly)?;
    let n = crate::progress::run_sync(
        &array,
        uraid_engine::SyncKind::Resync,
        uraid_engine::SyncLimits::default(),
        false,
    )?;
    println!("mismatch_cnt: {n}");
    array.stop()?;
    Ok(())
}

#[derive(Args)]
pub struct SyncArgs {
    /// md's sync_speed_min in KiB/s: the pace kept while the array is busy.
    #[arg(long, default_value_t = 1000)]
    pub speed_min: u64,
    /// md's sync_speed_max in KiB/s.
    #[arg(long, default_value_t = 200_000)]
    pub speed_max: u64,
    /// No progress output.
    #[arg(short, long)]
    pub quiet: bool,
    #[arg(long)]
    pub json: bool,
    /// Start even with stale members, or dirty and degraded (see assemble --force).
    #[arg(short, long)]
    pub force: bool,
    /// Open read-only (mdadm's -o): nothing is written to any member, not even the dirty
    /// flag; writes fail with EROFS.
    #[arg(short = 'o', long)]
    pub readonly: bool,
    #[arg(required = true)]
    pub devices: Vec<std::path::PathBuf>,
}

fn sync_command(a: SyncArgs, kind: uraid_engine::SyncKind) -> Result<()> {
    let (array, _) = open_array(&a.devices, a.force, a.readonly)?;
    sync_array(&array, &a, kind)
}

fn sync_array(
    array: &uraid_engine::Array,
    a: &SyncArgs,
    kind: uraid_engine::SyncKind,
) -> Result<()> {
    use uraid_engine::SyncKind;
    let limits = uraid_engine::SyncLimits {
        min_kib_s: a.speed_min,
        max_kib_s: a.speed_max.max(a.speed_min),
    };
    let mismatches = crate::progress::run_sync(array, kind, limits, a.quiet)?;
    let level = array.level();
    if a.json {
        let mut v = report::detail_json(array);
        v["sync_action"] = serde_json::json!(kind.name());
        v["mismatch_cnt"] = serde_json::json!(mismatches);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if kind != SyncKind::Recovery {
        println!("mismatch_cnt: {mismatches}");
    }
    array.stop()?;
    match kind {
        // Scripts act on the exit status (md leaves them to read mismatch_cnt).
        SyncKind::Check if mismatches > 0 => bail!(
            "check found {mismatches} mismatched sectors (mismatch_cnt {mismatches}); \
             `uraid repair` with the same members makes them consistent"
        ),
        SyncKind::Repair if !a.json => eprintln!("uraid: {}", repair_summary(level, mismatches)),
        _ => {}
    }
    Ok(())
}

/// What md's repair did, in words: for raid4/5 it makes parity agree with the data, which
/// is not the same as restoring a data block that went bad.
pub fn repair_summary(level: Level, mismatches: u64) -> String {
    if mismatches == 0 {
        return "repair: nothing to fix, every stripe was consistent".into();
    }
    let how = match level {
        Level::Raid4 | Level::Raid5 => {
            "parity was rewritten to be consistent with the data (md's repair: the data \
             blocks are taken as they are, so a corrupted data block is not restored)"
        }
        Level::Raid6 => {
            "where P and Q both disagreed in a way one data block explains, that block was \
             rewritten; elsewhere P and Q were rewritten to be consistent with the data"
        }
        Level::Raid1 | Level::Raid10 => {
            "the other copies were rewritten from the first readable copy (md's repair)"
        }
        Level::Raid0 => "nothing could be rewritten: raid0 has no redundancy",
    };
    format!("repair: {mismatches} mismatched sectors fixed: {how}")
}

/// md's check: count mismatched sectors (mismatch_cnt) without changing anything.
pub fn check(a: SyncArgs) -> Result<()> {
    sync_command(a, uraid_engine::SyncKind::Check)
}

/// md's repair: count and rewrite mismatches (raid6 also finds which block is wrong).
pub fn repair(a: SyncArgs) -> Result<()> {
    sync_command(a, uraid_engine::SyncKind::Repair)
}

/// Finish a pending recovery (a member added, or a rebuild interrupted by a stop); a
/// degraded array's spares take the missing roles first, as md does.
pub fn recover(a: SyncArgs) -> Result<()> {
    let (array, _) = open_array(&a.devices, a.force, a.readonly)?;
    uraid_engine::activate_spares(&array, &|n| eprintln!("uraid: {n}"));
    if array.recovering_roles().is_empty() && array.replacing_roles().is_empty() {
        let why = if array.is_degraded() {
            let missing: Vec<String> = array
                .missing_roles()
                .iter()
                .map(|r| r.to_string())
                .collect();
            format!(
                "role(s) {} missing and no spare to rebuild onto: add a device first \
                 (uraid add, or give it here as a spare)",
                missing.join(", ")
            )
        } else {
            "every member is in sync".to_string()
        };
        eprintln!("uraid: nothing to recover: {why}");
        array.stop()?;
        return Ok(());
    }
    sync_array(&array, &a, uraid_engine::SyncKind::Recovery)
}
