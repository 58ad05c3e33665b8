//! `uraid demo`: the one-command tour. Makes (or reuses) an array on sparse files and serves
//! it over NBD on 127.0.0.1, printing how to connect and how to stop it.

use crate::serve::{self, NbdAddr, ServeOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use uraid_core::geometry::parse_size_bytes;
use uraid_core::Level;
use uraid_engine::{CreateOptions, Member};

#[derive(Args)]
pub struct DemoArgs {
    /// Folder for the member files (created if needed; an existing demo there is reused).
    #[arg(long, default_value = "uraid-demo")]
    pub dir: PathBuf,
    /// RAID level of a new demo array (1, 5, 6, 10, ...).
    #[arg(short, long, default_value = "5")]
    pub level: String,
    /// Number of member files of a new demo array.
    #[arg(short = 'n', long, default_value_t = 4)]
    pub members: usize,
    /// Size of each member file (sparse: it takes no space until written).
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// NBD address (default tcp:127.0.0.1:10809, or a free port if that one is taken).
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<String>,
    /// Control socket path (default <dir>/control.sock).
    // The text is `--help`'s, as written: not Markdown.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

fn member_paths(dir: &std::path::Path, n: usize) -> Vec<PathBuf> {
    (0..n).map(|i| dir.join(format!("member{i}.img"))).collect()
}

pub fn demo(a: DemoArgs) -> Result<()> {
    serve::init_logging();
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let dir = std::fs::canonicalize(&a.dir)?;

    // Reuse whatever member files a previous demo left.
    let mut existing: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n.starts_with("member") && n.ends_with(".img")
        })
        .collect();
    existing.sort();

    let (array, paths, locks) = if !existing.is_empty() {
        let locks = crate::locks::lock_members(&existing)?;
        let (array, _) =
            crate::commands::open_array(&existing, false, false).with_context(|| {
                format!(
                    "reusing the demo in {} (delete its member*.img files to start afresh)",
                    dir.display()
                )
            })?;
        eprintln!(
            "uraid: reusing the demo array in {} ({} members)",
            dir.display(),
            existing.len()
        );
        (array, existing, locks)
    } else {
        let level =
            Level::parse(&a.level).with_context(|| format!("unknown raid level {:?}", a.level))?;
        let size =
            parse_size_bytes(&a.size, 1 << 20).with_context(|| format!("bad size {:?}", a.size))?;
        if size < 16 << 20 {
            bail!("--size must be at least 16M");
        }
        if a.members < 2 {
            bail!("a demo array needs at least 2 members");
        }
        let paths = member_paths(&dir, a.members);
        for p in &paths {
            let f =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            f.set_len(size)?;
        }
        let locks = crate::locks::lock_members(&paths)?;
        let devs: Vec<Option<Arc<dyn Member>>> = paths
            .iter()
            .map(|p| crate::open::open_member(p).map(Some))
            .collect::<Result<_>>()?;
        let mut opts = CreateOptions::new(level);
        opts.name = "demo".into();
        let array = uraid_engine::create(devs, &opts)?;
        array.stop()?;
        eprintln!(
            "uraid: created a {level} demo array on {} sparse files of {} in {}",
            paths.len(),
            a.size,
            dir.display()
        );
        (array, paths, locks)
    };

    let nbd = match &a.nbd {
        Some(s) => NbdAddr::parse(s)?,
        None => NbdAddr::default_tcp(),
    };
    let control = a
        .control
        .clone()
        .unwrap_or_else(|| dir.join("control.sock"));
    // A closed stdout must not stop the demo's server (see serve::print_info).
    let _ = writeln!(
        std::io::stdout(),
        "uraid demo: members {}; stop with Ctrl-C or `uraid stop --control {}`",
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        control.display()
    );
    serve::run(
        array,
        &paths,
        locks,
        ServeOptions {
            nbd: Some(nbd.clone()),
            nbd_queue_depth: serve::DEFAULT_NBD_QUEUE_DEPTH as usize,
            nbd_any_port: a.nbd.is_none(),
            ublk: false,
            ublk_opts: Default::default(),
            export_name: "demo".into(),
            control: Some(control),
            sync_limits: uraid_engine::SyncLimits::default(),
            tls: None,
            metrics: None,
            readd_interval: None,
        },
    )
    .map(drop)
}
