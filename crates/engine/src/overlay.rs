//! Rescue mode: members opened read-only, every write kept in a copy-on-write overlay.
//!
//! Data-recovery guides tell people to put device-mapper snapshot overlays over the disks
//! of a broken array before any experiment (a forced assembly, a guessed member order), so
//! that a wrong guess costs nothing. This is that, built in: each member is opened with
//! O_RDONLY (the kernel guarantees we write nothing to it), and an [`OverlayMember`] sends
//! every write (data, parity, superblocks, bitmap, journal, bad-block log, discards) to a
//! sparse file in the overlay directory, at the same offset. A [`ChunkMap`] says which
//! [`CHUNK_BYTES`] chunks the overlay holds; reads take those from the overlay and the
//! rest from the member. A write that covers a chunk only in part first copies the rest of
//! the chunk up from the member, so a held chunk is always whole.
//!
//! Durability: a write that adds chunks to the map writes its data, syncs the data file,
//! then writes and syncs the map, before it completes, so a chunk in the map always has
//! its data, even after a power loss; a write to chunks already held is a plain write of
//! the data file (durable at [`Member::flush`], as on a disk with a write cache). Either
//! way an acknowledged write survives a crash of the process.
//!
//! The directory's [`Manifest`] names each member by what it is (path, size, device id,
//! a checksum of its first and last MiB), so that an overlay is never applied to other
//! devices. [`commit`] writes the held chunks to the members; [`discard`] removes the
//! overlay. The byte layout of the directory is in docs/FORMAT.md.

use crate::identity::DeviceId;
use crate::member::{Member, ZeroHow};
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use thiserror::Error;

mod dir;
pub use dir::{
    commit, discard, identity_checksum, status, CommitReport, Manifest, ManifestMember,
    MemberStatus, OverlaySet, OverlayState, OverlayStatus, IDENTITY_SPAN_BYTES, MANIFEST_MAGIC,
};

/// The overlay's granularity: a held chunk is copied up whole. A write that adds chunks
/// costs two fsyncs (data, then map), so the number of chunks bounds the fsyncs a rebuild
/// or a sequential write pays: 64 KiB makes that 16 times fewer than 4 KiB pages would,
/// for a copy-up of up to 64 KiB on the first write to a chunk.
pub const CHUNK_BYTES: u64 = 64 * 1024;
/// Magic of a map file.
pub const MAP_MAGIC: &[u8; 8] = b"URAIDOVM";
const MAP_VERSION: u32 = 1;
/// The map's bits start here, so that a bit update never rewrites the header's sector.
pub const MAP_BITS_OFFSET: u64 = 4096;
pub(crate) const MAP_HEADER_BYTES: usize = 32;

/// What can go wrong with an overlay; each names the file, member or directory.
#[derive(Debug, Error)]
pub enum OverlayError {
    /// IO on one of the overlay's files failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error as the system gave it.
        source: io::Error,
    },
    /// A member that cannot be opened (the error names its path).
    #[error("cannot open member {0}")]
    Open(io::Error),
    /// The manifest is missing, unreadable or inconsistent.
    #[error("overlay {dir}: {what}")]
    Manifest {
        /// The overlay directory.
        dir: String,
        /// What is wrong with it.
        what: String,
    },
    /// The member is not the device the overlay was made over.
    #[error("overlay {dir}: member {member}: {what}")]
    Mismatch {
        /// The overlay directory.
        dir: String,
        /// The member's path.
        member: String,
        /// How it differs from what the manifest records.
        what: String,
    },
    /// Another process holds the overlay's lock.
    #[error(
        "overlay {dir} is in use by another uraid process (a running `uraid serve --overlay`?)"
    )]
    InUse {
        /// The overlay directory.
        dir: String,
    },
}

pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> OverlayError + '_ {
    move |source| OverlayError::Io {
        path: path.display().to_string(),
        source,
    }
}

// ---------------------------------------------------------------------------------------
// The chunk map (pure)

/// Which chunks of a member the overlay holds: one bit per [`CHUNK_BYTES`] chunk, chunk
/// `c` in bit `c % 8` of byte `c / 8` (the map file's layout). The last chunk may be short
/// when the member's size is not a multiple of the chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkMap {
    size_bytes: u64,
    bits: Vec<u8>,
}

/// A piece of a read: where its bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Byte offset on the member.
    pub offset: u64,
    /// Bytes in the piece.
    pub len: u64,
    /// Whether the bytes come from the overlay (else from the member).
    pub in_overlay: bool,
}

impl ChunkMap {
    /// An empty map of a member of `size_bytes`.
    pub fn new(size_bytes: u64) -> ChunkMap {
        let chunks = size_bytes.div_ceil(CHUNK_BYTES);
        ChunkMap {
            size_bytes,
            bits: vec![0; chunks.div_ceil(8) as usize],
        }
    }

    /// A map from its bit bytes (as stored); `None` if the length does not fit the size.
    pub fn from_bits(size_bytes: u64, bits: Vec<u8>) -> Option<ChunkMap> {
        let m = ChunkMap::new(size_bytes);
        (m.bits.len() == bits.len()).then_some(ChunkMap { size_bytes, bits })
    }

    /// The bit bytes, as stored in the map file.
    pub fn bits(&self) -> &[u8] {
        &self.bits
    }

    /// Chunks of the member (the last may be short).
    pub fn chunks(&self) -> u64 {
        self.size_bytes.div_ceil(CHUNK_BYTES)
    }

    /// Whether the overlay holds `chunk`.
    pub fn contains(&self, chunk: u64) -> bool {
        self.bits[(chunk / 8) as usize] & (1 << (chunk % 8)) != 0
    }

    /// Chunks held.
    pub fn held(&self) -> u64 {
        self.bits.iter().map(|b| b.count_ones() as u64).sum()
    }

    /// Bytes held (a short last chunk counts its own length).
    pub fn held_bytes(&self) -> u64 {
        self.runs().map(|r| r.end - r.start).sum()
    }

    /// The byte range of a chunk.
    pub fn chunk_bytes(&self, chunk: u64) -> Range<u64> {
        chunk * CHUNK_BYTES..((chunk + 1) * CHUNK_BYTES).min(self.size_bytes)
    }

    /// The chunks a byte range touches.
    pub fn chunks_of(offset: u64, len: u64) -> Range<u64> {
        if len == 0 {
            return 0..0;
        }
        offset / CHUNK_BYTES..(offset + len).div_ceil(CHUNK_BYTES)
    }

    /// Whether the overlay holds every chunk of `chunks`.
    pub fn all_held(&self, chunks: Range<u64>) -> bool {
        chunks.into_iter().all(|c| self.contains(c))
    }

    /// Where a read of `offset..offset + len` finds its bytes, in order, adjacent pieces
    /// of one source merged.
    pub fn segments(&self, offset: u64, len: u64) -> Vec<Segment> {
        let mut out: Vec<Segment> = Vec::new();
        let end = offset + len;
        for c in Self::chunks_of(offset, len) {
            let r = self.chunk_bytes(c);
            let (s, e) = (r.start.max(offset), r.end.min(end));
            let in_overlay = self.contains(c);
            match out.last_mut() {
                Some(last) if last.in_overlay == in_overlay => last.len += e - s,
                _ => out.push(Segment {
                    offset: s,
                    len: e - s,
                    in_overlay,
                }),
            }
        }
        out
    }

    /// The byte ranges a write of `offset..offset + len` must copy up from the member
    /// first: the parts of its partly covered end chunks that the overlay does not hold.
    pub fn copy_up(&self, offset: u64, len: u64) -> Vec<Range<u64>> {
        let end = offset + len;
        let chunks = Self::chunks_of(offset, len);
        let mut out = Vec::new();
        if chunks.is_empty() {
            return out;
        }
        let first = self.chunk_bytes(chunks.start);
        if !self.contains(chunks.start) && offset > first.start {
            out.push(first.start..offset);
        }
        let last = self.chunk_bytes(chunks.end - 1);
        if !self.contains(chunks.end - 1) && end < last.end {
            out.push(end..last.end);
        }
        out
    }

    /// Marks chunks held; returns the range of bit bytes that changed (to be written to
    /// the map file), or `None` if every chunk was held already.
    pub fn insert(&mut self, chunks: Range<u64>) -> Option<Range<usize>> {
        let mut changed: Option<Range<usize>> = None;
        for c in chunks {
            if self.contains(c) {
                continue;
            }
            let b = (c / 8) as usize;
            self.bits[b] |= 1 << (c % 8);
            changed = Some(match changed {
                None => b..b + 1,
                Some(r) => r.start..b + 1,
            });
        }
        changed
    }

    /// The held chunks as byte ranges, adjacent chunks merged.
    pub fn runs(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        let mut c = 0;
        let n = self.chunks();
        std::iter::from_fn(move || {
            while c < n && !self.contains(c) {
                c += 1;
            }
            if c >= n {
                return None;
            }
            let start = c;
            while c < n && self.contains(c) {
                c += 1;
            }
            Some(self.chunk_bytes(start).start..self.chunk_bytes(c - 1).end)
        })
    }
}

/// A map file's header (see docs/FORMAT.md): magic, version, chunk size, member size.
pub fn encode_map_header(size_bytes: u64) -> [u8; MAP_HEADER_BYTES] {
    let mut h = [0u8; MAP_HEADER_BYTES];
    h[0..8].copy_from_slice(MAP_MAGIC);
    h[8..12].copy_from_slice(&MAP_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(CHUNK_BYTES as u32).to_le_bytes());
    h[16..24].copy_from_slice(&size_bytes.to_le_bytes());
    h[24..32].copy_from_slice(&size_bytes.div_ceil(CHUNK_BYTES).to_le_bytes());
    h
}

/// The member size a map header records, or why it is not one of ours.
pub fn decode_map_header(h: &[u8]) -> Result<u64, String> {
    if h.len() < MAP_HEADER_BYTES || &h[0..8] != MAP_MAGIC {
        return Err("not an overlay map (bad magic)".into());
    }
    let word = |r: Range<usize>| u32::from_le_bytes(h[r].try_into().expect("4 bytes"));
    let quad = |r: Range<usize>| u64::from_le_bytes(h[r].try_into().expect("8 bytes"));
    if word(8..12) != MAP_VERSION {
        return Err(format!(
            "map version {} (uraid knows {MAP_VERSION})",
            word(8..12)
        ));
    }
    if word(12..16) as u64 != CHUNK_BYTES {
        return Err(format!(
            "chunk size {} (uraid uses {CHUNK_BYTES})",
            word(12..16)
        ));
    }
    let size = quad(16..24);
    if quad(24..32) != size.div_ceil(CHUNK_BYTES) {
        return Err("chunk count does not match the member size".into());
    }
    Ok(size)
}

// ---------------------------------------------------------------------------------------
// The read-only member underneath

/// A file or block device opened O_RDONLY: the kernel refuses any write to it.
pub struct ReadOnlyFile {
    path: PathBuf,
    file: File,
    size_bytes: u64,
    is_block: bool,
}

impl ReadOnlyFile {
    /// Open `path` read-only (a file or a block device).
    pub fn open(path: &Path) -> io::Result<ReadOnlyFile> {
        let file = File::open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let meta = file.metadata()?;
        let is_block = meta.file_type().is_block_device();
        let size_bytes = crate::file::file_or_device_bytes(&file, &meta, path)?;
        Ok(ReadOnlyFile {
            path: path.to_path_buf(),
            file,
            size_bytes,
            is_block,
        })
    }
}

impl Member for ReadOnlyFile {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > self.size_bytes)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access {offset}+{} beyond end of device ({} bytes)",
                    self.path.display(),
                    buf.len(),
                    self.size_bytes
                ),
            ));
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        // The descriptor is O_RDONLY; say why instead of EBADF.
        Err(io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            format!("{}: opened read-only under an overlay", self.path.display()),
        ))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn device_id(&self) -> DeviceId {
        match self.file.metadata() {
            Ok(m) if self.is_block => DeviceId::Block { rdev: m.rdev() },
            Ok(m) => DeviceId::File {
                dev: m.dev(),
                ino: m.ino(),
            },
            Err(_) => DeviceId::Named(self.name()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The overlay member

/// A member seen through its overlay: reads take held chunks from the overlay's data file
/// and the rest from the member; every write, discard and zeroing goes to the overlay.
pub struct OverlayMember {
    base: Arc<dyn Member>,
    data_path: PathBuf,
    data: File,
    map_path: PathBuf,
    map_file: File,
    map: RwLock<ChunkMap>,
    /// Serialises the writes that add chunks (copy-up, then the map), so that two of them
    /// never copy up one chunk; writes to held chunks do not take it.
    grow: Mutex<()>,
}

impl OverlayMember {
    /// Opens (creating if absent) the overlay files of `base`.
    pub fn open(
        base: Arc<dyn Member>,
        data_path: &Path,
        map_path: &Path,
    ) -> Result<OverlayMember, OverlayError> {
        let size = base.size_bytes();
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map_err(io_at(p))
        };
        let data = open(data_path)?;
        let map_file = open(map_path)?;
        let map_len = map_file.metadata().map_err(io_at(map_path))?.len();
        let map = if map_len == 0 {
            let m = ChunkMap::new(size);
            let mut image = vec![0u8; MAP_BITS_OFFSET as usize + m.bits().len()];
            image[..MAP_HEADER_BYTES].copy_from_slice(&encode_map_header(size));
            map_file.write_all_at(&image, 0).map_err(io_at(map_path))?;
            map_file.sync_all().map_err(io_at(map_path))?;
            data.set_len(size).map_err(io_at(data_path))?;
            data.sync_all().map_err(io_at(data_path))?;
            m
        } else {
            read_map(&map_file, map_path, size).map_err(|what| OverlayError::Mismatch {
                dir: map_path.display().to_string(),
                member: base.name(),
                what,
            })?
        };
        Ok(OverlayMember {
            base,
            data_path: data_path.to_path_buf(),
            data,
            map_path: map_path.to_path_buf(),
            map_file,
            map: RwLock::new(map),
            grow: Mutex::new(()),
        })
    }

    /// A copy of the map (status, tests).
    pub fn map(&self) -> ChunkMap {
        self.map.read().unwrap().clone()
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access {offset}+{len} beyond end of device ({} bytes)",
                    self.name(),
                    self.size_bytes()
                ),
            )),
        }
    }

    fn data_err(&self) -> impl Fn(io::Error) -> io::Error + '_ {
        move |e| {
            io::Error::new(
                e.kind(),
                format!("overlay {}: {e}", self.data_path.display()),
            )
        }
    }

    /// Adds `chunks` to the map durably: the data they hold is synced first, so that a
    /// chunk in the map has its data after any crash. Called under `grow`.
    fn hold(&self, chunks: Range<u64>) -> io::Result<()> {
        let mut next = self.map.read().unwrap().clone();
        let Some(changed) = next.insert(chunks) else {
            return Ok(());
        };
        self.data.sync_data().map_err(self.data_err())?;
        self.map_file
            .write_all_at(
                &next.bits()[changed.clone()],
                MAP_BITS_OFFSET + changed.start as u64,
            )
            .and_then(|_| self.map_file.sync_data())
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("overlay {}: {e}", self.map_path.display()),
                )
            })?;
        *self.map.write().unwrap() = next;
        Ok(())
    }

    /// Zeroes whole chunks in the overlay: a hole punched in the data file where the file
    /// system allows it, zero buffers otherwise.
    fn zero_chunks(&self, bytes: Range<u64>) -> io::Result<()> {
        let _g = self.grow.lock().unwrap();
        // SAFETY: plain syscall on an owned descriptor.
        let rc = unsafe {
            libc::fallocate(
                self.data.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                bytes.start as libc::off_t,
                (bytes.end - bytes.start) as libc::off_t,
            )
        };
        if rc != 0 {
            let zeros = vec![0u8; (bytes.end - bytes.start).min(1 << 20) as usize];
            let mut at = bytes.start;
            while at < bytes.end {
                let n = (bytes.end - at).min(zeros.len() as u64) as usize;
                self.data
                    .write_all_at(&zeros[..n], at)
                    .map_err(self.data_err())?;
                at += n as u64;
            }
        }
        self.hold(ChunkMap::chunks_of(bytes.start, bytes.end - bytes.start))
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        let end = offset + len;
        let full_start = offset.next_multiple_of(CHUNK_BYTES);
        // The member's last chunk may be short: it counts as whole when the range ends
        // at the end of the member.
        let full_end = if end == self.size_bytes() {
            end
        } else {
            end / CHUNK_BYTES * CHUNK_BYTES
        };
        if full_start >= full_end {
            return crate::member::write_zero_buffers(self, offset, len);
        }
        if offset < full_start {
            crate::member::write_zero_buffers(self, offset, full_start - offset)?;
        }
        self.zero_chunks(full_start..full_end)?;
        if full_end < end {
            crate::member::write_zero_buffers(self, full_end, end - full_end)?;
        }
        Ok(())
    }
}

impl Member for OverlayMember {
    fn size_bytes(&self) -> u64 {
        self.base.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let segments = self.map.read().unwrap().segments(offset, buf.len() as u64);
        for s in segments {
            let at = (s.offset - offset) as usize;
            let piece = &mut buf[at..at + s.len as usize];
            if s.in_overlay {
                self.data
                    .read_exact_at(piece, s.offset)
                    .map_err(self.data_err())?;
            } else {
                self.base.read_at(piece, s.offset)?;
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let len = buf.len() as u64;
        self.check_range(offset, len)?;
        let chunks = ChunkMap::chunks_of(offset, len);
        if self.map.read().unwrap().all_held(chunks.clone()) {
            return self.data.write_all_at(buf, offset).map_err(self.data_err());
        }
        let _g = self.grow.lock().unwrap();
        let copy_up = self.map.read().unwrap().copy_up(offset, len);
        for r in copy_up {
            let mut piece = vec![0u8; (r.end - r.start) as usize];
            self.base.read_at(&mut piece, r.start)?;
            self.data
                .write_all_at(&piece, r.start)
                .map_err(self.data_err())?;
        }
        self.data
            .write_all_at(buf, offset)
            .map_err(self.data_err())?;
        self.hold(chunks)
    }

    fn flush(&self) -> io::Result<()> {
        self.data.sync_data().map_err(self.data_err())?;
        self.map_file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero_range(offset, len)
    }

    fn discard_zeroes(&self) -> bool {
        true
    }

    fn write_zeroes(&self, offset: u64, len: u64, _how: ZeroHow) -> io::Result<()> {
        self.zero_range(offset, len)
    }

    fn zeroes_fast(&self, _unmap: bool) -> bool {
        true
    }

    fn name(&self) -> String {
        self.base.name()
    }

    fn device_id(&self) -> DeviceId {
        self.base.device_id()
    }
}

/// Reads a map file made for a member of `size_bytes`.
pub(crate) fn read_map(
    map_file: &File,
    map_path: &Path,
    size_bytes: u64,
) -> Result<ChunkMap, String> {
    let mut h = [0u8; MAP_HEADER_BYTES];
    map_file
        .read_exact_at(&mut h, 0)
        .map_err(|e| format!("{}: {e}", map_path.display()))?;
    let recorded = decode_map_header(&h)?;
    if recorded != size_bytes {
        return Err(format!(
            "the map is for {recorded} bytes, the member has {size_bytes}"
        ));
    }
    let mut bits = vec![0u8; ChunkMap::new(size_bytes).bits().len()];
    map_file
        .read_exact_at(&mut bits, MAP_BITS_OFFSET)
        .map_err(|e| format!("{}: {e}", map_path.display()))?;
    Ok(ChunkMap::from_bits(size_bytes, bits).expect("length from the size"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_of(size: u64, held: &[u64]) -> ChunkMap {
        let mut m = ChunkMap::new(size);
        for &c in held {
            m.insert(c..c + 1);
        }
        m
    }

    #[test]
    fn segments_split_by_source_and_merge_neighbours() {
        let m = map_of(8 * CHUNK_BYTES, &[1, 2, 5]);
        let s = m.segments(100, 6 * CHUNK_BYTES);
        let src: Vec<(u64, u64, bool)> =
            s.iter().map(|s| (s.offset, s.len, s.in_overlay)).collect();
        assert_eq!(
            src,
            vec![
                (100, CHUNK_BYTES - 100, false),
                (CHUNK_BYTES, 2 * CHUNK_BYTES, true),
                (3 * CHUNK_BYTES, 2 * CHUNK_BYTES, false),
                (5 * CHUNK_BYTES, CHUNK_BYTES, true),
                (6 * CHUNK_BYTES, 100, false),
            ]
        );
        assert_eq!(s.iter().map(|s| s.len).sum::<u64>(), 6 * CHUNK_BYTES);
    }

    #[test]
    fn copy_up_takes_the_unheld_rest_of_partial_end_chunks() {
        let m = map_of(8 * CHUNK_BYTES, &[3]);
        // Both ends partial, neither held.
        assert_eq!(
            m.copy_up(512, CHUNK_BYTES),
            vec![0..512, CHUNK_BYTES + 512..2 * CHUNK_BYTES]
        );
        // Inside one chunk: the head and the tail of that chunk.
        assert_eq!(m.copy_up(1024, 512), vec![0..1024, 1536..CHUNK_BYTES]);
        // A held end chunk needs nothing; aligned ends need nothing.
        assert_eq!(m.copy_up(3 * CHUNK_BYTES + 512, 512), vec![]);
        assert_eq!(m.copy_up(CHUNK_BYTES, 2 * CHUNK_BYTES), vec![]);
    }

    #[test]
    fn a_short_last_chunk_is_whole_at_the_end_of_the_member() {
        let size = 2 * CHUNK_BYTES + 1024;
        let m = ChunkMap::new(size);
        assert_eq!(m.chunks(), 3);
        assert_eq!(m.chunk_bytes(2), 2 * CHUNK_BYTES..size);
        assert_eq!(m.copy_up(2 * CHUNK_BYTES, 1024), vec![]);
        assert_eq!(
            m.copy_up(2 * CHUNK_BYTES, 512),
            vec![2 * CHUNK_BYTES + 512..size]
        );
        let mut m = m;
        m.insert(2..3);
        assert_eq!(m.held_bytes(), 1024);
        assert_eq!(m.runs().collect::<Vec<_>>(), vec![2 * CHUNK_BYTES..size]);
    }

    #[test]
    fn insert_reports_the_changed_bit_bytes_once() {
        let mut m = ChunkMap::new(100 * CHUNK_BYTES);
        assert_eq!(m.insert(3..20), Some(0..3));
        assert_eq!(m.insert(3..20), None);
        assert_eq!(m.insert(18..25), Some(2..4));
        assert_eq!(m.held(), 22);
        assert_eq!(
            m.runs().collect::<Vec<_>>(),
            vec![3 * CHUNK_BYTES..25 * CHUNK_BYTES]
        );
        let again = ChunkMap::from_bits(100 * CHUNK_BYTES, m.bits().to_vec()).unwrap();
        assert_eq!(again, m);
        assert!(ChunkMap::from_bits(100 * CHUNK_BYTES, vec![0; 3]).is_none());
    }

    #[test]
    fn map_header_round_trips_and_rejects_others() {
        let h = encode_map_header(12345 * 512);
        assert_eq!(&h[0..8], b"URAIDOVM");
        assert_eq!(decode_map_header(&h), Ok(12345 * 512));
        let mut bad = h;
        bad[12..16].copy_from_slice(&4096u32.to_le_bytes());
        assert!(decode_map_header(&bad).unwrap_err().contains("chunk size"));
        assert!(decode_map_header(&[0u8; 32]).unwrap_err().contains("magic"));
    }
}
