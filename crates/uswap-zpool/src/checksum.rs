//! The checksum every stored object carries: xxh3 (xxhash-rust) of the stored bytes,
//! truncated to 32 bits, checked before they are decompressed.
//!
//! It covers the bytes as they sit in the pool (compressed, or raw for an incompressible
//! unit chunk): that is what stray writes or bad memory can damage, it is ~1/3 of the
//! bytes of the page on typical data, and the decompressor then never sees damaged
//! input. A 32-bit sum misses a random corruption with probability 2^-32.
//!
//! Chosen against crc32c (crate crc32c, SSE4.2) by measurement on this project's VM
//! (`cargo run --release -p uswap-zpool --example zpool_bench -- checksums`: one
//! thread, 2 M calls, 3 rounds; generic x86-64 build; two sittings on a noisy shared
//! machine, so ranges). xxh3 was faster in every round:
//!
//! | input | xxh3 | crc32c |
//! |---|---|---|
//! | 4 KiB random page | 293–528 ns (8–14 GB/s) | 382–689 ns (6–11 GB/s) |
//! | 1400 B (a typical compressed page) | 114–185 ns (8–12 GB/s) | 189–475 ns (3–7 GB/s) |

/// Checksum of `bytes`.
#[inline]
pub(crate) fn checksum(bytes: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(bytes) as u32
}
