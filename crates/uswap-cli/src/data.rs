//! What the workloads write (`--data zeros|text|random|mixed`): pages of one kind of
//! data, each a function of (seed, page, version), so that a page can be written and
//! later checked word by word without keeping a copy, for about the cost of a copy from
//! a small table.
//!
//! A [`Pattern`] holds [`TEMPLATES`] pages of its kind from uswap-zpool's generator
//! ([`DataKind::fill_page`]: `mixed` compresses ~2.65:1 with lz4, like real anonymous
//! memory; see its module doc): one in eight of [`CANDIDATES`] generated pages, taken
//! evenly over their lz4 sizes, so that the table compresses as the generator's pages do
//! whatever the seed (512 pages drawn at random missed by up to 11%, the share of zero
//! and random pages varying from draw to draw). Page `p` at version `v` is template
//! `(h(seed, p) + v) mod TEMPLATES`, changed so that it is a page of its own:
//! - a *zero* template stays all zero (the kernel and uswap keep zero pages without
//!   memory) and a template of *one repeated word* stays one, of a word that is a hash
//!   of (seed, p, v);
//! - any *other* template gets every byte XORed with one byte `k` (1–255) of (seed, p,
//!   v), and word 0 replaced by that hash (the stamp). A byte-wise XOR keeps every
//!   repeat inside the page and the byte statistics, so the page compresses as its
//!   template does (lz4 and zstd within a percent), while two pages of one template do
//!   not repeat each other (a 2 MiB unit compressed whole finds no repeats that real data
//!   would not have);
//! - no two neighbours in the table are both zero templates, so versions `v` and `v + 1`
//!   of a page always differ: every rewrite changes the page, and a lost write (a stale
//!   copy brought back) is caught by the next check.
//!
//! `zeros` writes zero pages only: its checks catch any changed word, but not a lost
//! write (every version is the same bytes).

use crate::workloads::{page_base, splitmix64, PAGE_WORDS, POPULATE_VERSION};
pub use uswap_zpool::DataKind;

/// Template pages per pattern (2 MiB of table: enough that the mix of kinds in `mixed`
/// is close to its generator's, small enough to stay in the caches).
pub const TEMPLATES: usize = 512;

/// Pages generated to choose the templates from.
pub const CANDIDATES: usize = 8 * TEMPLATES;

/// The word of an *other* page that holds the stamp.
pub const STAMP_WORD: usize = 0;

/// What a template page is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// All zero.
    Zero,
    /// One word repeated (not zero).
    Same,
    /// Anything else.
    Other,
}

/// The pages of one kind of data for one seed.
pub struct Pattern {
    kind: DataKind,
    seed: u64,
    /// `TEMPLATES` pages, word after word.
    words: Box<[u64]>,
    shapes: Box<[Shape]>,
    /// A zero page, the base of zero and same-filled pages.
    zero: Box<[u64]>,
}

/// What one page holds at one version: word `w` is [`PageImage::word`].
#[derive(Clone, Copy)]
pub struct PageImage<'a> {
    rest: &'a [u64],
    key: u64,
    first: u64,
}

impl PageImage<'_> {
    /// Word `w` of the page.
    #[inline]
    pub fn word(&self, w: usize) -> u64 {
        if w == STAMP_WORD {
            self.first
        } else {
            self.rest[w] ^ self.key
        }
    }
}

fn shape_of(page: &[u64]) -> Shape {
    match page[0] {
        0 if page.iter().all(|&w| w == 0) => Shape::Zero,
        x if page.iter().all(|&w| w == x) => Shape::Same,
        _ => Shape::Other,
    }
}

impl Pattern {
    /// The pattern of `kind` for `seed` (makes the table: a few milliseconds).
    pub fn new(kind: DataKind, seed: u64) -> Pattern {
        let mut buf = [0u8; PAGE_WORDS * 8];
        // Sizes first, pages after: the candidates are not kept (16 MiB of them would
        // stay in the heap of a benchmark whose memory is measured).
        let mut sized: Vec<(usize, u64)> = (0..CANDIDATES as u64)
            .map(|i| {
                kind.fill_page(seed, i, &mut buf);
                (lz4_flex::block::compress(&buf).len(), i)
            })
            .collect();
        sized.sort_unstable();
        let step = CANDIDATES / TEMPLATES;
        let mut zeros = Vec::new();
        let mut others = Vec::new();
        for &(_, i) in sized.iter().skip(step / 2).step_by(step) {
            kind.fill_page(seed, i, &mut buf);
            let page: Vec<u64> = buf
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .collect();
            match shape_of(&page) {
                Shape::Zero => zeros.push(page),
                _ => others.push(page),
            }
        }
        // Spread the zero pages evenly between the others, never two side by side
        // (possible while they are fewer; `zeros` has no others).
        let order: Vec<Vec<u64>> = if zeros.len() < others.len() && !zeros.is_empty() {
            let (z, n) = (zeros.len(), others.len());
            let mut out = Vec::with_capacity(z + n);
            let mut zs = zeros.into_iter();
            for (i, page) in others.into_iter().enumerate() {
                out.push(page);
                if (i + 1) * z / n > i * z / n {
                    out.extend(zs.next());
                }
            }
            out
        } else {
            others.into_iter().chain(zeros).collect()
        };
        let shapes = order.iter().map(|p| shape_of(p)).collect();
        Pattern {
            kind,
            seed,
            words: order.concat().into_boxed_slice(),
            shapes,
            zero: vec![0; PAGE_WORDS].into_boxed_slice(),
        }
    }

    /// The kind of data.
    #[cfg(test)]
    pub fn kind(&self) -> DataKind {
        self.kind
    }

    /// What `page` holds at `version`.
    #[inline]
    pub fn page(&self, page: u64, version: u32) -> PageImage<'_> {
        let t = (splitmix64(self.seed ^ page.wrapping_mul(0x9FB2_1C65_1E98_DF25))
            .wrapping_add(u64::from(version))
            % TEMPLATES as u64) as usize;
        let stamp = page_base(self.seed, page, version) | 1;
        match self.shapes[t] {
            Shape::Zero => PageImage {
                rest: &self.zero,
                key: 0,
                first: 0,
            },
            Shape::Same => PageImage {
                rest: &self.zero,
                key: stamp,
                first: stamp,
            },
            Shape::Other => PageImage {
                rest: &self.words[t * PAGE_WORDS..(t + 1) * PAGE_WORDS],
                key: (1 + (stamp >> 32) % 255) * 0x0101_0101_0101_0101,
                first: stamp,
            },
        }
    }

    /// pmbench's touched word `w` of `page` at `version`: as populated at
    /// [`POPULATE_VERSION`], then a hash of (seed, page, version) for each write (0 with
    /// `zeros`), so that every write changes it.
    #[inline]
    pub fn touched(&self, page: u64, version: u32, w: usize) -> u64 {
        if version == POPULATE_VERSION {
            self.page(page, version).word(w)
        } else if self.kind == DataKind::Zeros {
            0
        } else {
            page_base(self.seed, page, version) | 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(img: PageImage<'_>) -> Vec<u8> {
        (0..PAGE_WORDS)
            .flat_map(|w| img.word(w).to_le_bytes())
            .collect()
    }

    /// lz4 ratio of pages compressed one by one (bytes in / bytes out).
    fn lz4_ratio(pages: impl Iterator<Item = Vec<u8>>) -> f64 {
        let (mut inb, mut out) = (0usize, 0usize);
        for p in pages {
            inb += p.len();
            out += lz4_flex::block::compress(&p).len();
        }
        inb as f64 / out as f64
    }

    /// The pages compress like the generator's pages of the same kind (the table is a
    /// fair sample, and the XOR and the stamp change nothing that matters), every
    /// version differs from the one before, and zero pages stay zero.
    #[test]
    fn pages_compress_like_their_kind_and_every_version_differs() {
        for kind in DataKind::ALL {
            for seed in [1u64, 7, 1234] {
                let p = Pattern::new(kind, seed);
                let pages = 2048u64;
                let ours = lz4_ratio((0..pages).map(|i| bytes(p.page(i, 3))));
                let theirs = lz4_ratio((0..pages).map(|i| {
                    let mut b = vec![0u8; 4096];
                    kind.fill_page(seed + 99, i, &mut b);
                    b
                }));
                println!("{kind} seed {seed}: pattern {ours:.2}, generator {theirs:.2}");
                match kind {
                    DataKind::Zeros => assert!(ours > 50.0, "{kind}: {ours:.2}"),
                    _ => assert!(
                        (ours / theirs - 1.0).abs() < 0.05,
                        "{kind} seed {seed}: pattern {ours:.2} vs generator {theirs:.2}"
                    ),
                }
                let mut zero_pages = 0;
                for page in 0..300u64 {
                    let a = bytes(p.page(page, 5));
                    let b = bytes(p.page(page, 6));
                    if a.iter().all(|&x| x == 0) {
                        zero_pages += 1;
                    }
                    if kind != DataKind::Zeros {
                        assert_ne!(a, b, "{kind}: page {page}, versions 5 and 6 equal");
                        assert_ne!(p.touched(page, 5, 9), p.touched(page, 6, 9));
                    } else {
                        assert!(a.iter().chain(&b).all(|&x| x == 0));
                        assert_eq!(p.touched(page, 6, 9), 0);
                    }
                    assert_eq!(p.touched(page, POPULATE_VERSION, 9), {
                        p.page(page, POPULATE_VERSION).word(9)
                    });
                }
                match kind {
                    DataKind::Mixed => assert!(
                        (30..120).contains(&zero_pages),
                        "mixed: {zero_pages} zero pages of 300"
                    ),
                    DataKind::Zeros => assert_eq!(zero_pages, 300),
                    _ => assert_eq!(zero_pages, 0, "{kind}"),
                }
            }
        }
    }

    /// Pages of a 2 MiB unit do not repeat each other: the unit compressed whole is
    /// about as big as its pages compressed one by one (random stays incompressible).
    #[test]
    fn a_unit_compressed_whole_finds_no_repeats_between_pages() {
        for kind in [DataKind::Random, DataKind::Text, DataKind::Mixed] {
            let p = Pattern::new(kind, 5);
            let unit: Vec<u8> = (0..512u64).flat_map(|i| bytes(p.page(i, 2))).collect();
            let whole = lz4_flex::block::compress(&unit).len() as f64;
            let by_page: usize = unit
                .chunks(4096)
                .map(|c| lz4_flex::block::compress(c).len())
                .sum();
            assert!(
                whole > 0.9 * by_page as f64,
                "{kind}: whole {whole} vs pages {by_page}"
            );
        }
    }

    #[test]
    fn depends_on_seed_page_and_version() {
        let t0 = std::time::Instant::now();
        let _ = Pattern::new(DataKind::Mixed, 3);
        println!("Pattern::new(mixed): {:?}", t0.elapsed());
        let p = Pattern::new(DataKind::Text, 1);
        let q = Pattern::new(DataKind::Text, 2);
        assert_ne!(bytes(p.page(10, 1)), bytes(q.page(10, 1)), "seed");
        assert_ne!(bytes(p.page(10, 1)), bytes(p.page(11, 1)), "page");
        assert_ne!(bytes(p.page(10, 1)), bytes(p.page(10, 2)), "version");
        assert_eq!(bytes(p.page(10, 1)), bytes(p.page(10, 1)), "deterministic");
        assert_eq!(p.kind(), DataKind::Text);
    }
}
