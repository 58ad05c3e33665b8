//! parity-bench: uraid's XOR, P+Q generation and two-data-block recovery against Intel ISA-L
//! on the same buffers, single-threaded, plus memcpy for scale.
//!
//! ```text
//! cargo run --release -p uraid-parity --features isal --bin parity-bench
//! ```
//!
//! Without the `isal` feature only uraid and memcpy are measured. Options:
//! `--all` also times every available uraid implementation; `--quick` takes fewer samples;
//! `--sizes 4096,65536` sets the block sizes (bytes); `--filter TEXT` runs only the rows whose name contains TEXT; `--wall` times wall-clock
//! instead of this thread's CPU time; `--isal-avx2` calls ISA-L's AVX2 functions
//! (`xor_gen_avx`, `pq_gen_avx2`) instead of its dispatcher, which is what ISA-L runs on a CPU
//! without AVX-512 (pair it with `URAID_PARITY_IMPL=avx2` to compare the AVX2 paths).
//! Throughput is GB/s (1e9 bytes) of source data: the data blocks for XOR and P+Q, and the
//! `ndata` surviving blocks read for recovery. Each figure is the median of interleaved
//! samples.

use std::hint::black_box;
use std::time::Duration;
use uraid_parity::{available, Implementation, Parity};

#[cfg(feature = "isal")]
mod isal {
    use std::ffi::{c_int, c_void};

    #[link(name = "isal")]
    extern "C" {
        pub fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        pub fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        // What ISA-L's dispatcher picks on a CPU with AVX2 and no AVX-512 (`--isal-avx2`).
        pub fn xor_gen_avx(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        pub fn pq_gen_avx2(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        pub fn ec_init_tables(k: c_int, rows: c_int, a: *mut u8, gftbls: *mut u8);
        pub fn ec_encode_data(
            len: c_int,
            k: c_int,
            rows: c_int,
            gftbls: *mut u8,
            data: *mut *mut u8,
            coding: *mut *mut u8,
        );
    }
}

/// `n` blocks of `len` bytes, 64-byte aligned (ISA-L wants 32), with a gap between blocks
/// so that they do not all map to the same cache sets.
struct Stripe {
    mem: Vec<u8>,
    base: usize,
    stride: usize,
    len: usize,
    n: usize,
}

impl Stripe {
    fn new(n: usize, len: usize, seed: u64) -> Stripe {
        let stride = len + 320;
        let mut mem = vec![0u8; n * stride + 64];
        let base = mem.as_ptr().align_offset(64);
        let mut x = seed | 1;
        for b in mem.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        Stripe {
            mem,
            base,
            stride,
            len,
            n,
        }
    }
    /// A copy with the same contents in its own (aligned) memory.
    #[cfg(feature = "isal")]
    fn duplicate(&self) -> Stripe {
        let mut d = Stripe::new(self.n, self.len, 0);
        let (a, b) = (self.base, d.base);
        let span = self.n * self.stride;
        d.mem[b..b + span].copy_from_slice(&self.mem[a..a + span]);
        d
    }
    fn ptr(&mut self, i: usize) -> *mut u8 {
        assert!(i < self.n);
        let off = self.base + i * self.stride;
        self.mem[off..off + self.len].as_mut_ptr()
    }
    fn get(&self, i: usize) -> &[u8] {
        let off = self.base + i * self.stride;
        &self.mem[off..off + self.len]
    }
    fn all(&self) -> Vec<&[u8]> {
        (0..self.n).map(|i| self.get(i)).collect()
    }
    fn all_mut(&mut self) -> Vec<&mut [u8]> {
        let (base, stride, len) = (self.base, self.stride, self.len);
        let mut out = Vec::new();
        let mut rest = &mut self.mem[base..];
        for _ in 0..self.n {
            let (head, tail) = rest.split_at_mut(stride.min(rest.len()));
            out.push(&mut head[..len]);
            rest = tail;
        }
        out
    }
}

struct Timer {
    samples: usize,
    sample_time: Duration,
    wall: bool,
    #[cfg_attr(not(feature = "isal"), allow(dead_code))]
    isal_avx2: bool,
}

/// CPU time of this thread: on a shared machine it does not count the time other
/// processes hold the core (wall time with `--wall`).
fn now(wall: bool) -> Duration {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_MONOTONIC: i32 = 1;
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    let clock = if wall {
        CLOCK_MONOTONIC
    } else {
        CLOCK_THREAD_CPUTIME_ID
    };
    // SAFETY: plain libc call with a valid out pointer.
    let rc = unsafe { clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.sec as u64, ts.nsec as u32)
}

impl Timer {
    /// Median GB/s of each closure; samples of the closures are interleaved so that a noisy
    /// neighbour hurts them alike.
    fn run(&self, bytes: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
        let iters: Vec<u64> = fs
            .iter_mut()
            .map(|f| {
                f(); // warm caches and lazy init
                let start = now(self.wall);
                let mut n = 0u64;
                while now(self.wall) - start < self.sample_time / 4 {
                    f();
                    n += 1;
                }
                // At least 16 calls, so that the first (cold) call of a sample weighs little.
                (n * 4).max(16)
            })
            .collect();
        let mut rates = vec![Vec::new(); fs.len()];
        for _ in 0..self.samples {
            for (i, f) in fs.iter_mut().enumerate() {
                let start = now(self.wall);
                for _ in 0..iters[i] {
                    f();
                }
                let secs = (now(self.wall) - start).as_secs_f64();
                rates[i].push(bytes as f64 * iters[i] as f64 / secs / 1e9);
            }
        }
        rates
            .into_iter()
            .map(|mut r| {
                r.sort_by(f64::total_cmp);
                r[r.len() / 2]
            })
            .collect()
    }
}

const SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];

fn size_name(len: usize) -> String {
    if !len.is_multiple_of(1024) {
        format!("{len} B")
    } else if len >= 1 << 20 {
        format!("{} MiB", len >> 20)
    } else {
        format!("{} KiB", len >> 10)
    }
}

/// One table row: uraid (active), ISA-L, ratio, and optionally every implementation.
struct Row {
    op: String,
    uraid: f64,
    isal: Option<f64>,
    per_impl: Vec<f64>,
}

fn print_header(impls: &[Implementation]) {
    let mut h = String::from("| operation | uraid GB/s | ISA-L GB/s | uraid / ISA-L |");
    let mut s = String::from("|---|---:|---:|---:|");
    for i in impls {
        h += &format!(" {i} |");
        s += "---:|";
    }
    println!("{h}\n{s}");
}

fn print_row(r: &Row) {
    let (isal, ratio) = match r.isal {
        Some(v) => (format!("{v:.1}"), format!("{:.2}x", r.uraid / v)),
        None => ("-".into(), "-".into()),
    };
    let mut line = format!("| {} | {:.1} | {isal} | {ratio} |", r.op, r.uraid);
    for v in &r.per_impl {
        line += &format!(" {v:.1} |");
    }
    println!("{line}");
}

fn bench_memcpy(t: &Timer, len: usize) -> Row {
    let n = 4;
    let mut src = Stripe::new(n, len, 1);
    let mut dst = Stripe::new(n, len, 2);
    let mut f = || {
        for i in 0..n {
            // SAFETY: distinct allocations, `len` bytes each.
            unsafe { std::ptr::copy_nonoverlapping(src.ptr(i), dst.ptr(i), len) };
        }
        black_box(dst.ptr(0));
    };
    let r = t.run(n * len, &mut [&mut f]);
    Row {
        op: format!("memcpy 4 blocks x {}", size_name(len)),
        uraid: r[0],
        isal: None,
        per_impl: vec![],
    }
}

/// Each of `impls` alone on the stripe (the `--all` columns).
fn per_impl(t: &Timer, s: &mut Stripe, impls: &[Implementation], op: Op, bytes: usize) -> Vec<f64> {
    impls
        .iter()
        .map(|&i| {
            let mut f = uraid_fn(Parity::new(i).expect("available"), s.all_mut(), op);
            t.run(bytes, &mut [&mut *f])[0]
        })
        .collect()
}

fn bench_xor(t: &Timer, impls: &[Implementation], ndata: usize, len: usize) -> Row {
    let mut s = Stripe::new(ndata + 1, len, 3);
    let mut want = vec![0u8; len];
    uraid_parity::scalar::xor_gen(&mut want, &s.all()[..ndata]);
    let op = Op::Xor { ndata };
    let per_impl = per_impl(t, &mut s, impls, op, ndata * len);
    let (uraid, isal) = versus(t, &mut s, ndata * len, op, &want);
    Row {
        op: format!("XOR {ndata}+1, {}", size_name(len)),
        uraid,
        isal,
        per_impl,
    }
}

fn bench_pq(t: &Timer, impls: &[Implementation], ndata: usize, len: usize) -> Row {
    let mut s = Stripe::new(ndata + 2, len, 4);
    let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
    uraid_parity::scalar::gen_pq(&s.all()[..ndata], &mut p, &mut q);
    let want = [p, q].concat();
    let op = Op::Pq { ndata };
    let per_impl = per_impl(t, &mut s, impls, op, ndata * len);
    let (uraid, isal) = versus(t, &mut s, ndata * len, op, &want);
    Row {
        op: format!("P+Q {ndata}+2, {}", size_name(len)),
        uraid,
        isal,
        per_impl,
    }
}

fn bench_recover(t: &Timer, impls: &[Implementation], ndata: usize, len: usize) -> Row {
    let mut s = Stripe::new(ndata + 2, len, 5);
    {
        let mut v = s.all_mut();
        let (data, pq) = v.split_at_mut(ndata);
        let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
        let (p, q) = pq.split_at_mut(1);
        uraid_parity::scalar::gen_pq(&data, p[0], q[0]);
    }
    // Lose the first two data blocks.
    let (x, y) = (0, 1);
    let want = [s.get(x), s.get(y)].concat();
    let op = Op::Recover { ndata, x, y };
    let per_impl = per_impl(t, &mut s, impls, op, ndata * len);
    let (uraid, isal) = versus(t, &mut s, ndata * len, op, &want);
    Row {
        op: format!("recover 2 data {ndata}+2, {}", size_name(len)),
        uraid,
        isal,
        per_impl,
    }
}

#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "isal"), allow(dead_code))]
enum Op {
    Xor { ndata: usize },
    Pq { ndata: usize },
    Recover { ndata: usize, x: usize, y: usize },
}

/// A closure that runs `op` with uraid on `blocks`, its slices built once as a caller
/// would hold them.
fn uraid_fn<'a>(par: Parity, mut blocks: Vec<&'a mut [u8]>, op: Op) -> Box<dyn FnMut() + 'a> {
    match op {
        Op::Xor { ndata } | Op::Pq { ndata } => {
            let mut outs = blocks.split_off(ndata);
            let data: Vec<&[u8]> = blocks.into_iter().map(|b| &*b).collect();
            if let Op::Xor { .. } = op {
                Box::new(move || par.xor_gen(black_box(&mut *outs[0]), black_box(&data)))
            } else {
                Box::new(move || {
                    let (p, q) = outs.split_at_mut(1);
                    par.gen_pq(black_box(&data), black_box(&mut *p[0]), &mut *q[0])
                })
            }
        }
        Op::Recover { x, y, .. } => Box::new(move || par.recover(black_box(&mut blocks), &[x, y])),
    }
}

/// The blocks `op` produces.
fn out_blocks(op: Op) -> Vec<usize> {
    match op {
        Op::Xor { ndata } => vec![ndata],
        Op::Pq { ndata } => vec![ndata, ndata + 1],
        Op::Recover { x, y, .. } => vec![x, y],
    }
}

fn output(s: &Stripe, op: Op) -> Vec<u8> {
    out_blocks(op)
        .iter()
        .flat_map(|&i| s.get(i).to_vec())
        .collect()
}

/// Overwrite what `op` is about to produce, so that a check after the call means something.
fn scribble(s: &mut Stripe, op: Op) {
    let mut v = s.all_mut();
    for i in out_blocks(op) {
        v[i].fill(0xee);
    }
}

/// The active uraid path and ISA-L on the same stripe, interleaved; both outputs are
/// checked against `want` first (this also shows that ISA-L's pq_gen computes md's Q).
fn versus(t: &Timer, s: &mut Stripe, bytes: usize, op: Op, want: &[u8]) -> (f64, Option<f64>) {
    let par = Parity::active();
    // ISA-L gets its own copy, so that neither writes memory the other holds references to.
    #[cfg(feature = "isal")]
    let mut s2 = s.duplicate();
    scribble(s, op);
    uraid_fn(par, s.all_mut(), op)();
    assert!(output(s, op) == want, "uraid output is wrong");
    let mut uraid = uraid_fn(par, s.all_mut(), op);

    #[cfg(feature = "isal")]
    {
        let ptrs: Vec<*mut u8> = (0..s2.n).map(|i| s2.ptr(i)).collect();
        let mut isal = IsalJob::new(&ptrs, s2.len, op, t.isal_avx2);
        scribble(&mut s2, op);
        isal.run();
        let got = match op {
            Op::Recover { .. } => [isal.out[0].clone(), isal.out[1].clone()].concat(),
            _ => output(&s2, op),
        };
        assert!(got == want, "ISA-L output is wrong");
        let mut f = || isal.run();
        let r = t.run(bytes, &mut [&mut *uraid, &mut f]);
        (r[0], Some(r[1]))
    }
    #[cfg(not(feature = "isal"))]
    {
        (t.run(bytes, &mut [&mut *uraid])[0], None)
    }
}

/// ISA-L's way to do each operation. Recovery uses ec_encode_data with the 2 x ndata
/// matrix that maps the survivors (other data, P, Q) to the two lost blocks; its tables are
/// built once, outside the timing (ISA-L's best case).
#[cfg(feature = "isal")]
struct IsalJob {
    op: Op,
    avx2: bool,
    len: usize,
    array: Vec<*mut std::ffi::c_void>,
    survivors: Vec<*mut u8>,
    out: [Vec<u8>; 2],
    tables: Vec<u8>,
}

#[cfg(feature = "isal")]
impl IsalJob {
    fn new(ptrs: &[*mut u8], len: usize, op: Op, avx2: bool) -> IsalJob {
        let array = ptrs.iter().map(|&p| p as *mut std::ffi::c_void).collect();
        let mut job = IsalJob {
            op,
            avx2,
            len,
            array,
            survivors: Vec::new(),
            out: [vec![0u8; len], vec![0u8; len]],
            tables: Vec::new(),
        };
        if let Op::Recover { ndata, x, y } = op {
            let gyx = uraid_parity::gf::exp2(y - x);
            let denom = uraid_parity::gf::inv(gyx ^ 1);
            let a = uraid_parity::gf::mul(gyx, denom);
            let b = uraid_parity::gf::mul(uraid_parity::gf::inv(uraid_parity::gf::exp2(x)), denom);
            // Dx = A*(P ^ sum D) ^ B*(Q ^ sum g^k D); Dy = P ^ sum D ^ Dx.
            let mut rx = Vec::new();
            for k in (0..ndata).filter(|&k| k != x && k != y) {
                job.survivors.push(ptrs[k]);
                rx.push(a ^ uraid_parity::gf::mul(b, uraid_parity::gf::exp2(k)));
            }
            job.survivors.extend([ptrs[ndata], ptrs[ndata + 1]]);
            rx.extend([a, b]);
            let ry: Vec<u8> = rx
                .iter()
                .enumerate()
                .map(|(i, &c)| if i == rx.len() - 1 { c } else { c ^ 1 })
                .collect();
            let mut matrix = [rx, ry].concat();
            job.tables = vec![0u8; 32 * matrix.len()];
            // SAFETY: sizes as the header documents (k * rows coefficients, 32 bytes each).
            unsafe {
                isal::ec_init_tables(
                    ndata as i32,
                    2,
                    matrix.as_mut_ptr(),
                    job.tables.as_mut_ptr(),
                )
            };
        }
        job
    }

    fn run(&mut self) {
        let len = self.len as i32;
        // SAFETY: pointer arrays name live, 64-byte aligned blocks of `len` bytes.
        unsafe {
            let rc = match self.op {
                Op::Xor { ndata } => {
                    let f = if self.avx2 {
                        isal::xor_gen_avx
                    } else {
                        isal::xor_gen
                    };
                    f(ndata as i32 + 1, len, self.array.as_mut_ptr())
                }
                Op::Pq { ndata } => {
                    let f = if self.avx2 {
                        isal::pq_gen_avx2
                    } else {
                        isal::pq_gen
                    };
                    f(ndata as i32 + 2, len, self.array.as_mut_ptr())
                }
                Op::Recover { ndata, .. } => {
                    let mut outs = [self.out[0].as_mut_ptr(), self.out[1].as_mut_ptr()];
                    isal::ec_encode_data(
                        len,
                        ndata as i32,
                        2,
                        self.tables.as_mut_ptr(),
                        self.survivors.as_mut_ptr(),
                        outs.as_mut_ptr(),
                    );
                    0
                }
            };
            assert_eq!(rc, 0, "ISA-L refused the call");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let impls: Vec<Implementation> = if args.iter().any(|a| a == "--all") {
        available()
    } else {
        Vec::new()
    };
    let t = Timer {
        // Many short samples: on a shared machine most of them run undisturbed, and the
        // median of those is what the code can do.
        samples: if quick { 15 } else { 41 },
        sample_time: Duration::from_micros(1500),
        wall: args.iter().any(|a| a == "--wall"),
        isal_avx2: args.iter().any(|a| a == "--isal-avx2"),
    };
    let filter = args
        .iter()
        .position(|a| a == "--filter")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let show = |r: Row| {
        if r.op.contains(&filter) {
            print_row(&r)
        }
    };
    println!(
        "uraid parity: active implementation {} (available: {}); ISA-L {}{}",
        uraid_parity::active(),
        available()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", "),
        if cfg!(feature = "isal") {
            "linked"
        } else {
            "not linked (build with --features isal)"
        },
        if args.iter().any(|a| a == "--isal-avx2") {
            " (its AVX2 functions: xor_gen_avx, pq_gen_avx2)"
        } else {
            ""
        }
    );
    println!();
    print_header(&impls);
    let sizes: Vec<usize> = args
        .iter()
        .position(|a| a == "--sizes")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.split(',')
                .map(|x| x.parse().expect("--sizes takes bytes"))
                .collect()
        })
        .unwrap_or(SIZES.to_vec());
    let want = |name: String| name.contains(&filter);
    for len in sizes {
        let sz = size_name(len);
        if want(format!("memcpy 4 blocks x {sz}")) {
            show(bench_memcpy(&t, len));
        }
        for ndata in [4, 8] {
            if want(format!("XOR {ndata}+1, {sz}")) {
                show(bench_xor(&t, &impls, ndata, len));
            }
        }
        for ndata in [4, 8] {
            if want(format!("P+Q {ndata}+2, {sz}")) {
                show(bench_pq(&t, &impls, ndata, len));
            }
        }
        for ndata in [4, 8] {
            if want(format!("recover 2 data {ndata}+2, {sz}")) {
                show(bench_recover(&t, &impls, ndata, len));
            }
        }
    }
}
