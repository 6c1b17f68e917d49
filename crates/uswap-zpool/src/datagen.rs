//! Test and benchmark data: pages made deterministically from (seed, page index), so
//! that a workload can write page `i` and later verify it without keeping a copy.
//!
//! - [`DataKind::Zeros`]: all zero (same-filled: the store keeps no object).
//! - [`DataKind::Text`]: English-like words, numbers and punctuation in lines.
//! - [`DataKind::Random`]: incompressible bytes.
//! - [`DataKind::Mixed`] (the default for benchmarks): a mix like real anonymous memory,
//!   page by page — 22% zero pages, 4% pages of one repeated word, 25% text, 19%
//!   arrays of pointers and small integers (heap objects), 19% partly used pages (a
//!   heap object array, then zeros), 11% random (compressed or encrypted data).
//!
//! Compression of 4096 pages (each page compressed alone, as zswap does; ratio = bytes
//! in / bytes out, every page compressed, zero pages included), seeds 1, 2 and 1234,
//! measured by the test `datagen::tests::ratios` (`cargo test -p uswap-zpool --release
//! ratios -- --nocapture` prints them):
//!
//! | kind | lz4 | zstd 1 | zstd 3 |
//! |---|---|---|---|
//! | Text | 1.95 | 2.80 | 2.85 |
//! | Random | 1.00 (slightly < 1) | 1.00 | 1.00 |
//! | Mixed | 2.64–2.69 | 3.62–3.67 | 3.61–3.67 |
//!
//! In a pool (lz4, default 80% threshold), Mixed keeps 89% of its pages (the random
//! ones are refused) at 3.4:1 over the compressed bytes and 3.0:1 over all memory the
//! pool holds (`zpool_bench`, 20,000 pages).
//!
//! Published figures for real anonymous memory: ~3:1 (Meta's and Google's zswap, zstd),
//! 2.5–3:1 with lz4.

use std::fmt;
use std::str::FromStr;

/// A kind of data; see the module doc.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DataKind {
    /// All zero.
    Zeros,
    /// English-like text.
    Text,
    /// Incompressible random bytes.
    Random,
    /// Like real anonymous memory (~2.65:1 with lz4).
    #[default]
    Mixed,
}

impl DataKind {
    /// Every kind.
    pub const ALL: [DataKind; 4] = [
        DataKind::Zeros,
        DataKind::Text,
        DataKind::Random,
        DataKind::Mixed,
    ];

    /// Its name on command lines (`zeros`, `text`, `random`, `mixed`).
    pub fn name(self) -> &'static str {
        match self {
            DataKind::Zeros => "zeros",
            DataKind::Text => "text",
            DataKind::Random => "random",
            DataKind::Mixed => "mixed",
        }
    }

    /// Fill `out` with page `page` of this kind for `seed` (its first `out.len()` bytes
    /// when `out` is shorter than a page; the page repeats when longer — use
    /// [`DataKind::fill`] for runs of pages).
    pub fn fill_page(self, seed: u64, page: u64, out: &mut [u8]) {
        let mut buf = [0u8; PAGE];
        let page_buf: &mut [u8; PAGE] = match out.len() {
            PAGE => out.try_into().expect("one page"),
            _ => &mut buf,
        };
        let mut rng = Rng::new(seed, page);
        match self {
            DataKind::Zeros => page_buf.fill(0),
            DataKind::Text => text(&mut rng, page_buf),
            DataKind::Random => random(&mut rng, page_buf),
            DataKind::Mixed => mixed(&mut rng, page_buf),
        }
        if out.len() != PAGE {
            for chunk in out.chunks_mut(PAGE) {
                chunk.copy_from_slice(&buf[..chunk.len()]);
            }
        }
    }

    /// Fill `out` with consecutive pages `first_page`, `first_page + 1`, ... (a
    /// partial last page gets that page's first bytes).
    pub fn fill(self, seed: u64, first_page: u64, out: &mut [u8]) {
        for (i, chunk) in out.chunks_mut(PAGE).enumerate() {
            self.fill_page(seed, first_page + i as u64, chunk);
        }
    }
}

impl fmt::Display for DataKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        DataKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown data kind {s:?}: expected zeros, text, random or mixed")
            })
    }
}

const PAGE: usize = crate::PAGE_SIZE;

/// SplitMix64: tiny, fast, and good enough for data that only has to look varied.
struct Rng(u64);

impl Rng {
    /// The stream of page `page` under `seed`. The start is hashed, not just offset:
    /// streams that start a few steps apart would make page i+1 page i shifted by a
    /// word, which lz4 finds (it did: "random" units compressed by 3%).
    fn new(seed: u64, page: u64) -> Rng {
        Rng(mix(mix(seed) ^ page.wrapping_mul(0xD6E8_FEB8_6659_FD93)))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in 0..n.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() >> 32) * n) >> 32
    }

    /// Skewed toward 0 (roughly Zipf-like), in 0..n.
    fn skewed(&mut self, n: u64) -> u64 {
        let a = self.below(n);
        self.below(a + 1)
    }
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn random(rng: &mut Rng, out: &mut [u8; PAGE]) {
    for w in out.chunks_exact_mut(8) {
        w.copy_from_slice(&rng.next().to_le_bytes());
    }
}

const WORDS: &[&str] = &[
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on",
    "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had",
    "by", "not", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all",
    "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do",
    "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would",
    "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look",
    "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my",
    "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now",
    "find", "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after",
    "back", "little", "only", "round", "man", "year", "came", "show", "every", "good", "me",
    "give", "our", "under", "name", "very", "through", "just", "form", "sentence", "great",
    "think", "say", "help", "low", "line", "differ", "turn", "cause", "much", "mean", "before",
    "move", "right", "boy", "old", "too", "same", "tell", "does", "set", "three", "want", "air",
    "well", "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large",
    "spell", "add", "even", "land", "here", "must", "big", "high", "such", "follow", "act", "why",
    "ask", "men", "change", "went", "light", "kind", "off", "need", "house", "picture", "try",
    "us", "again", "animal", "point", "mother", "world", "near", "build", "self", "earth",
    "father", "head", "stand", "own", "page", "should", "country", "found", "answer", "school",
    "grow", "study", "still", "learn", "plant", "cover", "food", "sun", "four", "between", "state",
    "keep", "eye", "never", "last", "let", "thought", "city", "tree", "cross", "farm", "hard",
    "start", "might", "story", "saw", "far", "sea", "draw", "left", "late", "run", "while",
    "press", "close", "night", "real", "life", "few", "north", "buffer", "request", "session",
    "config", "error", "value", "index", "handler", "thread", "memory", "region", "cluster",
];

/// Appends bytes to a page until it is full.
struct PageWriter<'a> {
    out: &'a mut [u8; PAGE],
    pos: usize,
}

impl PageWriter<'_> {
    fn full(&self) -> bool {
        self.pos == PAGE
    }

    fn put(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(PAGE - self.pos);
        self.out[self.pos..self.pos + n].copy_from_slice(&bytes[..n]);
        self.pos += n;
    }

    fn put_num(&mut self, mut v: u64, width: usize) {
        let mut digits = [b'0'; 20];
        let mut i = digits.len();
        while v > 0 || digits.len() - i < width.max(1) {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        self.put(&digits[i..]);
    }

    fn put_word(&mut self, rng: &mut Rng) {
        self.put(WORDS[rng.skewed(WORDS.len() as u64) as usize].as_bytes());
    }
}

const TEMPLATES: &[&str] = &[
    "request handled for session",
    "page fault resolved in region",
    "cache miss, reading slot from",
    "connection accepted from client",
    "writeback of cluster completed on",
    "retrying after short read of",
    "user logged in with token for",
    "query executed on table",
];
const LEVELS: &[&str] = &["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"];
const COMPONENTS: &[&str] = &["fault", "reclaim", "io", "cache", "server", "client", "db"];

/// Text as it sits in a program's memory: log lines from a few templates, and prose.
fn text(rng: &mut Rng, out: &mut [u8; PAGE]) {
    let mut w = PageWriter { out, pos: 0 };
    let mut time = rng.below(86_400_000);
    while !w.full() {
        if rng.below(4) != 0 {
            time += rng.below(2000);
            w.put_num(time / 3_600_000, 2);
            w.put(b":");
            w.put_num(time / 60_000 % 60, 2);
            w.put(b":");
            w.put_num(time / 1000 % 60, 2);
            w.put(b".");
            w.put_num(time % 1000, 3);
            w.put(b" ");
            w.put(LEVELS[rng.below(LEVELS.len() as u64) as usize].as_bytes());
            w.put(b" [");
            w.put(COMPONENTS[rng.skewed(COMPONENTS.len() as u64) as usize].as_bytes());
            w.put(b"] ");
            w.put(TEMPLATES[rng.skewed(TEMPLATES.len() as u64) as usize].as_bytes());
            w.put(b" ");
            w.put_word(rng);
            w.put(b" ");
            w.put(b"id=");
            w.put_num(rng.below(100_000), 0);
            w.put(b" took ");
            w.put_num(rng.skewed(500), 0);
            w.put(b" ms\n");
        } else {
            for i in 0..4 + rng.below(12) {
                if i > 0 {
                    w.put(if rng.below(10) == 0 { b", " } else { b" " });
                }
                w.put_word(rng);
            }
            w.put(b".\n");
        }
    }
}

/// Arrays of small heap objects: pointers into a few nearby areas, small integers,
/// flags, lengths and zero padding, in a struct layout of `words` 8-byte fields.
fn objects(rng: &mut Rng, out: &mut [u8]) {
    let heap = 0x0000_5600_0000_0000 | (rng.below(1 << 28) << 12);
    let words = 4 + rng.below(5) as usize;
    let mut layout = [0u64; 8];
    for field in &mut layout[..words] {
        *field = rng.below(6);
    }
    let mut next_obj = rng.below(1 << 16) * 16;
    for (i, w) in out.chunks_exact_mut(8).enumerate() {
        let v = match layout[i % words] {
            0 | 1 => {
                // A pointer to a nearby object.
                next_obj += 16 * rng.below(8);
                heap + next_obj
            }
            2 => rng.skewed(1000),   // a count or an enum
            3 => rng.below(4) << 32, // flags in the high half
            4 => 0,                  // padding / NULL
            _ => rng.below(1 << 20), // a length or an id
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

fn mixed(rng: &mut Rng, out: &mut [u8; PAGE]) {
    match rng.below(100) {
        0..=21 => out.fill(0),
        22..=25 => {
            let word = [0xffff_ffff_ffff_ffff, 0x0101_0101_0101_0101, 0x1][rng.below(3) as usize];
            for w in out.chunks_exact_mut(8) {
                w.copy_from_slice(&u64::to_le_bytes(word));
            }
        }
        26..=50 => text(rng, out),
        51..=69 => objects(rng, out),
        70..=88 => {
            let used = 8 * (64 + rng.below(384) as usize);
            objects(rng, &mut out[..used]);
            out[used..].fill(0);
        }
        _ => random(rng, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressor::Compressor;

    /// Ratio of `pages` pages of `kind` for `seed`, compressed one by one.
    fn ratio(kind: DataKind, c: Compressor, seed: u64, pages: u64) -> f64 {
        let mut page = [0u8; PAGE];
        let mut dst = vec![0u8; c.max_output(PAGE)];
        let mut out = 0usize;
        for i in 0..pages {
            kind.fill_page(seed, i, &mut page);
            out += c.compress(&page, &mut dst).unwrap();
        }
        (pages as usize * PAGE) as f64 / out as f64
    }

    /// The figures of the module doc (run with --nocapture to see them).
    #[test]
    fn ratios() {
        let cs = [
            Compressor::Lz4,
            Compressor::Zstd { level: 1 },
            Compressor::Zstd { level: 3 },
        ];
        for kind in [DataKind::Text, DataKind::Random, DataKind::Mixed] {
            for seed in [1, 2, 1234] {
                let r: Vec<f64> = cs.iter().map(|&c| ratio(kind, c, seed, 4096)).collect();
                println!(
                    "{kind} seed {seed}: lz4 {:.2}, zstd1 {:.2}, zstd3 {:.2}",
                    r[0], r[1], r[2]
                );
                match kind {
                    DataKind::Mixed => {
                        assert!((2.5..=3.0).contains(&r[0]), "mixed lz4 {:.2}", r[0])
                    }
                    DataKind::Random => assert!(r.iter().all(|&x| x < 1.0), "random compressed"),
                    _ => assert!(r[0] > 1.5, "text lz4 {:.2}", r[0]),
                }
            }
        }
    }

    #[test]
    fn random_runs_do_not_compress_across_pages() {
        let mut run = vec![0u8; 64 * PAGE];
        for seed in [0, 1, 9, 1 << 40] {
            DataKind::Random.fill(seed, 1000, &mut run);
            let c = Compressor::Lz4;
            let mut dst = vec![0u8; c.max_output(run.len())];
            let n = c.compress(&run, &mut dst).unwrap();
            assert!(
                n >= run.len(),
                "seed {seed}: 256 KiB of random pages -> {n} bytes"
            );
        }
    }

    #[test]
    fn pages_depend_only_on_seed_and_index() {
        for kind in DataKind::ALL {
            let (mut a, mut b) = ([0u8; PAGE], [0u8; PAGE]);
            kind.fill_page(7, 123, &mut a);
            kind.fill_page(7, 123, &mut b);
            assert_eq!(a, b, "{kind} not deterministic");
            let mut run = vec![0u8; 3 * PAGE + 100];
            kind.fill(7, 122, &mut run);
            assert_eq!(
                &run[PAGE..2 * PAGE],
                &a[..],
                "{kind}: fill differs from fill_page"
            );
            assert_eq!(
                &run[3 * PAGE..],
                &{
                    let mut p = [0u8; PAGE];
                    kind.fill_page(7, 125, &mut p);
                    p
                }[..100]
            );
            if kind != DataKind::Zeros {
                // Other pages and other seeds differ (Mixed: over a few pages, as some
                // of its pages are zeros).
                let (mut x, mut y) = (vec![0u8; 8 * PAGE], vec![0u8; 8 * PAGE]);
                kind.fill(7, 0, &mut x);
                kind.fill(8, 0, &mut y);
                assert_ne!(x, y, "{kind}: seed ignored");
                assert!(
                    x.chunks(PAGE).any(|p| p != &x[..PAGE]),
                    "{kind}: index ignored"
                );
            } else {
                assert!(a.iter().all(|&v| v == 0));
            }
        }
        assert_eq!("mixed".parse::<DataKind>(), Ok(DataKind::Mixed));
        assert!("bogus".parse::<DataKind>().is_err());
    }
}
