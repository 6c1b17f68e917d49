//! Microbenchmark of the remote tier (not run in CI): latency of a 4 KiB read, one at a time
//! through a client and its completion queue (what a fault sees), and MB/s of batched 2 MiB
//! writes acknowledged by primary + replica.
//!
//! ```text
//! cargo run --release -p uswap-remote --example remote-bench -- --start-cluster
//! cargo run --release -p uswap-remote --example remote-bench -- --nodes redis://127.0.0.1:30000,127.0.0.1:30001
//!   [--pages 4096] [--gets 20000] [--units 128] [--batch 4] [--in-flight 4] [--replicas N]
//! ```
//! `--start-cluster` starts a local 3+3 cluster with scripts/redis-cluster.sh (base port 21700)
//! and stops it at the end.

use std::process::Command;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use uswap_remote::{Completion, RemoteConfig, RemoteStore};

struct Args {
    nodes: Option<String>,
    start_cluster: bool,
    pages: u64,
    gets: u64,
    units: u64,
    batch: u64,
    in_flight: usize,
    replicas: Option<u32>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        nodes: None,
        start_cluster: false,
        pages: 4096,
        gets: 20_000,
        units: 128,
        batch: 4,
        in_flight: 4,
        replicas: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--nodes" => a.nodes = Some(value()?),
            "--start-cluster" => a.start_cluster = true,
            "--pages" => a.pages = num(value()?)?.max(1),
            "--gets" => a.gets = num(value()?)?,
            "--units" => a.units = num(value()?)?,
            "--batch" => a.batch = num(value()?)?.max(1),
            "--in-flight" => a.in_flight = num(value()?)?.max(1) as usize,
            "--replicas" => a.replicas = Some(num(value()?)? as u32),
            _ => {
                return Err(format!(
                    "unknown argument {flag} (see the example's doc comment)"
                ))
            }
        }
    }
    if a.nodes.is_none() && !a.start_cluster {
        return Err("give --nodes redis://HOST:PORT[,...] or --start-cluster".into());
    }
    Ok(a)
}

struct LocalCluster(std::path::PathBuf);

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", "--dir"])
            .arg(&self.0)
            .status();
    }
}

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh")
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("remote-bench: {e}");
            std::process::exit(2);
        }
    };
    let (_cluster, nodes) = if args.start_cluster {
        let dir = std::env::temp_dir().join(format!("uswap-remote-bench-{}", std::process::id()));
        let out = Command::new(script())
            .args(["start", "--dir"])
            .arg(&dir)
            .args(["--base-port", "21700"])
            .output()
            .expect("run scripts/redis-cluster.sh");
        if !out.status.success() {
            eprintln!(
                "remote-bench: cluster did not start:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::process::exit(1);
        }
        let nodes = String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>()
            .join(",");
        (Some(LocalCluster(dir)), nodes)
    } else {
        (None, args.nodes.clone().unwrap())
    };
    let mut cfg = match RemoteConfig::from_list(&nodes) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("remote-bench: {e}");
            std::process::exit(2);
        }
    };
    cfg.replicas_to_wait = args.replicas;
    let store = match RemoteStore::connect(cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("remote-bench: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "cluster {nodes}: WAIT for {} replica(s)",
        store.replicas_to_wait()
    );
    let client = store.client(None).expect("client");
    let mut done: Vec<Completion> = Vec::new();
    let wait_for = |n: usize, done: &mut Vec<Completion>| {
        done.clear();
        while done.len() < n {
            client.wait_completions(done, Duration::from_secs(60));
        }
    };

    // 4 KiB reads, one at a time
    let page = vec![0x5au8; 4096];
    for chunk in (0..args.pages).collect::<Vec<_>>().chunks(512) {
        store
            .put_batch_blocking(chunk.iter().map(|&id| (id, page.clone())).collect())
            .expect("write pages");
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let started = Instant::now();
    for i in 0..args.gets {
        let t = Instant::now();
        client.get(i, (i * 7919) % args.pages);
        wait_for(1, &mut done);
        assert_eq!(
            done[0].result.as_ref().map(|v| v.as_ref().map(Vec::len)),
            Ok(Some(4096))
        );
        hist.saturating_record(t.elapsed().as_micros().max(1) as u64);
    }
    if args.gets > 0 {
        println!(
            "4 KiB get, one at a time ({} reads, {:.1} s): p50 {} µs  p90 {} µs  p99 {} µs  p99.9 {} µs  max {} µs",
            args.gets,
            started.elapsed().as_secs_f64(),
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.9),
            hist.value_at_quantile(0.99),
            hist.value_at_quantile(0.999),
            hist.max()
        );
    }

    // 2 MiB writes, `batch` units per request, `in_flight` requests at once
    let unit = vec![0xa5u8; 2 << 20];
    let base = 1u64 << 40;
    let started = Instant::now();
    let (mut sent, mut acked, mut failed, mut outstanding) = (0u64, 0u64, 0u64, 0usize);
    while acked + failed < args.units {
        while sent < args.units && outstanding < args.in_flight {
            let n = args.batch.min(args.units - sent);
            let items = (sent..sent + n)
                .map(|u| (base + u * 512, unit.clone()))
                .collect();
            client.put_batch(n, items);
            sent += n;
            outstanding += 1;
        }
        wait_for(1, &mut done);
        for c in &done {
            outstanding -= 1;
            match &c.result {
                Ok(_) => acked += c.token,
                Err(e) => {
                    eprintln!("write failed: {e}");
                    failed += c.token;
                }
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if args.units > 0 {
        println!(
            "2 MiB put, {} per batch, {} batches in flight: {} units acknowledged in {:.2} s = {:.0} MB/s ({} failed)",
            args.batch,
            args.in_flight,
            acked,
            secs,
            (acked * (2 << 20)) as f64 / secs / 1e6,
            failed
        );
    }
    println!("{:#?}", store.counters());
    let _ = store.close();
}
