//! The control socket's requests: one JSON object per line, parsed here before anything
//! touches the array. This file uses only `serde_json`, so the `fuzz/` target
//! `control_request` includes it as it is.

use serde_json::{json, Map, Value};

/// A parsed request. Members are given as a role number or a member path, both as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Ping,
    Detail,
    /// The array's events numbered from `since` on (see the control server's event log).
    Events {
        since: u64,
    },
    Fail {
        member: String,
    },
    Remove {
        member: String,
    },
    Replace {
        member: String,
        with: Option<String>,
    },
    /// With md's member flags (mdadm --add --write-mostly --failfast).
    Add {
        device: String,
        write_mostly: bool,
        failfast: bool,
    },
    /// No mode: report the current one.
    JournalMode {
        mode: Option<String>,
    },
    /// md's sysfs knobs by name; no values lists them. With a member, the values are that
    /// member's flags (md's dev-N/state: writemostly, failfast).
    Set {
        member: Option<String>,
        values: Vec<(String, String)>,
    },
    /// mdadm --grow's changes by option name, as text (`raid_devices`, `size`, `level`,
    /// `layout`, `chunk`, `bitmap`, `array_size`), read against the array's level; `add`:
    /// devices to add as mdadm sequences `--grow --add` (a raid0's after its takeover).
    Grow {
        values: Vec<(String, String)>,
        add: Vec<String>,
    },
    /// With `keep_ublk`, the ublk device stays for the next server (`serve --recover`):
    /// an upgrade or restart in place.
    Stop {
        keep_ublk: bool,
    },
}

fn member(req: &Value) -> Result<String, String> {
    match &req["member"] {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err("give a member: a role number or a member path".into()),
    }
}

/// An optional boolean field: absent is false.
fn flag(req: &Value, key: &str) -> Result<bool, String> {
    match &req[key] {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        _ => Err(format!("\"{key}\" must be true or false")),
    }
}

/// Parses one request line; the error is the reply's message.
pub fn parse(line: &str) -> Result<Request, String> {
    let req: Value = serde_json::from_str(line.trim()).map_err(|e| format!("bad request: {e}"))?;
    let cmd = req["cmd"].as_str().unwrap_or("");
    let text = |key: &str| req[key].as_str().map(str::to_owned);
    Ok(match cmd {
        "ping" => Request::Ping,
        "detail" => Request::Detail,
        "events" => Request::Events {
            since: req["since"]
                .as_u64()
                .ok_or("events needs \"since\": an event number")?,
        },
        "fail" => Request::Fail {
            member: member(&req)?,
        },
        "remove" => Request::Remove {
            member: member(&req)?,
        },
        "replace" => Request::Replace {
            member: member(&req)?,
            with: text("with"),
        },
        "add" => Request::Add {
            device: text("device").ok_or("add needs \"device\"")?,
            write_mostly: flag(&req, "write_mostly")?,
            failfast: flag(&req, "failfast")?,
        },
        "journal-mode" => Request::JournalMode { mode: text("mode") },
        "set" => Request::Set {
            member: match &req["member"] {
                Value::Null => None,
                _ => Some(member(&req)?),
            },
            values: req["values"]
                .as_object()
                .map(|vals| {
                    vals.iter()
                        .map(|(k, v)| {
                            let v = match v {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            (k.clone(), v)
                        })
                        .collect()
                })
                .unwrap_or_default(),
        },
        "grow" => Request::Grow {
            values: req["values"]
                .as_object()
                .ok_or("grow needs \"values\": the changes by option name")?
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => (k.clone(), s.clone()),
                    other => (k.clone(), other.to_string()),
                })
                .collect(),
            add: match &req["add"] {
                Value::Null => Vec::new(),
                Value::Array(a) => a
                    .iter()
                    .map(|d| d.as_str().map(str::to_string))
                    .collect::<Option<_>>()
                    .ok_or("grow's \"add\" must be a list of device paths")?,
                _ => return Err("grow's \"add\" must be a list of device paths".into()),
            },
        },
        "stop" => Request::Stop {
            keep_ublk: flag(&req, "keep_ublk")?,
        },
        other => return Err(format!("unknown command {other:?}")),
    })
}

impl Request {
    /// The request as a client sends it ([`parse`] gives it back).
    pub fn to_json(&self) -> Value {
        match self {
            Request::Ping => json!({"cmd": "ping"}),
            Request::Detail => json!({"cmd": "detail"}),
            Request::Events { since } => json!({"cmd": "events", "since": since}),
            Request::Fail { member } => json!({"cmd": "fail", "member": member}),
            Request::Remove { member } => json!({"cmd": "remove", "member": member}),
            Request::Replace { member, with } => {
                let mut v = json!({"cmd": "replace", "member": member});
                if let Some(w) = with {
                    v["with"] = json!(w);
                }
                v
            }
            Request::Add {
                device,
                write_mostly,
                failfast,
            } => {
                let mut v = json!({"cmd": "add", "device": device});
                if *write_mostly {
                    v["write_mostly"] = json!(true);
                }
                if *failfast {
                    v["failfast"] = json!(true);
                }
                v
            }
            Request::JournalMode { mode } => {
                let mut v = json!({"cmd": "journal-mode"});
                if let Some(m) = mode {
                    v["mode"] = json!(m);
                }
                v
            }
            Request::Set { member, values } => {
                let vals: Map<String, Value> = values
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect();
                let mut v = json!({"cmd": "set", "values": vals});
                if let Some(m) = member {
                    v["member"] = json!(m);
                }
                v
            }
            Request::Grow { values, add } => {
                let vals: Map<String, Value> = values
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect();
                let mut v = json!({"cmd": "grow", "values": vals});
                if !add.is_empty() {
                    v["add"] = json!(add);
                }
                v
            }
            Request::Stop { keep_ublk: false } => json!({"cmd": "stop"}),
            Request::Stop { keep_ublk: true } => json!({"cmd": "stop", "keep_ublk": true}),
        }
    }
}

/// The reply to a request that failed.
pub fn fail_reply(msg: impl std::fmt::Display) -> Value {
    json!({"ok": false, "error": msg.to_string()})
}

/// Fuzz body: each line of arbitrary bytes parses without a panic; what parses comes back
/// the same from its JSON, and what does not gets a reply that is one line of valid JSON.
#[cfg_attr(not(test), allow(dead_code))] // the fuzz target and the tests call it
pub fn fuzz(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for line in text.split('\n') {
        match parse(line) {
            Ok(req) => {
                let again = req.to_json().to_string();
                assert_eq!(parse(&again), Ok(req), "{again}");
            }
            Err(e) => {
                let reply = fail_reply(&e).to_string();
                assert!(!reply.contains('\n'), "a reply must be one line: {reply}");
                let back: Value = serde_json::from_str(&reply).expect("the reply is JSON");
                assert_eq!(back["error"].as_str(), Some(e.as_str()));
            }
        }
    }
}

/// Requests to mutate: every command, with the shapes clients send.
#[cfg_attr(not(test), allow(dead_code))] // the tests call it
pub fn fuzz_seeds() -> Vec<Vec<u8>> {
    [
        r#"{"cmd":"ping"}"#,
        r#"{"cmd":"detail"}"#,
        r#"{"cmd":"events","since":7}"#,
        r#"{"cmd":"fail","member":"2"}"#,
        r#"{"cmd":"fail","member":1}"#,
        r#"{"cmd":"remove","member":"/dev/loop3"}"#,
        r#"{"cmd":"replace","member":0,"with":"/tmp/new.img"}"#,
        r#"{"cmd":"add","device":"/tmp/spare.img"}"#,
        r#"{"cmd":"add","device":"/tmp/spare.img","write_mostly":true,"failfast":false}"#,
        r#"{"cmd":"set","member":"1","values":{"writemostly":"1","failfast":"0"}}"#,
        r#"{"cmd":"journal-mode","mode":"write-back"}"#,
        r#"{"cmd":"grow","values":{"raid_devices":"3","size":"max"}}"#,
        r#"{"cmd":"grow","values":{"raid_devices":"3"},"add":["/d/c.img"]}"#,
        r#"{"cmd":"set","values":{"stripe_cache_size":"1024","skip_copy":1}}"#,
        r#"{"cmd":"stop","keep_ublk":true}"#,
        "{\"cmd\":\"stop\"}\n{\"cmd\":\"detail\",\"x\":[1,2,{\"y\":null}]}",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_round_trip() {
        assert_eq!(
            parse(r#"{"cmd":"stop"}"#),
            Ok(Request::Stop { keep_ublk: false })
        );
        assert_eq!(
            parse(r#"{"cmd":"stop","keep_ublk":true}"#),
            Ok(Request::Stop { keep_ublk: true })
        );
        assert!(parse(r#"{"cmd":"stop","keep_ublk":"yes"}"#).is_err());
        assert_eq!(
            parse(r#"{"cmd":"grow","values":{"raid_devices":3},"add":["/d/c"]}"#),
            Ok(Request::Grow {
                values: vec![("raid_devices".into(), "3".into())],
                add: vec!["/d/c".into()]
            })
        );
        assert!(parse(r#"{"cmd":"grow","values":{},"add":"/d/c"}"#).is_err());
        assert!(parse(r#"{"cmd":"grow","values":{},"add":[1]}"#).is_err());
        assert_eq!(
            parse(r#"{"cmd":"fail","member":2}"#),
            Ok(Request::Fail { member: "2".into() })
        );
        assert_eq!(
            parse(r#"{"cmd":"set","values":{"skip_copy":1}}"#),
            Ok(Request::Set {
                member: None,
                values: vec![("skip_copy".into(), "1".into())]
            })
        );
        assert_eq!(
            parse(r#"{"cmd":"set","member":1,"values":{"writemostly":"0"}}"#),
            Ok(Request::Set {
                member: Some("1".into()),
                values: vec![("writemostly".into(), "0".into())]
            })
        );
        assert_eq!(
            parse(r#"{"cmd":"add","device":"/d","failfast":true}"#),
            Ok(Request::Add {
                device: "/d".into(),
                write_mostly: false,
                failfast: true
            })
        );
        assert_eq!(
            parse(r#"{"cmd":"add","device":"/d","write_mostly":1}"#),
            Err("\"write_mostly\" must be true or false".into())
        );
        assert_eq!(
            parse(r#"{"cmd":"add"}"#),
            Err("add needs \"device\"".into())
        );
        assert_eq!(parse("[1]"), Err("unknown command \"\"".into()));
        assert!(parse("{").unwrap_err().starts_with("bad request: "));
        for s in fuzz_seeds() {
            fuzz(&s);
        }
    }

    /// The stable fuzz run of this parser (see `uraid_testkit::fuzz`).
    #[test]
    fn fuzz_control_request() {
        uraid_testkit::fuzz::run(&uraid_testkit::fuzz::Target {
            name: "control_request",
            seeds: fuzz_seeds(),
            max_len: 512,
            body: &fuzz,
        });
    }
}
