//! Why the lz4 block format is decompressed with liblz4 (the `lz4` crate) and not with
//! `lz4_flex`: per-call time of each library, one thread, on pages with long runs (which
//! `lz4_flex` copies byte by byte) and on text. Not a test and not in CI.
//!
//! ```text
//! cargo run --release -p uswap-zpool --example lz4_decoders
//! ```
//!
//! Every decompressed page is compared with its source (outside the timing).

use std::time::Instant;

const CALLS: usize = 200_000;

fn per_call_us(mut f: impl FnMut() -> usize) -> f64 {
    let t = Instant::now();
    let mut sink = 0usize;
    for _ in 0..CALLS {
        sink = sink.wrapping_add(f());
    }
    std::hint::black_box(sink);
    t.elapsed().as_secs_f64() * 1e6 / CALLS as f64
}

fn main() {
    let mut one_word = vec![0u8; 4096];
    one_word[..8].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
    let words: [&[u8]; 6] = [b"alpha ", b"swap ", b"page ", b"fault ", b"unit ", b"slot "];
    let mut text = Vec::new();
    let mut x = 88_172_645_463_325_252u64;
    while text.len() < 4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.extend_from_slice(words[(x % 6) as usize]);
    }
    text.truncate(4096);
    let run_of_one_byte = vec![0x5au8; 4096];
    for (name, page) in [
        ("one word and zeros", &one_word),
        ("a run of one byte", &run_of_one_byte),
        ("text", &text),
    ] {
        let block = lz4_flex::block::compress(page);
        let mut out = vec![0u8; page.len()];
        lz4_flex::block::decompress_into(&block, &mut out).expect("lz4_flex");
        assert_eq!(&out, page);
        out.fill(0);
        let n = lz4::block::decompress_to_buffer(&block, Some(page.len() as i32), &mut out)
            .expect("liblz4");
        assert_eq!((n, &out), (page.len(), page));
        let flex = per_call_us(|| lz4_flex::block::decompress_into(&block, &mut out).unwrap());
        let c =
            per_call_us(|| lz4::block::decompress_to_buffer(&block, Some(4096), &mut out).unwrap());
        let flex_c = per_call_us(|| lz4_flex::block::compress(page).len());
        let c_c = per_call_us(|| lz4::block::compress(page, None, false).unwrap().len());
        println!(
            "{name:>20}: {} -> {} bytes; decompress lz4_flex {flex:.2} us, liblz4 {c:.2} us; \
             compress lz4_flex {flex_c:.2} us, liblz4 {c_c:.2} us",
            page.len(),
            block.len()
        );
    }
}
