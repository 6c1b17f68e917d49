//! The memory a benchmark runs on: uswap regions from one pool, or ordinary anonymous
//! mappings (the kernel-swap side of a comparison). Both are seen as `&[AtomicU64]`, so
//! the workload code is the same. Also the counters of each kind and the process figures
//! (peak RSS, faults).

use serde::Serialize;
use std::io;
use std::sync::atomic::AtomicU64;

/// 2 MiB: plain mappings are aligned and sized to this, like uswap's units.
const UNIT: usize = uswap::UNIT_SIZE;

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// What uswap says when its swap is on zram.
pub fn zram_note(dev: &str) -> String {
    format!(
        "uswap: note: the swap is on {dev}, compressed RAM: what is swapped out still takes \
         memory, compressed"
    )
}

/// An ordinary private anonymous mapping, 2 MiB aligned, unmapped on drop.
pub struct PlainMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl PlainMap {
    /// Map `len` bytes (rounded up to 2 MiB); with `huge`, advise MADV_HUGEPAGE.
    pub fn new(len: usize, huge: bool) -> io::Result<PlainMap> {
        let len = round_up(len.max(1), UNIT);
        let map_len = len
            .checked_add(UNIT)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
        // SAFETY: a new private anonymous mapping with no address hint: the kernel picks a
        // free range, nothing existing is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let addr = raw as usize;
        let aligned = round_up(addr, UNIT);
        let head = aligned - addr;
        let tail = map_len - head - len;
        // SAFETY: both ranges lie inside the mapping made just above, which nothing else
        // refers to, and outside the part kept: [aligned, aligned + len).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        let map = PlainMap {
            ptr: aligned as *mut libc::c_void,
            len,
        };
        if huge {
            // SAFETY: advice on our own mapping, which stays mapped.
            let rc = unsafe { libc::madvise(map.ptr, len, libc::MADV_HUGEPAGE) };
            if rc != 0 {
                eprintln!(
                    "uswap: warning: madvise(MADV_HUGEPAGE) failed ({}); plain memory runs without THP",
                    io::Error::last_os_error()
                );
            }
        }
        Ok(map)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The mapping as 64-bit words any thread may read and write.
    pub fn as_words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is 2 MiB aligned (so aligned for u64) and `len` bytes from it are
        // mapped readable and writable for as long as `self` lives, which bounds the
        // returned borrow. AtomicU64 has u64's layout, every bit pattern is a valid value,
        // and all access goes through atomics, so sharing between threads is sound.
        unsafe { std::slice::from_raw_parts(self.ptr as *const AtomicU64, self.len / 8) }
    }
}

impl Drop for PlainMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range this value owns; no borrow of it outlives self.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// The memory of one benchmark run: one or more regions (combined uses two).
pub enum Memory {
    /// uswap regions of one pool (fields drop in order: the regions before their pool).
    Uswap {
        /// The regions.
        regions: Vec<uswap::Region>,
        /// Their pool.
        pool: uswap::Pool,
    },
    /// Ordinary anonymous memory, paged (if at all) by the kernel.
    Plain(Vec<PlainMap>),
}

impl Memory {
    /// A pool from `builder`, and one region of each size.
    pub fn uswap(builder: uswap::PoolBuilder, sizes: &[u64]) -> uswap::Result<Memory> {
        let pool = builder.build()?;
        if let Some(z) = pool.swap_zram() {
            eprintln!("{}", zram_note(&z));
        }
        let regions = sizes
            .iter()
            .map(|&s| pool.region(s))
            .collect::<uswap::Result<Vec<_>>>()?;
        Ok(Memory::Uswap { regions, pool })
    }

    /// Plain mappings of each size; `huge` advises MADV_HUGEPAGE.
    pub fn plain(sizes: &[u64], huge: bool) -> uswap::Result<Memory> {
        let maps = sizes
            .iter()
            .map(|&s| {
                let len = usize::try_from(s).map_err(|_| uswap::Error::InvalidRegionSize {
                    size: s,
                    reason: "larger than the address space".into(),
                })?;
                PlainMap::new(len, huge).map_err(|source| uswap::Error::Sys { op: "mmap", source })
            })
            .collect::<uswap::Result<Vec<_>>>()?;
        Ok(Memory::Plain(maps))
    }

    /// uswap: where the swap is; plain memory: None.
    pub fn swap_place(&self) -> Option<String> {
        match self {
            Memory::Uswap { pool, .. } => Some(pool.swap_place()),
            Memory::Plain(_) => None,
        }
    }

    /// `uswap` or `plain`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Memory::Uswap { .. } => "uswap",
            Memory::Plain(_) => "plain",
        }
    }

    /// Region `i` as words.
    pub fn words(&self, i: usize) -> &[AtomicU64] {
        match self {
            Memory::Uswap { regions, .. } => regions[i].as_words(),
            Memory::Plain(maps) => maps[i].as_words(),
        }
    }

    /// Region `i`'s length in bytes.
    pub fn len(&self, i: usize) -> u64 {
        match self {
            Memory::Uswap { regions, .. } => regions[i].len() as u64,
            Memory::Plain(maps) => maps[i].len() as u64,
        }
    }

    /// The counters now: uswap's (pool total and per region), or the kernel's.
    pub fn snapshot(&self) -> Snapshot {
        match self {
            Memory::Uswap { regions, pool } => Snapshot::Uswap {
                total: Box::new(pool.counters()),
                regions: regions.iter().map(|r| r.counters()).collect(),
            },
            Memory::Plain(_) => Snapshot::Kernel(KernelCounters::read()),
        }
    }
}

/// The kernel's swap counters (/proc/vmstat, system-wide) and this process's faults
/// (/proc/self/stat), under the names uswap uses.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct KernelCounters {
    /// Pages swapped in.
    pub pswpin: u64,
    /// Pages swapped out.
    pub pswpout: u64,
    /// Pages read ahead.
    pub swap_ra: u64,
    /// Read-ahead pages that were used.
    pub swap_ra_hit: u64,
    /// THPs swapped out whole.
    pub thp_swpout: u64,
    /// THPs split to be swapped out.
    pub thp_swpout_fallback: u64,
    /// This process's major faults.
    pub majflt: u64,
    /// This process's minor faults.
    pub minflt: u64,
}

impl KernelCounters {
    /// Read them now; a counter the kernel does not have reads 0.
    pub fn read() -> KernelCounters {
        let mut c = KernelCounters::default();
        if let Ok(text) = std::fs::read_to_string("/proc/vmstat") {
            for line in text.lines() {
                let mut it = line.split_whitespace();
                let (Some(k), Some(v)) = (it.next(), it.next()) else {
                    continue;
                };
                let v = v.parse().unwrap_or(0);
                match k {
                    "pswpin" => c.pswpin = v,
                    "pswpout" => c.pswpout = v,
                    "swap_ra" => c.swap_ra = v,
                    "swap_ra_hit" => c.swap_ra_hit = v,
                    "thp_swpout" => c.thp_swpout = v,
                    "thp_swpout_fallback" => c.thp_swpout_fallback = v,
                    _ => {}
                }
            }
        }
        if let Some((minflt, majflt)) = self_faults() {
            c.minflt = minflt;
            c.majflt = majflt;
        }
        c
    }

    fn since(&self, e: &KernelCounters) -> KernelCounters {
        KernelCounters {
            pswpin: self.pswpin.saturating_sub(e.pswpin),
            pswpout: self.pswpout.saturating_sub(e.pswpout),
            swap_ra: self.swap_ra.saturating_sub(e.swap_ra),
            swap_ra_hit: self.swap_ra_hit.saturating_sub(e.swap_ra_hit),
            thp_swpout: self.thp_swpout.saturating_sub(e.thp_swpout),
            thp_swpout_fallback: self
                .thp_swpout_fallback
                .saturating_sub(e.thp_swpout_fallback),
            majflt: self.majflt.saturating_sub(e.majflt),
            minflt: self.minflt.saturating_sub(e.minflt),
        }
    }
}

/// (minflt, majflt) of this process from /proc/self/stat (fields 10 and 12).
fn self_faults() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: the fields that follow start after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): field n is f[n - 3].
    Some((f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?))
}

/// Counters at one moment, of either kind.
#[derive(Debug, Clone)]
pub enum Snapshot {
    /// uswap: pool totals and each region's own.
    Uswap {
        /// Pool totals with the pool's gauges.
        total: Box<uswap::Counters>,
        /// Per region, in creation order.
        regions: Vec<uswap::Counters>,
    },
    /// Kernel swap (plain memory).
    Kernel(KernelCounters),
}

impl Snapshot {
    /// Events since `earlier` (gauges as of now).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        match (self, earlier) {
            (
                Snapshot::Uswap { total, regions },
                Snapshot::Uswap {
                    total: t0,
                    regions: r0,
                },
            ) => Snapshot::Uswap {
                total: Box::new(total.since(t0)),
                regions: regions.iter().zip(r0).map(|(a, b)| a.since(b)).collect(),
            },
            (Snapshot::Kernel(a), Snapshot::Kernel(b)) => Snapshot::Kernel(a.since(b)),
            _ => self.clone(),
        }
    }

    /// The totals as a JSON object (counter name → value).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Snapshot::Uswap { total, .. } => serde_json::to_value(total),
            Snapshot::Kernel(k) => serde_json::to_value(k),
        }
        .unwrap_or(serde_json::Value::Null)
    }

    /// Region `i`'s counters as JSON (uswap only).
    pub fn region_json(&self, i: usize) -> Option<serde_json::Value> {
        match self {
            Snapshot::Uswap { regions, .. } => {
                regions.get(i).and_then(|c| serde_json::to_value(c).ok())
            }
            Snapshot::Kernel(_) => None,
        }
    }

    /// uswap's pool totals (None for kernel swap).
    pub fn uswap_total(&self) -> Option<&uswap::Counters> {
        match self {
            Snapshot::Uswap { total, .. } => Some(total),
            Snapshot::Kernel(_) => None,
        }
    }

    /// Pages swapped in and out (4 KiB units).
    pub fn swapped(&self) -> (u64, u64) {
        match self {
            Snapshot::Uswap { total, .. } => (total.pswpin, total.pswpout),
            Snapshot::Kernel(k) => (k.pswpin, k.pswpout),
        }
    }

    /// Readahead hit rate in percent (None when nothing was read ahead).
    pub fn ra_hit_pct(&self) -> Option<f64> {
        let (ra, hit) = match self {
            Snapshot::Uswap { total, .. } => (total.swap_ra, total.swap_ra_hit),
            Snapshot::Kernel(k) => (k.swap_ra, k.swap_ra_hit),
        };
        (ra > 0).then(|| 100.0 * hit as f64 / ra as f64)
    }

    /// Region `i`'s readahead hit rate in percent (uswap only; None when nothing was read ahead).
    pub fn region_ra_hit_pct(&self, i: usize) -> Option<f64> {
        match self {
            Snapshot::Uswap { regions, .. } => regions
                .get(i)
                .filter(|c| c.swap_ra > 0)
                .map(|c| c.ra_hit_pct()),
            Snapshot::Kernel(_) => None,
        }
    }
}

/// Peak resident set of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataKind, Pattern};
    use crate::workloads::{check_page, write_page, Expect, PAGE_WORDS};
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn plain_map_is_aligned_zeroed_and_usable() {
        let m = PlainMap::new(3 << 20, true).unwrap();
        assert_eq!(m.len(), 4 << 20);
        assert_eq!(m.ptr as usize % UNIT, 0);
        let w = m.as_words();
        assert_eq!(w.len(), (4 << 20) / 8);
        assert!(w.iter().step_by(512).all(|x| x.load(Relaxed) == 0));
        w[w.len() - 1].store(5, Relaxed);
        assert_eq!(w[w.len() - 1].load(Relaxed), 5);
    }

    #[test]
    fn verifier_reports_a_corrupted_word_in_plain_memory() {
        let mem = Memory::plain(&[2 << 20], false).unwrap();
        let words = mem.words(0);
        let pages = (words.len() / PAGE_WORDS) as u64;
        let pat = Pattern::new(DataKind::Mixed, 77);
        for page in 0..pages {
            write_page(words, &pat, page, 1);
        }
        let (page, word) = (300u64, 17usize);
        let x = &words[page as usize * PAGE_WORDS + word];
        let good = x.load(Relaxed);
        x.store(good ^ 1, Relaxed);
        let bad: Vec<_> = (0..pages)
            .filter_map(|p| check_page(words, &pat, p, Expect::Page(1)).err())
            .collect();
        assert_eq!(bad.len(), 1);
        assert_eq!((bad[0].page, bad[0].word), (page, word));
        assert_eq!(bad[0].offset, page * 4096 + word as u64 * 8);
        assert_eq!((bad[0].expected, bad[0].found), (good, good ^ 1));
    }

    #[test]
    fn process_figures_read() {
        assert!(peak_rss_bytes().unwrap() > 0);
        let (minflt, _) = self_faults().unwrap();
        assert!(minflt > 0);
        let k = KernelCounters::read();
        assert_eq!(k.since(&k).pswpout, 0);
    }
}
