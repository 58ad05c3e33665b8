//! The byte model of an array: what every read must return.
//!
//! A byte is exact (one legal value) until a write to it fails or is cut by a crash; then
//! it may hold the old or the new value (md gives no more than that for a failed write),
//! and after a second such write, anything. A successful write makes bytes exact again.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Certainty {
    Exact,
    /// `cur` or `alt`.
    Either,
    /// Any value (several failed writes overlapped).
    Any,
}

pub struct Model {
    cur: Vec<u8>,
    alt: Vec<u8>,
    state: Vec<Certainty>,
}

impl Model {
    pub fn new(size_bytes: u64) -> Model {
        let n = size_bytes as usize;
        Model {
            cur: vec![0; n],
            alt: vec![0; n],
            state: vec![Certainty::Exact; n],
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.cur.len() as u64
    }

    pub fn write_ok(&mut self, offset: u64, data: &[u8]) {
        let s = offset as usize;
        self.cur[s..s + data.len()].copy_from_slice(data);
        self.state[s..s + data.len()].fill(Certainty::Exact);
    }

    /// A write that failed (or was cut): each byte is now the old or the new value.
    pub fn write_uncertain(&mut self, offset: u64, data: &[u8]) {
        let s = offset as usize;
        for (i, &new) in data.iter().enumerate() {
            let j = s + i;
            match self.state[j] {
                Certainty::Exact if self.cur[j] != new => {
                    self.alt[j] = self.cur[j];
                    self.cur[j] = new;
                    self.state[j] = Certainty::Either;
                }
                Certainty::Either if new != self.cur[j] && new != self.alt[j] => {
                    self.state[j] = Certainty::Any;
                }
                _ => {}
            }
        }
    }

    /// Whether `got` (read at `offset`) is legal; else a description of the first bad byte.
    pub fn check(&self, offset: u64, got: &[u8]) -> Result<(), String> {
        let s = offset as usize;
        let exact = &self.cur[s..s + got.len()];
        if got == exact {
            return Ok(());
        }
        for (i, &g) in got.iter().enumerate() {
            let j = s + i;
            let ok = match self.state[j] {
                Certainty::Exact => g == self.cur[j],
                Certainty::Either => g == self.cur[j] || g == self.alt[j],
                Certainty::Any => true,
            };
            if !ok {
                let run = got[i..]
                    .iter()
                    .zip(&self.cur[j..])
                    .take_while(|(a, b)| a != b)
                    .count();
                return Err(format!(
                    "wrong data at array byte {j} (sector {}): read {:#04x}, model {:#04x}{} \
                     ({run} differing bytes from there)",
                    j / 512,
                    g,
                    self.cur[j],
                    match self.state[j] {
                        Certainty::Either => format!(" or {:#04x}", self.alt[j]),
                        _ => String::new(),
                    }
                ));
            }
        }
        Ok(())
    }

    /// After a read that passed [`Model::check`] on a consistent array, take what it
    /// returned as the truth.
    pub fn settle(&mut self, offset: u64, got: &[u8]) {
        self.write_ok(offset, got);
    }

    /// Byte ranges `[start, end)` that are not exact.
    pub fn uncertain_ranges(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.state.len() {
            if self.state[i] == Certainty::Exact {
                i += 1;
                continue;
            }
            let s = i;
            while i < self.state.len() && self.state[i] != Certainty::Exact {
                i += 1;
            }
            out.push((s as u64, i as u64));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_allows_old_or_new_but_nothing_else() {
        let mut m = Model::new(16);
        m.write_ok(0, &[1; 16]);
        m.write_uncertain(4, &[2; 4]);
        assert!(m.check(0, &[1; 16]).is_ok());
        let mut mixed = [1u8; 16];
        mixed[5] = 2;
        assert!(m.check(0, &mixed).is_ok());
        mixed[6] = 3;
        assert!(m.check(0, &mixed).is_err());
        mixed[6] = 1;
        mixed[9] = 2;
        assert!(m.check(0, &mixed).is_err(), "byte 9 was not written");
        assert_eq!(m.uncertain_ranges(), vec![(4, 8)]);
        m.write_ok(0, &[7; 8]);
        assert!(m.uncertain_ranges().is_empty());
        assert!(m.check(4, &[1; 4]).is_err());
    }
}
