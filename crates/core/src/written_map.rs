//! uraid's own file (not md's) for what an array knows was never written: one bit per
//! region of array sectors, set where the region was written or may have been. It is
//! kept across a clean stop in uraid's state directory, one file per array
//! (`<set uuid>.written`), and trusted at the next start only if the superblocks are
//! still the ones written at that stop: the same events and the same `utime`, whose
//! microseconds field (bits 40..64, which md never fills) carries a nonce that only
//! that stop wrote. Any other writer of the array (Linux md, mdadm, another uraid) writes
//! its superblocks before it writes data, and changes one of the two. Layout (all
//! little-endian; docs/FORMAT.md):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `uraidwm1` |
//! | 8..12 | version, 1 |
//! | 12..16 | log2 of the region in sectors |
//! | 16..32 | the array's set uuid |
//! | 32..40 | the superblocks' events at the stop |
//! | 40..48 | the superblocks' utime at the stop (nonce in bits 40..64) |
//! | 48..56 | array sectors |
//! | 56..64 | words that follow |
//! | 64.. | the map, 64 regions a word, bit set: written |
//! | last 4 | crc32c of everything before |

/// The file's first bytes.
pub const MAGIC: [u8; 8] = *b"uraidwm1";
/// The version this code writes and reads.
pub const VERSION: u32 = 1;
const HEADER: usize = 64;

/// Why a file cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WrittenMapError {
    #[error("not a uraid written-map file (magic {0:02x?})")]
    Magic(Vec<u8>),
    #[error("written-map version {0}; this uraid reads version {VERSION}")]
    Version(u32),
    #[error("written-map file is {got} bytes, its header says {want}")]
    Length { got: usize, want: usize },
    #[error("written-map checksum {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

/// The file's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenMapFile {
    pub set_uuid: [u8; 16],
    pub events: u64,
    pub utime: u64,
    pub array_sectors: u64,
    /// A region is `1 << region_shift` sectors.
    pub region_shift: u32,
    /// Bit `r % 64` of word `r / 64` set: region `r` was written.
    pub words: Vec<u64>,
}

impl WrittenMapFile {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + 8 * self.words.len() + 4);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.region_shift.to_le_bytes());
        b.extend_from_slice(&self.set_uuid);
        for v in [
            self.events,
            self.utime,
            self.array_sectors,
            self.words.len() as u64,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for w in &self.words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<WrittenMapFile, WrittenMapError> {
        if b.len() < HEADER + 4 || b[..8] != MAGIC {
            return Err(WrittenMapError::Magic(b[..b.len().min(8)].to_vec()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(8) != VERSION {
            return Err(WrittenMapError::Version(u32_at(8)));
        }
        let words = u64_at(56);
        let want = words
            .checked_mul(8)
            .and_then(|n| n.checked_add((HEADER + 4) as u64))
            .filter(|&n| n <= usize::MAX as u64)
            .map_or(usize::MAX, |n| n as usize);
        if b.len() != want {
            return Err(WrittenMapError::Length { got: b.len(), want });
        }
        let end = b.len() - 4;
        let (stored, computed) = (u32_at(end), crc32c::crc32c(&b[..end]));
        if stored != computed {
            return Err(WrittenMapError::Checksum { stored, computed });
        }
        Ok(WrittenMapFile {
            region_shift: u32_at(12),
            set_uuid: b[16..32].try_into().expect("16 bytes"),
            events: u64_at(32),
            utime: u64_at(40),
            array_sectors: u64_at(48),
            words: (HEADER..end).step_by(8).map(u64_at).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> WrittenMapFile {
        WrittenMapFile {
            set_uuid: [7; 16],
            events: 42,
            utime: 1_700_000_000 | 123_456 << 40,
            array_sectors: 1 << 21,
            region_shift: 11,
            words: vec![0, u64::MAX, 0x8000_0000_0000_0001],
        }
    }

    #[test]
    fn a_file_reads_back_as_written() {
        let f = sample();
        let b = f.encode();
        assert_eq!(b.len(), 64 + 3 * 8 + 4);
        assert_eq!(&b[..8], b"uraidwm1");
        assert_eq!(WrittenMapFile::decode(&b).unwrap(), f);
    }

    #[test]
    fn damage_is_named() {
        let b = sample().encode();
        let mut c = b.clone();
        c[70] ^= 1;
        assert!(matches!(
            WrittenMapFile::decode(&c),
            Err(WrittenMapError::Checksum { .. })
        ));
        assert!(matches!(
            WrittenMapFile::decode(&b[..b.len() - 1]),
            Err(WrittenMapError::Length { .. })
        ));
        let mut c = b.clone();
        c[8] = 2;
        assert_eq!(WrittenMapFile::decode(&c), Err(WrittenMapError::Version(2)));
        assert!(matches!(
            WrittenMapFile::decode(b"garbage"),
            Err(WrittenMapError::Magic(_))
        ));
        // A word count that would overflow is a length error, not a panic.
        let mut c = b.clone();
        c[56..64].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            WrittenMapFile::decode(&c),
            Err(WrittenMapError::Length { .. })
        ));
    }
}
