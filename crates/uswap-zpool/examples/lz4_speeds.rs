//! Compression speed and ratio of lz4 variants on whole units of benchmark data, cut
//! into the pool's 16 KiB chunks, one thread: what bounds the compressed tier on a
//! stream (every byte evicted is compressed once). Not a test and not in CI.
//!
//! ```text
//! cargo run --release -p uswap-zpool --example lz4_speeds [-- --data mixed]
//! ```

use std::time::Instant;
use uswap_zpool::{DataKind, PAGE_SIZE, UNIT_CHUNK, UNIT_SIZE};

/// A compressor under test: a name and a call (source, destination) -> length.
type Variant = (String, Box<dyn FnMut(&[u8], &mut [u8]) -> usize>);

fn main() {
    let kind: DataKind = std::env::args()
        .skip_while(|a| a != "--data")
        .nth(1)
        .map(|s| s.parse().expect("--data"))
        .unwrap_or(DataKind::Mixed);
    let units = 64;
    let mut data = vec![0u8; units * UNIT_SIZE];
    let mut page = [0u8; PAGE_SIZE];
    for (i, p) in data.chunks_exact_mut(PAGE_SIZE).enumerate() {
        kind.fill_page(7, i as u64, &mut page);
        p.copy_from_slice(&page);
    }
    let mut dst = vec![0u8; 2 * UNIT_CHUNK];
    let mut table = lz4_flex::block::CompressTable::small();
    let variants: Vec<Variant> = vec![
        (
            "lz4_flex".into(),
            Box::new(move |s: &[u8], d: &mut [u8]| {
                lz4_flex::block::compress_into_with_table(s, d, &mut table).unwrap()
            }),
        ),
        (
            "liblz4 default".into(),
            Box::new(|s: &[u8], d: &mut [u8]| {
                lz4::block::compress_to_buffer(s, None, false, d).unwrap()
            }),
        ),
        (
            "liblz4 fast 2".into(),
            Box::new(|s: &[u8], d: &mut [u8]| {
                lz4::block::compress_to_buffer(
                    s,
                    Some(lz4::block::CompressionMode::FAST(2)),
                    false,
                    d,
                )
                .unwrap()
            }),
        ),
        (
            "liblz4 fast 4".into(),
            Box::new(|s: &[u8], d: &mut [u8]| {
                lz4::block::compress_to_buffer(
                    s,
                    Some(lz4::block::CompressionMode::FAST(4)),
                    false,
                    d,
                )
                .unwrap()
            }),
        ),
        (
            "liblz4 fast 8".into(),
            Box::new(|s: &[u8], d: &mut [u8]| {
                lz4::block::compress_to_buffer(
                    s,
                    Some(lz4::block::CompressionMode::FAST(8)),
                    false,
                    d,
                )
                .unwrap()
            }),
        ),
        (
            "liblz4 fast 16".into(),
            Box::new(|s: &[u8], d: &mut [u8]| {
                lz4::block::compress_to_buffer(
                    s,
                    Some(lz4::block::CompressionMode::FAST(16)),
                    false,
                    d,
                )
                .unwrap()
            }),
        ),
    ];
    for (name, mut f) in variants {
        for _round in 0..2 {
            let t = Instant::now();
            let mut out = 0usize;
            for c in data.chunks(UNIT_CHUNK) {
                out += f(c, &mut dst).min(c.len());
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "{name:>16}: {:6.0} MB/s ratio {:.2}",
                data.len() as f64 / s / 1e6,
                data.len() as f64 / out as f64
            );
        }
    }
}
