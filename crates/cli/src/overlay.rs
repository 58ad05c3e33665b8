//! `uraid overlay status|discard|commit DIR`: the rescue mode's overlays (see
//! `uraid_engine::overlay`; `--overlay DIR` on the commands that open members makes one).

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use uraid_engine::overlay::{self, OverlayState, OverlayStatus, CHUNK_BYTES};

#[derive(Args)]
pub struct OverlayArgs {
    #[command(subcommand)]
    pub cmd: OverlayCmd,
}

#[derive(Subcommand)]
pub enum OverlayCmd {
    /// Say what an overlay holds: its members, the chunks and bytes it keeps for each,
    /// when and by which command it was made. Fails if a member is not the device the
    /// overlay was made over.
    Status {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Throw an overlay away; the members stay as they are. Refused while a server uses it.
    Discard { dir: PathBuf },
    /// Write what an overlay holds to its members, then remove it. Without
    /// --yes-write-members it only says what it would write. An interrupted commit is
    /// finished by running it again.
    Commit {
        dir: PathBuf,
        /// Really write the members.
        #[arg(long)]
        yes_write_members: bool,
    },
}

pub fn overlay(a: OverlayArgs) -> Result<()> {
    match a.cmd {
        OverlayCmd::Status { dir, json } => status(&dir, json),
        OverlayCmd::Discard { dir } => {
            overlay::discard(&dir)?;
            eprintln!(
                "uraid: overlay {} discarded; the members were not changed",
                dir.display()
            );
            Ok(())
        }
        OverlayCmd::Commit {
            dir,
            yes_write_members,
        } => commit(&dir, yes_write_members),
    }
}

fn status_json(st: &OverlayStatus) -> serde_json::Value {
    serde_json::json!({
        "state": st.manifest.state.name(),
        "created": st.manifest.created_unix,
        "command": st.manifest.command,
        "in_use": st.in_use,
        "chunk_bytes": CHUNK_BYTES,
        "members": st.members.iter().map(|m| serde_json::json!({
            "path": m.entry.path.display().to_string(),
            "size_bytes": m.entry.size_bytes,
            "device": m.entry.device.to_string(),
            "held_chunks": m.held_chunks,
            "held_bytes": m.held_bytes,
            "problem": m.problem,
        })).collect::<Vec<_>>(),
    })
}

/// The first member that is not what the overlay was made over, as an error.
fn refuse_mismatch(dir: &std::path::Path, st: &OverlayStatus) -> Result<()> {
    match st.members.iter().find(|m| m.problem.is_some()) {
        Some(m) => bail!(
            "overlay {}: member {} {}",
            dir.display(),
            m.entry.path.display(),
            m.problem.as_deref().unwrap_or("")
        ),
        None => Ok(()),
    }
}

fn status(dir: &std::path::Path, json: bool) -> Result<()> {
    let st = overlay::status(dir)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status_json(&st))?);
    } else {
        let m = &st.manifest;
        println!("Overlay {}", dir.display());
        println!("       State : {}", m.state.name());
        println!("     Created : {}", crate::timefmt::ctime(m.created_unix));
        println!("  By command : {}", m.command);
        println!("      In use : {}", if st.in_use { "yes" } else { "no" });
        println!(" Chunk bytes : {CHUNK_BYTES}");
        let total: u64 = st.members.iter().map(|m| m.held_bytes).sum();
        println!("  Bytes held : {total}");
        println!("     Members : {}", st.members.len());
        for m in &st.members {
            println!(
                "    {}  size {}  chunks {}  bytes {}{}",
                m.entry.path.display(),
                m.entry.size_bytes,
                m.held_chunks,
                m.held_bytes,
                m.problem
                    .as_ref()
                    .map(|p| format!("  PROBLEM: {p}"))
                    .unwrap_or_default()
            );
        }
    }
    refuse_mismatch(dir, &st)
}

fn commit(dir: &std::path::Path, yes: bool) -> Result<()> {
    let st = overlay::status(dir)?;
    if st.in_use {
        bail!(
            "overlay {} is in use by another uraid process (a running `uraid serve \
             --overlay`?); stop it first",
            dir.display()
        );
    }
    if st.manifest.state == OverlayState::Active {
        refuse_mismatch(dir, &st)?;
    }
    if !yes {
        for m in &st.members {
            eprintln!(
                "uraid: would write {} bytes ({} chunks) to {}",
                m.held_bytes,
                m.held_chunks,
                m.entry.path.display()
            );
        }
        bail!(
            "not writing the members without --yes-write-members (`uraid overlay discard {}` \
             throws the overlay away instead)",
            dir.display()
        );
    }
    // A server running on the members without this overlay holds their locks.
    let paths: Vec<PathBuf> = st.members.iter().map(|m| m.entry.path.clone()).collect();
    let _locks = crate::locks::guard(&paths)?;
    let rep = overlay::commit(dir)?;
    for (path, n) in &rep.written {
        eprintln!("uraid: wrote {n} bytes to {}", path.display());
    }
    eprintln!(
        "uraid: overlay {} committed to its members and removed",
        dir.display()
    );
    Ok(())
}
