//! The overlay directory: its manifest (which members, by what they are), the overlay in
//! use ([`OverlaySet`], one per process, holding the directory's lock), and what is done
//! with it afterwards: [`status`], [`commit`], [`discard`]. docs/FORMAT.md has the bytes.

use super::{io_at, read_map, ChunkMap, OverlayError, OverlayMember, ReadOnlyFile, CHUNK_BYTES};
use crate::identity::DeviceId;
use crate::member::Member;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// First line of a manifest.
pub const MANIFEST_MAGIC: &str = "uraid-overlay 1";
/// Bytes checksummed at each end of a member for its identity.
pub const IDENTITY_SPAN_BYTES: u64 = 1 << 20;

const MANIFEST: &str = "manifest";
const MANIFEST_TMP: &str = "manifest.tmp";
const LOCK: &str = "lock";

/// Where an overlay is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverlayState {
    /// In use: the members are as they were when the overlay was made.
    Active,
    /// `commit` began writing the members (a re-run finishes it).
    Committing,
    /// Every chunk is on the members; only the removal of the directory is left.
    Committed,
}

impl OverlayState {
    /// The state's word in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            OverlayState::Active => "active",
            OverlayState::Committing => "committing",
            OverlayState::Committed => "committed",
        }
    }
}

/// A member as the overlay knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestMember {
    /// Names its files: `N.data` and `N.map`.
    pub index: u32,
    /// Absolute path, as given when the member was first opened.
    pub path: PathBuf,
    /// The member's size when it was first opened.
    pub size_bytes: u64,
    /// The device (device and inode numbers) at the path then.
    pub device: DeviceId,
    /// [`identity_checksum`] of the member when it was first opened.
    pub checksum: u64,
}

/// The overlay directory's `manifest` (a text file; see docs/FORMAT.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// When the overlay was made (Unix seconds).
    pub created_unix: u64,
    /// The command line that made the overlay.
    pub command: String,
    /// Active, committing or committed.
    pub state: OverlayState,
    /// The members, in the order they were first opened.
    pub members: Vec<ManifestMember>,
}

fn encode_device(d: &DeviceId) -> String {
    match d {
        DeviceId::File { dev, ino } => format!("file:{dev}:{ino}"),
        DeviceId::Block { rdev } => format!("block:{rdev}"),
        DeviceId::Named(n) => format!("named:{n}"),
    }
}

fn decode_device(s: &str) -> Option<DeviceId> {
    let (kind, rest) = s.split_once(':')?;
    match kind {
        "file" => {
            let (dev, ino) = rest.split_once(':')?;
            Some(DeviceId::File {
                dev: dev.parse().ok()?,
                ino: ino.parse().ok()?,
            })
        }
        "block" => Some(DeviceId::Block {
            rdev: rest.parse().ok()?,
        }),
        "named" => Some(DeviceId::Named(rest.to_string())),
        _ => None,
    }
}

impl Manifest {
    /// A manifest of no members yet, made by `command` at `created_unix`.
    pub fn new(command: &str, created_unix: u64) -> Manifest {
        Manifest {
            created_unix,
            command: command.replace(['\n', '\t', '\r'], " "),
            state: OverlayState::Active,
            members: Vec::new(),
        }
    }

    /// The manifest file's text.
    pub fn encode(&self) -> String {
        let mut s = format!(
            "{MANIFEST_MAGIC}\nchunk_bytes {CHUNK_BYTES}\ncreated {}\ncommand {}\nstate {}\n",
            self.created_unix,
            self.command,
            self.state.name()
        );
        for m in &self.members {
            s.push_str(&format!(
                "member\t{}\t{}\t{}\t{:016x}\t{}\n",
                m.index,
                m.size_bytes,
                encode_device(&m.device),
                m.checksum,
                m.path.display()
            ));
        }
        s
    }

    /// Parse the manifest file's text; the error says which line is wrong.
    pub fn decode(text: &str) -> Result<Manifest, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MANIFEST_MAGIC) {
            return Err(format!(
                "not an overlay manifest (no `{MANIFEST_MAGIC}` line)"
            ));
        }
        let mut m = Manifest::new("", 0);
        let mut chunk_ok = false;
        for (n, line) in lines.enumerate() {
            let bad = || format!("line {}: cannot parse `{line}`", n + 2);
            if let Some(rest) = line.strip_prefix("member\t") {
                let f: Vec<&str> = rest.splitn(5, '\t').collect();
                if f.len() != 5 {
                    return Err(bad());
                }
                m.members.push(ManifestMember {
                    index: f[0].parse().map_err(|_| bad())?,
                    size_bytes: f[1].parse().map_err(|_| bad())?,
                    device: decode_device(f[2]).ok_or_else(bad)?,
                    checksum: u64::from_str_radix(f[3], 16).map_err(|_| bad())?,
                    path: PathBuf::from(f[4]),
                });
                continue;
            }
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "chunk_bytes" => {
                    if value != CHUNK_BYTES.to_string() {
                        return Err(format!("chunk size {value} (uraid uses {CHUNK_BYTES})"));
                    }
                    chunk_ok = true;
                }
                "created" => m.created_unix = value.parse().map_err(|_| bad())?,
                "command" => m.command = value.to_string(),
                "state" => {
                    m.state = match value {
                        "active" => OverlayState::Active,
                        "committing" => OverlayState::Committing,
                        "committed" => OverlayState::Committed,
                        _ => return Err(bad()),
                    }
                }
                _ => return Err(bad()),
            }
        }
        if !chunk_ok {
            return Err("no chunk_bytes line".into());
        }
        Ok(m)
    }
}

/// FNV-1a 64 of a member's first and last [`IDENTITY_SPAN_BYTES`]: a cheap check that a
/// device still holds what it held (md's superblocks live in these spans).
pub fn identity_checksum(dev: &dyn Member) -> io::Result<u64> {
    let size = dev.size_bytes();
    let span = size.min(IDENTITY_SPAN_BYTES);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf = vec![0u8; span as usize];
    for at in [0, size - span] {
        dev.read_at(&mut buf, at)?;
        for &b in &buf {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    Ok(h)
}

fn read_manifest(dir: &Path) -> Result<Option<Manifest>, OverlayError> {
    let p = dir.join(MANIFEST);
    match std::fs::read_to_string(&p) {
        Ok(text) => Manifest::decode(&text)
            .map(Some)
            .map_err(|what| OverlayError::Manifest {
                dir: dir.display().to_string(),
                what,
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_at(&p)(e)),
    }
}

/// Replaces the manifest atomically (a temporary file, synced, renamed, the directory
/// synced): a crash leaves the old one or the new one.
fn write_manifest(dir: &Path, m: &Manifest) -> Result<(), OverlayError> {
    let tmp = dir.join(MANIFEST_TMP);
    let mut f = File::create(&tmp).map_err(io_at(&tmp))?;
    f.write_all(m.encode().as_bytes()).map_err(io_at(&tmp))?;
    f.sync_all().map_err(io_at(&tmp))?;
    let p = dir.join(MANIFEST);
    std::fs::rename(&tmp, &p).map_err(io_at(&p))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))
}

/// Takes the overlay's lock (an exclusive `flock` on `DIR/lock`), or says it is in use.
fn lock_dir(dir: &Path) -> Result<File, OverlayError> {
    let p = dir.join(LOCK);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .map_err(io_at(&p))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(f);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(OverlayError::InUse {
            dir: dir.display().to_string(),
        });
    }
    Err(io_at(&p)(e))
}

fn data_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("{index}.data"))
}

fn map_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("{index}.map"))
}

/// Whether the device at a recorded member's path is still that member; `what` it is
/// not, otherwise. The checksum is checked only while the overlay is active (a commit
/// changes the members).
fn verify(entry: &ManifestMember, state: OverlayState) -> Result<ReadOnlyFile, String> {
    let base = ReadOnlyFile::open(&entry.path).map_err(|e| e.to_string())?;
    let device = base.device_id();
    if device != entry.device {
        return Err(format!(
            "is not the device the overlay was made over (that was {}, this is {device})",
            entry.device
        ));
    }
    if base.size_bytes() != entry.size_bytes {
        return Err(format!(
            "has {} bytes, the overlay was made over {} bytes",
            base.size_bytes(),
            entry.size_bytes
        ));
    }
    if state == OverlayState::Active {
        let sum = identity_checksum(&base).map_err(|e| e.to_string())?;
        if sum != entry.checksum {
            return Err(
                "has changed since the overlay was made (the checksum of its first and last \
                 MiB differs): something wrote to it"
                    .into(),
            );
        }
    }
    Ok(base)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ---------------------------------------------------------------------------------------
// An overlay in use

/// An overlay directory opened for use: it holds the directory's lock until dropped, and
/// hands out an [`OverlayMember`] per member path.
pub struct OverlaySet {
    dir: PathBuf,
    _lock: File,
    manifest: Mutex<Manifest>,
    /// Members the manifest named before this open.
    recorded: usize,
}

impl OverlaySet {
    /// Opens the overlay in `dir` (made, with the directory, if absent); `command` is
    /// recorded in a new manifest.
    pub fn open(dir: &Path, command: &str) -> Result<OverlaySet, OverlayError> {
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        let lock = lock_dir(dir)?;
        let manifest = match read_manifest(dir)? {
            Some(m) if m.state != OverlayState::Active => {
                return Err(OverlayError::Manifest {
                    dir: dir.display().to_string(),
                    what: format!(
                        "it is {}: the members were being written; finish with `uraid overlay \
                         commit {}` first",
                        m.state.name(),
                        dir.display()
                    ),
                })
            }
            Some(m) => m,
            None => {
                let m = Manifest::new(command, now_unix());
                write_manifest(dir, &m)?;
                m
            }
        };
        Ok(OverlaySet {
            dir: dir.to_path_buf(),
            _lock: lock,
            recorded: manifest.members.len(),
            manifest: Mutex::new(manifest),
        })
    }

    /// The overlay directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The member at `path`, seen through its overlay. A device the manifest names must
    /// be unchanged; a new one is recorded (a spare, a member tried for the first time).
    pub fn member(&self, path: &Path) -> Result<Arc<OverlayMember>, OverlayError> {
        let mismatch = |what: String| OverlayError::Mismatch {
            dir: self.dir.display().to_string(),
            member: path.display().to_string(),
            what,
        };
        let base = ReadOnlyFile::open(path).map_err(OverlayError::Open)?;
        let device = base.device_id();
        let abs = std::path::absolute(path).map_err(io_at(path))?;
        if abs.to_string_lossy().contains(['\n', '\t']) || abs.to_str().is_none() {
            // The manifest is lines of tab-separated fields.
            return Err(mismatch(
                "its path holds a tab, a newline or bytes that are not UTF-8: name it \
                 through a symlink"
                    .into(),
            ));
        }
        let mut manifest = self.manifest.lock().unwrap();
        let index = match manifest.members.iter().find(|m| m.device == device) {
            Some(entry) => {
                verify(entry, OverlayState::Active).map_err(mismatch)?;
                entry.index
            }
            None => {
                if let Some(entry) = manifest.members.iter().find(|m| m.path == abs) {
                    return Err(mismatch(format!(
                        "is not the device the overlay was made over (that was {}, this is \
                         {device})",
                        entry.device
                    )));
                }
                let checksum = identity_checksum(&base).map_err(io_at(path))?;
                let index = manifest
                    .members
                    .iter()
                    .map(|m| m.index + 1)
                    .max()
                    .unwrap_or(0);
                let mut next = manifest.clone();
                next.members.push(ManifestMember {
                    index,
                    path: abs,
                    size_bytes: base.size_bytes(),
                    device,
                    checksum,
                });
                write_manifest(&self.dir, &next)?;
                *manifest = next;
                index
            }
        };
        drop(manifest);
        Ok(Arc::new(OverlayMember::open(
            Arc::new(base),
            &data_path(&self.dir, index),
            &map_path(&self.dir, index),
        )?))
    }

    /// The members at `paths` through the overlay. An overlay made over other members
    /// (none of `paths` among the ones it names) is refused.
    pub fn members(&self, paths: &[PathBuf]) -> Result<Vec<Arc<dyn Member>>, OverlayError> {
        if self.recorded > 0 {
            let manifest = self.manifest.lock().unwrap().clone();
            let known = paths.iter().any(|p| {
                DeviceId::of_path(p).is_ok_and(|d| manifest.members.iter().any(|m| m.device == d))
            });
            if !known {
                return Err(OverlayError::Manifest {
                    dir: self.dir.display().to_string(),
                    what: format!(
                        "it was made over other members ({}), not these",
                        manifest
                            .members
                            .iter()
                            .map(|m| m.path.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
        }
        paths
            .iter()
            .map(|p| self.member(p).map(|m| m as Arc<dyn Member>))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// status, commit, discard

/// What an overlay holds for one member.
#[derive(Clone, Debug)]
pub struct MemberStatus {
    /// The member as the manifest records it.
    pub entry: ManifestMember,
    /// Chunks the overlay holds for it.
    pub held_chunks: u64,
    /// Bytes those chunks cover.
    pub held_bytes: u64,
    /// Why the device at the path is not this member (or its map is unreadable).
    pub problem: Option<String>,
}

/// What an overlay directory holds.
#[derive(Clone, Debug)]
pub struct OverlayStatus {
    /// The manifest.
    pub manifest: Manifest,
    /// Per member, what the overlay holds.
    pub members: Vec<MemberStatus>,
    /// Another process (a server) has the overlay open.
    pub in_use: bool,
}

fn no_overlay(dir: &Path) -> OverlayError {
    OverlayError::Manifest {
        dir: dir.display().to_string(),
        what: "no overlay here (no manifest)".into(),
    }
}

fn member_status(dir: &Path, entry: &ManifestMember, state: OverlayState) -> MemberStatus {
    let mp = map_path(dir, entry.index);
    let map = match File::open(&mp) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(ChunkMap::new(entry.size_bytes)),
        Err(e) => Err(format!("{}: {e}", mp.display())),
        Ok(f) => read_map(&f, &mp, entry.size_bytes),
    };
    let identity = verify(entry, state).err();
    let (held_chunks, held_bytes) = map.as_ref().map_or((0, 0), |m| (m.held(), m.held_bytes()));
    MemberStatus {
        entry: entry.clone(),
        held_chunks,
        held_bytes,
        problem: identity.or(map.err()),
    }
}

/// What the overlay in `dir` holds, and whether its members are still the ones it was
/// made over. Reads only.
pub fn status(dir: &Path) -> Result<OverlayStatus, OverlayError> {
    let manifest = read_manifest(dir)?.ok_or_else(|| no_overlay(dir))?;
    let in_use = matches!(lock_dir(dir), Err(OverlayError::InUse { .. }));
    let members = manifest
        .members
        .iter()
        .map(|e| member_status(dir, e, manifest.state))
        .collect();
    Ok(OverlayStatus {
        manifest,
        members,
        in_use,
    })
}

/// What [`commit`] wrote.
#[derive(Clone, Debug, Default)]
pub struct CommitReport {
    /// (member path, bytes written).
    pub written: Vec<(PathBuf, u64)>,
}

/// Writes every held chunk to its member, syncs the members, then removes the overlay.
/// The manifest says `committing` while the members are written, so an interrupted commit
/// is finished by running it again (the overlay still holds every chunk).
pub fn commit(dir: &Path) -> Result<CommitReport, OverlayError> {
    let _lock = lock_dir(dir)?;
    let mut manifest = read_manifest(dir)?.ok_or_else(|| no_overlay(dir))?;
    let mut report = CommitReport::default();
    if manifest.state != OverlayState::Committed {
        for e in &manifest.members {
            verify(e, manifest.state).map_err(|what| OverlayError::Mismatch {
                dir: dir.display().to_string(),
                member: e.path.display().to_string(),
                what,
            })?;
        }
        manifest.state = OverlayState::Committing;
        write_manifest(dir, &manifest)?;
        for e in &manifest.members {
            let n = commit_member(dir, e)?;
            report.written.push((e.path.clone(), n));
        }
        manifest.state = OverlayState::Committed;
        write_manifest(dir, &manifest)?;
    }
    remove_files(dir, &manifest)?;
    Ok(report)
}

fn commit_member(dir: &Path, e: &ManifestMember) -> Result<u64, OverlayError> {
    let mp = map_path(dir, e.index);
    let dp = data_path(dir, e.index);
    let map_file = match File::open(&mp) {
        // Recorded, but stopped before its files were made: it holds nothing.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        r => r.map_err(io_at(&mp))?,
    };
    let map = read_map(&map_file, &mp, e.size_bytes).map_err(|what| OverlayError::Mismatch {
        dir: dir.display().to_string(),
        member: e.path.display().to_string(),
        what,
    })?;
    let data = File::open(&dp).map_err(io_at(&dp))?;
    let dev = OpenOptions::new()
        .write(true)
        .open(&e.path)
        .map_err(io_at(&e.path))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0;
    for run in map.runs() {
        let mut at = run.start;
        while at < run.end {
            let n = (run.end - at).min(buf.len() as u64) as usize;
            data.read_exact_at(&mut buf[..n], at).map_err(io_at(&dp))?;
            dev.write_all_at(&buf[..n], at).map_err(io_at(&e.path))?;
            at += n as u64;
            written += n as u64;
        }
    }
    dev.sync_all().map_err(io_at(&e.path))?;
    Ok(written)
}

/// Removes the overlay's own files (the manifest last), then the directory if nothing
/// else is in it.
fn remove_files(dir: &Path, manifest: &Manifest) -> Result<(), OverlayError> {
    let rm = |p: PathBuf| match std::fs::remove_file(&p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_at(&p)(e)),
        _ => Ok(()),
    };
    for e in &manifest.members {
        rm(data_path(dir, e.index))?;
        rm(map_path(dir, e.index))?;
    }
    rm(dir.join(MANIFEST_TMP))?;
    rm(dir.join(MANIFEST))?;
    rm(dir.join(LOCK))?;
    // A directory holding other files is left as it is.
    let _ = std::fs::remove_dir(dir);
    Ok(())
}

/// Throws the overlay away: the members stay as they are. Refused while it is in use.
pub fn discard(dir: &Path) -> Result<(), OverlayError> {
    let manifest = read_manifest(dir)?.ok_or_else(|| no_overlay(dir))?;
    let _lock = lock_dir(dir)?;
    if manifest.state == OverlayState::Committing {
        // The members hold part of the overlay: throwing the rest away would leave them
        // neither as they were nor as the overlay showed.
        return Err(OverlayError::Manifest {
            dir: dir.display().to_string(),
            what: format!(
                "a commit was interrupted while writing the members: finish it with `uraid \
                 overlay commit {} --yes-write-members`",
                dir.display()
            ),
        });
    }
    remove_files(dir, &manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips() {
        let mut m = Manifest::new("uraid serve --overlay o\tm0", 1_764_500_000);
        m.state = OverlayState::Committing;
        m.members.push(ManifestMember {
            index: 0,
            path: PathBuf::from("/tmp/a b/m0.img"),
            size_bytes: 1 << 24,
            device: DeviceId::File { dev: 2049, ino: 77 },
            checksum: 0xdead_beef_0123_4567,
        });
        m.members.push(ManifestMember {
            index: 3,
            path: PathBuf::from("/dev/sdb"),
            size_bytes: 1 << 30,
            device: DeviceId::Block { rdev: 2064 },
            checksum: 1,
        });
        let text = m.encode();
        assert!(text.starts_with("uraid-overlay 1\nchunk_bytes 65536\ncreated 1764500000\n"));
        assert!(text.contains("command uraid serve --overlay o m0\n"));
        assert_eq!(Manifest::decode(&text), Ok(m));
        assert!(Manifest::decode("something else\n").is_err());
        assert!(Manifest::decode("uraid-overlay 1\nstate active\n")
            .unwrap_err()
            .contains("chunk_bytes"));
    }
}
