//! A stored unit as one self-contained byte string (a *packed* unit), to write it to
//! disk as it is stored — compressed — and decode it later without storing it again.
//! The engine writes a unit back this way when the pool passes its share: it writes
//! the compressed bytes (~2.7× fewer on mixed data), not the unit decompressed as
//! zswap's writeback does.
//!
//! ```text
//! [magic "UZU1"][chunks: u16 LE][0: u16]
//! chunks = 0:   [pattern: u64 LE]                     a same-filled unit
//! else, per chunk:
//!   [0][pattern: u64 LE]                                same-filled chunk
//!   [1][payload length: u16 LE][payload]                stored object: its header
//!                                                       (checksum, length, RAW) and bytes
//! ```
//!
//! Decoding checks the layout, each object's checksum and each chunk's decompressed
//! length; anything else is [`Error::BadPacked`], never a panic or bytes outside the
//! output. A whole-string checksum is the caller's (it checks what came back from disk
//! before decoding).

use crate::error::Error;
use crate::handle::{Entry, Handle};
use crate::pool::{Zpool, STORE_HEADER};
use crate::records::{Chunk, Record};
use crate::same_filled::fill;
use crate::unit::{chunk_range, UNIT_CHUNKS};
use crate::UNIT_SIZE;

const MAGIC: &[u8; 4] = b"UZU1";
const HEADER: usize = 8;

impl Zpool {
    /// Show the packed form of unit entry `handle` to `put`, piece by piece.
    fn walk_packed(&self, handle: Handle, mut put: impl FnMut(&[u8])) -> Result<(), Error> {
        if !handle.is_unit() {
            return Err(Error::InvalidHandle(handle));
        }
        put(MAGIC);
        let mut same = |pattern: u64| {
            put(&[0, 0, 0, 0]);
            put(&pattern.to_le_bytes());
        };
        let chunks = match handle.entry() {
            Entry::SameFilled { pattern, .. } => {
                same(pattern);
                return Ok(());
            }
            Entry::Object(_) => return Err(Error::InvalidHandle(handle)),
            Entry::Record {
                shard, idx, gen, ..
            } => match self.records.get(shard, idx, gen) {
                Some(Record::SameFilled(pattern)) => {
                    same(pattern);
                    return Ok(());
                }
                Some(Record::Unit(chunks)) => chunks,
                None => return Err(Error::InvalidHandle(handle)),
            },
        };
        put(&(chunks.len() as u16).to_le_bytes());
        put(&[0, 0]);
        for c in chunks.iter() {
            match *c {
                Chunk::SameFilled(pattern) => {
                    put(&[0]);
                    put(&pattern.to_le_bytes());
                }
                Chunk::Object(obj) => {
                    let shown = self.objects.read(obj, |payload| {
                        let len = crate::pool::stored_len(payload)?;
                        let p = payload.get(..STORE_HEADER + len)?;
                        put(&[1]);
                        put(&(p.len() as u16).to_le_bytes());
                        put(p);
                        Some(())
                    });
                    if shown.flatten().is_none() {
                        return Err(Error::Corrupt(handle));
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes of the packed form of unit entry `handle`.
    pub fn packed_len(&self, handle: Handle) -> Result<usize, Error> {
        let mut n = 0;
        self.walk_packed(handle, |b| n += b.len())?;
        Ok(n)
    }

    /// Write the packed form of unit entry `handle` at the start of `out` (at least
    /// [`Zpool::packed_len`] long); its length. The entry stays stored.
    pub fn export_unit(&self, handle: Handle, out: &mut [u8]) -> Result<usize, Error> {
        let mut at = 0;
        let mut short = false;
        self.walk_packed(handle, |b| match out.get_mut(at..at + b.len()) {
            Some(dst) => {
                dst.copy_from_slice(b);
                at += b.len();
            }
            None => short = true,
        })?;
        if short {
            return Err(Error::WrongLength {
                handle,
                expected: self.packed_len(handle)?,
                got: out.len(),
            });
        }
        Ok(at)
    }

    /// Decode a packed unit (from [`Zpool::export_unit`] of this pool, or of a pool
    /// with the same compressor) into `out` (2 MiB).
    pub fn decode_packed_unit(&self, packed: &[u8], out: &mut [u8]) -> Result<(), Error> {
        if out.len() != UNIT_SIZE || packed.get(..4) != Some(MAGIC) {
            return Err(Error::BadPacked);
        }
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(packed.get(at..at + 8)?.try_into().ok()?))
        };
        let half = |at: usize| -> Option<usize> {
            Some(u16::from_le_bytes(packed.get(at..at + 2)?.try_into().ok()?) as usize)
        };
        let chunks = half(4).ok_or(Error::BadPacked)?;
        if chunks == 0 {
            fill(out, word(HEADER).ok_or(Error::BadPacked)?);
            return Ok(());
        }
        if chunks != UNIT_CHUNKS {
            return Err(Error::BadPacked);
        }
        let mut at = HEADER;
        for i in 0..UNIT_CHUNKS {
            let dst = &mut out[chunk_range(i)];
            match packed.get(at) {
                Some(0) => {
                    fill(dst, word(at + 1).ok_or(Error::BadPacked)?);
                    at += 9;
                }
                Some(1) => {
                    let len = half(at + 1).ok_or(Error::BadPacked)?;
                    let payload = packed.get(at + 3..at + 3 + len).ok_or(Error::BadPacked)?;
                    if !self.decode(payload, dst) {
                        return Err(Error::BadPacked);
                    }
                    at += 3 + len;
                }
                _ => return Err(Error::BadPacked),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Compressor, Config, DataKind, Error, Zpool, PAGE_SIZE, UNIT_SIZE};

    fn unit_of(kind: DataKind, seed: u64) -> Box<[u8; UNIT_SIZE]> {
        let mut u = vec![0u8; UNIT_SIZE].into_boxed_slice();
        let mut page = [0u8; PAGE_SIZE];
        for (i, p) in u.chunks_exact_mut(PAGE_SIZE).enumerate() {
            kind.fill_page(seed, i as u64, &mut page);
            p.copy_from_slice(&page);
        }
        u.try_into().expect("2 MiB")
    }

    /// Every kind of unit entry (chunks compressed, raw, same-filled; a unit all one
    /// word) comes back exact from its packed form, smaller than 2 MiB where it
    /// compresses, with both compressors; after the entry is freed too.
    #[test]
    fn packed_units_decode_exact() {
        for c in [Compressor::Lz4, Compressor::Zstd { level: 1 }] {
            let pool = Zpool::new(Config {
                compressor: c,
                max_compressed_percent: 100,
                ..Default::default()
            })
            .unwrap();
            let mut words = vec![0u8; UNIT_SIZE];
            for w in words.chunks_exact_mut(8) {
                w.copy_from_slice(&0x0101_0101_0101_0101u64.to_le_bytes());
            }
            let words: Box<[u8; UNIT_SIZE]> = words.into_boxed_slice().try_into().unwrap();
            let mut half_random = unit_of(DataKind::Text, 3);
            half_random[..UNIT_SIZE / 2]
                .copy_from_slice(&unit_of(DataKind::Random, 4)[..UNIT_SIZE / 2]);
            for (name, unit) in [
                ("mixed", unit_of(DataKind::Mixed, 1)),
                ("zeros", unit_of(DataKind::Zeros, 1)),
                ("one word", words),
                ("half random", half_random),
            ] {
                let h = pool.store_unit(&unit).unwrap();
                let n = pool.packed_len(h).unwrap();
                let mut packed = vec![0u8; n + 100];
                assert_eq!(pool.export_unit(h, &mut packed).unwrap(), n);
                assert!(pool.export_unit(h, &mut vec![0u8; n - 1]).is_err(), "short");
                packed.truncate(n);
                if name == "mixed" {
                    assert!(n < UNIT_SIZE / 2, "{c} {name}: {n} bytes");
                }
                pool.free(h).unwrap();
                let mut out = vec![0xa5u8; UNIT_SIZE];
                pool.decode_packed_unit(&packed, &mut out).unwrap();
                assert!(out[..] == unit[..], "{c} {name}");
            }
        }
    }

    /// A damaged or cut packed unit is refused, never a panic; a page's handle has no
    /// packed form.
    #[test]
    fn damaged_packed_units_are_refused() {
        let pool = Zpool::new(Config::default()).unwrap();
        let unit = unit_of(DataKind::Mixed, 9);
        let h = pool.store_unit(&unit).unwrap();
        let mut packed = vec![0u8; pool.packed_len(h).unwrap()];
        pool.export_unit(h, &mut packed).unwrap();
        let mut out = vec![0u8; UNIT_SIZE];
        for cut in [0, 3, 8, packed.len() / 2, packed.len() - 1] {
            assert_eq!(
                pool.decode_packed_unit(&packed[..cut], &mut out),
                Err(Error::BadPacked),
                "cut at {cut}"
            );
        }
        let mut step = 1;
        let mut at = 0;
        while at < packed.len() {
            let mut bad = packed.clone();
            bad[at] ^= 0x40;
            // Flips in a payload fail its checksum; in the layout, its parse. (A flip
            // in a same-filled word changes the bytes: the caller's checksum over the
            // whole string catches that.)
            let _ = pool.decode_packed_unit(&bad, &mut out);
            at += step;
            step += 7;
        }
        assert!(pool
            .decode_packed_unit(&packed, &mut out[..UNIT_SIZE - 1])
            .is_err());
        let page = pool.store_page(&[7u8; PAGE_SIZE]).unwrap();
        assert!(pool.export_unit(page, &mut packed).is_err());
        assert!(pool.packed_len(page).is_err());
    }
}
