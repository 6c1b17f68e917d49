//! The compressors: lz4 (the default) and zstd at a chosen level.
//!
//! lz4 compresses with `lz4_flex` and decompresses with liblz4 (the `lz4` crate): one
//! block format. `lz4_flex` copies an overlapping match byte by byte, and memory is full
//! of long runs: a page of one word and zeros took 7.1 µs to decompress with it, 0.21 µs
//! with liblz4 (`examples/lz4_decoders.rs`), and a fault pays for decompression (compression costs the same in both;
//! `lz4_flex` keeps its hash table per thread, where liblz4's would be allocated per call).
//!
//! Both keep their state per thread, made on a thread's first use and reused after, so
//! compressing and decompressing allocate nothing: lz4_flex's 8 KiB hash table, zstd's
//! compression context (a few hundred KiB at level 1–3 for 16 KiB inputs) and its
//! decompression context (~100 KiB). That memory belongs to the calling threads (the
//! engine's fault and reclaim threads), not to a pool, and is not in `metadata_bytes`.

use std::cell::RefCell;

/// Which compressor a pool uses (chosen at construction).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Compressor {
    /// LZ4 block format: ~1.0 GB/s compress and ~2 GB/s decompress on mixed data here.
    #[default]
    Lz4,
    /// LZ4 block format with liblz4's acceleration (2-64): faster to compress, less
    /// small. Whole units of mixed data (`examples/lz4_speeds.rs`, one thread):
    /// acceleration 4 ~1.16 GB/s at 2.59:1, 8 ~1.38 GB/s at 2.35:1, 16 ~1.73 GB/s at
    /// 2.10:1, against `Lz4`'s ~1.04 GB/s at 2.71:1. Decompressed as `Lz4`.
    Lz4Fast {
        /// liblz4's acceleration factor.
        acceleration: i32,
    },
    /// Zstandard at `level` (1–22, negative for faster; 1 and 3 are the useful ones
    /// here): ~10–20% smaller than lz4 at 3–5× the cost.
    Zstd {
        /// zstd compression level.
        level: i32,
    },
}

impl std::fmt::Display for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compressor::Lz4 => write!(f, "lz4"),
            Compressor::Lz4Fast { acceleration } => write!(f, "lz4:{acceleration}"),
            Compressor::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

impl std::str::FromStr for Compressor {
    type Err = String;

    /// `lz4`, `lz4:ACCELERATION` (2-64), `zstd` (level 1) or `zstd:LEVEL` (a level zstd
    /// has): checked here, so that a command line or a setting is refused where it is
    /// read.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lz4" => Ok(Compressor::Lz4),
            "zstd" => Ok(Compressor::Zstd {
                level: DEFAULT_ZSTD_LEVEL,
            }),
            _ => {
                let c = if let Some(Ok(level)) = s.strip_prefix("zstd:").map(str::parse) {
                    Compressor::Zstd { level }
                } else if let Some(Ok(acceleration)) = s.strip_prefix("lz4:").map(str::parse) {
                    Compressor::Lz4Fast { acceleration }
                } else {
                    return Err(format!(
                        "unknown compressor {s:?}: expected lz4, lz4:ACCELERATION (2-64), \
                         zstd or zstd:LEVEL"
                    ));
                };
                c.check().map_err(|e| format!("compressor {s:?}: {e}"))?;
                Ok(c)
            }
        }
    }
}

/// zstd's level when none is given: the fastest positive level (the fault path pays
/// for decompression, and level 1 decompresses as fast as any).
pub const DEFAULT_ZSTD_LEVEL: i32 = 1;

thread_local! {
    static LZ4_TABLE: RefCell<lz4_flex::block::CompressTable> =
        RefCell::new(lz4_flex::block::CompressTable::small());
    static ZSTD_COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

impl Compressor {
    /// Whether the settings are usable; the reason if not.
    pub(crate) fn check(&self) -> Result<(), String> {
        match *self {
            Compressor::Lz4 => Ok(()),
            Compressor::Lz4Fast { acceleration } => {
                if (2..=64).contains(&acceleration) {
                    Ok(())
                } else {
                    Err(format!(
                        "lz4 acceleration {acceleration} is outside 2..=64 (1 is plain lz4)"
                    ))
                }
            }
            Compressor::Zstd { level } => {
                let range = zstd::compression_level_range();
                if range.contains(&level) {
                    Ok(())
                } else {
                    Err(format!(
                        "zstd level {level} is outside {}..={}",
                        range.start(),
                        range.end()
                    ))
                }
            }
        }
    }

    /// Room `compress` needs in `dst` for `len` input bytes.
    pub(crate) fn max_output(&self, len: usize) -> usize {
        match self {
            // (lz4_flex's bound is above liblz4's LZ4_compressBound.)
            Compressor::Lz4 | Compressor::Lz4Fast { .. } => {
                lz4_flex::block::get_maximum_output_size(len)
            }
            Compressor::Zstd { .. } => zstd::zstd_safe::compress_bound(len),
        }
    }

    /// Compress `src` into `dst` (at least `max_output(src.len())` long); the length.
    /// `None` only if the compressor failed, which it does not for in-memory buffers of
    /// that size.
    pub(crate) fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        match *self {
            Compressor::Lz4 => LZ4_TABLE.with_borrow_mut(|table| {
                lz4_flex::block::compress_into_with_table(src, dst, table).ok()
            }),
            // LZ4_compress_fast keeps its table on the stack (16 KiB): no allocation.
            Compressor::Lz4Fast { acceleration } => {
                let mode = lz4::block::CompressionMode::FAST(acceleration);
                lz4::block::compress_to_buffer(src, Some(mode), false, dst).ok()
            }
            Compressor::Zstd { level } => ZSTD_COMPRESSOR.with_borrow_mut(|slot| {
                if slot.as_ref().is_some_and(|(l, _)| *l != level) {
                    // Another pool on this thread uses another level.
                    let (l, c) = slot.as_mut().expect("checked");
                    c.set_compression_level(level).ok()?;
                    *l = level;
                }
                if slot.is_none() {
                    *slot = Some((level, zstd::bulk::Compressor::new(level).ok()?));
                }
                let (_, c) = slot.as_mut().expect("made above");
                c.compress_to_buffer(src, dst).ok()
            }),
        }
    }

    /// Decompress `src` into all of `dst`. `false` if `src` is not a valid stream of
    /// exactly `dst.len()` bytes (never reads or writes outside the two slices).
    pub(crate) fn decompress(&self, src: &[u8], dst: &mut [u8]) -> bool {
        match self {
            Compressor::Lz4 | Compressor::Lz4Fast { .. } => {
                let want = dst.len();
                i32::try_from(want).is_ok_and(|n| {
                    lz4::block::decompress_to_buffer(src, Some(n), dst).ok() == Some(want)
                })
            }
            Compressor::Zstd { .. } => ZSTD_DECOMPRESSOR.with_borrow_mut(|slot| {
                if slot.is_none() {
                    *slot = zstd::bulk::Decompressor::new().ok();
                }
                match slot.as_mut() {
                    Some(d) => d.decompress_to_buffer(src, dst).ok() == Some(dst.len()),
                    None => false,
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        assert_eq!("lz4".parse::<Compressor>(), Ok(Compressor::Lz4));
        assert_eq!(
            "zstd".parse::<Compressor>(),
            Ok(Compressor::Zstd { level: 1 })
        );
        assert_eq!(
            "zstd:3".parse::<Compressor>(),
            Ok(Compressor::Zstd { level: 3 })
        );
        assert!("zstd:x".parse::<Compressor>().is_err());
        let e = "zstd:99".parse::<Compressor>().unwrap_err();
        assert!(e.contains("zstd:99") && e.contains("outside"), "{e}");
        assert!("gzip".parse::<Compressor>().is_err());
        assert_eq!(
            "lz4:8".parse::<Compressor>(),
            Ok(Compressor::Lz4Fast { acceleration: 8 })
        );
        assert_eq!(Compressor::Lz4Fast { acceleration: 8 }.to_string(), "lz4:8");
        for bad in ["lz4:1", "lz4:65", "lz4:0", "lz4:x", "lz4:"] {
            let e = bad.parse::<Compressor>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert_eq!(Compressor::Zstd { level: 3 }.to_string(), "zstd:3");
        assert!(Compressor::Zstd { level: 1000 }.check().is_err());
        assert!(Compressor::Zstd { level: 3 }.check().is_ok());
    }

    /// Long runs (overlapping matches) come back exact through the other library's
    /// decoder: a page of one word and zeros, a run of one byte, a 2-byte period.
    #[test]
    fn runs_round_trip_exact() {
        let mut one_word = vec![0u8; 4096];
        one_word[8..16].copy_from_slice(&0x0123_4567_89ab_cdefu64.to_le_bytes());
        let ones = vec![0x5au8; 16 * 1024 - 16];
        let period: Vec<u8> = (0..4096).map(|i| if i % 2 == 0 { 7 } else { 9 }).collect();
        let fast = Compressor::Lz4Fast { acceleration: 8 };
        for (src, c) in [one_word, ones, period]
            .into_iter()
            .flat_map(|s| [(s.clone(), Compressor::Lz4), (s, fast)])
        {
            let mut dst = vec![0; c.max_output(src.len())];
            let n = c.compress(&src, &mut dst).unwrap();
            assert!(n < src.len() / 32, "{n} bytes");
            let mut out = vec![0xffu8; src.len()];
            assert!(c.decompress(&dst[..n], &mut out));
            assert_eq!(out, src);
            assert!(!c.decompress(&dst[..n], &mut out[..src.len() - 1]));
            let mut long = vec![0u8; src.len() + 1];
            assert!(
                !c.decompress(&dst[..n], &mut long),
                "one byte short of the buffer"
            );
        }
    }

    #[test]
    fn round_trip_and_garbage_is_refused() {
        let src: Vec<u8> = (0..4096u32)
            .map(|i| (i % 251) as u8 ^ (i / 97) as u8)
            .collect();
        for c in [
            Compressor::Lz4,
            Compressor::Zstd { level: 1 },
            Compressor::Zstd { level: 3 },
        ] {
            let mut dst = vec![0; c.max_output(src.len())];
            let n = c.compress(&src, &mut dst).unwrap();
            assert!(n < src.len());
            let mut out = vec![0; 4096];
            assert!(c.decompress(&dst[..n], &mut out));
            assert_eq!(out, src);
            // Wrong length wanted, truncated and flipped inputs: refused, no panic.
            assert!(!c.decompress(&dst[..n], &mut out[..4000]));
            assert!(!c.decompress(&dst[..n / 2], &mut out));
            for i in [0, n / 3, n - 1] {
                let mut bad = dst[..n].to_vec();
                bad[i] ^= 0x5a;
                let _ = c.decompress(&bad, &mut out); // must not panic; may or may not detect
            }
        }
    }
}
