//! mdadm.conf, as mdadm.conf(5) describes it: pure parsing, no IO.
//!
//! A line's first word is a keyword (case-insensitive; mdadm accepts the first three
//! letters or more of it); `#` starts a comment; a line that starts with white space
//! continues the one before. Words may be quoted ('..' or ".."). The keywords uraid uses:
//!
//! - `DEVICE` globs, `partitions` (the devices of /proc/partitions), `containers`;
//!   several lines add up; without any, mdadm scans `partitions containers`. uraid also
//!   takes NBD URIs there (`nbd://host[:port]/export`, `nbds://...`, `nbd+unix://...`):
//!   remote members, which no glob or /proc/partitions can find.
//! - `ARRAY [DEV] tag=value...`: `uuid=`, `name=`, `devices=` (comma-separated globs or
//!   NBD URIs; a URI there is also scanned, as if a DEVICE line named it),
//!   `level=`, `num-devices=`, `spares=`, `metadata=`, `super-minor=`; a line with no
//!   identity (uuid, name, super-minor, devices) identifies nothing and is an error.
//! - `HOMEHOST <system>|<ignore>|<none>|NAME`.
//! - `AUTO +meta|-meta|homehost|-all ...`: which arrays not listed may be auto-assembled.
//!
//! MAILADDR, MAILFROM, PROGRAM, CREATE, POLICY, PART-POLICY, SYSFS, MONITORDELAY and
//! ENCRYPTION are accepted and not used. An unknown keyword or ARRAY tag is a warning
//! (mdadm ignores it too); a malformed value is an error that names the file and line.

use std::fmt;

/// Where a DEVICE line looks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A shell glob (`/dev/sd*`, `/srv/img/*.img`).
    Glob(String),
    /// Every device of /proc/partitions.
    Partitions,
    /// Arrays that hold other arrays (external metadata): uraid has none, so nothing.
    Containers,
    /// An NBD export (`nbd://`, `nbds://`, `nbd+unix://`...): probed over the network.
    Nbd(String),
}

/// An `ARRAY` line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArrayLine {
    /// Its line number in the file (the first line, for a continued one).
    pub line: usize,
    /// The device it names (`/dev/md/home`, `/dev/md0`), or `<ignore>`.
    pub device: Option<String>,
    /// `uuid=`, bytes in on-disk order.
    pub uuid: Option<[u8; 16]>,
    /// `name=` as written (`host:name` or `name`).
    pub name: Option<String>,
    /// `devices=`: globs; the array's members must be among them.
    pub devices: Vec<String>,
    /// `level=` as written (raid5, 5, mirror...).
    pub level: Option<String>,
    /// `num-devices=`.
    pub num_devices: Option<u32>,
    /// `spares=`: mdadm's monitor warns below it; assembly does not use it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub spares: Option<u32>,
    /// `metadata=` (1.2, 1.x, 0.90...).
    pub metadata: Option<String>,
    /// `super-minor=` (0.90 arrays, which uraid does not assemble: it identifies none).
    #[cfg_attr(not(test), allow(dead_code))]
    pub super_minor: Option<u32>,
}

impl ArrayLine {
    /// `ARRAY <ignore> ...`: arrays it matches are never assembled.
    pub fn ignored(&self) -> bool {
        self.device.as_deref() == Some("<ignore>")
    }

    /// Whether an array of this UUID and set name (`host:name`) is the one this line
    /// names: each identity the line gives must hold. A name without a host matches the
    /// name part of the set name, as mdadm's does.
    pub fn matches(&self, uuid: &[u8; 16], set_name: &str) -> bool {
        if self.uuid.is_some_and(|u| &u != uuid) {
            return false;
        }
        if let Some(n) = &self.name {
            let short = set_name.rsplit_once(':').map_or(set_name, |(_, s)| s);
            let same = n == set_name || (!n.contains(':') && n == short);
            if !same {
                return false;
            }
        }
        self.uuid.is_some() || self.name.is_some()
    }
}

/// `HOMEHOST`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HomeHost {
    /// `<system>`, also the default: this machine's host name.
    #[default]
    System,
    /// `<ignore>`: arrays of any host are this host's.
    Ignore,
    /// `<none>`: no homehost; arrays with a host in their name are nobody's here.
    None,
    /// A name.
    Name(String),
}

/// One word of an `AUTO` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoRule {
    /// `+` (allow) or `-` (refuse).
    pub allow: bool,
    /// `all`, `homehost`, or a metadata name (`1.x`, `0.90`, `ddf`, `imsm`).
    pub what: String,
}

/// A parsed mdadm.conf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub devices: Vec<DeviceSpec>,
    pub arrays: Vec<ArrayLine>,
    /// The last HOMEHOST line's, `System` when none.
    pub homehost: HomeHost,
    pub auto: Vec<AutoRule>,
    /// What was ignored, with its line ("FILE:3: unknown keyword ...").
    pub warnings: Vec<String>,
}

/// A line that could not be understood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfError {
    pub file: String,
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.msg)
    }
}

impl std::error::Error for ConfError {}

const KEYWORDS: [&str; 14] = [
    "DEVICE",
    "ARRAY",
    "HOMEHOST",
    "AUTO",
    "MAILADDR",
    "MAILFROM",
    "PROGRAM",
    "CREATE",
    "POLICY",
    "PART-POLICY",
    "SYSFS",
    "MONITORDELAY",
    "ENCRYPTION",
    "HOMECLUSTER",
];

/// The keyword `word` spells (three letters at least of one, any case).
fn keyword(word: &str) -> Option<&'static str> {
    if word.len() < 3 {
        return None;
    }
    let w = word.to_ascii_uppercase();
    KEYWORDS.iter().copied().find(|k| k.starts_with(&w))
}

/// Splits a logical line into words: white space separates, quotes group.
fn words(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("a quote is not closed".into());
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// The file's logical lines: comments cut, continuation lines joined; each with the
/// number of its first physical line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = match raw.find('#') {
            Some(at) => &raw[..at],
            None => raw,
        };
        let continues = line.starts_with([' ', '\t']);
        if line.trim().is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if continues => {
                last.1.push(' ');
                last.1.push_str(line.trim());
            }
            _ => out.push((i + 1, line.trim().to_string())),
        }
    }
    out
}

/// Parses the text of an mdadm.conf; `file` names it in errors and warnings.
pub fn parse(file: &str, text: &str) -> Result<Config, ConfError> {
    let mut c = Config::default();
    for (line, content) in logical_lines(text) {
        let err = |msg: String| ConfError {
            file: file.to_string(),
            line,
            msg,
        };
        let w = words(&content).map_err(err)?;
        let Some(first) = w.first() else { continue };
        let rest = &w[1..];
        match keyword(first) {
            Some("DEVICE") => {
                for d in rest {
                    c.devices.push(match d.as_str() {
                        "partitions" => DeviceSpec::Partitions,
                        "containers" => DeviceSpec::Containers,
                        u if uraid_engine::is_nbd_uri(u) => DeviceSpec::Nbd(u.to_string()),
                        g => DeviceSpec::Glob(g.to_string()),
                    });
                }
            }
            Some("ARRAY") => {
                let (a, warn) = array_line(line, rest).map_err(err)?;
                c.warnings
                    .extend(warn.into_iter().map(|m| format!("{file}:{line}: {m}")));
                c.arrays.push(a);
            }
            Some("HOMEHOST") => {
                let [h] = rest else {
                    return Err(err("HOMEHOST takes one word".into()));
                };
                c.homehost = match h.as_str() {
                    "<system>" => HomeHost::System,
                    "<ignore>" => HomeHost::Ignore,
                    "<none>" => HomeHost::None,
                    n => HomeHost::Name(n.to_string()),
                };
            }
            Some("AUTO") => {
                for r in rest {
                    let (allow, what) = match r.split_at_checked(1) {
                        // mdadm.conf(5): a bare "homehost" allows this host's arrays.
                        _ if r.eq_ignore_ascii_case("homehost") => (true, r.as_str()),
                        Some(("+", w)) => (true, w),
                        Some(("-", w)) => (false, w),
                        _ => return Err(err(format!("AUTO word {r:?} must start with + or -"))),
                    };
                    if what.is_empty() {
                        return Err(err(format!("AUTO word {r:?} names nothing")));
                    }
                    c.auto.push(AutoRule {
                        allow,
                        what: what.to_ascii_lowercase(),
                    });
                }
            }
            Some(_) => {}
            None => c
                .warnings
                .push(format!("{file}:{line}: unknown keyword {first:?} ignored")),
        }
    }
    Ok(c)
}

fn number(tag: &str, v: &str) -> Result<u32, String> {
    v.parse()
        .map_err(|_| format!("{tag}={v:?} is not a number"))
}

/// An ARRAY line's words after the keyword, and the warnings it gives.
fn array_line(line: usize, words: &[String]) -> Result<(ArrayLine, Vec<String>), String> {
    let mut a = ArrayLine {
        line,
        ..ArrayLine::default()
    };
    let mut warnings = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let Some((tag, v)) = w.split_once('=') else {
            if i == 0 {
                a.device = Some(w.clone());
                continue;
            }
            return Err(format!("ARRAY word {w:?} is not tag=value"));
        };
        match tag.to_ascii_lowercase().as_str() {
            "uuid" => {
                a.uuid = Some(
                    uraid_core::superblock::parse_uuid(v)
                        .ok_or_else(|| format!("uuid={v:?} is not a UUID"))?,
                )
            }
            "name" => a.name = Some(v.to_string()),
            "devices" => a.devices = v.split(',').map(str::to_string).collect(),
            "level" => a.level = Some(v.to_string()),
            "num-devices" => a.num_devices = Some(number(tag, v)?),
            "spares" => a.spares = Some(number(tag, v)?),
            "metadata" => a.metadata = Some(v.to_string()),
            "super-minor" => a.super_minor = Some(number(tag, v)?),
            // mdadm's tags that say how to make the device, not which array it is.
            "auto" | "bitmap" | "container" | "member" => {}
            other => warnings.push(format!("ARRAY tag {other:?} ignored")),
        }
    }
    if a.uuid.is_none() && a.name.is_none() && a.super_minor.is_none() && a.devices.is_empty() {
        return Err("ARRAY line has no identity: give uuid=, name= or devices=".into());
    }
    Ok((a, warnings))
}

impl Config {
    /// The host name arrays must carry to be this host's; `None` for any (`<ignore>`).
    /// `cli` is `--homehost`, which wins over the file; `system` is the machine's name.
    pub fn homehost(&self, cli: Option<&str>, system: Option<&str>) -> HostRule {
        let h = match cli {
            Some("<ignore>") => HomeHost::Ignore,
            Some("<system>") => HomeHost::System,
            Some("<none>") => HomeHost::None,
            Some(n) => HomeHost::Name(n.to_string()),
            None => self.homehost.clone(),
        };
        match h {
            HomeHost::Ignore => HostRule::Any,
            HomeHost::None => HostRule::Host(None),
            HomeHost::System => HostRule::Host(system.map(str::to_string)),
            HomeHost::Name(n) => HostRule::Host(Some(n)),
        }
    }

    /// Whether an array not listed in an ARRAY line may be assembled automatically:
    /// AUTO's words in order, the first that applies decides; without one, yes.
    /// `metadata` is the superblock's version ("1.2"), `local` whether the array is this
    /// host's.
    pub fn auto_allows(&self, metadata: &str, local: bool) -> bool {
        for r in &self.auto {
            let applies = match r.what.as_str() {
                "all" => true,
                "homehost" => local,
                "1" | "1.x" => metadata.starts_with("1."),
                "0.90" | "0" => metadata == "0.90",
                m => m == metadata,
            };
            if applies {
                return r.allow;
            }
        }
        true
    }

    /// DEVICE lines, or mdadm's default (`partitions containers`); then the NBD URIs of
    /// ARRAY lines' `devices=` that no DEVICE line names (a remote member is on no local
    /// list, so its ARRAY line is where it is found).
    pub fn device_specs(&self) -> Vec<DeviceSpec> {
        let mut specs = if self.devices.is_empty() {
            vec![DeviceSpec::Partitions, DeviceSpec::Containers]
        } else {
            self.devices.clone()
        };
        for a in self.arrays.iter().filter(|a| !a.ignored()) {
            for d in a.devices.iter().filter(|d| uraid_engine::is_nbd_uri(d)) {
                let spec = DeviceSpec::Nbd(d.clone());
                if !specs.contains(&spec) {
                    specs.push(spec);
                }
            }
        }
        specs
    }
}

/// Whose arrays are this host's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostRule {
    /// Every array's.
    Any,
    /// Those whose set name is `HOST:name` with this host; an array whose name has no host
    /// part belongs to no other host, so it is this one's too.
    Host(Option<String>),
}

impl HostRule {
    /// Whether an array of this set name is this host's; `Err(host)` names the other host.
    pub fn local(&self, set_name: &str) -> Result<(), String> {
        let Some((host, _)) = set_name.rsplit_once(':') else {
            return Ok(());
        };
        match self {
            HostRule::Any => Ok(()),
            HostRule::Host(Some(me)) if me == host => Ok(()),
            HostRule::Host(_) => Err(host.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "3aaa0122:29827cfa:5331ad66:ca767371";

    fn uuid() -> [u8; 16] {
        uraid_core::superblock::parse_uuid(U).unwrap()
    }

    #[test]
    fn every_line_kind() {
        let text = format!(
            "# made by hand\n\
             DEVICE /dev/sd[ab]* /srv/*.img\n\
             DEV partitions containers\n\
             HOMEHOST <ignore>\n\
             AUTO +1.x homehost -all\n\
             MAILADDR root@example.org\n\
             ARRAY /dev/md/home metadata=1.2 UUID={U}\n   \
             name=box:home spares=1 # the home array\n\
             array /dev/md0 level=raid5 num-devices=4 devices=/dev/sda1,/dev/sdb1\n\
             ARRAY <ignore> name=\"old one\"\n"
        );
        let c = parse("mdadm.conf", &text).unwrap();
        assert_eq!(
            c.devices,
            vec![
                DeviceSpec::Glob("/dev/sd[ab]*".into()),
                DeviceSpec::Glob("/srv/*.img".into()),
                DeviceSpec::Partitions,
                DeviceSpec::Containers
            ]
        );
        assert_eq!(c.homehost, HomeHost::Ignore);
        assert_eq!(
            c.auto,
            vec![
                AutoRule {
                    allow: true,
                    what: "1.x".into()
                },
                AutoRule {
                    allow: true,
                    what: "homehost".into()
                },
                AutoRule {
                    allow: false,
                    what: "all".into()
                },
            ]
        );
        assert_eq!(c.arrays.len(), 3);
        let home = &c.arrays[0];
        assert_eq!(home.line, 7);
        assert_eq!(home.device.as_deref(), Some("/dev/md/home"));
        assert_eq!(home.uuid, Some(uuid()));
        assert_eq!(home.name.as_deref(), Some("box:home"));
        assert_eq!(home.spares, Some(1));
        assert_eq!(home.metadata.as_deref(), Some("1.2"));
        let md0 = &c.arrays[1];
        assert_eq!(md0.line, 9);
        assert_eq!(md0.level.as_deref(), Some("raid5"));
        assert_eq!(md0.num_devices, Some(4));
        assert_eq!(md0.devices, vec!["/dev/sda1", "/dev/sdb1"]);
        assert!(c.arrays[2].ignored());
        assert_eq!(c.arrays[2].name.as_deref(), Some("old one"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn nbd_uris_are_devices() {
        let c = parse(
            "c",
            "DEVICE /dev/sd* nbds://store1:10809/disk0\n\
             ARRAY /dev/md/r name=r devices=nbds://store1:10809/disk0,nbd://store2/disk0,/dev/sdc\n\
             ARRAY <ignore> name=old devices=nbd://store3/old\n",
        )
        .unwrap();
        assert_eq!(
            c.device_specs(),
            vec![
                DeviceSpec::Glob("/dev/sd*".into()),
                DeviceSpec::Nbd("nbds://store1:10809/disk0".into()),
                DeviceSpec::Nbd("nbd://store2/disk0".into()),
            ]
        );
        // Without DEVICE lines: mdadm's default, and the ARRAY line's URIs.
        let c = parse(
            "c",
            "ARRAY /dev/md/r name=r devices=nbd+unix:///e?socket=/run/s.sock\n",
        )
        .unwrap();
        assert_eq!(
            c.device_specs(),
            vec![
                DeviceSpec::Partitions,
                DeviceSpec::Containers,
                DeviceSpec::Nbd("nbd+unix:///e?socket=/run/s.sock".into()),
            ]
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let e = parse(
            "/etc/mdadm/mdadm.conf",
            "DEVICE /x\n\nARRAY /dev/md0 uuid=12:34\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 3);
        assert_eq!(
            e.to_string(),
            "/etc/mdadm/mdadm.conf:3: uuid=\"12:34\" is not a UUID"
        );
        let e = parse("c", "# x\nARRAY /dev/md0 metadata=1.2\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.msg.contains("no identity"), "{e}");
        let e = parse("c", "ARRAY /dev/md0 name=a spares=two\n").unwrap_err();
        assert_eq!(e.to_string(), "c:1: spares=\"two\" is not a number");
        let e = parse("c", "\nAUTO 1.x\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse("c", "HOMEHOST a b\n").unwrap_err();
        assert_eq!(e.to_string(), "c:1: HOMEHOST takes one word");
        let e = parse("c", "ARRAY /dev/md0 name=\"open\n").unwrap_err();
        assert_eq!(e.msg, "a quote is not closed");
        // A continued line's error is at the line it began on.
        let e = parse("c", "DEVICE /a\nARRAY /dev/md0 name=x\n  level=5 oops\n").unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn unknown_words_are_warnings() {
        let c = parse("c", "FROBNICATE yes\nARRAY /dev/md0 name=x colour=red\n").unwrap();
        assert_eq!(
            c.warnings,
            vec![
                "c:1: unknown keyword \"FROBNICATE\" ignored".to_string(),
                "c:2: ARRAY tag \"colour\" ignored".to_string()
            ]
        );
        assert_eq!(c.arrays.len(), 1);
    }

    #[test]
    fn matching_homehost_and_auto() {
        let c = parse(
            "c",
            &format!("ARRAY /dev/md/a UUID={U}\nARRAY /dev/md/b name=b\n"),
        )
        .unwrap();
        assert!(c.arrays[0].matches(&uuid(), "other:a"));
        assert!(!c.arrays[0].matches(&[0; 16], "other:a"));
        assert!(c.arrays[1].matches(&[0; 16], "host:b"));
        assert!(c.arrays[1].matches(&[0; 16], "b"));
        assert!(!c.arrays[1].matches(&[0; 16], "host:bb"));
        let named = parse("c", "ARRAY /dev/md/b name=h1:b\n").unwrap();
        assert!(!named.arrays[0].matches(&[0; 16], "h2:b"));

        let rule = c.homehost(None, Some("me"));
        assert_eq!(rule, HostRule::Host(Some("me".into())));
        assert_eq!(rule.local("me:x"), Ok(()));
        assert_eq!(rule.local("x"), Ok(()));
        assert_eq!(rule.local("you:x"), Err("you".into()));
        assert_eq!(c.homehost(Some("you"), Some("me")).local("you:x"), Ok(()));
        assert_eq!(
            c.homehost(Some("<ignore>"), Some("me")).local("you:x"),
            Ok(())
        );
        let none = parse("c", "HOMEHOST <none>\n").unwrap();
        assert_eq!(
            none.homehost(None, Some("me")).local("me:x"),
            Err("me".into())
        );

        let auto = parse("c", "AUTO +homehost -1.x +all\n").unwrap();
        assert!(auto.auto_allows("1.2", true));
        assert!(!auto.auto_allows("1.2", false));
        assert!(auto.auto_allows("0.90", false));
        assert!(c.auto_allows("1.2", false));
        assert_eq!(
            parse("c", "").unwrap().device_specs(),
            vec![DeviceSpec::Partitions, DeviceSpec::Containers]
        );
    }
}
