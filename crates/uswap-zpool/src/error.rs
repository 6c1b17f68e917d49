//! What can go wrong: a store the pool declines ([`Reject`]), a load or free that fails
//! ([`Error`]), settings that cannot work ([`ConfigError`]).

use crate::Handle;

/// Why a page or unit was not stored. The engine sends it on to the next tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Its compressed size is over the pool's threshold
    /// ([`Config::max_compressed_percent`](crate::Config::max_compressed_percent) of its
    /// size): storing it would save too little.
    #[error("compresses poorly (over the pool's accept threshold)")]
    PoorCompression,
    /// Storing it would pass the pool's byte limit.
    #[error("the compressed pool is at its byte limit")]
    PoolFull,
}

/// Why a load or free failed. The caller's buffer may have been partly written; it
/// never holds another entry's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No entry has this handle: freed already, or never made by this pool.
    #[error("handle {0} names no stored entry (freed, or from another pool)")]
    InvalidHandle(Handle),
    /// The buffer's length is not the entry's (4096 for a page, 2 MiB for a unit).
    #[error("buffer of {got} bytes for handle {handle} of {expected} bytes")]
    WrongLength {
        /// The handle.
        handle: Handle,
        /// Bytes the entry holds.
        expected: usize,
        /// Bytes the buffer has.
        got: usize,
    },
    /// The stored bytes fail their checksum or do not decompress: the pool's memory was
    /// damaged. The entry stays stored (free it as usual).
    #[error("stored data of handle {0} is corrupt (checksum or decompression failed)")]
    Corrupt(Handle),
    /// A packed unit ([`Zpool::decode_packed_unit`](crate::Zpool::decode_packed_unit))
    /// is damaged: its layout, a checksum or a decompression failed.
    #[error("packed unit is damaged (layout, checksum or decompression)")]
    BadPacked,
}

/// Settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad compressed pool settings: {0}")]
pub struct ConfigError(pub String);
