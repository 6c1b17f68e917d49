//! A compressed-memory store for uswap's compressed tier (zswap-style): 4 KiB pages
//! and whole 2 MiB units, compressed with lz4 (default) or zstd, packed densely in
//! size classes the way the kernel's zsmalloc does, and charged honestly: every byte
//! it holds is in [`Zpool::pool_bytes`] or [`Zpool::metadata_bytes`].
//!
//! ```
//! use uswap_zpool::{Config, Zpool, Reject, DataKind, PAGE_SIZE};
//! let pool = Zpool::new(Config::default())?;
//! let mut page = [0u8; PAGE_SIZE];
//! DataKind::Text.fill_page(1, 0, &mut page);
//! let h = pool.store_page(&page).expect("text compresses");
//! let mut back = [0u8; PAGE_SIZE];
//! pool.load(h, &mut back)?;           // decompress; the entry stays
//! assert_eq!(back, page);
//! pool.free(h)?;                      // writeback = load, write elsewhere, free
//! DataKind::Random.fill_page(1, 0, &mut page);
//! assert_eq!(pool.store_page(&page), Err(Reject::PoorCompression));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is where
//! | module | concept |
//! |---|---|
//! | `pool` | [`Zpool`]: settings, store/load/free of pages, stats, compaction |
//! | `unit` | 2 MiB units: one entry made of 16 KiB chunks, loaded straight into the caller's buffer |
//! | `compressor` | lz4 / zstd, per-thread state, no allocation per call |
//! | `same_filled` | pages of one repeated 64-bit word, kept as the word |
//! | `checksum` | xxh3 over the stored bytes, verified on every load (numbers there) |
//! | `handle` | [`Handle`]: 48-bit, stable while compaction moves objects |
//! | `records` | sharded table of units and odd same-filled words |
//! | `zsmalloc` | the object allocator: arena (mmap'd spans), size classes, zspages, per-class locks, compaction |
//! | `slab` | generation-checked tables (handle tables, records) |
//! | `stats` | [`ZpoolStats`]: counters and gauges |
//! | `datagen` | [`DataKind`]: deterministic benchmark data (zeros, text, random, mixed ≈ 2.65:1 lz4) |
//!
//! # Entries
//! - A page that is **same-filled** (every u64 word equal) is kept as its word: in the
//!   handle itself when the word is a repeated 32-bit value (zeros, 0xff..), else in a
//!   small record (one table entry). No object, no pool memory.
//! - Any other page is compressed; if the result is over the accept threshold
//!   ([`Config::max_compressed_percent`], default 80%) it is refused with
//!   [`Reject::PoorCompression`] and the engine sends it to the next tier. Otherwise it
//!   becomes one object: checksum, length, compressed bytes.
//! - A **unit** is one entry too: same-filled whole, or cut into 16 KiB chunks (each
//!   same-filled, compressed, or raw), accepted or refused as a whole, and decompressed
//!   chunk by chunk straight into the caller's 2 MiB buffer.
//! - Memory: objects live in zspages (spans of 1–16 pages taken from `mmap`'d arenas)
//!   shared by objects of one size class; a span whose last object goes is given back
//!   with `MADV_DONTNEED` at once. [`Zpool::compact`] moves objects out of sparse
//!   zspages so that more of them empty. A byte limit ([`Zpool::set_limit`], changeable
//!   any time) refuses stores with [`Reject::PoolFull`] rather than pass it.
//! - Integrity: a load checks the checksum before decompressing and returns
//!   [`Error::Corrupt`] on a mismatch — never wrong bytes.
//!
//! # Threads
//! [`Zpool`] is `Sync`. Each size class has its own `RwLock`: loads share it, stores,
//! frees and compaction steps take it alone, and loads of different classes never
//! touch the same lock. Compression happens before any lock is taken. Units and odd
//! same-filled words are kept in 16 shards, one per storing thread (round-robin).
//! The caller must not free a handle while loading it (the engine holds the page's
//! lock); if it does, the load fails with an error but nothing unsafe happens.
//!
//! # Costs on the hot path
//! - `load` of a page: one shared lock, checksum of the stored bytes (~0.1–0.2 µs for
//!   a typical 1.4 KiB), decompression into the caller's buffer; no allocation, no copy.
//! - `store_page`: same-filled check, compression into a per-thread buffer and the
//!   checksum, all before any lock; then one exclusive class lock for one copy into the
//!   object. It allocates only when a table grows by a chunk or a class needs a new
//!   zspage (then also `mmap`/touch of its pages).
//! - `store_unit`: one allocation (the unit's chunk list, ~2 KiB; now and then also a
//!   table chunk for its ~130 objects) and a pooled ~2 MiB
//!   scratch buffer for the compressed chunks (counted in the metadata and the limit;
//!   two are kept, [`Zpool::release_unit_scratch`] frees them).
//!
//! # Memory the pool holds
//! `pool_bytes` is the zspages, every page of which is resident (touched when handed
//! out; `MADV_NOHUGEPAGE` keeps 4 KiB frees real), so it equals what the kernel has
//! mapped in the pool's arenas (the crate's tests check it against
//! `/proc/self/pagemap`). `metadata_bytes` is every heap byte the pool holds (a test
//! checks it against a counting allocator, byte for byte): handle and zspage tables
//! (they grow and shrink in ~3–6 KiB chunks), zspage bitmaps, unit records, unit
//! scratch, the class table. What it keeps after everything is freed: the empty class
//! table (~60 KiB) and 8 bytes per freed zspage of address-reuse lists (the address
//! space itself is reserved with `MAP_NORESERVE` in 64 MiB chunks and costs nothing).
//! Not counted: each thread's compressor state (see `compressor`) and ~4 KiB page
//! scratch, which belong to the calling threads.
//!
//! # Benchmark
//! `cargo run --release -p uswap-zpool --example zpool_bench` (flags in
//! `examples/zpool_bench.rs`): store and load throughput and p50/p99 latency per page
//! and per unit, for each data kind and compressor, every byte checked.

mod checksum;
mod compressor;
pub mod datagen;
mod error;
mod export;
mod handle;
mod pool;
mod records;
mod same_filled;
pub use same_filled::same_filled;
mod slab;
mod stats;
mod unit;
mod zsmalloc;

pub use compressor::{Compressor, DEFAULT_ZSTD_LEVEL};
pub use datagen::DataKind;
pub use error::{ConfigError, Error, Reject};
pub use handle::Handle;
pub use pool::{Config, Zpool, DEFAULT_MAX_COMPRESSED_PERCENT};
pub use stats::ZpoolStats;
pub use unit::{PreparedUnit, UNIT_CHUNK};

/// Bytes in a page.
pub const PAGE_SIZE: usize = 4096;
/// Bytes in a unit (one 2 MiB huge page).
pub const UNIT_SIZE: usize = 2 << 20;

#[cfg(test)]
mod tests;
