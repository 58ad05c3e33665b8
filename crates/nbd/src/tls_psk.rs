//! The pre-shared key file of TLS-PSK, as nbdkit's `--tls-psk`, qemu's `keys.psk` and
//! GnuTLS's psktool write it: one `identity:hexkey` per line, blank lines ignored.
//!
//! The keys are never printed: errors name the file, the line and what is wrong, and
//! `Debug` shows the identities only.

use std::fmt;
use std::path::Path;

/// A key file that cannot be used: the file, and what is wrong (never the key). The TLS
/// setup reports it as a [`crate::TlsError::File`].
#[derive(Debug, thiserror::Error)]
#[error("TLS: pre-shared key file {path}: {why}")]
pub struct PskFileError {
    /// The file.
    pub path: String,
    /// What is wrong, with the line where there is one.
    pub why: String,
}

/// Longest identity accepted (bytes), as GnuTLS and nbdkit take them.
pub const MAX_IDENTITY: usize = 128;
/// Longest key accepted (bytes, decoded): OpenSSL 3's `PSK_MAX_PSK_LEN`.
pub const MAX_KEY: usize = 512;

/// The identities of a key file and their keys.
#[derive(Clone)]
pub struct PskFile {
    /// The file, for messages.
    pub path: String,
    entries: Vec<(String, Vec<u8>)>,
}

impl fmt::Debug for PskFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PskFile")
            .field("path", &self.path)
            .field("identities", &self.identities().collect::<Vec<_>>())
            .finish()
    }
}

impl PskFile {
    /// Reads and checks the file at `path`.
    pub fn read(path: &Path) -> Result<PskFile, PskFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| PskFileError {
            path: shown.clone(),
            why: e.to_string(),
        })?;
        PskFile::parse(&shown, &text)
    }

    /// Checks `text`, the contents of the file `path`.
    pub fn parse(path: &str, text: &str) -> Result<PskFile, PskFileError> {
        let bad = |line: usize, why: String| PskFileError {
            path: path.to_string(),
            why: format!("line {line}: {why} (each line is identity:hexkey)"),
        };
        let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let Some((identity, hex)) = line.split_once(':') else {
                return Err(bad(n, "no ':' between the identity and the key".into()));
            };
            if identity.is_empty() {
                return Err(bad(n, "the identity is empty".into()));
            }
            if identity.len() > MAX_IDENTITY {
                return Err(bad(
                    n,
                    format!(
                        "the identity is {} bytes long, more than {MAX_IDENTITY}",
                        identity.len()
                    ),
                ));
            }
            if identity.bytes().any(|b| b.is_ascii_control()) {
                return Err(bad(n, "the identity holds a control character".into()));
            }
            let hex = hex.trim();
            if hex.is_empty() {
                return Err(bad(n, format!("identity {identity:?} has no key")));
            }
            if hex.len() % 2 != 0 {
                return Err(bad(
                    n,
                    format!("the key of {identity:?} has an odd number of hex digits"),
                ));
            }
            let Ok(key) = hex::decode(hex) else {
                return Err(bad(
                    n,
                    format!("the key of {identity:?} is not hexadecimal"),
                ));
            };
            if key.len() > MAX_KEY {
                return Err(bad(
                    n,
                    format!(
                        "the key of {identity:?} is {} bytes long, more than {MAX_KEY}",
                        key.len()
                    ),
                ));
            }
            if entries.iter().any(|(i, _)| i == identity) {
                return Err(bad(n, format!("identity {identity:?} is given twice")));
            }
            entries.push((identity.to_string(), key));
        }
        if entries.is_empty() {
            return Err(PskFileError {
                path: path.to_string(),
                why: "it holds no key (each line is identity:hexkey)".into(),
            });
        }
        Ok(PskFile {
            path: path.to_string(),
            entries,
        })
    }

    /// The key of `identity`, if the file has it.
    pub fn key(&self, identity: &[u8]) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(i, _)| i.as_bytes() == identity)
            .map(|(_, k)| k.as_slice())
    }

    /// The identities, in file order.
    pub fn identities(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(i, _)| i.as_str())
    }

    /// The identity a client uses: `username` (which the file must have), else the file's
    /// only one.
    pub fn choose(&self, username: Option<&str>) -> Result<(String, Vec<u8>), PskFileError> {
        let bad = |why: String| PskFileError {
            path: self.path.clone(),
            why,
        };
        match username {
            Some(name) => self
                .key(name.as_bytes())
                .map(|k| (name.to_string(), k.to_vec()))
                .ok_or_else(|| {
                    bad(format!(
                        "it has no identity {name:?} (the username asked for)"
                    ))
                }),
            None if self.entries.len() == 1 => Ok(self.entries[0].clone()),
            None => Err(bad(format!(
                "it holds {} identities: say which with ?tls-username=NAME (or \
                 --nbd-tls-username NAME)",
                self.entries.len()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        PskFile::parse("/k.psk", text).unwrap_err().to_string()
    }

    #[test]
    fn lines_are_identity_and_hex_key_and_blank_lines_are_ignored() {
        let f = PskFile::parse("/k.psk", "\nalice:00ff10\r\n\n  \nbob:ABCDEF\n").unwrap();
        assert_eq!(f.key(b"alice"), Some(&[0x00, 0xff, 0x10][..]));
        assert_eq!(f.key(b"bob"), Some(&[0xab, 0xcd, 0xef][..]));
        assert_eq!(f.key(b"carol"), None);
        assert_eq!(f.identities().collect::<Vec<_>>(), ["alice", "bob"]);
        let dbg = format!("{f:?}");
        assert!(dbg.contains("alice") && !dbg.contains("00ff10") && !dbg.contains("255"));
        // A key holding ':' cannot be, but an identity is split at the first one.
        assert!(err("a:b:cd").contains("not hexadecimal"));
    }

    #[test]
    fn bad_files_are_refused_naming_file_line_and_fault() {
        for (text, line, what) in [
            ("", None, "holds no key"),
            ("\n\n", None, "holds no key"),
            ("alice:0011\nbob", Some(2), "no ':'"),
            ("alice:0g", Some(1), "not hexadecimal"),
            ("alice:001", Some(1), "odd number of hex digits"),
            ("alice:", Some(1), "has no key"),
            (":0011", Some(1), "identity is empty"),
            ("a:00\na:11", Some(2), "given twice"),
        ] {
            let e = err(text);
            assert!(e.contains("/k.psk") && e.contains(what), "{text:?}: {e}");
            if let Some(l) = line {
                assert!(e.contains(&format!("line {l}:")), "{text:?}: {e}");
            }
            assert!(!e.contains("0011"), "the key is never printed: {e}");
        }
        let long = format!("{}:00", "x".repeat(MAX_IDENTITY + 1));
        assert!(err(&long).contains("more than 128"));
        let big = format!("k:{}", "ab".repeat(MAX_KEY + 1));
        assert!(err(&big).contains("more than 512"));
        assert!(PskFile::parse("/k", &format!("k:{}", "ab".repeat(MAX_KEY))).is_ok());
    }

    #[test]
    fn the_client_identity_is_the_username_or_the_only_one() {
        let one = PskFile::parse("/k", "alice:0102").unwrap();
        assert_eq!(one.choose(None).unwrap(), ("alice".into(), vec![1, 2]));
        assert_eq!(one.choose(Some("alice")).unwrap().0, "alice");
        let e = one.choose(Some("bob")).unwrap_err().to_string();
        assert!(e.contains("no identity \"bob\"") && e.contains("/k"), "{e}");
        let two = PskFile::parse("/k", "alice:0102\nbob:0304").unwrap();
        let e = two.choose(None).unwrap_err().to_string();
        assert!(
            e.contains("holds 2 identities") && e.contains("?tls-username=NAME"),
            "{e}"
        );
        assert_eq!(two.choose(Some("bob")).unwrap(), ("bob".into(), vec![3, 4]));
    }
}
