//! A slow, lossy link in user space: a TCP proxy on loopback that forwards to a server
//! (a [`crate::netns::Host`]'s, usually) with a delay on every byte in each direction and,
//! now and then, a stall as TCP makes after a lost segment (the retransmission timeout:
//! everything behind it waits too). This machine's kernel may lack `sch_netem`, so `tc
//! netem` cannot be counted on; the proxy gives the same two effects a client sees.
//!
//! Stalls are drawn from a seeded generator, printed when the proxy starts, so that a run
//! can be repeated. Dropping the proxy stops accepting; the pumps of open connections end
//! when either side closes.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

/// What the link does to each direction of every connection through it.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Every byte arrives this much after it was sent (one way).
    pub delay: Duration,
    /// The chance that a chunk read from one side is "lost": it (and all behind it) then
    /// waits `stall` more, as for a retransmission.
    pub loss: f64,
    /// How long a lost chunk holds the direction up.
    pub stall: Duration,
    /// The seed of the loss draws.
    pub seed: u64,
}

/// A running proxy: connect to [`DelayProxy::addr`].
pub struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    stalls: Arc<AtomicU64>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

/// The chunks one direction has read and not yet passed on, each with its due time.
struct Queue {
    chunks: Mutex<Chunks>,
    ready: Condvar,
}

/// A [`Queue`]'s contents: chunks in order, and whether the reading side has ended.
#[derive(Default)]
struct Chunks {
    due: VecDeque<(Instant, Vec<u8>)>,
    ended: bool,
}

impl DelayProxy {
    /// A proxy on 127.0.0.1 (a free port) to `target`, with `link` on both directions.
    pub fn start(target: SocketAddr, link: Link) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        eprintln!(
            "delay proxy {addr} -> {target}: {:?} one way, loss {} with {:?} stalls, seed {}",
            link.delay, link.loss, link.stall, link.seed
        );
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stalls = Arc::new(AtomicU64::new(0));
        let acceptor = {
            let (stop, stalls) = (stop.clone(), stalls.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            n += 1;
                            let Ok(server) = TcpStream::connect(target) else {
                                // The target is gone: the client sees its connection close.
                                continue;
                            };
                            client.set_nonblocking(false).unwrap();
                            let _ = client.set_nodelay(true);
                            let _ = server.set_nodelay(true);
                            // Each direction of each connection draws from its own stream.
                            let seed = link.seed.wrapping_add(n.wrapping_mul(0x9e37_79b9));
                            pump(&client, &server, link, seed, stalls.clone());
                            pump(&server, &client, link, seed ^ 1, stalls.clone());
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        DelayProxy {
            addr,
            stop,
            stalls,
            acceptor: Some(acceptor),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many stalls ("lost" chunks) the proxy has made so far, both directions of all
    /// connections together.
    pub fn stalls(&self) -> u64 {
        self.stalls.load(Ordering::Relaxed)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// Moves bytes from `from` to `to`: a reader thread stamps each chunk with its due time
/// (now + delay, later for a lost one, never before the chunk ahead of it), a writer
/// thread sends it then. So a delay does not limit throughput, and a stall holds up
/// everything behind it, as in-order delivery does.
fn pump(from: &TcpStream, to: &TcpStream, link: Link, seed: u64, stalls: Arc<AtomicU64>) {
    let q = Arc::new(Queue {
        chunks: Mutex::new(Chunks::default()),
        ready: Condvar::new(),
    });
    let mut r = from.try_clone().unwrap();
    let mut w = to.try_clone().unwrap();
    {
        let q = q.clone();
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut last_due = Instant::now();
            let mut buf = vec![0u8; 256 << 10];
            loop {
                let n = match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut due = Instant::now() + link.delay;
                if link.loss > 0.0 && rng.gen_bool(link.loss.min(1.0)) {
                    due += link.stall;
                    stalls.fetch_add(1, Ordering::Relaxed);
                }
                due = due.max(last_due);
                last_due = due;
                q.chunks
                    .lock()
                    .unwrap()
                    .due
                    .push_back((due, buf[..n].to_vec()));
                q.ready.notify_one();
            }
            q.chunks.lock().unwrap().ended = true;
            q.ready.notify_one();
        });
    }
    std::thread::spawn(move || loop {
        let next = {
            let mut g = q.chunks.lock().unwrap();
            loop {
                if let Some(c) = g.due.pop_front() {
                    break Some(c);
                }
                if g.ended {
                    break None;
                }
                g = q.ready.wait(g).unwrap();
            }
        };
        let Some((due, bytes)) = next else {
            let _ = w.shutdown(Shutdown::Write);
            return;
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if w.write_all(&bytes).is_err() {
            // The other side is gone: end both directions.
            let _ = w.shutdown(Shutdown::Both);
            return;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes arrive in order and whole, no sooner than the delay, and a certain loss
    /// makes a stall for each chunk.
    #[test]
    fn bytes_arrive_in_order_delayed_and_stalled() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut b = vec![0u8; 4096];
            loop {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => s.write_all(&b[..n]).unwrap(),
                }
            }
        });
        let link = Link {
            delay: Duration::from_millis(30),
            loss: 1.0,
            stall: Duration::from_millis(10),
            seed: 7,
        };
        let p = DelayProxy::start(target, link);
        let mut c = TcpStream::connect(p.addr()).unwrap();
        let data = crate::data::pattern(1 << 20, 3);
        let t = Instant::now();
        let writer = {
            let mut c = c.try_clone().unwrap();
            let data = data.clone();
            std::thread::spawn(move || c.write_all(&data).unwrap())
        };
        let mut back = vec![0u8; data.len()];
        c.read_exact(&mut back).unwrap();
        writer.join().unwrap();
        assert!(back == data, "the proxy reordered or changed bytes");
        // There and back: two delays and at least one stall each way, at the least.
        assert!(
            t.elapsed() >= Duration::from_millis(80),
            "{:?}",
            t.elapsed()
        );
        assert!(p.stalls() >= 2, "{}", p.stalls());
    }
}
