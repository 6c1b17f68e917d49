//! What a page checksum costs on this CPU: xxh3-64 (what uswap uses) against crc32c (the
//! alternative issue 17 names), over 4 KiB pages and 2 MiB units, 2 GiB hashed per figure.
//! Run: cargo run --release --manifest-path scripts/hash-cost/Cargo.toml
use std::time::Instant;
fn main() {
    let buf: Vec<u8> = (0..(2usize << 20)).map(|i| (i * 2654435761usize >> 7) as u8).collect();
    for (name, size) in [("4 KiB", 4096usize), ("2 MiB", 2 << 20)] {
        let iters = (1usize << 31) / size; // 2 GiB hashed per measurement
        for _ in 0..2 {
            let mut acc = 0u64;
            let t = Instant::now();
            for i in 0..iters { let o = (i * 4096) % (buf.len() - size + 1); acc ^= xxhash_rust::xxh3::xxh3_64(&buf[o..o + size]); }
            let x = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for i in 0..iters { let o = (i * 4096) % (buf.len() - size + 1); acc ^= crc32c::crc32c(&buf[o..o + size]) as u64; }
            let c = t.elapsed().as_secs_f64();
            let per = |s: f64| s / iters as f64 * 1e6;
            println!("{name}: xxh3 {:.2} GB/s ({:.2} us each), crc32c {:.2} GB/s ({:.2} us each) [{acc:x}]",
                (iters * size) as f64 / x / 1e9, per(x), (iters * size) as f64 / c / 1e9, per(c));
        }
    }
}
