//! `uswap bench fault-latency`: what one 4 KiB fault costs, next to what the disk
//! costs for the same 4 KiB, in one run.
//!
//! Three samples, interleaved so that the machine's drift hits all of them alike:
//! - major faults: a random page of a region swapped out long ago (4 KiB units,
//!   readahead off), one word read and checked;
//! - swap-cache hits: a sequential pass over another swapped-out region with VMA
//!   readahead, whose pages the window read ahead (the first touch of a page read
//!   ahead is a minor fault served from the cache);
//! - O_DIRECT 4 KiB preads at random offsets of a file in the swap file's directory
//!   (the same disk and filesystem);
//! - the same reads through io_uring, their completion polled (yielding the CPU between
//!   looks) for up to `OWN_READ_POLL_US` before sleeping: the device's cost for a fault
//!   that polls for its read (`--fault-mode in-thread`), which skips the sleep and
//!   wake-up that a pread pays.
//!
//! Each access is classified by the region's counters (majflt, swapcache_hit) read
//! outside the timed window; accesses of another kind are not counted.

use crate::bench::BenchArgs;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

const PAGE: usize = 4096;
const WORDS_PER_PAGE: usize = PAGE / 8;

/// Percentiles of one sample, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub n: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
}

impl Sample {
    fn of(h: &Histogram<u64>) -> Sample {
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        Sample {
            n: h.len(),
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
        }
    }
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct FaultLatency {
    pub workload: &'static str,
    pub budget: u64,
    pub size: u64,
    pub fault_threads: usize,
    pub spin_us: u32,
    pub fault_mode: &'static str,
    pub io_poll_us: u32,
    pub major_fault: Sample,
    pub swapcache_hit: Sample,
    pub pread: Sample,
    pub polled_read: Sample,
    /// How long the baseline's reads polled before sleeping.
    pub polled_read_poll_us: u32,
    pub own_read_poll_us: u32,
    /// Major fault p50 minus pread p50.
    pub major_minus_pread_p50_us: f64,
    /// Major fault p50 minus polled read p50.
    pub major_minus_polled_read_p50_us: f64,
    pub verify: &'static str,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds")
}

fn pattern(seed: u64, page: usize) -> u64 {
    let mut z = seed ^ (page as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fill(words: &[AtomicU64], seed: u64) {
    for p in 0..words.len() / WORDS_PER_PAGE {
        words[p * WORDS_PER_PAGE].store(pattern(seed, p), Relaxed);
    }
}

/// An O_DIRECT file of `len` bytes of random data next to the swap file.
fn pread_file(dir: &std::path::Path, len: usize) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE | libc::O_DIRECT)
        .mode(0o600)
        .open(dir)?;
    let mut buf = AlignedPage::new(256);
    for (i, b) in buf.bytes_mut().iter_mut().enumerate() {
        *b = (pattern(7, i) & 0xff) as u8;
    }
    use std::os::unix::fs::FileExt;
    let chunk = buf.len();
    let mut off = 0;
    while off < len {
        f.write_all_at(buf.bytes(), off as u64)?;
        off += chunk;
    }
    f.sync_all()?;
    Ok(f)
}

/// A page-aligned buffer (O_DIRECT needs one).
struct AlignedPage {
    ptr: *mut u8,
    pages: usize,
}

impl AlignedPage {
    fn new(pages: usize) -> AlignedPage {
        let layout = std::alloc::Layout::from_size_align(pages * PAGE, PAGE).expect("layout");
        // SAFETY: a non-zero layout; freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        AlignedPage { ptr, pages }
    }
    fn len(&self) -> usize {
        self.pages * PAGE
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialized bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len()) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len()) }
    }
}

impl Drop for AlignedPage {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len(), PAGE).expect("layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

fn errno_text(n: i32) -> String {
    if n < 0 {
        std::io::Error::from_raw_os_error(-n).to_string()
    } else {
        format!("{n} bytes of {PAGE}")
    }
}

/// Run it.
pub fn run(args: &BenchArgs) -> Result<FaultLatency, String> {
    let pool = args
        .pool_builder()
        .unit(uswap::UnitPolicy::Small)
        .build()
        .map_err(|e| e.to_string())?;
    let opts = |ra| uswap::RegionOptions {
        unit: Some(uswap::UnitPolicy::Small),
        readahead: Some(ra),
        ..Default::default()
    };
    let major = pool
        .region_with(args.size, opts(uswap::ReadaheadPolicy::Off))
        .map_err(|e| e.to_string())?;
    let hits = pool
        .region_with(args.size / 2, opts(uswap::ReadaheadPolicy::Vma))
        .map_err(|e| e.to_string())?;
    let (mw, hw) = (major.as_words(), hits.as_words());
    fill(mw, args.seed);
    fill(hw, args.seed + 1);
    // Push both out: touch the second half of the major region again.
    let mpages = mw.len() / WORDS_PER_PAGE;
    for p in mpages / 2..mpages {
        mw[p * WORDS_PER_PAGE + 1].load(Relaxed);
    }
    let file = pread_file(&pool.swap_location(), 64 << 20).map_err(|e| {
        format!(
            "cannot make the O_DIRECT comparison file in {}: {e}",
            pool.swap_location().display()
        )
    })?;
    let fpages = (64 << 20) / PAGE;
    let mut buf = AlignedPage::new(1);
    let (mut h_major, mut h_hit, mut h_pread, mut h_polled) = (hist(), hist(), hist(), hist());
    // The polled baseline polls as the faults do (the default when they do not).
    let polled_read_poll_us = match args.own_read_poll_us {
        0 => uswap::OWN_READ_POLL_US,
        us => us,
    };
    let poll = std::time::Duration::from_micros(polled_read_poll_us as u64);
    let polled_read = |buf: &mut AlignedPage, off: u64| -> Result<(), String> {
        match uswap::read_own(file.as_raw_fd(), buf.bytes_mut(), off, poll) {
            Some(n) if n == PAGE as i32 => Ok(()),
            Some(n) => Err(format!("polled O_DIRECT read: {}", errno_text(n))),
            None => Err("polled O_DIRECT read: no io_uring here".into()),
        }
    };
    // (the thread's ring is made at its first read: not timed)
    polled_read(&mut buf, 0)?;
    let mut rng = args.seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let hpages = hw.len() / WORDS_PER_PAGE;
    let mut hit_page = 0usize;
    let mut bad = None;
    let samples = 3000;
    use std::os::unix::fs::FileExt;
    for _ in 0..samples {
        // A major fault: a random page of the first half.
        let p = (next() as usize) % (mpages / 2);
        let c0 = major.counters();
        let t = Instant::now();
        let v = mw[p * WORDS_PER_PAGE].load(Relaxed);
        let d = t.elapsed();
        let c1 = major.counters();
        if v != pattern(args.seed, p) {
            bad.get_or_insert(format!("page {p} of the major-fault region read {v:#x}"));
        }
        if c1.majflt > c0.majflt {
            let _ = h_major.record(d.as_nanos() as u64);
        }
        // A sequential step through the readahead region.
        if hit_page < hpages {
            let c0 = hits.counters();
            let t = Instant::now();
            let v = hw[hit_page * WORDS_PER_PAGE].load(Relaxed);
            let d = t.elapsed();
            let c1 = hits.counters();
            if v != pattern(args.seed + 1, hit_page) {
                bad.get_or_insert(format!(
                    "page {hit_page} of the readahead region read {v:#x}"
                ));
            }
            if c1.swapcache_hit > c0.swapcache_hit && c1.majflt == c0.majflt {
                let _ = h_hit.record(d.as_nanos() as u64);
            }
            hit_page += 1;
        }
        // The disk alone.
        let off = ((next() as usize) % fpages * PAGE) as u64;
        let t = Instant::now();
        file.read_exact_at(buf.bytes_mut(), off)
            .map_err(|e| format!("O_DIRECT pread: {e}"))?;
        let _ = h_pread.record(t.elapsed().as_nanos() as u64);
        // The disk alone, polled.
        let off = ((next() as usize) % fpages * PAGE) as u64;
        let t = Instant::now();
        polled_read(&mut buf, off)?;
        let _ = h_polled.record(t.elapsed().as_nanos() as u64);
    }
    if h_major.is_empty() {
        return Err("no access was a major fault: the region did not swap out".into());
    }
    let (m, p, q) = (
        Sample::of(&h_major),
        Sample::of(&h_pread),
        Sample::of(&h_polled),
    );
    if let Some(b) = &bad {
        eprintln!("uswap: verify FAILED: {b}");
    }
    Ok(FaultLatency {
        workload: "fault-latency",
        budget: args.budget,
        size: args.size,
        fault_threads: args.fault_threads,
        spin_us: args.spin_us,
        fault_mode: args.fault_mode.name(),
        io_poll_us: args.io_poll_us,
        major_minus_pread_p50_us: m.p50_us - p.p50_us,
        major_minus_polled_read_p50_us: m.p50_us - q.p50_us,
        own_read_poll_us: args.own_read_poll_us,
        polled_read_poll_us,
        major_fault: m,
        swapcache_hit: Sample::of(&h_hit),
        pread: p,
        polled_read: q,
        verify: if bad.is_some() { "FAILED" } else { "ok" },
    })
}

/// `uswap bench fault-latency`: run, print, exit status.
pub fn main(args: &BenchArgs) -> i32 {
    let r = match run(args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uswap: error: {e}");
            return 1;
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&r).expect("serializable"));
    } else {
        println!(
            "fault-latency: {} region, budget {}, 4 KiB units, fault mode {}{}, {} fault thread(s)",
            uswap::format_size(r.size),
            uswap::format_size(r.budget),
            r.fault_mode,
            match (r.fault_mode, r.io_poll_us, r.own_read_poll_us) {
                ("in-thread", _, 0) => " (reads waited for asleep)".to_string(),
                ("in-thread", _, us) => format!(" (own reads polled up to {us} µs)"),
                (_, 0, _) => String::new(),
                (_, us, _) => format!(" (completion polling {us} µs)"),
            },
            r.fault_threads
        );
        println!(
            "{:<34} {:>7} {:>9} {:>9} {:>9}",
            "", "n", "p50 µs", "p90 µs", "p99 µs"
        );
        let polled = format!("O_DIRECT 4 KiB read, polled {} µs", r.polled_read_poll_us);
        for (name, s) in [
            ("4 KiB major fault", &r.major_fault),
            ("swap-cache hit", &r.swapcache_hit),
            ("O_DIRECT 4 KiB pread", &r.pread),
            (polled.as_str(), &r.polled_read),
        ] {
            println!(
                "{name:<34} {:>7} {:>9.1} {:>9.1} {:>9.1}",
                s.n, s.p50_us, s.p90_us, s.p99_us
            );
        }
        println!(
            "major fault - pread, p50: {:+.1} µs; - polled read: {:+.1} µs; verify {}",
            r.major_minus_pread_p50_us, r.major_minus_polled_read_p50_us, r.verify
        );
    }
    if r.verify == "ok" {
        0
    } else {
        1
    }
}
