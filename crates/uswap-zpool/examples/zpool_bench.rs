//! Store/load throughput and per-operation latency of the compressed store, per data
//! kind and compressor, one thread. Not a test and not in CI: run it on a quiet machine.
//!
//! ```text
//! cargo run --release -p uswap-zpool --example zpool_bench -- \
//!     [--pages N] [--units N] [--data zeros,text,random,mixed] [--compressor lz4,zstd:1,zstd:3]
//! cargo run --release -p uswap-zpool --example zpool_bench -- checksums
//! ```
//!
//! Every page and unit loaded is compared with what was stored (outside the timing).

use std::time::Instant;
use uswap_zpool::{Compressor, Config, DataKind, Handle, Zpool, PAGE_SIZE, UNIT_SIZE};

struct Args {
    pages: usize,
    units: usize,
    kinds: Vec<DataKind>,
    compressors: Vec<Compressor>,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        pages: 50_000,
        units: 32,
        kinds: DataKind::ALL.to_vec(),
        compressors: vec![
            Compressor::Lz4,
            Compressor::Zstd { level: 1 },
            Compressor::Zstd { level: 3 },
        ],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "checksums" => return Ok(None),
            "-h" | "--help" => {
                return Err(
                    "usage: zpool_bench [--pages N] [--units N] [--data KIND,..] \
                     [--compressor lz4|zstd:LEVEL,..] | checksums"
                        .into(),
                )
            }
            "--pages" => a.pages = value()?.parse().map_err(|e| format!("--pages: {e}"))?,
            "--units" => a.units = value()?.parse().map_err(|e| format!("--units: {e}"))?,
            "--data" => {
                a.kinds = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            "--compressor" => {
                a.compressors = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            _ => return Err(format!("unknown argument {arg:?} (see the file's doc)")),
        }
    }
    Ok(Some(a))
}

/// p50 and p99 of `ns`, in µs.
fn percentiles(ns: &mut [u64]) -> (f64, f64) {
    if ns.is_empty() {
        return (0.0, 0.0);
    }
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    (at(0.50), at(0.99))
}

fn mbps(bytes: usize, ns: u64) -> f64 {
    bytes as f64 / ns.max(1) as f64 * 1000.0
}

fn bench_pages(pool: &Zpool, kind: DataKind, pages: usize) -> String {
    let data: Vec<[u8; PAGE_SIZE]> = (0..pages)
        .map(|i| {
            let mut p = [0u8; PAGE_SIZE];
            kind.fill_page(1, i as u64, &mut p);
            p
        })
        .collect();
    let mut store_ns = Vec::with_capacity(pages);
    let mut handles: Vec<(usize, Handle)> = Vec::with_capacity(pages);
    let t = Instant::now();
    for (i, p) in data.iter().enumerate() {
        let t0 = Instant::now();
        let r = pool.store_page(p);
        store_ns.push(t0.elapsed().as_nanos() as u64);
        if let Ok(h) = r {
            handles.push((i, h));
        }
    }
    let store_total = t.elapsed().as_nanos() as u64;
    let stats = pool.stats();
    // Load in a scattered order, as faults come.
    let order: Vec<usize> = (0..handles.len())
        .map(|i| (i * 7919) % handles.len().max(1))
        .collect();
    let mut load_ns = Vec::with_capacity(handles.len());
    let mut out = [0u8; PAGE_SIZE];
    let mut load_total = 0;
    for &k in &order {
        let (i, h) = handles[k];
        let t0 = Instant::now();
        pool.load(h, &mut out).expect("load");
        let ns = t0.elapsed().as_nanos() as u64;
        load_ns.push(ns);
        load_total += ns;
        assert!(out == data[i], "page {i} came back different");
    }
    for (_, h) in handles.iter() {
        pool.free(*h).expect("free");
    }
    let (s50, s99) = percentiles(&mut store_ns);
    let (l50, l99) = percentiles(&mut load_ns);
    format!(
        "pages  {:>6} stored of {:<6} ratio {:>5.2} (effective {:>5.2})  store {:>7.0} MB/s p50 {:>6.2} p99 {:>6.2} µs  load {:>7.0} MB/s p50 {:>6.2} p99 {:>6.2} µs",
        handles.len(),
        pages,
        stats.compression_ratio(),
        stats.effective_ratio(),
        mbps(pages * PAGE_SIZE, store_total),
        s50,
        s99,
        mbps(handles.len() * PAGE_SIZE, load_total),
        l50,
        l99
    )
}

fn bench_units(pool: &Zpool, kind: DataKind, units: usize) -> String {
    let data: Vec<Box<[u8; UNIT_SIZE]>> = (0..units)
        .map(|i| {
            let mut u: Box<[u8; UNIT_SIZE]> =
                vec![0u8; UNIT_SIZE].into_boxed_slice().try_into().unwrap();
            kind.fill(2, (i * 512) as u64, &mut u[..]);
            u
        })
        .collect();
    let (mut store_ns, mut load_ns) = (Vec::new(), Vec::new());
    let mut handles = Vec::new();
    for (i, u) in data.iter().enumerate() {
        let t0 = Instant::now();
        let r = pool.store_unit(u);
        store_ns.push(t0.elapsed().as_nanos() as u64);
        if let Ok(h) = r {
            handles.push((i, h));
        }
    }
    let stats = pool.stats();
    let mut out: Box<[u8; UNIT_SIZE]> = vec![0u8; UNIT_SIZE].into_boxed_slice().try_into().unwrap();
    for &(i, h) in handles.iter().rev() {
        let t0 = Instant::now();
        pool.load(h, &mut out[..]).expect("load");
        load_ns.push(t0.elapsed().as_nanos() as u64);
        assert!(out[..] == data[i][..], "unit {i} came back different");
    }
    for (_, h) in &handles {
        pool.free(*h).expect("free");
    }
    let (store_total, load_total): (u64, u64) = (store_ns.iter().sum(), load_ns.iter().sum());
    let (s50, s99) = percentiles(&mut store_ns);
    let (l50, l99) = percentiles(&mut load_ns);
    format!(
        "units  {:>6} stored of {:<6} ratio {:>5.2} (effective {:>5.2})  store {:>7.0} MB/s p50 {:>6.0} p99 {:>6.0} µs  load {:>7.0} MB/s p50 {:>6.0} p99 {:>6.0} µs",
        handles.len(),
        units,
        stats.compression_ratio(),
        stats.effective_ratio(),
        mbps(units * UNIT_SIZE, store_total),
        s50,
        s99,
        mbps(handles.len() * UNIT_SIZE, load_total),
        l50,
        l99
    )
}

/// The measurement behind the checksum choice (src/checksum.rs).
fn checksums() {
    let mut page = [0u8; PAGE_SIZE];
    DataKind::Random.fill_page(1, 0, &mut page);
    for len in [PAGE_SIZE, 1400] {
        let p = &page[..len];
        for round in 0..3 {
            let n = 2_000_000u64;
            let mut acc = 0u64;
            let t = Instant::now();
            for i in 0..n {
                acc = acc.wrapping_add(xxhash_rust::xxh3::xxh3_64(std::hint::black_box(p)) ^ i);
            }
            let xxh3 = t.elapsed().as_nanos() as f64 / n as f64;
            let t = Instant::now();
            for i in 0..n {
                acc = acc.wrapping_add(crc32c::crc32c(std::hint::black_box(p)) as u64 ^ i);
            }
            let crc = t.elapsed().as_nanos() as f64 / n as f64;
            println!(
                "{len:>5} B round {round}: xxh3 {xxh3:>5.0} ns ({:>4.1} GB/s)  crc32c {crc:>5.0} ns ({:>4.1} GB/s)  [{}]",
                len as f64 / xxh3,
                len as f64 / crc,
                acc & 1
            );
        }
    }
}

fn main() {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => return checksums(),
        Err(e) => {
            eprintln!("zpool_bench: {e}");
            std::process::exit(2);
        }
    };
    for &compressor in &args.compressors {
        for &kind in &args.kinds {
            let pool = Zpool::new(Config {
                compressor,
                ..Config::default()
            })
            .unwrap_or_else(|e| {
                eprintln!("zpool_bench: {e}");
                std::process::exit(2)
            });
            println!(
                "{compressor:<7} {kind:<7} {}",
                bench_pages(&pool, kind, args.pages)
            );
            println!(
                "{compressor:<7} {kind:<7} {}",
                bench_units(&pool, kind, args.units)
            );
        }
    }
}
