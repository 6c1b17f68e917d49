//! Where an id's value lives in the cluster, and what a value looks like.
//!
//! ## Keys: one Redis hash per group of 512 ids
//!
//! Id `i` (the engine's swap slot), written at generation `g` (the store's write counter),
//! lives in field `<i % 512>:<g, hex>` of the hash
//!
//! ```text
//! uswap:{<prefix: 32 hex digits>.<i / 512, hex>}
//! ```
//!
//! - The generation in the field name makes a write never collide with an older one of the
//!   same id: a delete of the old value still in flight when the slot is reused cannot remove
//!   the new one, and a new write lost in a failover reads as missing (`Lost`), never as the
//!   slot's previous page. The store keeps each live id's generation (8 bytes per id) and
//!   deletes the replaced field once the new write is acknowledged.
//! - The prefix is 128 random bits from the OS (getrandom), made per store: another pool
//!   cannot find this pool's keys by guessing, and a SCAN is the only way to list them (ACLs
//!   can forbid it: `~uswap:*` patterns do not need `KEYS`/`SCAN`).
//! - The whole key is the hash tag `{...}`, so a group lives in one slot: a write of many pages
//!   of a group is one `HSET` on one node (one round trip, one `WAIT`), and the groups of a
//!   pool spread over all the shards.
//! - One `EXPIRE` covers 512 ids: refreshing the TTL of a 100 GiB pool of 4 KiB pages is ~51k
//!   `EXPIRE`s per refresh period, not 26M; deleting the pool at close is one `DEL` per group;
//!   and Redis keeps one key (dict entry, expire entry) per 512 pages. The cost: a group is
//!   served by one shard (ids are dense swap slots, so the groups of a big pool still spread
//!   evenly), and a group holding 512 2 MiB values is a 1 GiB key (slow to migrate when
//!   resharding; the engine gives units ids 512 apart, so a group holds one unit).
//!
//! ## Values: the payload, then a 32-byte trailer
//!
//! ```text
//! 0   payload               n
//! n   magic "USWR"          4
//!     version (3)           2
//!     flags                 2   bit 0: the payload is lz4 (see below); others 0
//!     id                    8   little-endian: the key's identity
//!     generation            8   the store's write counter at this write (never 0)
//!     payload length        4   n
//!     crc32c                4   over the pool's prefix, the payload and the trailer's first 28 bytes
//! ```
//!
//! A payload that lz4 shrinks by at least an eighth is stored compressed (flag bit 0): its
//! original length as 4 bytes little-endian, then the lz4 block (liblz4 through the `lz4`
//! crate, size prepended). The checksum covers the stored bytes, so a value is checked
//! before it is decompressed, and a reader gets the original payload back. Mixed data like
//! real anonymous memory goes over the wire and sits in the cluster's RAM at ~1/2.6 of its
//! size; a payload that does not compress is stored as it is.
//!
//! A trailer, not a header: a value read arrives in a `Vec` with the payload at its start, so
//! opening it is a `truncate`, where a header cost a memmove of the whole payload (2 MiB for
//! a unit) on every read.
//!
//! A read checks all of it: a value of another id (a misplaced or swapped value), of another
//! pool (the prefix is in the checksum), truncated, or flipped is `Corrupt`; an older write of
//! the same id (a write lost in a failover, a slot reused after a lost delete) is `Lost` — the
//! caller never gets another page's bytes or zeros.

use crate::RemoteError;

/// Ids per group (one hash key).
pub const GROUP_IDS: u64 = 512;

/// Bytes of the trailer after every payload.
pub const TRAILER_LEN: usize = 32;

const MAGIC: [u8; 4] = *b"USWR";
/// 3: the flags field (2 had it reserved, 0).
const VERSION: u16 = 3;

/// Flag: the stored payload is lz4 (size-prepended block).
pub const FLAG_LZ4: u16 = 1;

/// The largest payload a compressed value may claim (a bound on what a read allocates).
const MAX_PAYLOAD: usize = 64 << 20;

/// `payload` as it is stored: compressed (with [`FLAG_LZ4`]) when lz4 saves at least an
/// eighth of it, else `None` (store it as it is).
pub fn compress(payload: &[u8]) -> Option<Vec<u8>> {
    if payload.len() < 64 || payload.len() > MAX_PAYLOAD {
        return None;
    }
    let packed = lz4::block::compress(payload, None, true).ok()?;
    (packed.len() <= payload.len() - payload.len() / 8).then_some(packed)
}

/// The per-store private key prefix: 128 random bits.
#[derive(Clone, PartialEq, Eq)]
pub struct Prefix {
    hex: String,
    crc_seed: u32,
}

impl Prefix {
    /// A fresh prefix from the OS's random source.
    pub fn random() -> Result<Prefix, RemoteError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            RemoteError::Config(format!("no OS randomness for the key prefix: {e}"))
        })?;
        Ok(Prefix::from_bytes(bytes))
    }

    fn from_bytes(bytes: [u8; 16]) -> Prefix {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Prefix {
            crc_seed: crc32c::crc32c(&bytes),
            hex,
        }
    }

    /// The prefix as 32 lowercase hex digits.
    pub fn as_hex(&self) -> &str {
        &self.hex
    }

    /// The hash key of a group.
    pub fn group_key(&self, group: u64) -> String {
        format!("uswap:{{{}.{:x}}}", self.hex, group)
    }
}

impl std::fmt::Debug for Prefix {
    // the prefix is what keeps the pool private: keep it out of logs
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prefix(<128 random bits>)")
    }
}

/// The group of an id.
pub fn group_of(id: u64) -> u64 {
    id / GROUP_IDS
}

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag, mod 16384, as Redis Cluster
/// computes it.
pub fn slot_of(key: &str) -> u16 {
    let key = key.as_bytes();
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tag) % 16384
}

fn checksum(prefix: &Prefix, payload: &[u8], trailer: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c_append(prefix.crc_seed, payload), trailer)
}

/// The trailer of a value of `id` at `generation` holding `payload` as stored (written
/// after it), with `flags` ([`FLAG_LZ4`] or 0).
pub fn trailer(
    prefix: &Prefix,
    id: u64,
    generation: u64,
    payload: &[u8],
    flags: u16,
) -> [u8; TRAILER_LEN] {
    let mut h = [0u8; TRAILER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&flags.to_le_bytes());
    h[8..16].copy_from_slice(&id.to_le_bytes());
    h[16..24].copy_from_slice(&generation.to_le_bytes());
    h[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = checksum(prefix, payload, &h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks a value read for `id` (expecting the write of `generation`), strips its trailer
/// (in place: the payload stays where it is) and decompresses a compressed payload.
pub fn open(
    prefix: &Prefix,
    id: u64,
    generation: u64,
    mut value: Vec<u8>,
) -> Result<Vec<u8>, RemoteError> {
    let corrupt = |why: String| Err(RemoteError::Corrupt { id, why });
    if value.len() < TRAILER_LEN {
        return corrupt(format!("{} bytes, shorter than the trailer", value.len()));
    }
    let n = value.len() - TRAILER_LEN;
    let h: [u8; TRAILER_LEN] = value[n..].try_into().expect("length checked");
    if h[0..4] != MAGIC {
        return corrupt("bad magic (not a uswap value)".into());
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != VERSION {
        return corrupt(format!("unknown value version {version}"));
    }
    let len = u32::from_le_bytes(h[24..28].try_into().expect("4 bytes")) as usize;
    if len != n {
        return corrupt(format!("trailer says {len} payload bytes, value holds {n}"));
    }
    let crc = u32::from_le_bytes(h[28..32].try_into().expect("4 bytes"));
    if checksum(prefix, &value[..n], &h[0..28]) != crc {
        return corrupt("checksum mismatch".into());
    }
    // the checksum holds, so these fields are what was written under this pool's prefix
    let value_id = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    if value_id != id {
        return corrupt(format!("holds the value of id {value_id}"));
    }
    let value_gen = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    if value_gen != generation {
        return Err(RemoteError::Lost {
            id,
            why: if value_gen < generation {
                "an older write of this id: the last acknowledged write was lost"
            } else {
                "a newer write of this id than the store acknowledged"
            },
        });
    }
    let flags = u16::from_le_bytes([h[6], h[7]]);
    value.truncate(n);
    match flags {
        0 => Ok(value),
        FLAG_LZ4 => {
            // checked above: these are the bytes this pool wrote; the bound is a guard
            let claimed = value.get(..4).map_or(0, |b| {
                u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize
            });
            if claimed > MAX_PAYLOAD {
                return corrupt(format!("claims {claimed} bytes decompressed"));
            }
            match lz4::block::decompress(&value, None) {
                Ok(payload) if payload.len() == claimed => Ok(payload),
                Ok(payload) => corrupt(format!(
                    "decompressed to {} bytes, claims {claimed}",
                    payload.len()
                )),
                Err(e) => corrupt(format!("does not decompress: {e}")),
            }
        }
        other => corrupt(format!("unknown flags {other:#x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(prefix: &Prefix, id: u64, gen: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = payload.to_vec();
        v.extend_from_slice(&trailer(prefix, id, gen, payload, 0));
        v
    }

    /// As the store writes it: compressed when lz4 pays.
    fn stored(prefix: &Prefix, id: u64, gen: u64, payload: &[u8]) -> (Vec<u8>, bool) {
        match compress(payload) {
            Some(mut v) => {
                let t = trailer(prefix, id, gen, &v, FLAG_LZ4);
                v.extend_from_slice(&t);
                (v, true)
            }
            None => (value(prefix, id, gen, payload), false),
        }
    }

    #[test]
    fn compressed_values_come_back_exact_and_checked() {
        let p = Prefix::random().unwrap();
        // text-like (compresses), zeros (compresses), noise (does not)
        let text: Vec<u8> = (0..2 << 20).map(|i| b"uswap page "[i % 11]).collect();
        let zeros = vec![0u8; 4096];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for (payload, packs) in [(&text, true), (&zeros, true), (&noise, false)] {
            let (v, packed) = stored(&p, 9, 4, payload);
            assert_eq!(packed, packs);
            if packed {
                assert!(v.len() < payload.len() / 2, "{} bytes stored", v.len());
            }
            assert_eq!(&open(&p, 9, 4, v.clone()).unwrap(), payload);
            // damage to the compressed bytes is caught before decompression
            let mut bad = v.clone();
            bad[v.len() / 3] ^= 1;
            assert!(matches!(
                open(&p, 9, 4, bad),
                Err(RemoteError::Corrupt { .. })
            ));
        }
        // a flag this reader does not know, under a good checksum, is refused
        let mut v = zeros.clone();
        v.extend_from_slice(&trailer(&p, 1, 1, &zeros, 4));
        assert!(matches!(
            open(&p, 1, 1, v),
            Err(RemoteError::Corrupt { .. })
        ));
        // a good checksum over bytes that are not lz4, or whose size claim is wrong, is
        // refused, not mapped: a claim past the bound, garbage under a plausible claim,
        // a good block claiming one byte more or less than it holds
        let sealed = |stored: Vec<u8>| {
            let mut v = stored.clone();
            v.extend_from_slice(&trailer(&p, 1, 1, &stored, FLAG_LZ4));
            open(&p, 1, 1, v)
        };
        assert!(matches!(
            sealed(vec![0xffu8; 64]),
            Err(RemoteError::Corrupt { .. })
        ));
        let mut garbage = 4096u32.to_le_bytes().to_vec();
        garbage.extend_from_slice(&[0xf0u8; 60]);
        assert!(matches!(sealed(garbage), Err(RemoteError::Corrupt { .. })));
        let good = compress(&text[..4096]).expect("text compresses");
        assert_eq!(sealed(good.clone()).unwrap(), &text[..4096]);
        for claim in [4095u32, 4097] {
            let mut wrong = good.clone();
            wrong[..4].copy_from_slice(&claim.to_le_bytes());
            assert!(
                matches!(sealed(wrong), Err(RemoteError::Corrupt { .. })),
                "claims {claim}"
            );
        }
    }

    #[test]
    fn round_trip_is_exact() {
        let p = Prefix::random().unwrap();
        for len in [0usize, 1, 4096, 2 << 20] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let got = open(&p, 77, 3, value(&p, 77, 3, &payload)).unwrap();
            assert_eq!(got, payload);
        }
    }

    #[test]
    fn every_kind_of_damage_is_caught() {
        let p = Prefix::random().unwrap();
        let payload = vec![0xabu8; 4096];
        let good = value(&p, 5, 9, &payload);
        let is_corrupt =
            |r: Result<Vec<u8>, RemoteError>| matches!(r, Err(RemoteError::Corrupt { .. }));
        // another id's value under this key
        assert!(is_corrupt(open(&p, 6, 9, good.clone())));
        // another pool's value (same id and generation)
        let other = Prefix::random().unwrap();
        assert!(is_corrupt(open(&other, 5, 9, good.clone())));
        // a flipped bit anywhere
        for at in [
            0,
            4095,
            4096,
            4101,
            4104,
            4113,
            4121,
            4125,
            4096 + TRAILER_LEN - 1,
        ] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            assert!(is_corrupt(open(&p, 5, 9, bad)), "flip at {at}");
        }
        // truncated, extended, empty, zeros
        assert!(is_corrupt(open(&p, 5, 9, good[..good.len() - 1].to_vec())));
        let mut long = good.clone();
        long.push(0);
        assert!(is_corrupt(open(&p, 5, 9, long)));
        assert!(is_corrupt(open(&p, 5, 9, Vec::new())));
        assert!(is_corrupt(open(&p, 5, 9, vec![0; 4096 + TRAILER_LEN])));
        // a value of the old layout (header first) is not taken for a payload
        let mut old = good[4096..].to_vec();
        old.extend_from_slice(&payload);
        assert!(is_corrupt(open(&p, 5, 9, old)));
        // an older write of the same id is a lost write
        assert!(matches!(
            open(&p, 5, 10, good.clone()),
            Err(RemoteError::Lost { id: 5, .. })
        ));
        assert!(open(&p, 5, 9, good).is_ok());
    }

    #[test]
    fn keys_group_ids_and_keep_the_prefix_private() {
        let p = Prefix::random().unwrap();
        assert_eq!(p.as_hex().len(), 32);
        assert_ne!(p, Prefix::random().unwrap());
        assert_eq!(group_of(511), 0);
        assert_eq!(group_of(512), 1);
        let key = p.group_key(0x1234);
        assert_eq!(key, format!("uswap:{{{}.1234}}", p.as_hex()));
        assert!(!format!("{p:?}").contains(p.as_hex()));
        // Redis Cluster's reference values
        assert_eq!(slot_of("123456789"), 0x31c3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("x{foo}y"), 12182);
        assert_eq!(slot_of("{}foo"), slot_of("{}foo"));
    }
}
