//! Opening members from paths.

use anyhow::Result;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use uraid_engine::Member;
use uraid_engine::{set_io_engine, set_io_engine_per_member, IoEngine};
use uraid_engine::{DirectMode, FileMember};
use uraid_engine::{NbdClientConfig, NbdMember};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    /// Per member: sync on tmpfs and for files without O_DIRECT, io_uring for block
    /// devices and O_DIRECT files (`detail` shows the choice).
    Auto,
    /// io_uring (falls back to sync where unavailable).
    Uring,
    /// pread/pwrite (fastest on tmpfs).
    Sync,
}

static NO_DIRECT: AtomicBool = AtomicBool::new(false);

/// How NBD members (`nbd://`, `nbd+unix://`) connect: `--nbd-timeout`, `--nbd-connections`.
static NBD: OnceLock<NbdClientConfig> = OnceLock::new();

/// Sets the NBD members' per-request timeout, connections, TLS CA and client certificate
/// (once, at start).
pub fn configure_nbd(
    timeout_secs: f64,
    connections: usize,
    tls_ca: Option<&Path>,
    identity: (Option<&Path>, Option<&Path>),
    psk: (Option<&Path>, Option<&str>),
) -> Result<()> {
    if !(timeout_secs.is_finite() && timeout_secs > 0.0) {
        anyhow::bail!("--nbd-timeout must be a positive number of seconds");
    }
    let identity = match identity {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => anyhow::bail!("--nbd-tls-cert and --nbd-tls-key go together: give both"),
    };
    let config = NbdClientConfig {
        timeout: std::time::Duration::from_secs_f64(timeout_secs),
        connections: connections.max(1),
        tls: match (tls_ca, identity) {
            _ if psk.0.is_some() => None, // below
            (Some(ca), identity) => Some(uraid_engine::NbdTlsClient::with_identity(ca, identity)?),
            (None, Some(_)) => anyhow::bail!(
                "--nbd-tls-cert needs --nbd-tls-ca: the CA that the members' servers are signed by"
            ),
            (None, None) => None,
        },
        ..NbdClientConfig::default()
    };
    let config = match psk {
        (Some(file), username) => {
            if tls_ca.is_some() || identity.is_some() {
                anyhow::bail!(
                    "--nbd-tls-psk is TLS with pre-shared keys, --nbd-tls-ca/--nbd-tls-cert \
                     with certificates: choose one (a member may still have its own \
                     ?tls-psk-file=)"
                );
            }
            NbdClientConfig {
                tls: Some(uraid_engine::NbdTlsClient::from_psk_file_for_members(
                    file, username,
                )?),
                ..config
            }
        }
        (None, Some(_)) => anyhow::bail!(
            "--nbd-tls-username names an identity of --nbd-tls-psk's key file: give \
             --nbd-tls-psk FILE (or put ?tls-username=NAME in a member's URI)"
        ),
        (None, None) => config,
    };
    NBD.set(config)
        .map_err(|_| anyhow::anyhow!("NBD members are configured already"))
}

/// `--nbd-retry`: how long a last copy's requests keep reconnecting.
static NBD_RETRY: OnceLock<std::time::Duration> = OnceLock::new();

/// Sets `--nbd-retry` (once, at start).
pub fn configure_nbd_retry(secs: f64) -> Result<()> {
    if !(secs.is_finite() && secs >= 0.0) {
        anyhow::bail!("--nbd-retry must be a number of seconds (0: never retry), not {secs}");
    }
    NBD_RETRY
        .set(std::time::Duration::from_secs_f64(secs))
        .map_err(|_| anyhow::anyhow!("--nbd-retry is configured already"))
}

fn is_remote(path: &Path) -> Option<&str> {
    path.to_str().filter(|s| uraid_engine::is_nbd_uri(s))
}

/// A member on an NBD export; `--overlay` needs a local device to open read-only.
fn open_remote(uri: &str) -> Result<Arc<dyn Member>> {
    if OVERLAY.get().is_some() {
        anyhow::bail!(
            "{uri}: --overlay takes local members only (it opens each device read-only \
             underneath; a remote export cannot be)"
        );
    }
    let config = NBD.get().cloned().unwrap_or_default();
    let m =
        NbdMember::connect(uri, &config).map_err(|e| anyhow::anyhow!("cannot open member {e}"))?;
    let retry = NBD_RETRY
        .get()
        .copied()
        .unwrap_or(uraid_engine::NBD_DEFAULT_RETRY);
    Ok(Arc::new(m.with_retry(retry)))
}

/// `--overlay DIR`: every member this process opens is seen through the overlay (opened
/// read-only underneath). Held, with the overlay's lock, until the process exits.
static OVERLAY: OnceLock<uraid_engine::overlay::OverlaySet> = OnceLock::new();

/// Opens the overlay in `dir` for this process; `command` is recorded in a new one.
pub fn use_overlay(dir: &Path, command: &str) -> Result<()> {
    let set = uraid_engine::overlay::OverlaySet::open(dir, command)?;
    if OVERLAY.set(set).is_err() {
        anyhow::bail!("an overlay is open already");
    }
    Ok(())
}

pub fn configure(engine: EngineArg, no_direct: bool) {
    match engine {
        EngineArg::Auto => set_io_engine_per_member(),
        EngineArg::Uring => set_io_engine(IoEngine::Uring),
        EngineArg::Sync => set_io_engine(IoEngine::Sync),
    }
    NO_DIRECT.store(no_direct, Ordering::Relaxed);
}

pub fn open_member(path: &Path) -> Result<Arc<dyn Member>> {
    if let Some(uri) = is_remote(path) {
        return open_remote(uri);
    }
    if let Some(set) = OVERLAY.get() {
        return Ok(set.member(path)?);
    }
    let mode = if NO_DIRECT.load(Ordering::Relaxed) {
        DirectMode::Off
    } else {
        DirectMode::Auto
    };
    // The engine's error already names the path: "cannot open member d9.img: No such file".
    let f = FileMember::open(path, mode).map_err(|e| anyhow::anyhow!("cannot open member {e}"))?;
    Ok(Arc::new(f))
}

pub fn open_all(paths: &[std::path::PathBuf]) -> Result<Vec<Arc<dyn Member>>> {
    if let Some(set) = OVERLAY
        .get()
        .filter(|_| !paths.iter().any(|p| is_remote(p).is_some()))
    {
        return Ok(set.members(paths)?);
    }
    paths.iter().map(|p| open_member(p)).collect()
}
