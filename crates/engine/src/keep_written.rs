//! What the array knows was never written ([`crate::written`]), kept across a clean stop:
//! saved in uraid's state directory after the stop's last superblock write, which carries
//! a nonce in utime's microseconds; taken back at the next start only if the superblocks
//! are still that write's (same events, same utime, nonce and all) and clean. Any writer
//! of the array's data writes superblocks first (md marks the array dirty before its
//! first write; so does uraid), and Linux md and mdadm write utime in whole seconds: the
//! stamp then differs and the map is not trusted. A crash leaves the superblocks dirty, or
//! changed by the session's first write: not trusted either. The file is removed when it
//! is taken, so nothing stale lies around. Format: `uraid_core::written_map`.

use crate::array::Array;
use crate::error::ArrayError;
use std::path::{Path, PathBuf};
use uraid_core::written_map::WrittenMapFile;

/// What [`Array::keep_written_in`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeptWritten {
    /// No file for this array: everything counts as written.
    Nothing,
    /// The map of the last clean stop: bytes known never written.
    Restored {
        /// Bytes of the array in regions never written.
        never_written_bytes: u64,
    },
    /// A file that does not describe the array as it is now (removed): why.
    Stale(String),
    /// The array cannot keep a map: why (read-only, no redundancy, metadata 0.90, a write
    /// journal, a reshape).
    Off(String),
}

impl std::fmt::Display for KeptWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeptWritten::Nothing => write!(f, "no saved map: every region counts as written"),
            KeptWritten::Restored {
                never_written_bytes,
            } => write!(
                f,
                "{} MiB known never written since the last clean stop",
                never_written_bytes >> 20
            ),
            KeptWritten::Stale(why) => write!(f, "saved map not used: {why}"),
            KeptWritten::Off(why) => write!(f, "not kept: {why}"),
        }
    }
}

fn file_of(dir: &Path, uuid: &[u8; 16]) -> PathBuf {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{hex}.written"))
}

/// An IO error on what `what` names (a path, or what was done to one).
fn at(what: impl std::fmt::Display, e: std::io::Error) -> ArrayError {
    ArrayError::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// fsync of a directory, so that a rename or removal in it is durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl Array {
    /// Keep what the array knows was never written in `dir` (uraid's state directory): take
    /// the map the last clean stop saved there, if it still describes the array, and save
    /// it again at the next clean [`Array::stop`]. Call it after assembly and before the
    /// first write (a server does, before it serves).
    pub fn keep_written_in(&self, dir: &Path) -> Result<KeptWritten, ArrayError> {
        if let Some(why) = self.cannot_keep_written() {
            return Ok(KeptWritten::Off(why));
        }
        let _ = self.written_dir.set(dir.to_path_buf());
        let uuid = self.meta().template().set_uuid;
        let path = file_of(dir, &uuid);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(KeptWritten::Nothing),
            Err(e) => return Err(at(path.display(), e)),
        };
        // Taken once: the next stop writes a new one.
        std::fs::remove_file(&path)
            .and_then(|()| sync_dir(dir))
            .map_err(|e| {
                at(
                    format_args!("cannot remove {} after reading it", path.display()),
                    e,
                )
            })?;
        let why = match WrittenMapFile::decode(&bytes) {
            Err(e) => Some(format!("{}: {e}", path.display())),
            Ok(f) => self.mismatch(&f).or_else(|| {
                (!self.written.load(&f.words)).then(|| "its map has another size".to_string())
            }),
        };
        Ok(match why {
            Some(why) => KeptWritten::Stale(why),
            None => KeptWritten::Restored {
                never_written_bytes: self.never_written_bytes(),
            },
        })
    }

    /// Why this array cannot keep a map, if it cannot.
    fn cannot_keep_written(&self) -> Option<String> {
        if self.is_read_only() {
            return Some("the array is read-only".into());
        }
        if self.pers().max_degraded() == 0 {
            return Some(format!(
                "{} has no redundancy: nothing is ever rebuilt",
                self.level()
            ));
        }
        if self.has_journal() {
            return Some("a write journal may hold any region's newest data".into());
        }
        if self.meta().is_090() {
            return Some("metadata 0.90 has no room for the stamp (utime is seconds only)".into());
        }
        if self.written.extent().1 == 0 {
            return Some("the array is reshaping".into());
        }
        None
    }

    /// Why a saved map does not describe the array as assembled now, if it does not.
    fn mismatch(&self, f: &WrittenMapFile) -> Option<String> {
        let dirty_now = self.is_dirty();
        let meta = self.meta();
        let t = meta.template();
        let (shift, sectors) = self.written.extent();
        if f.set_uuid != t.set_uuid {
            return Some("it names another array".into());
        }
        if meta.is_dirty() || dirty_now {
            return Some("the array was not stopped cleanly since".into());
        }
        if f.events != t.events || f.utime != t.utime {
            return Some(format!(
                "the superblocks were written since it was saved (events {} and utime {:#x} \
                 then, {} and {:#x} now): by another program or an unclean stop",
                f.events, f.utime, t.events, t.utime
            ));
        }
        if (f.region_shift, f.array_sectors) != (shift, sectors) {
            return Some(format!(
                "it maps {} sectors in regions of {} and the array has {sectors} in regions \
                 of {}",
                f.array_sectors,
                1u64 << f.region_shift.min(63),
                1u64 << shift
            ));
        }
        None
    }

    /// At the end of a clean stop: save the map if it knows anything (with a superblock
    /// write that stamps it), else remove a saved one.
    pub(crate) fn save_written(&self) -> Result<(), ArrayError> {
        let Some(dir) = self.written_dir.get() else {
            return Ok(());
        };
        // Members that all say where they were never written need no map kept for them
        // (and their superblocks keep md's plain utime).
        let off =
            self.cannot_keep_written().is_some() || self.devices().iter().all(|d| d.tells_holes());
        let mut meta = self.meta();
        let path = file_of(dir, &meta.template().set_uuid);
        if off || meta.is_dirty() || self.written.never_written_sectors() == 0 {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(at(path.display(), e)),
                _ => Ok(()),
            };
        }
        // A nonce md never writes (it leaves the microseconds 0): 1..=999999.
        let r = crate::create::random_uuid();
        let nonce = u32::from_le_bytes(r[..4].try_into().expect("4 bytes")) % 999_999 + 1;
        meta.stamp_micros = Some(nonce);
        meta.write_all(self)?;
        let (region_shift, array_sectors) = self.written.extent();
        let t = meta.template();
        let file = WrittenMapFile {
            set_uuid: t.set_uuid,
            events: t.events,
            utime: t.utime,
            array_sectors,
            region_shift,
            words: self.written.words(),
        };
        drop(meta);
        std::fs::create_dir_all(dir).map_err(|e| at(dir.display(), e))?;
        let tmp = path.with_extension("written.new");
        let f = std::fs::File::create(&tmp).map_err(|e| at(tmp.display(), e))?;
        std::io::Write::write_all(&mut &f, &file.encode()).map_err(|e| at(tmp.display(), e))?;
        f.sync_all().map_err(|e| at(tmp.display(), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| at(path.display(), e))?;
        sync_dir(dir).map_err(|e| at(dir.display(), e))
    }
}
