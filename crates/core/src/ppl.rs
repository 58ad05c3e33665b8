//! md's partial parity log (PPL, raid5 only): the header codec, the area scan, and the
//! geometry of one entry, for writing and for recovery. Pure; the engine does the IO.
//!
//! The PPL area of a member lies `ppl.offset` sectors from its superblock and is
//! `ppl.size` sectors long. It holds PPLs: a 4 KiB header (`ppl_header`) followed by the
//! partial parity of its entries, in entry order. With a small area there is one PPL, at
//! the start; with an area of at least 2 × (128 KiB + 4 KiB) md writes PPLs one after
//! another and wraps around (FEATURE_MULTIPLE_PPLS), and the newest is found by walking
//! the chain of headers from the start while their generation grows (md's
//! `ppl_load_distributed`).
//!
//! An entry describes a rectangle of one stripe: `data_disks` consecutive data chunks,
//! starting with the chunk of `data_sector`, each over the same rows. Its partial parity
//! is the XOR of the stripe's other data chunks over those rows, so that after a crash
//! the parity is the XOR of the rectangle's data (whatever of it reached the members) and
//! the partial parity. An entry covering every data chunk has no partial parity
//! (`pp_size` 0). All checksums are CRC32C (md's `~crc32c_le(~0, ..)`).

use crate::SECTOR_BYTES;

/// Size of a PPL header.
pub const PPL_HEADER_SIZE: usize = 4096;
/// Reserved bytes at the start of the header, filled with 0xff.
pub const PPL_HDR_RESERVED: usize = 512;
/// Bytes of one `ppl_header_entry`.
pub const PPL_ENTRY_BYTES: usize = 24;
/// Entries that fit in a header (md's PPL_HDR_MAX_ENTRIES).
pub const PPL_HDR_MAX_ENTRIES: usize = (PPL_HEADER_SIZE - PPL_HDR_RESERVED - 4 * 4 - 8) / 24;
/// Partial parity bytes of one PPL when the area holds several (md's PPL_SPACE_SIZE).
pub const PPL_SPACE_SIZE: usize = 128 * 1024;
/// The area size from which md writes several PPLs round-robin.
pub const MULTIPLE_PPL_MIN_BYTES: u64 = 2 * (PPL_SPACE_SIZE + PPL_HEADER_SIZE) as u64;
/// md's stripe_head page: the granularity of an area's partial parity space.
const PAGE: u64 = 4096;

const OFF_SIGNATURE: usize = 512;
const OFF_GENERATION: usize = 520;
const OFF_COUNT: usize = 528;
const OFF_CHECKSUM: usize = 532;
const OFF_ENTRIES: usize = 536;

/// A PPL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PplError {
    /// Fewer than 4096 bytes.
    #[error("PPL header: {0} bytes, a header has 4096")]
    Short(usize),
    /// The header checksum does not match its bytes.
    #[error("PPL header checksum {stored:#010x} does not match its bytes ({computed:#010x})")]
    Checksum {
        /// What the header says.
        stored: u32,
        /// What its bytes give.
        computed: u32,
    },
    /// The header belongs to another array.
    #[error("PPL header signature {found:#010x} is not this array's ({want:#010x})")]
    Signature {
        /// What the header says.
        found: u32,
        /// crc32c of this array's UUID.
        want: u32,
    },
    /// More entries than a header holds.
    #[error("PPL header says {0} entries, a header holds at most {PPL_HDR_MAX_ENTRIES}")]
    TooManyEntries(u32),
    /// An entry that describes no valid rectangle of a stripe.
    #[error("PPL entry {index}: {why}")]
    BadEntry {
        /// Its index in the header.
        index: usize,
        /// What is wrong with it.
        why: String,
    },
}

/// One `ppl_header_entry` (little endian, 24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PplEntry {
    /// Array sector (512-byte units for md's native metadata) of the first modified data.
    pub data_sector: u64,
    /// Bytes of partial parity (0 when every data chunk is modified).
    pub pp_size: u32,
    /// Bytes of modified data (rows × data_disks).
    pub data_size: u32,
    /// Role of the stripe's parity member (the member holding this PPL).
    pub parity_disk: u32,
    /// crc32c of the partial parity.
    pub checksum: u32,
}

/// A `ppl_header`: signature, generation and entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PplHeader {
    /// crc32c of the array UUID ([`signature`]).
    pub signature: u32,
    /// Grows by one with every PPL written since the array started (0: an empty header).
    pub generation: u64,
    /// The logged writes.
    pub entries: Vec<PplEntry>,
}

/// The PPL signature of an array: crc32c of its 16-byte UUID (md's native metadata).
pub fn signature(uuid: &[u8; 16]) -> u32 {
    crc32c::crc32c(uuid)
}

/// The checksum of an entry's partial parity.
pub fn pp_checksum(pp: &[u8]) -> u32 {
    crc32c::crc32c(pp)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl PplHeader {
    /// An empty header (what md writes when it starts an array).
    pub fn empty(signature: u32) -> PplHeader {
        PplHeader {
            signature,
            ..PplHeader::default()
        }
    }

    /// Sectors of partial parity after the header.
    pub fn pp_sectors(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| u64::from(e.pp_size))
            .sum::<u64>()
            / SECTOR_BYTES
    }

    /// The 4 KiB header: reserved bytes 0xff, fields, entries, zeros, checksum.
    pub fn encode(&self) -> [u8; PPL_HEADER_SIZE] {
        assert!(
            self.entries.len() <= PPL_HDR_MAX_ENTRIES,
            "a PPL header holds at most {PPL_HDR_MAX_ENTRIES} entries"
        );
        let mut b = [0u8; PPL_HEADER_SIZE];
        b[..PPL_HDR_RESERVED].fill(0xff);
        b[OFF_SIGNATURE..OFF_SIGNATURE + 4].copy_from_slice(&self.signature.to_le_bytes());
        b[OFF_GENERATION..OFF_GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        b[OFF_COUNT..OFF_COUNT + 4].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let at = OFF_ENTRIES + i * PPL_ENTRY_BYTES;
            b[at..at + 8].copy_from_slice(&e.data_sector.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&e.pp_size.to_le_bytes());
            b[at + 12..at + 16].copy_from_slice(&e.data_size.to_le_bytes());
            b[at + 16..at + 20].copy_from_slice(&e.parity_disk.to_le_bytes());
            b[at + 20..at + 24].copy_from_slice(&e.checksum.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b[OFF_CHECKSUM..OFF_CHECKSUM + 4].copy_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(PplHeader::decode(&b).as_ref(), Ok(self));
        b
    }

    /// Decode a header, checking its checksum (computed with the checksum field zeroed,
    /// as md does) and its entry count. The signature is the caller's to check
    /// ([`PplHeader::decode_for`]).
    pub fn decode(b: &[u8]) -> Result<PplHeader, PplError> {
        if b.len() < PPL_HEADER_SIZE {
            return Err(PplError::Short(b.len()));
        }
        let b = &b[..PPL_HEADER_SIZE];
        let stored = le32(b, OFF_CHECKSUM);
        let computed = crc32c::crc32c_append(
            crc32c::crc32c_append(crc32c::crc32c(&b[..OFF_CHECKSUM]), &[0; 4]),
            &b[OFF_CHECKSUM + 4..],
        );
        if stored != computed {
            return Err(PplError::Checksum { stored, computed });
        }
        let count = le32(b, OFF_COUNT);
        if count as usize > PPL_HDR_MAX_ENTRIES {
            return Err(PplError::TooManyEntries(count));
        }
        let entries = (0..count as usize)
            .map(|i| {
                let at = OFF_ENTRIES + i * PPL_ENTRY_BYTES;
                PplEntry {
                    data_sector: le64(b, at),
                    pp_size: le32(b, at + 8),
                    data_size: le32(b, at + 12),
                    parity_disk: le32(b, at + 16),
                    checksum: le32(b, at + 20),
                }
            })
            .collect();
        Ok(PplHeader {
            signature: le32(b, OFF_SIGNATURE),
            generation: le64(b, OFF_GENERATION),
            entries,
        })
    }

    /// Decode a header of the array whose signature is `want`.
    pub fn decode_for(b: &[u8], want: u32) -> Result<PplHeader, PplError> {
        let h = PplHeader::decode(b)?;
        if h.signature != want {
            return Err(PplError::Signature {
                found: h.signature,
                want,
            });
        }
        Ok(h)
    }
}

/// How a member's PPL area is used, from its size (md's `ppl_init_child_log`, after
/// `ppl_validate_rdev` rounds the partial parity space down to whole pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PplArea {
    /// Usable sectors of the area (header included).
    pub size_sectors: u64,
    /// Several PPLs, written round-robin.
    pub multiple: bool,
    /// Partial parity bytes one PPL may carry.
    pub entry_space_bytes: u64,
}

impl PplArea {
    /// The area of `size_sectors`; None if it cannot hold a header and one page.
    pub fn new(size_sectors: u64) -> Option<PplArea> {
        let hdr = PPL_HEADER_SIZE as u64 / SECTOR_BYTES;
        let pp = size_sectors.checked_sub(hdr)? / (PAGE / SECTOR_BYTES) * (PAGE / SECTOR_BYTES);
        if pp == 0 {
            return None;
        }
        let size_sectors = pp + hdr;
        let multiple = size_sectors * SECTOR_BYTES >= MULTIPLE_PPL_MIN_BYTES;
        Some(PplArea {
            size_sectors,
            multiple,
            entry_space_bytes: if multiple {
                PPL_SPACE_SIZE as u64
            } else {
                pp * SECTOR_BYTES
            },
        })
    }

    /// Where the PPL after one at `at` (sectors into the area) carrying `pp_bytes` goes:
    /// with one PPL always the start; with several the next free place, wrapping to the
    /// start when the next PPL of `next_pp_bytes` would not fit (md's next_io_sector).
    pub fn next_at(&self, at: u64, pp_bytes: u64) -> u64 {
        if !self.multiple {
            return 0;
        }
        at + (PPL_HEADER_SIZE as u64 + pp_bytes) / SECTOR_BYTES
    }

    /// Where a PPL of `pp_bytes` goes when the next free place is `next`.
    pub fn place(&self, next: u64, pp_bytes: u64) -> u64 {
        if !self.multiple {
            return 0;
        }
        let need = (PPL_HEADER_SIZE as u64 + pp_bytes) / SECTOR_BYTES;
        if self.size_sectors.saturating_sub(next) < need {
            0
        } else {
            next
        }
    }
}

/// The newest PPL of an area, found as md finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latest {
    /// Sectors from the area's start to its header.
    pub at_sectors: u64,
    /// The header.
    pub header: PplHeader,
}

/// Walk the headers of an area from its start (`read` returns the 4 KiB at a sector
/// offset into the area, or None past its end) and return the newest valid one: the walk
/// stops at the first header with a bad checksum or signature, or whose generation is
/// lower than the one before. `Err` with the first header's error when none is valid
/// (md counts that as a mismatch and leaves the array to a resync).
pub fn find_latest(
    area_sectors: u64,
    want_signature: u32,
    mut read: impl FnMut(u64) -> Option<Vec<u8>>,
) -> Result<Latest, PplError> {
    let hdr = PPL_HEADER_SIZE as u64 / SECTOR_BYTES;
    let mut prev: Option<Latest> = None;
    let mut at = 0u64;
    while at + hdr <= area_sectors {
        let Some(b) = read(at) else { break };
        let h = match PplHeader::decode_for(&b, want_signature) {
            Ok(h) => h,
            Err(e) => return prev.ok_or(e),
        };
        if prev
            .as_ref()
            .is_some_and(|p| p.header.generation > h.generation)
        {
            break;
        }
        let next = at + hdr + h.pp_sectors();
        prev = Some(Latest {
            at_sectors: at,
            header: h,
        });
        at = next;
    }
    prev.ok_or(PplError::Short(0))
}

/// What one entry covers in its stripe, as md's `ppl_recover_entry` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryExtent {
    /// Array sector of the first modified data.
    pub first_sector: u64,
    /// Rows (sectors within each chunk) the entry covers.
    pub strip_sectors: u64,
    /// Consecutive data chunks read for the parity.
    pub data_disks: u64,
    /// Array sectors at or past this take no part (md's r_sector_last).
    pub last_sector: u64,
}

impl EntryExtent {
    /// Rows of data chunk `d` (0 = the chunk of `first_sector`) that take part.
    pub fn rows_of(&self, d: u64, chunk_sectors: u64) -> u64 {
        let start = self.first_sector + d * chunk_sectors;
        self.last_sector
            .saturating_sub(start)
            .min(self.strip_sectors)
    }
}

/// The extent of entry `index` for an array of `stripe_data_disks` data chunks of
/// `chunk_sectors`, checked: it must lie in one stripe and its sizes must be whole
/// sectors, so that recovery neither reads nor writes outside the stripe.
pub fn entry_extent(
    index: usize,
    e: &PplEntry,
    chunk_sectors: u64,
    stripe_data_disks: u64,
) -> Result<EntryExtent, PplError> {
    let bad = |why: String| Err(PplError::BadEntry { index, why });
    let (pp, data) = (u64::from(e.pp_size), u64::from(e.data_size));
    if !pp.is_multiple_of(SECTOR_BYTES) || !data.is_multiple_of(SECTOR_BYTES) || data == 0 {
        return bad(format!(
            "pp_size {pp} and data_size {data} must be whole sectors, data_size not 0"
        ));
    }
    let first = e.data_sector;
    // No array reaches 2^62 sectors: a larger data_sector is damage, and the sums below
    // stay far from overflow.
    if first >= 1 << 62 {
        return bad(format!("data_sector {first} is beyond any array"));
    }
    let (data_disks, strip, last);
    if pp / SECTOR_BYTES < chunk_sectors {
        if pp > 0 {
            if !data.is_multiple_of(pp) {
                return bad(format!(
                    "data_size {data} is not a multiple of pp_size {pp}"
                ));
            }
            data_disks = data / pp;
            strip = pp / SECTOR_BYTES;
        } else {
            data_disks = stripe_data_disks;
            if !(data / SECTOR_BYTES).is_multiple_of(data_disks) {
                return bad(format!(
                    "data_size {data} of a full-stripe entry is not a multiple of {data_disks} data chunks"
                ));
            }
            strip = data / SECTOR_BYTES / data_disks;
        }
        last = first + (data_disks - 1) * chunk_sectors + strip;
    } else {
        data_disks = stripe_data_disks;
        strip = chunk_sectors;
        last = first + data / SECTOR_BYTES;
    }
    let x = EntryExtent {
        first_sector: first,
        strip_sectors: strip,
        data_disks,
        last_sector: last,
    };
    let stripe_sectors = chunk_sectors * stripe_data_disks;
    let stripe_end = first - first % stripe_sectors + stripe_sectors;
    let inside = data_disks <= stripe_data_disks
        && first % chunk_sectors + strip <= chunk_sectors
        && (0..data_disks).all(|d| {
            let rows = x.rows_of(d, chunk_sectors);
            rows == 0 || first + d * chunk_sectors + rows <= stripe_end
        });
    if !inside {
        return bad(format!(
            "data_sector {first}, pp_size {pp}, data_size {data} do not describe rows of one \
             stripe of {stripe_data_disks} chunks of {chunk_sectors} sectors"
        ));
    }
    Ok(x)
}

/// One rectangle of a stripe write: data chunks `first..first + count` (logical data
/// indices) over the byte rows `rows` of each chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rect {
    /// First data index.
    pub first: usize,
    /// Consecutive data chunks.
    pub count: usize,
    /// Byte rows within a chunk.
    pub rows: std::ops::Range<usize>,
}

/// Split a stripe write into rectangles: `pieces[i]` is the byte range written in data
/// chunk `i`. Every row written in some chunk lies in exactly one rectangle, which spans
/// the written chunks of that row; None if a row's written chunks are not consecutive
/// (a partial parity must then leave out data the writer does not have).
pub fn rects(pieces: &[Option<std::ops::Range<usize>>]) -> Option<Vec<Rect>> {
    let mut cuts: Vec<usize> = pieces
        .iter()
        .flatten()
        .flat_map(|r| [r.start, r.end])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<Rect> = Vec::new();
    for w in cuts.windows(2) {
        let (lo, hi) = (w[0], w[1]);
        let written: Vec<usize> = (0..pieces.len())
            .filter(|&i| {
                pieces[i]
                    .as_ref()
                    .is_some_and(|r| r.start <= lo && hi <= r.end)
            })
            .collect();
        let (Some(&first), Some(&last)) = (written.first(), written.last()) else {
            continue;
        };
        if last - first + 1 != written.len() {
            return None;
        }
        match out.last_mut() {
            Some(r) if r.first == first && r.count == written.len() && r.rows.end == lo => {
                r.rows.end = hi
            }
            _ => out.push(Rect {
                first,
                count: written.len(),
                rows: lo..hi,
            }),
        }
    }
    Some(out)
}

/// The entry of rectangle `r` of the stripe whose first array sector is `stripe_sector`
/// (`checksum` of its partial parity; none with every data chunk written).
pub fn entry_for(
    r: &Rect,
    stripe_sector: u64,
    chunk_bytes: usize,
    data_disks: usize,
    parity_disk: u32,
    checksum: u32,
) -> PplEntry {
    let rows = r.rows.len();
    let full = r.count == data_disks;
    PplEntry {
        data_sector: stripe_sector + ((r.first * chunk_bytes + r.rows.start) as u64) / SECTOR_BYTES,
        pp_size: if full { 0 } else { rows as u32 },
        data_size: (r.count * rows) as u32,
        parity_disk,
        checksum: if full { pp_checksum(&[]) } else { checksum },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_mds() {
        assert_eq!(PPL_HDR_MAX_ENTRIES, 148);
        let h = PplHeader {
            signature: 0x1122_3344,
            generation: 7,
            entries: vec![PplEntry {
                data_sector: 0x0102_0304_0506_0708,
                pp_size: 4096,
                data_size: 8192,
                parity_disk: 2,
                checksum: 0xdead_beef,
            }],
        };
        let b = h.encode();
        assert!(b[..512].iter().all(|&x| x == 0xff));
        assert_eq!(&b[512..516], &0x1122_3344u32.to_le_bytes());
        assert_eq!(&b[516..520], &[0; 4], "padding");
        assert_eq!(&b[520..528], &7u64.to_le_bytes());
        assert_eq!(&b[528..532], &1u32.to_le_bytes());
        assert_eq!(&b[536..544], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[544..548], &4096u32.to_le_bytes());
        assert_eq!(&b[548..552], &8192u32.to_le_bytes());
        assert_eq!(&b[552..556], &2u32.to_le_bytes());
        assert_eq!(&b[556..560], &0xdead_beefu32.to_le_bytes());
        assert!(b[560..].iter().all(|&x| x == 0));
        // The checksum is crc32c of the page with the checksum field zero.
        let mut z = b;
        z[532..536].fill(0);
        assert_eq!(&b[532..536], &crc32c::crc32c(&z).to_le_bytes());
    }

    #[test]
    fn signature_is_crc32c_of_the_uuid() {
        // crc32c("123456789") is the standard check value 0xe3069283.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let uuid = *b"0123456789abcdef";
        assert_eq!(signature(&uuid), crc32c::crc32c(&uuid));
        assert_ne!(signature(&uuid), signature(&[0; 16]));
    }

    #[test]
    fn empty_header_of_md() {
        let h = PplHeader::empty(5);
        let b = h.encode();
        assert_eq!(PplHeader::decode_for(&b, 5), Ok(h));
        assert!(matches!(
            PplHeader::decode_for(&b, 6),
            Err(PplError::Signature { found: 5, want: 6 })
        ));
        assert!(matches!(
            PplHeader::decode(&[0u8; 4096]),
            Err(PplError::Checksum { .. })
        ));
        assert_eq!(PplHeader::decode(&[0u8; 10]), Err(PplError::Short(10)));
    }

    #[test]
    fn area_modes() {
        assert_eq!(PplArea::new(8), None);
        let small = PplArea::new(8 + 20).unwrap();
        assert_eq!(small.size_sectors, 8 + 16);
        assert!(!small.multiple);
        assert_eq!(small.entry_space_bytes, 16 * 512);
        let big = PplArea::new(2048).unwrap();
        assert!(big.multiple);
        assert_eq!(big.entry_space_bytes, 128 * 1024);
        assert_eq!(big.place(0, 4096), 0);
        assert_eq!(big.next_at(0, 4096), 16);
        assert_eq!(big.place(2040, 4096), 0, "wraps when it does not fit");
        assert_eq!(big.place(2032, 4096), 2032);
    }

    fn hdr(sig: u32, generation: u64, pp: &[u32]) -> Vec<u8> {
        PplHeader {
            signature: sig,
            generation,
            entries: pp
                .iter()
                .map(|&p| PplEntry {
                    pp_size: p,
                    data_size: p.max(512),
                    ..Default::default()
                })
                .collect(),
        }
        .encode()
        .to_vec()
    }

    #[test]
    fn latest_walks_the_chain() {
        let mut area = vec![0u8; 64 * 512];
        area[..4096].copy_from_slice(&hdr(1, 4, &[4096]));
        area[16 * 512..16 * 512 + 4096].copy_from_slice(&hdr(1, 5, &[]));
        area[24 * 512..24 * 512 + 4096].copy_from_slice(&hdr(1, 2, &[]));
        let read = |at: u64| {
            let a = at as usize * 512;
            area.get(a..a + 4096).map(|b| b.to_vec())
        };
        let l = find_latest(64, 1, read).unwrap();
        assert_eq!((l.at_sectors, l.header.generation), (16, 5));
        // A wrong signature at the start: nothing valid.
        assert!(matches!(
            find_latest(64, 2, read),
            Err(PplError::Signature { .. })
        ));
    }

    #[test]
    fn rects_of_a_contiguous_write() {
        // Chunks of 16 KiB; write from chunk 0 at 12 KiB to chunk 2 at 4 KiB.
        let p = vec![Some(12288..16384), Some(0..16384), Some(0..4096), None];
        let r = rects(&p).unwrap();
        assert_eq!(
            r,
            vec![
                Rect {
                    first: 1,
                    count: 2,
                    rows: 0..4096
                },
                Rect {
                    first: 1,
                    count: 1,
                    rows: 4096..12288
                },
                Rect {
                    first: 0,
                    count: 2,
                    rows: 12288..16384
                },
            ]
        );
        assert_eq!(rects(&[Some(0..512), None, Some(0..512)]), None);
    }

    #[test]
    fn entries_read_back_as_their_rects() {
        // 3 data disks, chunk 32 sectors; rect of chunks 1..3 at rows 8..16 of stripe 2.
        let r = Rect {
            first: 1,
            count: 2,
            rows: 4096..8192,
        };
        let e = entry_for(&r, 2 * 96, 16384, 3, 0, 9);
        let x = entry_extent(0, &e, 32, 3).unwrap();
        assert_eq!(x.first_sector, 2 * 96 + 32 + 8);
        assert_eq!((x.strip_sectors, x.data_disks), (8, 2));
        assert_eq!(
            (x.rows_of(0, 32), x.rows_of(1, 32), x.rows_of(2, 32)),
            (8, 8, 0)
        );
        // Full rows: every data chunk, no partial parity.
        let f = entry_for(
            &Rect {
                first: 0,
                count: 3,
                rows: 0..16384,
            },
            0,
            16384,
            3,
            3,
            0,
        );
        assert_eq!(f.pp_size, 0);
        let x = entry_extent(0, &f, 32, 3).unwrap();
        assert_eq!((x.strip_sectors, x.data_disks), (32, 3));
        // A chunk-sized partial parity (md's case 3/4 reading).
        let c = entry_for(
            &Rect {
                first: 0,
                count: 2,
                rows: 0..16384,
            },
            0,
            16384,
            3,
            3,
            0,
        );
        let x = entry_extent(0, &c, 32, 3).unwrap();
        assert_eq!(
            (x.rows_of(0, 32), x.rows_of(1, 32), x.rows_of(2, 32)),
            (32, 32, 0)
        );
        // Out of the stripe: refused by name.
        let bad = PplEntry {
            data_sector: 80,
            pp_size: 4096,
            data_size: 3 * 4096,
            ..f
        };
        assert!(matches!(
            entry_extent(3, &bad, 32, 3),
            Err(PplError::BadEntry { index: 3, .. })
        ));
    }

    proptest! {
        #[test]
        fn header_round_trips(
            sig: u32, generation: u64,
            es in proptest::collection::vec((any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()), 0..=PPL_HDR_MAX_ENTRIES),
        ) {
            let h = PplHeader {
                signature: sig,
                generation,
                entries: es.iter().map(|&(d, p, s, pd, c)| PplEntry {
                    data_sector: d, pp_size: p, data_size: s, parity_disk: pd, checksum: c,
                }).collect(),
            };
            let b = h.encode();
            prop_assert_eq!(PplHeader::decode_for(&b, sig), Ok(h));
        }

        #[test]
        fn any_flipped_bit_is_caught(generation: u64, at in 0usize..4096, bit in 0u8..8) {
            let mut b = PplHeader { signature: 3, generation, entries: vec![PplEntry::default(); 2] }.encode();
            b[at] ^= 1 << bit;
            prop_assert!(PplHeader::decode(&b).is_err());
        }

        #[test]
        fn decode_and_extent_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200), chunk_pow in 3u32..10, dd in 1u64..8) {
            let _ = PplHeader::decode(&bytes);
            if bytes.len() >= 24 {
                let e = PplEntry {
                    data_sector: le64(&bytes, 0) >> 20,
                    pp_size: le32(&bytes, 8) >> 12,
                    data_size: le32(&bytes, 12) >> 12,
                    parity_disk: 0,
                    checksum: 0,
                };
                let chunk = 1u64 << chunk_pow;
                if let Ok(x) = entry_extent(0, &e, chunk, dd) {
                    // A valid extent stays inside one stripe.
                    let stripe = chunk * dd;
                    let base = x.first_sector / stripe * stripe;
                    prop_assert!(x.last_sector <= base + stripe);
                    for d in 0..x.data_disks {
                        if x.rows_of(d, chunk) > 0 {
                            prop_assert!(x.first_sector + d * chunk + x.rows_of(d, chunk) <= base + stripe);
                        }
                    }
                }
            }
        }

        #[test]
        fn rects_cover_each_written_row_once(start in 0usize..4, end in 0usize..4, s_off in 0usize..8, e_off in 1usize..=8) {
            // A contiguous write over 4 chunks of 8 rows (row = 512 bytes).
            let (a, b) = (start.min(end), start.max(end));
            let (s, e) = (s_off * 512, e_off * 512);
            if a == b && s >= e { return Ok(()); }
            let pieces: Vec<Option<std::ops::Range<usize>>> = (0..4).map(|i| {
                if i < a || i > b { None }
                else if a == b { Some(s..e) }
                else if i == a { (s < 4096).then_some(s..4096) }
                else if i == b { Some(0..e) }
                else { Some(0..4096) }
            }).collect();
            let r = rects(&pieces).unwrap();
            for (i, p) in pieces.iter().enumerate() {
                for row in (0..4096).step_by(512) {
                    let written = p.as_ref().is_some_and(|p| p.contains(&row));
                    let n = r.iter().filter(|x| x.rows.contains(&row) && (x.first..x.first + x.count).contains(&i)).count();
                    prop_assert_eq!(n, written as usize, "chunk {} row {}", i, row);
                }
            }
        }
    }

    #[test]
    fn entry_near_the_end_of_the_sector_space_is_refused_not_overflowed() {
        // Found by tests/fuzz.rs: a data_sector near u64::MAX made the extent sums overflow.
        let e = PplEntry {
            data_sector: u64::MAX - 3,
            pp_size: 0,
            data_size: 512 * 96,
            parity_disk: 0,
            checksum: 0,
        };
        let err = entry_extent(0, &e, 32, 3).unwrap_err();
        assert!(format!("{err}").contains("beyond any array"), "{err}");
    }
}
