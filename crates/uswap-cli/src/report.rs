//! The result of one benchmark run: a JSON object (`--json`, the last line of stdout) and
//! a short table for humans. MB are 10^6 bytes; latencies are microseconds.

#![allow(non_snake_case)] // the JSON keys `throughput_MBps`, `swapin_MBps`, ... are a contract

use crate::workloads::{Mismatch, PhaseTime};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One run's figures. Fields that do not apply to the workload are `null`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// Workload name (`swap-w-seq`, `swap-w-rand`, `pmbench`, `seq-read`, `combined`).
    pub workload: String,
    /// `uswap` or `plain`.
    pub memory: String,
    /// What the workload wrote (`--data`): `zeros`, `text`, `random` or `mixed`.
    #[serde(default)]
    pub data: String,
    /// uswap: where swapped pages went (`file`, `compressed`, `compressed+file`); null
    /// for plain memory.
    #[serde(default)]
    pub tier: Option<String>,
    /// With the compressed tier: its compressor (`lz4`, `zstd:1`, ...).
    #[serde(default)]
    pub compressor: Option<String>,
    /// With the compressed tier: the pool's share of the budget, percent.
    #[serde(default)]
    pub compressed_max_pct: Option<u32>,
    /// With a compressed tier in front of another: what becomes of pages that compress
    /// poorly (`store` or `pass`; reports from before this field passed them on).
    #[serde(default)]
    pub incompressible: Option<String>,
    /// With a remote tier: the cluster's seed nodes (without passwords).
    #[serde(default)]
    pub remote: Option<String>,
    /// With the compressed tier: bytes stored over bytes the pool held, at the end of
    /// the measured phases (`counters_measured` has both).
    #[serde(default)]
    pub zswap_ratio: Option<f64>,
    /// Size asked for, bytes.
    pub size: u64,
    /// Size of the region actually mapped (rounded up to 2 MiB), bytes.
    pub region_bytes: u64,
    /// Resident budget, bytes (uswap's; for plain memory only what was asked).
    pub budget: u64,
    /// uswap: where the swap is ("an unnamed file in /var/tmp (on vda)", with any default
    /// place skipped and why); null for plain memory.
    pub swap: Option<String>,
    /// Workload threads.
    pub threads: usize,
    /// `4k`, `2m` or `auto`.
    pub unit: String,
    /// `vma`, `cluster` or `off`.
    pub readahead: String,
    /// Seed of the pattern and of the random choices.
    pub seed: u64,
    /// Seconds of the measured phases (see `phases`).
    pub elapsed_s: f64,
    /// Seconds of the whole run, populate and verification included.
    pub total_s: f64,
    /// Bytes moved by the measured phases per second, MB/s (swap-w-seq, swap-w-rand,
    /// seq-read, combined's sequential part).
    pub throughput_MBps: Option<f64>,
    /// Accesses per second (pmbench: word accesses; swap-w-rand: page writes; combined: pages
    /// of the sequential part).
    pub accesses_per_s: Option<f64>,
    /// Mean access latency (pmbench, combined).
    pub lat_avg_us: Option<f64>,
    /// Latency percentiles (pmbench: 50/90/99/99.9; combined: 50/60/70/80/90/95/99 too).
    pub lat_p50_us: Option<f64>,
    /// 60th percentile.
    pub lat_p60_us: Option<f64>,
    /// 70th percentile.
    pub lat_p70_us: Option<f64>,
    /// 80th percentile.
    pub lat_p80_us: Option<f64>,
    /// 90th percentile.
    pub lat_p90_us: Option<f64>,
    /// 95th percentile.
    pub lat_p95_us: Option<f64>,
    /// 99th percentile.
    pub lat_p99_us: Option<f64>,
    /// 99.9th percentile.
    pub lat_p999_us: Option<f64>,
    /// Largest latency seen.
    pub lat_max_us: Option<f64>,
    /// pmbench: percent of reads.
    pub read_pct: Option<u8>,
    /// Timed workloads: the duration asked for, seconds.
    pub duration_s: Option<f64>,
    /// Pages swapped in during the measured phases × 4 KiB per second, MB/s.
    pub swapin_MBps: Option<f64>,
    /// Pages swapped out during the measured phases × 4 KiB per second, MB/s.
    pub swapout_MBps: Option<f64>,
    /// Readahead hit rate over the run, percent (null when nothing was read ahead).
    pub ra_hit_pct: Option<f64>,
    /// combined: the sequential region's readahead hit rate (uswap only).
    pub ra_hit_pct_seq: Option<f64>,
    /// combined: the background region's readahead hit rate (uswap only).
    pub ra_hit_pct_bg: Option<f64>,
    /// combined: background writer threads.
    pub bg_threads: Option<usize>,
    /// combined: background region size, bytes.
    pub bg_size: Option<u64>,
    /// combined: background page writes per second.
    pub bg_accesses_per_s: Option<f64>,
    /// `ok` or `failed`.
    pub verify: String,
    /// The first wrong word, when verification failed.
    pub mismatch: Option<Mismatch>,
    /// VmHWM of this process at the end, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Every phase with its time.
    pub phases: Vec<PhaseTime>,
    /// Counters over the whole run: uswap's [`uswap::Counters`], or for plain memory the
    /// kernel's /proc/vmstat deltas (pswpin, pswpout, swap_ra, swap_ra_hit, thp_swpout,
    /// thp_swpout_fallback) and this process's majflt / minflt.
    pub counters: serde_json::Value,
    /// Counters of the measured phases only.
    pub counters_measured: serde_json::Value,
    /// combined, uswap: the sequential region's own counters over the run.
    pub counters_seq: Option<serde_json::Value>,
    /// combined, uswap: the background region's own counters over the run.
    pub counters_bg: Option<serde_json::Value>,
    /// The command that reproduces this run.
    pub command: String,
}

impl Report {
    /// The compressed tier's figures for the table: compressor and share, the pool at
    /// the end of the measured phases, and the whole run's stores, loads, write-backs
    /// and refusals.
    fn compressed_row(&self) -> Option<String> {
        let compressor = self.compressor.as_deref()?;
        let end = |k: &str| self.counters_measured.get(k).and_then(|v| v.as_u64());
        let run = |k: &str| self.counters.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        let size = |v: Option<u64>| v.map_or("-".to_string(), uswap::format_size);
        Some(format!(
            "{compressor}, pool share {}% of the budget{}; at the end of the measured phases: \
             pool {}, stored {}, ratio {}; zswpout {} zswpin {} zswpwb {}; poor compression \
             {} (stored as they are at the end: {}), refused for a full pool {}; same-filled \
             pages {}",
            self.compressed_max_pct.unwrap_or(0),
            self.incompressible
                .as_deref()
                .map_or(String::new(), |i| format!(", poor pages {i}")),
            size(end("zswap_pool_bytes")),
            size(end("zswap_stored_bytes")),
            self.zswap_ratio
                .map_or("-".to_string(), |r| format!("{r:.2}")),
            run("zswpout"),
            run("zswpin"),
            run("zswpwb"),
            run("zswap_reject_compress"),
            end("zswap_stored_incompressible_pages").unwrap_or(0),
            run("zswap_reject_full"),
            end("zswap_same_filled_pages").unwrap_or(0),
        ))
    }

    /// The remote tier's figures for the table: the whole run's values written and
    /// read, payload bytes, retries, failovers, values lost, read latency.
    fn remote_row(&self) -> Option<String> {
        let nodes = self.remote.as_deref()?;
        let run = |k: &str| self.counters.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        Some(format!(
            "{nodes}: writes {} ({}, {} stored), reads {} ({}; {} direct), retries {}, \
             failovers {}, lost {}; read p50 {} us, p99 {} us",
            run("remote_writes"),
            uswap::format_size(run("remote_bytes_out")),
            uswap::format_size(run("remote_stored_bytes_out")),
            run("remote_reads"),
            uswap::format_size(run("remote_bytes_in")),
            run("remote_direct_reads"),
            run("remote_retries"),
            run("remote_failovers"),
            run("remote_lost"),
            run("remote_get_p50_us"),
            run("remote_get_p99_us"),
        ))
    }

    /// The single-line JSON object.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self)
            .unwrap_or_else(|e| format!("{{\"error\":\"cannot serialise report: {e}\"}}"))
    }

    /// The table for humans.
    pub fn to_table(&self) -> String {
        let mut t = String::new();
        let mut row = |k: &str, v: String| {
            let _ = writeln!(t, "  {k:<14} {v}");
        };
        row("workload", self.workload.clone());
        row(
            "memory",
            if self.memory == "uswap" {
                format!(
                    "uswap (unit {}, readahead {}, tier {})",
                    self.unit,
                    self.readahead,
                    self.tier.as_deref().unwrap_or("file")
                )
            } else {
                format!("plain anonymous memory, kernel swap (unit {})", self.unit)
            },
        );
        row("data", self.data.clone());
        if let Some(c) = self.compressed_row() {
            row("compressed", c);
        }
        if let Some(r) = self.remote_row() {
            row("remote", r);
        }
        row("size", uswap::format_size(self.region_bytes));
        if let Some(bg) = self.bg_size {
            row(
                "bg region",
                format!(
                    "{} ({} threads)",
                    uswap::format_size(bg),
                    self.bg_threads.unwrap_or(0)
                ),
            );
        }
        row("budget", uswap::format_size(self.budget));
        if let Some(swap) = &self.swap {
            row("swap", swap.clone());
        }
        row("threads", self.threads.to_string());
        let measured: Vec<&str> = self
            .phases
            .iter()
            .filter(|p| p.measured)
            .map(|p| p.name.as_str())
            .collect();
        row(
            "elapsed",
            format!(
                "{:.2} s ({}; whole run {:.2} s)",
                self.elapsed_s,
                measured.join(" + "),
                self.total_s
            ),
        );
        if let Some(v) = self.throughput_MBps {
            row("throughput", format!("{v:.1} MB/s"));
        }
        if let Some(v) = self.accesses_per_s {
            row("accesses/s", format!("{v:.0}"));
        }
        if let Some(v) = self.bg_accesses_per_s {
            row("bg writes/s", format!("{v:.0}"));
        }
        if self.lat_p50_us.is_some() {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
            if self.workload == "combined" {
                row(
                    "latency us",
                    format!(
                        "avg {} p50 {} p60 {} p70 {} p80 {} p90 {} p95 {} p99 {}",
                        f(self.lat_avg_us),
                        f(self.lat_p50_us),
                        f(self.lat_p60_us),
                        f(self.lat_p70_us),
                        f(self.lat_p80_us),
                        f(self.lat_p90_us),
                        f(self.lat_p95_us),
                        f(self.lat_p99_us)
                    ),
                );
            } else {
                row(
                    "latency us",
                    format!(
                        "avg {} p50 {} p90 {} p99 {} p99.9 {} max {}",
                        f(self.lat_avg_us),
                        f(self.lat_p50_us),
                        f(self.lat_p90_us),
                        f(self.lat_p99_us),
                        f(self.lat_p999_us),
                        f(self.lat_max_us)
                    ),
                );
            }
        }
        if let (Some(i), Some(o)) = (self.swapin_MBps, self.swapout_MBps) {
            row(
                "swap in/out",
                format!("{i:.1} / {o:.1} MB/s (measured phases)"),
            );
        }
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}%"));
        if self.workload == "combined" && self.memory == "uswap" {
            row(
                "ra_hit",
                format!(
                    "{} (seq {}, bg {})",
                    pct(self.ra_hit_pct),
                    pct(self.ra_hit_pct_seq),
                    pct(self.ra_hit_pct_bg)
                ),
            );
        } else {
            row("ra_hit", pct(self.ra_hit_pct));
        }
        row("verify", self.verify.clone());
        if let Some(m) = &self.mismatch {
            row("mismatch", m.to_string());
        }
        row(
            "peak RSS",
            self.peak_rss_bytes
                .map_or("unknown".into(), uswap::format_size),
        );
        let title = if self.memory == "uswap" {
            "counters"
        } else {
            "kernel counters"
        };
        let _ = writeln!(t, "  {title} (whole run):");
        if let serde_json::Value::Object(map) = &self.counters {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| {
                    let v = v.as_u64().unwrap_or(0);
                    if k.ends_with("_bytes") {
                        format!("{k} {}", uswap::format_size(v))
                    } else {
                        format!("{k} {v}")
                    }
                })
                .collect();
            for chunk in items.chunks(4) {
                let _ = writeln!(
                    t,
                    "    {}",
                    chunk
                        .iter()
                        .map(|s| format!("{s:<30}"))
                        .collect::<String>()
                        .trim_end()
                );
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            workload: "pmbench".into(),
            memory: "plain".into(),
            data: "mixed".into(),
            tier: None,
            compressor: None,
            compressed_max_pct: None,
            incompressible: None,
            remote: None,
            zswap_ratio: None,
            size: 1 << 20,
            region_bytes: 2 << 20,
            budget: 256 << 20,
            swap: None,
            threads: 1,
            unit: "4k".into(),
            readahead: "vma".into(),
            seed: 1,
            elapsed_s: 1.0,
            total_s: 1.5,
            throughput_MBps: None,
            accesses_per_s: Some(1e6),
            lat_avg_us: Some(0.1),
            lat_p50_us: Some(0.1),
            lat_p60_us: None,
            lat_p70_us: None,
            lat_p80_us: None,
            lat_p90_us: Some(0.2),
            lat_p95_us: None,
            lat_p99_us: Some(0.3),
            lat_p999_us: Some(0.4),
            lat_max_us: Some(9.0),
            read_pct: Some(80),
            duration_s: Some(1.0),
            swapin_MBps: Some(0.0),
            swapout_MBps: Some(0.0),
            ra_hit_pct: None,
            ra_hit_pct_seq: None,
            ra_hit_pct_bg: None,
            bg_threads: None,
            bg_size: None,
            bg_accesses_per_s: None,
            verify: "ok".into(),
            mismatch: None,
            peak_rss_bytes: Some(10 << 20),
            phases: vec![],
            counters: serde_json::json!({"pswpin": 0, "resident_bytes": 4096}),
            counters_measured: serde_json::json!({}),
            counters_seq: None,
            counters_bg: None,
            command: "uswap bench pmbench".into(),
        }
    }

    #[test]
    fn json_is_one_line_with_the_contract_keys_and_round_trips() {
        let r = sample();
        let line = r.to_json_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for k in [
            "workload",
            "size",
            "budget",
            "threads",
            "elapsed_s",
            "throughput_MBps",
            "accesses_per_s",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        for k in [
            "lat_p50_us",
            "lat_p90_us",
            "lat_p99_us",
            "lat_p999_us",
            "verify",
            "peak_rss_bytes",
            "counters",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert!(v["throughput_MBps"].is_null());
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        let table = r.to_table();
        assert!(
            table.contains("accesses/s") && table.contains("resident_bytes 4.0 KiB"),
            "{table}"
        );
    }
}
