//! `uraid serve --metrics ADDR`: the served array in Prometheus' text format at
//! `GET /metrics` (prometheus-client encodes it, tiny_http serves it).
//!
//! Two kinds of figures. Requests through the NBD export are counted as they pass (the
//! export's `ArrayBackend` tells a [`RequestObserver`]; without --metrics there is none):
//! per op a count, bytes, errors, and a latency histogram that times one request in
//! [`LATENCY_SAMPLE`] (two clock reads for that one), so the request path pays one atomic
//! add per counter. The array's state (degraded, members, sync, stripe cache, journal) is
//! read from the engine when a scrape comes, never kept up to date in between; so are the
//! members on other hosts ([`RemoteCollector`]): per member, labelled by role and URI, its
//! connection state, the moving average of its reply latency and a histogram of every
//! reply's latency, which the member's NBD client keeps (it times each reply anyway).

use anyhow::{bail, Context, Result};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uraid_core::superblock::uuid_string;
use uraid_engine::nbd::{RequestObserver, RequestOp};
use uraid_engine::{ArrayCell, Level, MemberIdx, SlotState, SyncProgress};

/// One request in this many is timed for the latency histograms.
pub const LATENCY_SAMPLE: u64 = 8;

/// The NBD ops counted.
const OPS: [&str; 5] = ["read", "write", "flush", "trim", "write_zeroes"];

/// Which count of joined partial-stripe writes (`uraid_stripe_joins_total{what=...}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JoinLabel {
    what: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

fn latency_histogram() -> Histogram {
    // 10 us to about 5 s.
    Histogram::new(exponential_buckets(10e-6, 2.0, 20))
}

/// Request counters of one op: clones of the families' members, taken once, so a request
/// takes no lock to find them.
struct OpMetrics {
    requests: Counter,
    bytes: Counter,
    errors: Counter,
    latency: Histogram,
}

/// Request counters, shared by the export's wrapper and the scrape.
struct RequestMetrics {
    /// Indexed as [`OPS`].
    ops: Vec<OpMetrics>,
    seq: AtomicU64,
}

impl RequestObserver for RequestMetrics {
    fn wants_timing(&self, _op: RequestOp) -> bool {
        self.seq
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(LATENCY_SAMPLE)
    }

    fn done(&self, op: RequestOp, bytes: u64, ok: bool, latency: Option<Duration>) {
        let m = &self.ops[op_index(op)];
        if let Some(l) = latency {
            m.latency.observe(l.as_secs_f64());
        }
        m.requests.inc();
        if ok {
            m.bytes.inc_by(bytes);
        } else {
            m.errors.inc();
        }
    }
}

impl RequestMetrics {
    /// The request families of one export (`PREFIX_requests`, `_bytes`, `_errors`,
    /// `_request_latency_seconds`), every op at zero from the start.
    fn register(registry: &mut Registry, prefix: &str, who: &str) -> Arc<RequestMetrics> {
        let requests: Family<OpLabel, Counter> = Family::default();
        let bytes: Family<OpLabel, Counter> = Family::default();
        let errors: Family<OpLabel, Counter> = Family::default();
        let latency: Family<OpLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let ops = OPS
            .iter()
            .map(|&op| {
                let l = OpLabel { op };
                OpMetrics {
                    requests: requests.get_or_create(&l).clone(),
                    bytes: bytes.get_or_create(&l).clone(),
                    errors: errors.get_or_create(&l).clone(),
                    latency: latency.get_or_create(&l).clone(),
                }
            })
            .collect();
        registry.register(
            format!("{prefix}_requests"),
            format!("{who} requests served, by op"),
            requests,
        );
        registry.register(
            format!("{prefix}_bytes"),
            format!("Bytes moved by {who} requests, by op"),
            bytes,
        );
        registry.register(
            format!("{prefix}_errors"),
            format!("{who} requests that failed, by op"),
            errors,
        );
        registry.register(
            format!("{prefix}_request_latency_seconds"),
            format!("Time the array took for a {who} request, by op (one request in 8 is timed)"),
            latency,
        );
        Arc::new(RequestMetrics {
            ops,
            seq: AtomicU64::new(0),
        })
    }
}

/// Where `op` sits in [`OPS`].
fn op_index(op: RequestOp) -> usize {
    match op {
        RequestOp::Read => 0,
        RequestOp::Write => 1,
        RequestOp::Flush => 2,
        RequestOp::Trim => 3,
        RequestOp::WriteZeroes => 4,
    }
}

/// What a scrape reads from the engine, set just before it is encoded.
struct StateMetrics {
    degraded: Gauge,
    raid_disks: Gauge,
    members: Family<StateLabel, Gauge>,
    sync_action: Family<ActionLabel, Gauge>,
    sync_completed: Gauge<f64, std::sync::atomic::AtomicU64>,
    mismatch_sectors: Gauge,
    member_reads: Counter,
    member_writes: Counter,
    degraded_reads: Counter,
    corrected_reads: Counter,
    sync_zero_bytes: Counter,
    stripe_cache_size: Gauge,
    stripe_cache_active: Gauge,
    stripe_joins: Family<JoinLabel, Counter>,
    journal_faulty: Gauge,
    journal_write_back: Gauge,
    journal_cached_stripes: Gauge,
    journal_cached_bytes: Gauge,
}

/// Where the running sync pass is read from (the daemons, which start after the exports).
pub type SyncSource = Box<dyn Fn() -> Option<SyncProgress> + Send + Sync>;

/// The registry of one served array.
pub struct Metrics {
    /// The array served (replaced by a grow; read at each scrape).
    cell: Arc<ArrayCell>,
    sync: Mutex<Option<SyncSource>>,
    requests: Arc<RequestMetrics>,
    /// The ublk export's requests (`uraid_ublk_*`).
    ublk: Arc<RequestMetrics>,
    state: StateMetrics,
    registry: Registry,
    /// One scrape at a time: the state gauges are set, then encoded.
    scrape: Mutex<()>,
}

impl Metrics {
    /// Metrics of the array in `cell`.
    pub fn new(cell: Arc<ArrayCell>) -> Metrics {
        let array = cell.current();
        let uuid = uuid_string(&array.meta().template().set_uuid);
        let mut registry =
            Registry::with_prefix_and_labels("uraid", [("array".into(), uuid.into())].into_iter());
        let requests = RequestMetrics::register(&mut registry, "nbd", "NBD");
        let ublk = RequestMetrics::register(&mut registry, "ublk", "ublk");
        let state = StateMetrics {
            degraded: Gauge::default(),
            raid_disks: Gauge::default(),
            members: Family::default(),
            sync_action: Family::default(),
            sync_completed: Gauge::default(),
            mismatch_sectors: Gauge::default(),
            member_reads: Counter::default(),
            member_writes: Counter::default(),
            degraded_reads: Counter::default(),
            corrected_reads: Counter::default(),
            sync_zero_bytes: Counter::default(),
            stripe_cache_size: Gauge::default(),
            stripe_cache_active: Gauge::default(),
            stripe_joins: Family::default(),
            journal_faulty: Gauge::default(),
            journal_write_back: Gauge::default(),
            journal_cached_stripes: Gauge::default(),
            journal_cached_bytes: Gauge::default(),
        };
        let s = &state;
        let r = &mut registry;
        r.register(
            "degraded",
            "1 when a role has no in-sync member (md's degraded)",
            s.degraded.clone(),
        );
        r.register(
            "raid_disks",
            "Roles of the array (md's raid_disks)",
            s.raid_disks.clone(),
        );
        r.register(
            "members",
            "Roles by the state of their member",
            s.members.clone(),
        );
        r.register(
            "sync_action",
            "1 for the sync pass running (md's sync_action; idle when none)",
            s.sync_action.clone(),
        );
        r.register(
            "sync_completed_ratio",
            "How far the running sync pass is, 0 to 1 (md's sync_completed)",
            s.sync_completed.clone(),
        );
        r.register(
            "mismatch_sectors",
            "Sectors found to differ by the running check or repair (md's mismatch_cnt)",
            s.mismatch_sectors.clone(),
        );
        r.register(
            "member_reads",
            "Reads issued to the members",
            s.member_reads.clone(),
        );
        r.register(
            "member_writes",
            "Writes issued to the members",
            s.member_writes.clone(),
        );
        r.register(
            "degraded_reads",
            "Reads served from redundancy",
            s.degraded_reads.clone(),
        );
        r.register(
            "corrected_read_errors",
            "Read errors corrected by rewriting (md's corrected_errors)",
            s.corrected_reads.clone(),
        );
        r.register(
            "sync_zero_bytes",
            "Array bytes syncs skipped as zeros on every member (never written or discarded): \
             a recovery zeroed its targets there instead of rebuilding them",
            s.sync_zero_bytes.clone(),
        );
        r.register(
            "stripe_cache_size",
            "Stripe heads the cache may hold (md's stripe_cache_size; raid4/5/6)",
            s.stripe_cache_size.clone(),
        );
        r.register(
            "stripe_cache_active",
            "Stripe heads in use (md's stripe_cache_active; raid4/5/6)",
            s.stripe_cache_active.clone(),
        );
        r.register(
            "stripe_joins",
            "Partial-stripe writes joined into full-stripe writes (raid4/5/6, join_wait_us): \
             what=led (pieces that waited for others), joined (pieces that joined one), \
             full (stripes written whole, without reads), partial (stripes not covered in time)",
            s.stripe_joins.clone(),
        );
        r.register(
            "journal_faulty",
            "1 when the write journal failed",
            s.journal_faulty.clone(),
        );
        r.register(
            "journal_write_back",
            "1 in write-back mode, 0 in write-through (md's journal_mode)",
            s.journal_write_back.clone(),
        );
        r.register(
            "journal_cached_stripes",
            "Stripes in the write-back cache not yet on the members",
            s.journal_cached_stripes.clone(),
        );
        r.register(
            "journal_cached_bytes",
            "Bytes in the write-back cache not yet on the members",
            s.journal_cached_bytes.clone(),
        );
        r.register_collector(Box::new(RemoteCollector(cell.clone())));
        Metrics {
            cell,
            sync: Mutex::new(None),
            requests,
            ublk,
            state,
            registry,
            scrape: Mutex::new(()),
        }
    }

    /// Where the running sync pass is read from, once the daemons run.
    pub fn set_sync_source(&self, f: SyncSource) {
        *self.sync.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    /// What the export tells about each request, counted here
    /// ([`ArrayBackend::with_observer`](uraid_engine::nbd::ArrayBackend::with_observer)).
    pub fn observer(&self) -> Arc<dyn RequestObserver> {
        self.requests.clone()
    }

    /// The same for the ublk export's requests (`uraid_ublk_*`).
    pub fn ublk_observer(&self) -> Arc<dyn RequestObserver> {
        self.ublk.clone()
    }

    /// The text format, with the array's state as it is now.
    pub fn render(&self) -> String {
        let _one = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    fn refresh(&self) {
        let a = &self.cell.current();
        let s = &self.state;
        s.degraded.set(i64::from(a.is_degraded()));
        s.raid_disks.set(a.raid_disks() as i64);
        let mut counts = [0i64; 4];
        for r in 0..a.raid_disks() {
            counts[match a.slot_state(MemberIdx(r)) {
                SlotState::InSync => 0,
                SlotState::Recovering => 1,
                SlotState::Faulty => 2,
                SlotState::Missing => 3,
            }] += 1;
        }
        for (state, n) in ["in_sync", "recovering", "faulty", "missing"]
            .iter()
            .zip(counts)
        {
            s.members.get_or_create(&StateLabel { state }).set(n);
        }
        let sync = self
            .sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|f| f());
        let running = sync.map(|p| p.kind.name()).unwrap_or("idle");
        for action in ["idle", "resync", "recovery", "check", "repair"] {
            s.sync_action
                .get_or_create(&ActionLabel { action })
                .set(i64::from(action == running));
        }
        s.sync_completed
            .set(sync.map(|p| p.percent() / 100.0).unwrap_or(0.0));
        s.mismatch_sectors
            .set(sync.map(|p| p.mismatch_sectors as i64).unwrap_or(0));
        let st = &a.stats;
        catch_up(&s.member_reads, st.member_reads.load(Ordering::Relaxed));
        catch_up(&s.member_writes, st.member_writes.load(Ordering::Relaxed));
        catch_up(&s.degraded_reads, st.degraded_reads.load(Ordering::Relaxed));
        catch_up(
            &s.corrected_reads,
            st.corrected_reads.load(Ordering::Relaxed),
        );
        catch_up(
            &s.sync_zero_bytes,
            st.sync_zero_bytes.load(Ordering::Relaxed),
        );
        if matches!(a.level(), Level::Raid4 | Level::Raid5 | Level::Raid6) {
            let c = a.stripe_cache();
            s.stripe_cache_size.set(c.size() as i64);
            s.stripe_cache_active.set(c.active() as i64);
        }
        if let Some(j) = a.join_stats() {
            for (what, n) in [
                ("led", &j.led),
                ("joined", &j.joined),
                ("full", &j.full),
                ("partial", &j.partial),
            ] {
                catch_up(
                    &s.stripe_joins.get_or_create(&JoinLabel { what }),
                    n.load(Ordering::Relaxed),
                );
            }
        }
        if let Some(mode) = a.journal_mode() {
            s.journal_faulty.set(i64::from(a.journal_failed()));
            s.journal_write_back
                .set(i64::from(mode == uraid_engine::JournalMode::WriteBack));
            let wb = a.writeback_stats().unwrap_or_default();
            s.journal_cached_stripes.set(wb.cached_stripes as i64);
            s.journal_cached_bytes.set(wb.cached_pages as i64 * 4096);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RemoteLabel {
    role: u64,
    uri: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RemoteStateLabel {
    role: u64,
    uri: String,
    state: &'static str,
}

/// The members on other hosts, read from their [`Member::remote`](uraid_engine::Member)
/// at each scrape (the same source as `detail`'s `remote` objects).
struct RemoteCollector(Arc<ArrayCell>);

impl std::fmt::Debug for RemoteCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteCollector")
    }
}

impl prometheus_client::collector::Collector for RemoteCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType;
        use uraid_engine::RemoteConnection;
        let a = &self.0.current();
        let remotes: Vec<(u64, uraid_engine::RemoteStatus)> = (0..a.raid_disks())
            .filter_map(|r| Some((r as u64, a.slot(MemberIdx(r)).device()?.remote()?)))
            .collect();
        if remotes.is_empty() {
            return Ok(());
        }
        let label = |role: u64, m: &uraid_engine::RemoteStatus| RemoteLabel {
            role,
            uri: m.uri.clone(),
        };
        let mut e = encoder.encode_descriptor(
            "remote_connection",
            "1 for the state of a remote member's connection (up, reconnecting, lost)",
            None,
            MetricType::Gauge,
        )?;
        for (role, m) in &remotes {
            for c in [
                RemoteConnection::Up,
                RemoteConnection::Reconnecting,
                RemoteConnection::Lost,
            ] {
                let l = RemoteStateLabel {
                    role: *role,
                    uri: m.uri.clone(),
                    state: c.name(),
                };
                e.encode_family(&l)?
                    .encode_gauge(&i64::from(m.connection == c))?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "remote_latency_average_seconds",
            "Moving average (weight 1/8) of a remote member's reply latency",
            None,
            MetricType::Gauge,
        )?;
        for (role, m) in &remotes {
            if let Some(us) = m.latency_us {
                e.encode_family(&label(*role, m))?
                    .encode_gauge(&(us as f64 / 1e6))?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "remote_reply_latency_seconds",
            "Time a remote member's server took to answer, every reply of its connection",
            None,
            MetricType::Histogram,
        )?;
        for (role, m) in &remotes {
            let buckets: Vec<(f64, u64)> = m
                .latency_buckets
                .iter()
                .map(|&(upper, n)| (upper.map_or(f64::MAX, |us| us as f64 / 1e6), n))
                .collect();
            let count = buckets.iter().map(|b| b.1).sum();
            e.encode_family(&label(*role, m))?.encode_histogram::<()>(
                m.latency_sum_us as f64 / 1e6,
                count,
                &buckets,
                None,
            )?;
        }
        let mut e = encoder.encode_descriptor(
            "remote_reconnect_attempts",
            "Attempts to connect a remote member anew (reconnects and re-add tries)",
            None,
            MetricType::Counter,
        )?;
        for (role, m) in &remotes {
            e.encode_family(&label(*role, m))?
                .encode_counter::<(), _, f64>(&m.reconnect_attempts, None)?;
        }
        Ok(())
    }
}

/// Brings a Prometheus counter up to the engine's counter of the same thing.
fn catch_up(c: &Counter, engine: u64) {
    let now = c.get();
    if engine > now {
        c.inc_by(engine - now);
    }
}

/// Where `--metrics` listens: loopback unless `allow_remote`.
pub fn parse_addr(s: &str, allow_remote: bool) -> Result<SocketAddr> {
    let addr: SocketAddr = match s.parse::<u16>() {
        Ok(port) => SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => s
            .parse()
            .with_context(|| format!("bad --metrics address {s:?} (HOST:PORT or PORT)"))?,
    };
    if !addr.ip().is_loopback() && !allow_remote {
        bail!(
            "--metrics {addr} is not a loopback address: the metrics are served to anyone who \
             connects; add --metrics-allow-remote to serve them there"
        );
    }
    Ok(addr)
}

/// The HTTP endpoint, answering until dropped.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The address it listens on (the port chosen where 0 was given).
    pub addr: SocketAddr,
}

impl MetricsServer {
    /// Listens on `addr` and serves `metrics` at GET /metrics.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<MetricsServer> {
        let server = tiny_http::Server::http(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for --metrics: {e}"))?;
        let bound = server
            .server_addr()
            .to_ip()
            .context("the metrics listener has no IP address")?;
        let server = Arc::new(server);
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for req in s.incoming_requests() {
                    let resp = match (req.method(), req.url()) {
                        (tiny_http::Method::Get, "/metrics") => {
                            tiny_http::Response::from_string(metrics.render()).with_header(
                                "Content-Type: text/plain; version=0.0.4; charset=utf-8"
                                    .parse::<tiny_http::Header>()
                                    .expect("a valid header"),
                            )
                        }
                        _ => tiny_http::Response::from_string("uraid serves GET /metrics only\n")
                            .with_status_code(404),
                    };
                    let _ = req.respond(resp);
                }
            })
            .context("starting the metrics thread")?;
        Ok(MetricsServer {
            server,
            thread: Some(thread),
            addr: bound,
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_address_is_loopback_unless_allowed() {
        assert_eq!(
            parse_addr("9100", false).unwrap(),
            "127.0.0.1:9100".parse().unwrap()
        );
        assert_eq!(
            parse_addr("[::1]:9100", false).unwrap(),
            "[::1]:9100".parse().unwrap()
        );
        let e = parse_addr("0.0.0.0:9100", false).unwrap_err().to_string();
        assert!(e.contains("--metrics-allow-remote"), "{e}");
        assert!(parse_addr("0.0.0.0:9100", true).is_ok());
        assert!(parse_addr("nohost", false).is_err());
    }
}
