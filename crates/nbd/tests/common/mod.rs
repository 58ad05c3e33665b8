//! The NBD tests' own helpers: an in-process server on a temp Unix socket and a minimal raw
//! NBD client built on the crate's wire codecs. Temp folders, test data and tool checks
//! come from `uraid_testkit`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uraid_testkit::TempDir;

use uraid_nbd::proto::*;
use uraid_nbd::{Backend, Listener, MemBackend, RunningServer, ServeStats, Server, ServerConfig};

pub struct TestServer {
    pub backend: Arc<MemBackend>,
    pub socket: PathBuf,
    running: Option<RunningServer>,
    pub dir: TempDir,
}

impl TestServer {
    pub fn start(size_bytes: usize) -> TestServer {
        Self::start_with(MemBackend::new(size_bytes), ServerConfig::default())
    }

    pub fn start_with(backend: MemBackend, config: ServerConfig) -> TestServer {
        let dir = TempDir::new("srv");
        let socket = dir.path("nbd.sock");
        let backend = Arc::new(backend);
        let listener = Listener::bind_unix(&socket).unwrap();
        let running = Server::new(config)
            .unwrap()
            .spawn(listener, backend.clone() as Arc<dyn Backend>)
            .unwrap();
        TestServer {
            backend,
            socket,
            running: Some(running),
            dir,
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    pub fn stop(mut self) -> ServeStats {
        self.running.take().unwrap().shutdown().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.shutdown();
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
}

/// Minimal NBD client for tests.
pub struct Client {
    pub stream: UnixStream,
    pub structured: bool,
    pub size: u64,
    pub flags: u16,
    pending_reads: HashMap<u64, u32>,
    next_cookie: u64,
}

pub fn read_exact(s: &mut UnixStream, n: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

pub fn send_option(s: &mut UnixStream, option: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::new();
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

/// Reads one option reply: (option, reply type, data).
pub fn read_option_reply(s: &mut UnixStream) -> io::Result<(u32, u32, Vec<u8>)> {
    let h = read_exact(s, 20)?;
    assert_eq!(&h[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
    let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
    let rep = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let data = read_exact(s, len as usize)?;
    Ok((opt, rep, data))
}

/// Connects and reads the greeting; returns the stream after sending client flags.
pub fn greet(path: &Path, client_flags: u32) -> io::Result<UnixStream> {
    let mut s = UnixStream::connect(path)?;
    let g = read_exact(&mut s, 18)?;
    assert_eq!(&g[0..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    assert_eq!(u16::from_be_bytes([g[16], g[17]]), 3);
    s.write_all(&client_flags.to_be_bytes())?;
    Ok(s)
}

pub fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// Does true when the peer has closed the connection (reads EOF or reset).
pub fn is_closed(s: &mut UnixStream) -> bool {
    let mut sink = [0u8; 4096];
    loop {
        match s.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

impl Client {
    /// Fixed newstyle + NO_ZEROES, optional structured replies, then GO.
    pub fn connect(path: &Path, name: &str, structured: bool) -> io::Result<Client> {
        let mut s = greet(path, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)?;
        if structured {
            send_option(&mut s, OPT_STRUCTURED_REPLY, &[])?;
            let (_, rep, _) = read_option_reply(&mut s)?;
            assert_eq!(rep, REP_ACK);
        }
        send_option(&mut s, OPT_GO, &go_data(name, &[INFO_BLOCK_SIZE]))?;
        let mut size = None;
        let mut flags = 0;
        loop {
            let (opt, rep, data) = read_option_reply(&mut s)?;
            assert_eq!(opt, OPT_GO);
            match rep {
                REP_INFO if u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT => {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                    flags = u16::from_be_bytes([data[10], data[11]]);
                }
                REP_INFO => {}
                REP_ACK => break,
                other => {
                    return Err(io::Error::other(format!("GO refused: {other:#x}")));
                }
            }
        }
        Ok(Client {
            stream: s,
            structured,
            size: size.expect("no NBD_INFO_EXPORT"),
            flags,
            pending_reads: HashMap::new(),
            next_cookie: 1,
        })
    }

    pub fn send(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<u64> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let h = encode_request(&Request {
            flags,
            command,
            cookie,
            offset,
            length,
        });
        if command == Command::Read {
            self.pending_reads.insert(cookie, length);
        }
        let mut m = Vec::with_capacity(28 + payload.len());
        m.extend_from_slice(&h);
        m.extend_from_slice(payload);
        self.stream.write_all(&m)?;
        Ok(cookie)
    }

    /// Several writes sent with one `write` call: (offset, payload, flags) each;
    /// returns their cookies.
    pub fn send_writes(&mut self, writes: &[(u64, Vec<u8>, u16)]) -> io::Result<Vec<u64>> {
        let mut m = Vec::new();
        let mut cookies = Vec::new();
        for (offset, payload, flags) in writes {
            let cookie = self.next_cookie;
            self.next_cookie += 1;
            m.extend_from_slice(&encode_request(&Request {
                flags: *flags,
                command: Command::Write,
                cookie,
                offset: *offset,
                length: payload.len() as u32,
            }));
            m.extend_from_slice(payload);
            cookies.push(cookie);
        }
        self.stream.write_all(&m)?;
        Ok(cookies)
    }

    pub fn recv(&mut self) -> io::Result<Reply> {
        let magic = read_exact(&mut self.stream, 4)?;
        let magic = u32::from_be_bytes(magic.try_into().unwrap());
        if magic == SIMPLE_REPLY_MAGIC {
            let h = read_exact(&mut self.stream, 12)?;
            let error = u32::from_be_bytes(h[0..4].try_into().unwrap());
            let cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
            let read_len = self.pending_reads.remove(&cookie);
            assert!(
                !(self.structured && read_len.is_some()),
                "simple reply to a read after structured replies were negotiated"
            );
            let data = match read_len {
                Some(n) if error == 0 => read_exact(&mut self.stream, n as usize)?,
                _ => Vec::new(),
            };
            return Ok(Reply {
                cookie,
                error,
                data,
            });
        }
        assert_eq!(magic, STRUCTURED_REPLY_MAGIC, "bad reply magic");
        assert!(self.structured);
        let h = read_exact(&mut self.stream, 16)?;
        let flags = u16::from_be_bytes([h[0], h[1]]);
        let kind = u16::from_be_bytes([h[2], h[3]]);
        let cookie = u64::from_be_bytes(h[4..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
        assert_eq!(flags, REPLY_FLAG_DONE, "this server sends one chunk");
        let payload = read_exact(&mut self.stream, len as usize)?;
        let read_len = self.pending_reads.remove(&cookie);
        match kind {
            REPLY_TYPE_OFFSET_DATA => {
                let data = payload[8..].to_vec();
                assert_eq!(Some(data.len() as u32), read_len);
                Ok(Reply {
                    cookie,
                    error: 0,
                    data,
                })
            }
            REPLY_TYPE_NONE => Ok(Reply {
                cookie,
                error: 0,
                data: Vec::new(),
            }),
            REPLY_TYPE_ERROR => {
                let error = u32::from_be_bytes(payload[0..4].try_into().unwrap());
                let msg_len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
                assert_eq!(6 + msg_len, payload.len());
                assert_ne!(error, 0);
                Ok(Reply {
                    cookie,
                    error,
                    data: Vec::new(),
                })
            }
            other => panic!("unexpected chunk type {other}"),
        }
    }

    /// Sends a request and waits for its reply (nothing else in flight).
    pub fn call(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<Reply> {
        let cookie = self.send(command, flags, offset, length, payload)?;
        let r = self.recv()?;
        assert_eq!(r.cookie, cookie);
        Ok(r)
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.call(Command::Write, 0, offset, data.len() as u32, data)
            .unwrap()
            .error
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let r = self.call(Command::Read, 0, offset, len, &[]).unwrap();
        if r.error == 0 {
            Ok(r.data)
        } else {
            Err(r.error)
        }
    }

    pub fn disconnect(mut self) {
        let _ = self.send(Command::Disc, 0, 0, 0, &[]);
    }
}
