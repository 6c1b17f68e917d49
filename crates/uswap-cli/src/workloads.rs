//! The benchmark workloads, shaped like the seeds' tests (vm-scalability swap-w-seq and
//! swap-w-rand, pmbench, sequential re-read, and seed 004's combined sequential + random
//! test).
//!
//! Every workload works on `&[AtomicU64]` with relaxed loads and stores (plain moves), so
//! the same code runs on a uswap region and on ordinary memory. Every 4 KiB page holds
//! data of the chosen kind (`--data`, [`crate::data::Pattern`]) that is a function of
//! (seed, page index, version): writers write it, readers check every word of it, and a
//! final pass checks every page against the version its owner last wrote.
//! A writer that overwrites a page checks what the page held first ([`rewrite_page`]),
//! so that every page brought back from swap is checked whole before anything is written
//! over it: data lost between two writes cannot hide under the second.
//! Random workloads give each thread a disjoint set of pages (`page % threads == thread`)
//! so that the expected version of every page is known exactly.

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::data::Pattern;

/// Bytes in one page of the pattern.
pub const PAGE_BYTES: u64 = 4096;
/// 64-bit words in one page.
pub const PAGE_WORDS: usize = PAGE_BYTES as usize / 8;
/// The version every page gets when a workload populates its region.
pub const POPULATE_VERSION: u32 = 1;

// ---------------------------------------------------------------------------------------
// Pattern

/// splitmix64's finaliser applied to `x + golden`: a cheap, well-mixed 64-bit hash.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash of `(seed, page, version)`: a page's stamp (see [`crate::data`]).
#[inline]
pub fn page_base(seed: u64, page: u64, version: u32) -> u64 {
    let p = splitmix64(seed ^ page.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    splitmix64(p ^ u64::from(version).wrapping_mul(0xA076_1D64_78BD_642F))
}

/// The one word of a page that pmbench writes (its reads touch any word).
#[inline]
pub fn touched_word(page: u64) -> usize {
    (splitmix64(page ^ 0x5A5A_5A5A) % PAGE_WORDS as u64) as usize
}

/// The words of one page.
#[inline]
pub fn page_words(words: &[AtomicU64], page: u64) -> &[AtomicU64] {
    let start = page as usize * PAGE_WORDS;
    &words[start..start + PAGE_WORDS]
}

/// Number of whole pages in `words`.
pub fn page_count(words: &[AtomicU64]) -> u64 {
    (words.len() / PAGE_WORDS) as u64
}

/// Write all 512 words of `page` with its data at `version`.
#[inline]
pub fn write_page(words: &[AtomicU64], pat: &Pattern, page: u64, version: u32) {
    let img = pat.page(page, version);
    for (w, x) in page_words(words, page).iter().enumerate() {
        x.store(img.word(w), Relaxed);
    }
}

/// Overwrite `page`, at version `old`, with version `new`, checking each word before it
/// is overwritten. The first access writes (an atomic swap of word 0), so that a page
/// that is not resident comes back on one write fault, dirty, as under [`write_page`],
/// rather than on a read fault and then a write-protect fault.
#[inline]
pub fn rewrite_page(
    words: &[AtomicU64],
    pat: &Pattern,
    page: u64,
    old: u32,
    new: u32,
) -> Result<(), Box<Mismatch>> {
    let (was, now) = (pat.page(page, old), pat.page(page, new));
    let ws = page_words(words, page);
    let wrong = |w: usize, found: u64| {
        Err(Box::new(Mismatch {
            region: String::new(),
            phase: String::new(),
            page,
            word: w,
            offset: page * PAGE_BYTES + w as u64 * 8,
            expected: was.word(w),
            found,
            expected_version: old,
        }))
    };
    let found = ws[0].swap(now.word(0), Relaxed);
    if found != was.word(0) {
        return wrong(0, found);
    }
    for (w, x) in ws.iter().enumerate().skip(1) {
        let found = x.load(Relaxed);
        if found != was.word(w) {
            return wrong(w, found);
        }
        x.store(now.word(w), Relaxed);
    }
    Ok(())
}

/// What a page must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Every word at this version.
    Page(u32),
    /// pmbench: every word at [`POPULATE_VERSION`] except [`touched_word`], at this version.
    Touched(u32),
}

/// A word that did not hold what the workload wrote there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Which region (`main`, or `seq` / `bg` for `combined`).
    pub region: String,
    /// The phase that found it.
    pub phase: String,
    /// Page index in the region.
    pub page: u64,
    /// Word index in the page.
    pub word: usize,
    /// Byte offset in the region.
    pub offset: u64,
    /// The value the pattern says.
    pub expected: u64,
    /// The value found.
    pub found: u64,
    /// The version the page was expected to hold at that word.
    pub expected_version: u32,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {}, page {} (byte offset {:#x}, word {}) during {}: expected {:#018x} (version {}), found {:#018x}",
            self.region,
            self.page,
            self.offset,
            self.word,
            self.phase,
            self.expected,
            self.expected_version,
            self.found
        )
    }
}

/// Check every word of `page`; the first wrong word is returned (region and phase left
/// empty for the caller to fill).
pub fn check_page(
    words: &[AtomicU64],
    pat: &Pattern,
    page: u64,
    expect: Expect,
) -> Result<(), Box<Mismatch>> {
    let (base_version, touched, touched_version) = match expect {
        Expect::Page(v) => (v, usize::MAX, v),
        Expect::Touched(v) => (POPULATE_VERSION, touched_word(page), v),
    };
    let img = pat.page(page, base_version);
    for (w, x) in page_words(words, page).iter().enumerate() {
        let found = x.load(Relaxed);
        let (want, version) = if w == touched {
            (pat.touched(page, touched_version, w), touched_version)
        } else {
            (img.word(w), base_version)
        };
        if found != want {
            return Err(Box::new(Mismatch {
                region: String::new(),
                phase: String::new(),
                page,
                word: w,
                offset: page * PAGE_BYTES + w as u64 * 8,
                expected: want,
                found,
                expected_version: version,
            }));
        }
    }
    Ok(())
}

/// A small, fast PRNG (splitmix64 stream), one per thread.
pub struct Rng(u64);

impl Rng {
    /// A stream for `(seed, stream)`.
    pub fn new(seed: u64, stream: u64) -> Rng {
        Rng(splitmix64(
            seed ^ splitmix64(stream.wrapping_add(0x1234_5678)),
        ))
    }
    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64(self.0)
    }
    /// `r` scaled into `0..n` (Lemire's multiply-shift).
    #[inline]
    pub fn scale(r: u64, n: u64) -> u64 {
        ((u128::from(r) * u128::from(n)) >> 64) as u64
    }
}

/// Contiguous pages of thread `t` of `threads` in a region of `pages` pages.
pub fn slice_of(pages: u64, threads: usize, t: usize) -> Range<u64> {
    let (t, n) = (t as u128, threads as u128);
    let p = u128::from(pages);
    (p * t / n) as u64..(p * (t + 1) / n) as u64
}

/// How many pages thread `t` owns when page `p` belongs to thread `p % threads`.
pub fn owned_count(pages: u64, threads: usize, t: usize) -> u64 {
    let (t, n) = (t as u64, threads as u64);
    if t >= pages {
        0
    } else {
        (pages - t - 1) / n + 1
    }
}

// ---------------------------------------------------------------------------------------
// Phases: worker threads, a progress bar, a stop flag

/// Whether to draw progress bars (stderr, only when it is a terminal and not `--json`).
pub struct Ui {
    show: bool,
}

impl Ui {
    /// Draw bars when `show`.
    pub fn new(show: bool) -> Ui {
        Ui { show }
    }

    fn bar(&self, name: &str, len: Len) -> ProgressBar {
        if !self.show {
            return ProgressBar::hidden();
        }
        let (total, template) = match len {
            Len::Bytes(b) => (
                b,
                "{msg:>14} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            ),
            Len::Time(d) => (
                d.as_millis() as u64,
                "{msg:>14} [{wide_bar}] {pos}/{len} ms",
            ),
        };
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(name.to_string());
        bar
    }
}

/// How long a phase runs: until its workers have moved so many bytes, or for a time.
#[derive(Debug, Clone, Copy)]
pub enum Len {
    /// Workers stop by themselves; progress counts bytes.
    Bytes(u64),
    /// Workers run until told to stop.
    Time(Duration),
}

/// Shared by the workers of one phase.
#[derive(Default)]
pub struct Ctl {
    done: AtomicU64,
    stop: AtomicBool,
}

impl Ctl {
    /// Count bytes done (for the progress bar).
    #[inline]
    pub fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Relaxed);
    }
    /// Whether workers should stop (time is up, or another worker found a mismatch).
    #[inline]
    pub fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
    /// Tell every worker to stop.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }
}

/// Run `work(thread, ctl)` on `workers` threads, drive the bar and the clock from this
/// thread, and return the results with the time from start to the last worker's end.
pub fn run_phase<R: Send>(
    ui: &Ui,
    name: &str,
    len: Len,
    workers: usize,
    work: impl Fn(usize, &Ctl) -> R + Sync,
) -> (Vec<R>, Duration) {
    let ctl = Ctl::default();
    let bar = ui.bar(name, len);
    let start = Instant::now();
    let ended = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|t| {
                let (work, ctl) = (&work, &ctl);
                s.spawn(move || {
                    let r = work(t, ctl);
                    (r, Instant::now())
                })
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            let elapsed = start.elapsed();
            let mut nap = Duration::from_millis(50);
            match len {
                Len::Bytes(_) => bar.set_position(ctl.done.load(Relaxed)),
                Len::Time(d) => {
                    bar.set_position(elapsed.as_millis() as u64);
                    if elapsed >= d {
                        ctl.stop();
                    } else {
                        nap = nap.min(d - elapsed);
                    }
                }
            }
            std::thread::sleep(nap);
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Vec<_>>()
    });
    bar.finish_and_clear();
    let end = ended.iter().map(|(_, t)| *t).max().unwrap_or(start);
    (
        ended.into_iter().map(|(r, _)| r).collect(),
        end.duration_since(start),
    )
}

/// The first mismatch (lowest page) of several threads, labelled.
fn first_mismatch(
    found: impl IntoIterator<Item = Option<Box<Mismatch>>>,
    region: &str,
    phase: &str,
) -> Option<Box<Mismatch>> {
    let mut m = found
        .into_iter()
        .flatten()
        .min_by_key(|m| (m.page, m.word))?;
    m.region = region.to_string();
    m.phase = phase.to_string();
    Some(m)
}

/// One sequential pass: each of `threads` threads runs `op` over its contiguous slice in
/// order; the first error stops all of them.
fn seq_phase(
    ui: &Ui,
    name: &str,
    region: &str,
    words: &[AtomicU64],
    threads: usize,
    op: impl Fn(u64) -> Result<(), Box<Mismatch>> + Sync,
) -> (Duration, Option<Box<Mismatch>>) {
    const BATCH: u64 = 64;
    let pages = page_count(words);
    let (results, elapsed) = run_phase(
        ui,
        name,
        Len::Bytes(pages * PAGE_BYTES),
        threads,
        |t, ctl| {
            let mut pending = 0;
            for page in slice_of(pages, threads, t) {
                if let Err(m) = op(page) {
                    ctl.stop();
                    return Some(m);
                }
                pending += 1;
                if pending == BATCH {
                    ctl.add(BATCH * PAGE_BYTES);
                    pending = 0;
                    if ctl.stopped() {
                        return None;
                    }
                }
            }
            ctl.add(pending * PAGE_BYTES);
            None
        },
    );
    (elapsed, first_mismatch(results, region, name))
}

// ---------------------------------------------------------------------------------------
// Workloads

/// Settings shared by the workloads.
#[derive(Clone, Copy)]
pub struct Params<'a> {
    /// The data pages hold.
    pub pattern: &'a Pattern,
    /// Seed of the random choices (the pattern has its own).
    pub seed: u64,
    /// Worker threads.
    pub threads: usize,
    /// How long the timed part runs (pmbench, combined; swap-w-rand when given).
    pub duration: Option<Duration>,
    /// pmbench: percent of accesses that are reads.
    pub read_pct: u8,
    /// combined: background random writers.
    pub bg_threads: usize,
}

/// Default duration of the timed workloads.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// Where the measured part of a workload starts and ends (to snapshot counters there),
/// and when its data is first in place (where a test hook may corrupt it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Every page holds data a later phase checks: after the populate, or after
    /// swap-w-seq's first pass.
    Written,
    /// Just before the first measured phase.
    Start,
    /// Just after the last measured phase.
    End,
}

/// Time of one phase.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PhaseTime {
    /// Phase name (`populate`, `write 1`, `verify`, ...).
    pub name: String,
    /// Seconds.
    pub seconds: f64,
    /// Whether it counts in `elapsed_s`.
    pub measured: bool,
}

/// What a workload did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every phase in order.
    pub phases: Vec<PhaseTime>,
    /// Time of the measured phases.
    pub measured: Duration,
    /// Bytes written or read in the measured phases (throughput workloads).
    pub bytes: Option<u64>,
    /// Accesses in the measured phases (pmbench: words; combined: pages of the sequential part).
    pub accesses: Option<u64>,
    /// Per-access latency in ns (pmbench, combined's sequential part).
    pub latency: Option<Histogram<u64>>,
    /// combined: background page writes.
    pub bg_accesses: Option<u64>,
    /// The first data mismatch, if any.
    pub mismatch: Option<Box<Mismatch>>,
}

impl Outcome {
    fn record(&mut self, name: &str, d: Duration, measured: bool) {
        self.phases.push(PhaseTime {
            name: name.to_string(),
            seconds: d.as_secs_f64(),
            measured,
        });
        if measured {
            self.measured += d;
        }
    }

    /// Run a sequential phase, record it, keep its mismatch; false when it failed.
    fn seq(
        &mut self,
        ui: &Ui,
        (name, region): (&str, &str),
        words: &[AtomicU64],
        threads: usize,
        measured: bool,
        op: impl Fn(u64) -> Result<(), Box<Mismatch>> + Sync,
    ) -> bool {
        let (d, m) = seq_phase(ui, name, region, words, threads, op);
        self.record(name, d, measured);
        if m.is_some() {
            self.mismatch = m;
            return false;
        }
        true
    }

    fn populate(&mut self, ui: &Ui, name: &str, words: &[AtomicU64], p: &Params) {
        self.seq(ui, (name, ""), words, p.threads, false, |page| {
            write_page(words, p.pattern, page, POPULATE_VERSION);
            Ok(())
        });
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 1 hour at 3 significant digits; these bounds are valid, so this cannot fail.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).unwrap_or_else(|_| unreachable!())
}

/// vm-scalability swap-w-seq: every thread writes its contiguous slice, twice, the second
/// pass with another pattern, checking each word the first pass wrote before overwriting
/// it; then everything must read back as the second pass wrote it.
pub fn swap_w_seq(words: &[AtomicU64], p: &Params, ui: &Ui, mark: &mut dyn FnMut(Mark)) -> Outcome {
    let mut out = Outcome::default();
    mark(Mark::Start);
    let ok = out.seq(ui, ("write 1", "main"), words, p.threads, true, |page| {
        write_page(words, p.pattern, page, 1);
        Ok(())
    });
    mark(Mark::Written);
    if ok {
        out.seq(ui, ("write 2", "main"), words, p.threads, true, |page| {
            rewrite_page(words, p.pattern, page, 1, 2)
        });
    }
    mark(Mark::End);
    if out.mismatch.is_some() {
        return out;
    }
    out.bytes = Some(2 * page_count(words) * PAGE_BYTES);
    out.seq(ui, ("verify", "main"), words, p.threads, false, |page| {
        check_page(words, p.pattern, page, Expect::Page(2))
    });
    out
}

/// Per-thread page versions of a random workload: `versions[page % n][page / n]`.
struct Owned(Vec<Vec<u32>>);

impl Owned {
    fn version(&self, page: u64) -> u32 {
        let n = self.0.len() as u64;
        self.0[(page % n) as usize][(page / n) as usize]
    }
}

/// Random 4 KiB page writes by `threads` threads over their own pages of `words` (region
/// `region`) until `len` is done, each page checked before it is overwritten; the first
/// wrong page stops them all.
fn random_writes(
    ui: &Ui,
    (name, region): (&str, &str),
    words: &[AtomicU64],
    p: &Params,
    len: Len,
    stream_base: u64,
) -> RandomWrites {
    let (threads, seed, pat) = (p.threads, p.seed, p.pattern);
    let pages = page_count(words);
    let (results, elapsed) = run_phase(ui, name, len, threads, |t, ctl| {
        let n = owned_count(pages, threads, t);
        let mut versions = vec![POPULATE_VERSION; n as usize];
        if n == 0 {
            return (versions, 0u64, None);
        }
        let mut rng = Rng::new(seed, stream_base + t as u64);
        let target = if matches!(len, Len::Bytes(_)) {
            n
        } else {
            u64::MAX
        };
        let mut writes = 0u64;
        while writes < target && !ctl.stopped() {
            let k = Rng::scale(rng.next_u64(), n);
            let page = t as u64 + k * threads as u64;
            let v = &mut versions[k as usize];
            if let Err(m) = rewrite_page(words, pat, page, *v, v.wrapping_add(1)) {
                ctl.stop();
                return (versions, writes, Some(m));
            }
            *v = v.wrapping_add(1);
            writes += 1;
            if writes & 63 == 0 {
                ctl.add(64 * PAGE_BYTES);
            }
        }
        (versions, writes, None)
    });
    let writes = results.iter().map(|(_, w, _)| w).sum();
    let mut owned = Vec::new();
    let mut mismatches = Vec::new();
    for (v, _, m) in results {
        owned.push(v);
        mismatches.push(m);
    }
    RandomWrites {
        owned: Owned(owned),
        writes,
        elapsed,
        mismatch: first_mismatch(mismatches, region, name),
    }
}

/// What [`random_writes`] did.
struct RandomWrites {
    owned: Owned,
    writes: u64,
    elapsed: Duration,
    /// A page that did not hold what was last written there when it was rewritten.
    mismatch: Option<Box<Mismatch>>,
}

/// vm-scalability swap-w-rand: populate, then random 4 KiB page writes (as many as the
/// region has pages, or for `duration` when given), then verify every page.
pub fn swap_w_rand(
    words: &[AtomicU64],
    p: &Params,
    ui: &Ui,
    mark: &mut dyn FnMut(Mark),
) -> Outcome {
    let mut out = Outcome::default();
    out.populate(ui, "populate", words, p);
    let pages = page_count(words);
    let len = p.duration.map_or(Len::Bytes(pages * PAGE_BYTES), Len::Time);
    mark(Mark::Written);
    mark(Mark::Start);
    let name = "random write";
    let w = random_writes(ui, (name, "main"), words, p, len, 0);
    out.record(name, w.elapsed, true);
    mark(Mark::End);
    out.bytes = Some(w.writes * PAGE_BYTES);
    out.accesses = Some(w.writes);
    out.mismatch = w.mismatch;
    if out.mismatch.is_none() {
        let owned = w.owned;
        out.seq(ui, ("verify", "main"), words, p.threads, false, |page| {
            check_page(words, p.pattern, page, Expect::Page(owned.version(page)))
        });
    }
    out
}

/// pmbench: populate, then uniform random accesses to one word of a 4 KiB page for the
/// duration, `read_pct` % reads (checked against the page's current version), the rest
/// writes (which bump the touched word's version, checking the old value as they swap it
/// in); per-access latency in a histogram; then verify every page. The words other than
/// the touched one are never overwritten, so the final pass checks them as swapped in.
pub fn pmbench(words: &[AtomicU64], p: &Params, ui: &Ui, mark: &mut dyn FnMut(Mark)) -> Outcome {
    let mut out = Outcome::default();
    out.populate(ui, "populate", words, p);
    let pages = page_count(words);
    let threads = p.threads;
    let duration = p.duration.unwrap_or(DEFAULT_DURATION);
    mark(Mark::Written);
    mark(Mark::Start);
    let (results, d) = run_phase(ui, "pmbench", Len::Time(duration), threads, |t, ctl| {
        let n = owned_count(pages, threads, t);
        let mut versions = vec![POPULATE_VERSION; n as usize];
        let mut hist = new_histogram();
        let mut accesses = 0u64;
        if n == 0 {
            return (versions, hist, accesses, None);
        }
        let mut rng = Rng::new(p.seed, 1000 + t as u64);
        while !ctl.stopped() {
            let r = rng.next_u64();
            let k = Rng::scale(r, n);
            let page = t as u64 + k * threads as u64;
            let read = rng.next_u64() % 100 < u64::from(p.read_pct);
            let v = &mut versions[k as usize];
            let tw = touched_word(page);
            let w = if read { (r & 511) as usize } else { tw };
            let x = &words[page as usize * PAGE_WORDS + w];
            let version = if w == tw { *v } else { POPULATE_VERSION };
            let want = if w == tw {
                p.pattern.touched(page, *v, w)
            } else {
                p.pattern.page(page, POPULATE_VERSION).word(w)
            };
            let t0 = Instant::now();
            let found = if read {
                x.load(Relaxed)
            } else {
                // The write returns what it overwrote: checked like a read.
                x.swap(p.pattern.touched(page, v.wrapping_add(1), tw), Relaxed)
            };
            hist.saturating_record(t0.elapsed().as_nanos() as u64);
            if found != want {
                ctl.stop();
                let m = Mismatch {
                    region: String::new(),
                    phase: String::new(),
                    page,
                    word: w,
                    offset: page * PAGE_BYTES + w as u64 * 8,
                    expected: want,
                    found,
                    expected_version: version,
                };
                return (versions, hist, accesses, Some(Box::new(m)));
            }
            if !read {
                *v = v.wrapping_add(1);
            }
            accesses += 1;
        }
        (versions, hist, accesses, None)
    });
    out.record("pmbench", d, true);
    mark(Mark::End);
    let mut hist = new_histogram();
    let mut total = 0;
    let mut owned = Vec::new();
    let mut mismatches = Vec::new();
    for (versions, h, a, m) in results {
        // Same bounds on both sides: adding cannot fail.
        let _ = hist.add(&h);
        total += a;
        owned.push(versions);
        mismatches.push(m);
    }
    out.accesses = Some(total);
    out.latency = Some(hist);
    out.mismatch = first_mismatch(mismatches, "main", "pmbench");
    if out.mismatch.is_none() {
        let owned = Owned(owned);
        out.seq(ui, ("verify", "main"), words, threads, false, |page| {
            check_page(words, p.pattern, page, Expect::Touched(owned.version(page)))
        });
    }
    out
}

/// Sequential re-read: populate, then read the region twice, checking every word.
pub fn seq_read(words: &[AtomicU64], p: &Params, ui: &Ui, mark: &mut dyn FnMut(Mark)) -> Outcome {
    let mut out = Outcome::default();
    out.populate(ui, "populate", words, p);
    mark(Mark::Written);
    mark(Mark::Start);
    for name in ["read 1", "read 2"] {
        let ok = out.seq(ui, (name, "main"), words, p.threads, true, |page| {
            check_page(words, p.pattern, page, Expect::Page(POPULATE_VERSION))
        });
        if !ok {
            break;
        }
    }
    mark(Mark::End);
    out.bytes = Some(2 * page_count(words) * PAGE_BYTES);
    out
}

/// What one thread of `combined` did.
enum CombinedWorker {
    Seq {
        slice: Range<u64>,
        version: u32,
        pos: u64,
        hist: Histogram<u64>,
        mismatch: Option<Box<Mismatch>>,
    },
    Bg {
        versions: Vec<u32>,
        writes: u64,
        mismatch: Option<Box<Mismatch>>,
    },
}

/// Seed 004's test: `threads` threads read-verify then rewrite each page of their slice of
/// `seq` in order, pass after pass (every page with the next version), while `bg_threads`
/// threads rewrite random pages of `bg` (checking each before overwriting it); for the
/// duration. Then verify both regions.
pub fn combined(
    seq: &[AtomicU64],
    bg: Option<&[AtomicU64]>,
    p: &Params,
    ui: &Ui,
    mark: &mut dyn FnMut(Mark),
) -> Outcome {
    let mut out = Outcome::default();
    out.populate(ui, "populate seq", seq, p);
    let bg_threads = if bg.is_some() { p.bg_threads } else { 0 };
    let bg = bg.unwrap_or(&[]);
    if bg_threads > 0 {
        out.populate(ui, "populate bg", bg, p);
    }
    let (seq_pages, bg_pages) = (page_count(seq), page_count(bg));
    let threads = p.threads;
    let duration = p.duration.unwrap_or(DEFAULT_DURATION);
    mark(Mark::Written);
    mark(Mark::Start);
    let (results, d) = run_phase(
        ui,
        "combined",
        Len::Time(duration),
        threads + bg_threads,
        |t, ctl| {
            if t >= threads {
                let b = t - threads;
                let n = owned_count(bg_pages, bg_threads, b);
                let mut versions = vec![POPULATE_VERSION; n as usize];
                let mut writes = 0;
                let mut rng = Rng::new(p.seed, 2000 + b as u64);
                let mut mismatch = None;
                while n > 0 && !ctl.stopped() {
                    let k = Rng::scale(rng.next_u64(), n);
                    let page = b as u64 + k * bg_threads as u64;
                    let v = &mut versions[k as usize];
                    if let Err(m) = rewrite_page(bg, p.pattern, page, *v, v.wrapping_add(1)) {
                        ctl.stop();
                        mismatch = Some(m);
                        break;
                    }
                    *v = v.wrapping_add(1);
                    writes += 1;
                }
                return CombinedWorker::Bg {
                    versions,
                    writes,
                    mismatch,
                };
            }
            let slice = slice_of(seq_pages, threads, t);
            let mut hist = new_histogram();
            let mut version = POPULATE_VERSION;
            if slice.is_empty() {
                return CombinedWorker::Seq {
                    slice,
                    version,
                    pos: 0,
                    hist,
                    mismatch: None,
                };
            }
            loop {
                for (i, page) in slice.clone().enumerate() {
                    if ctl.stopped() {
                        return CombinedWorker::Seq {
                            slice,
                            version,
                            pos: i as u64,
                            hist,
                            mismatch: None,
                        };
                    }
                    let t0 = Instant::now();
                    if let Err(m) = check_page(seq, p.pattern, page, Expect::Page(version)) {
                        ctl.stop();
                        return CombinedWorker::Seq {
                            slice,
                            version,
                            pos: i as u64,
                            hist,
                            mismatch: Some(m),
                        };
                    }
                    write_page(seq, p.pattern, page, version.wrapping_add(1));
                    hist.saturating_record(t0.elapsed().as_nanos() as u64);
                    ctl.add(PAGE_BYTES);
                }
                version = version.wrapping_add(1);
            }
        },
    );
    out.record("combined", d, true);
    mark(Mark::End);

    let mut hist = new_histogram();
    let mut seq_state = Vec::new();
    let mut bg_owned = Vec::new();
    let mut bg_writes = 0;
    let mut mismatches = Vec::new();
    let mut bg_mismatches = Vec::new();
    for r in results {
        match r {
            CombinedWorker::Seq {
                slice,
                version,
                pos,
                hist: h,
                mismatch,
            } => {
                let _ = hist.add(&h);
                mismatches.push(mismatch);
                seq_state.push((slice, version, pos));
            }
            CombinedWorker::Bg {
                versions,
                writes,
                mismatch,
            } => {
                bg_owned.push(versions);
                bg_writes += writes;
                bg_mismatches.push(mismatch);
            }
        }
    }
    let pages_done = hist.len();
    out.bytes = Some(pages_done * PAGE_BYTES);
    out.accesses = Some(pages_done);
    out.latency = Some(hist);
    out.bg_accesses = Some(bg_writes);
    out.mismatch = first_mismatch(mismatches, "seq", "combined")
        .or_else(|| first_mismatch(bg_mismatches, "bg", "combined"));
    if out.mismatch.is_some() {
        return out;
    }
    // Pages before a thread's stop position hold version + 1, the rest version.
    let seq_version = |page: u64| {
        let i = seq_state.partition_point(|(s, _, _)| s.end <= page);
        let (s, v, pos) = &seq_state[i];
        if page - s.start < *pos {
            v.wrapping_add(1)
        } else {
            *v
        }
    };
    let ok = out.seq(ui, ("verify seq", "seq"), seq, threads, false, |page| {
        check_page(seq, p.pattern, page, Expect::Page(seq_version(page)))
    });
    if ok && bg_threads > 0 {
        let owned = Owned(bg_owned);
        out.seq(ui, ("verify bg", "bg"), bg, threads, false, |page| {
            check_page(bg, p.pattern, page, Expect::Page(owned.version(page)))
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataKind;

    fn words(pages: usize) -> Vec<AtomicU64> {
        (0..pages * PAGE_WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    fn params(pattern: &Pattern, threads: usize) -> Params<'_> {
        Params {
            pattern,
            seed: 42,
            threads,
            duration: Some(Duration::from_millis(100)),
            read_pct: 80,
            bg_threads: 1,
        }
    }

    fn patterns() -> Vec<Pattern> {
        DataKind::ALL.map(|k| Pattern::new(k, 9)).into()
    }

    #[test]
    fn write_then_check_round_trips_and_catches_each_kind_of_error() {
        assert!(touched_word(123) < PAGE_WORDS);
        for pat in patterns() {
            let kind = pat.kind();
            let w = words(4);
            for page in 0..4 {
                write_page(&w, &pat, page, 3);
            }
            for page in 0..4 {
                assert!(check_page(&w, &pat, page, Expect::Page(3)).is_ok());
            }
            if kind != DataKind::Zeros {
                // Another version or another seed: the stamp (word 0) differs.
                let m = check_page(&w, &pat, 2, Expect::Page(4)).unwrap_err();
                assert_eq!((m.page, m.word, m.expected_version), (2, 0, 4), "{kind}");
                let other = Pattern::new(kind, 8);
                assert!(
                    (0..4).any(|page| check_page(&w, &other, page, Expect::Page(3)).is_err()),
                    "{kind}: other seed"
                );
                // A page never written is caught, unless its data is a zero page.
                let z = words(8);
                for page in 0..8 {
                    let zero = (0..PAGE_WORDS).all(|i| pat.page(page, 1).word(i) == 0);
                    assert_eq!(
                        check_page(&z, &pat, page, Expect::Page(1)).is_err(),
                        !zero,
                        "{kind}: page {page}"
                    );
                }
            }
            // pmbench's touched word.
            write_page(&w, &pat, 1, POPULATE_VERSION);
            let tw = touched_word(1);
            w[PAGE_WORDS + tw].store(pat.touched(1, 5, tw), Relaxed);
            assert!(check_page(&w, &pat, 1, Expect::Touched(5)).is_ok());
            if kind != DataKind::Zeros {
                let m = check_page(&w, &pat, 1, Expect::Touched(4)).unwrap_err();
                assert_eq!(m.word, tw);
                assert_eq!(m.offset, PAGE_BYTES + tw as u64 * 8);
            }
            // Any changed word is caught, in every kind.
            w[2 * PAGE_WORDS + 300].fetch_xor(1 << 40, Relaxed);
            let m = check_page(&w, &pat, 2, Expect::Page(3)).unwrap_err();
            assert_eq!((m.word, m.found ^ m.expected), (300, 1 << 40), "{kind}");
        }
    }

    #[test]
    fn slices_and_ownership_cover_every_page_once() {
        for (pages, threads) in [(10u64, 3usize), (1, 4), (512, 2), (7, 7), (0, 2)] {
            let covered: u64 = (0..threads)
                .map(|t| slice_of(pages, threads, t))
                .map(|r| r.end - r.start)
                .sum();
            assert_eq!(covered, pages);
            let owned: u64 = (0..threads).map(|t| owned_count(pages, threads, t)).sum();
            assert_eq!(owned, pages);
        }
    }

    #[test]
    fn workloads_verify_ok_on_ordinary_memory() {
        let ui = Ui::new(false);
        for pat in patterns() {
            for threads in [1, 3] {
                let kind = pat.kind();
                let w = words(300);
                let p = params(&pat, threads);
                let mut marks = Vec::new();
                let out = swap_w_seq(&w, &p, &ui, &mut |m| marks.push(m));
                assert!(out.mismatch.is_none(), "{kind}: {:?}", out.mismatch);
                assert_eq!(marks, [Mark::Start, Mark::Written, Mark::End]);
                assert_eq!(out.bytes, Some(2 * 300 * PAGE_BYTES));
                let p = Params {
                    duration: None,
                    ..p
                };
                let out = swap_w_rand(&w, &p, &ui, &mut |_| {});
                assert!(out.mismatch.is_none(), "{kind}: {:?}", out.mismatch);
                assert!(seq_read(&w, &p, &ui, &mut |_| {}).mismatch.is_none());
                let p = params(&pat, threads);
                let out = pmbench(&w, &p, &ui, &mut |_| {});
                assert!(out.mismatch.is_none(), "{kind}: {:?}", out.mismatch);
                assert!(out.accesses.unwrap() > 0);
                let bg = words(100);
                let out = combined(
                    &w,
                    Some(&bg),
                    &Params { bg_threads: 2, ..p },
                    &ui,
                    &mut |_| {},
                );
                assert!(out.mismatch.is_none(), "{kind}: {:?}", out.mismatch);
                assert!(out.accesses.unwrap() > 0 && out.bg_accesses.unwrap() > 0);
            }
        }
    }

    /// Data that comes back wrong is caught by the access that brings it back, in every
    /// workload, before anything overwrites it (swap-w-seq's second pass, swap-w-rand's
    /// and combined's background writes, pmbench's writes overwrote it unchecked, and
    /// the final verification then passed).
    #[test]
    fn wrong_data_is_caught_where_it_comes_back_not_overwritten() {
        for pat in patterns() {
            let ui = Ui::new(false);
            let p = Params {
                read_pct: 0,
                ..params(&pat, 2)
            };
            let flip = |region: &[AtomicU64], page: u64, word: usize| {
                region[page as usize * PAGE_WORDS + word].fetch_xor(1 << 20, Relaxed);
            };
            let caught = |out: Outcome, region: &str, phase: &str, word: usize| {
                let m = out
                    .mismatch
                    .unwrap_or_else(|| panic!("{}: {phase}: not caught", pat.kind()));
                assert_eq!(
                    (m.region.as_str(), m.phase.as_str(), m.page, m.word),
                    (region, phase, 3, word),
                    "{m}"
                );
            };
            let w = words(64);
            let at_written = |word: usize| {
                let w = &w;
                move |m: Mark| {
                    if m == Mark::Written {
                        flip(w, 3, word)
                    }
                }
            };
            caught(
                swap_w_seq(&w, &p, &ui, &mut at_written(5)),
                "main",
                "write 2",
                5,
            );
            caught(
                swap_w_rand(&w, &p, &ui, &mut at_written(5)),
                "main",
                "random write",
                5,
            );
            caught(
                seq_read(&w, &p, &ui, &mut at_written(5)),
                "main",
                "read 1",
                5,
            );
            // pmbench writes one word of a page: the touched word.
            let tw = touched_word(3);
            caught(
                pmbench(&w, &p, &ui, &mut at_written(tw)),
                "main",
                "pmbench",
                tw,
            );
            let bg = words(16);
            let out = combined(&w, Some(&bg), &p, &ui, &mut |m| {
                if m == Mark::Written {
                    flip(&bg, 3, 5)
                }
            });
            caught(out, "bg", "combined", 5);
            caught(
                combined(&w, None, &p, &ui, &mut at_written(5)),
                "seq",
                "combined",
                5,
            );
        }
    }

    /// A page checked as it is rewritten: the right data passes and is replaced; the
    /// first wrong word is reported with the version expected there.
    #[test]
    fn rewrite_page_checks_then_writes() {
        for pat in patterns() {
            let kind = pat.kind();
            let w = words(2);
            write_page(&w, &pat, 1, 4);
            assert!(rewrite_page(&w, &pat, 1, 4, 5).is_ok());
            assert!(check_page(&w, &pat, 1, Expect::Page(5)).is_ok());
            if kind != DataKind::Zeros {
                let m = rewrite_page(&w, &pat, 1, 4, 6).unwrap_err();
                assert_eq!((m.page, m.word, m.expected_version), (1, 0, 4), "{kind}");
            }
            write_page(&w, &pat, 1, 4);
            w[PAGE_WORDS + 300].fetch_xor(1, Relaxed);
            let m = rewrite_page(&w, &pat, 1, 4, 5).unwrap_err();
            assert_eq!((m.word, m.offset), (300, PAGE_BYTES + 300 * 8), "{kind}");
            assert_eq!(m.found ^ m.expected, 1);
        }
    }

    #[test]
    fn time_phase_stops_on_time() {
        let ui = Ui::new(false);
        let (r, d) = run_phase(
            &ui,
            "t",
            Len::Time(Duration::from_millis(120)),
            2,
            |_, ctl| {
                let mut n = 0u64;
                while !ctl.stopped() {
                    n += 1;
                    std::thread::yield_now();
                }
                n
            },
        );
        assert_eq!(r.len(), 2);
        assert!(
            d >= Duration::from_millis(120) && d < Duration::from_secs(5),
            "{d:?}"
        );
    }
}
