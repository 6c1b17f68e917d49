//! Encryption at rest of what goes to the back tier (`PoolBuilder::encrypt`).
//!
//! - One AES-256-GCM key per pool, made at start from the OS RNG and never written
//!   anywhere: it lives in a page of its own, locked in RAM (so the kernel's swap
//!   never gets it), left out of core dumps, and wiped when the pool goes.
//! - Every page written gets a fresh *generation* from a per-pool counter that never
//!   goes back; its nonce is (generation, slot), so a nonce is never used twice with
//!   a key. The generation and the 16-byte tag are kept per slot in this process's
//!   memory (24 bytes per slot, charged with the regions' metadata), never on disk.
//! - The tag is the page's checksum: a read decrypts in place and the tag check
//!   fails on any changed byte, on another slot's bytes (misdirected I/O: another
//!   generation), and on an older write of the same slot (dropped writes: another
//!   generation); the caller retries, then poisons the page, as for a checksum.
//! - A write encrypts its frames in place (dm-crypt copies into bounce pages from a
//!   mempool; here bounce pages would be memory over the budget at the very moment
//!   reclaim is short of it, and a reserve for them would come out of every fault's
//!   room). Nothing reads a frame under write: a fault on its page waits for the
//!   write (the swap cache's `Writing` entry), so every `Writing` frame holds
//!   ciphertext and every `Clean` one plaintext. When the write completes, a page a
//!   fault waits for (or a failed write's, which goes back or elsewhere) is opened in
//!   place ([`open_frame`]); the others' frames go at once instead of staying as clean
//!   copies (the kernel frees a page reclaim wrote the same way, at the end of its
//!   writeback), which saves decrypting what nobody may read.
//! - fork: the child reads the slots it shares with its parent with the parent's key
//!   (it has a copy), but writes its own file under a key of its own: the parent and
//!   the child both go on counting generations from where they were at the fork and
//!   may use the same slot numbers (each in its own file), so one key for both would
//!   repeat nonces. Each range of slots (one per file, as `file.rs` has them) keeps
//!   the key it was written with.
//!
//! The plaintext's xxh3 is still recorded on every write (it costs a twentieth of the
//! encryption): eviction uses it to check a unit mapped clean by a move against its
//! slot before trusting the slot (`unit.rs`), where re-encrypting the page to compare
//! tags would cost as much as the write it saves.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::slots::Slot;
use crate::tier::SlotWords;
use crate::PAGE_SIZE;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

/// One AES-256-GCM key (its expanded schedule), in a page of its own: locked in RAM,
/// out of core dumps, wiped on drop.
struct Key {
    addr: usize,
    len: usize,
}

// SAFETY: the page holds a `LessSafeKey`, which is Send and Sync; the page is
// written only in `generate` and `drop`, when nobody else can reach it.
unsafe impl Send for Key {}
// SAFETY: as above.
unsafe impl Sync for Key {}

impl Key {
    /// A new key from the OS RNG (getrandom).
    fn generate() -> Result<Key> {
        let mut raw = [0u8; 32];
        let rng_failed = |what: &str| Error::Sys {
            op: "making the swap encryption key",
            source: std::io::Error::other(what.to_string()),
        };
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
            .map_err(|_| rng_failed("the OS random number generator failed"))?;
        let unbound = UnboundKey::new(&AES_256_GCM, &raw);
        wipe(&mut raw);
        let key = LessSafeKey::new(unbound.map_err(|_| rng_failed("AES-256-GCM refused the key"))?);
        let len = std::mem::size_of::<LessSafeKey>().next_multiple_of(PAGE_SIZE);
        // SAFETY: a fresh private anonymous mapping, ours alone.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Error::sys("mmap (the swap encryption key's page)"));
        }
        // SAFETY: `addr..addr+len` is the mapping just made. Best effort: without
        // RLIMIT_MEMLOCK room the key stays swappable by the kernel (said nowhere: a
        // program under a tight limit would hear it on every start).
        unsafe {
            libc::mlock(addr, len);
            libc::madvise(addr, len, libc::MADV_DONTDUMP);
            std::ptr::write(addr.cast::<LessSafeKey>(), key);
        }
        Ok(Key {
            addr: addr as usize,
            len,
        })
    }

    fn get(&self) -> &LessSafeKey {
        // SAFETY: `generate` wrote a LessSafeKey at `addr`, which lives until drop.
        unsafe { &*(self.addr as *const LessSafeKey) }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: the key was written at `addr` in `generate` and nobody holds a
        // reference any more (`&mut self`); then the page is wiped and unmapped.
        unsafe {
            std::ptr::drop_in_place(self.addr as *mut LessSafeKey);
            wipe(std::slice::from_raw_parts_mut(
                self.addr as *mut u8,
                self.len,
            ));
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
    }
}

/// Overwrite secret bytes with zeros (volatile: not optimized away).
fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: a valid, exclusive reference to one byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

/// The nonce of generation `generation` at `slot`: unique per key, since generations
/// never repeat for one.
fn nonce(generation: u64, slot: Slot) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&generation.to_le_bytes());
    n[8..].copy_from_slice(&(slot as u32).to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The pool's encryption state: keys by slot range, the generation counter, and
/// per slot the generation and tag of its last write.
pub(crate) struct Sealer {
    /// `(first slot, key)`, ascending: a key covers its first slot up to the next
    /// one's; the last covers the writable file (`None` in a forked child whose new
    /// key could not be made: then nothing is written).
    keys: RwLock<Vec<(Slot, Option<Arc<Key>>)>>,
    /// The next generation (0 is never used: it marks a slot never written).
    next_generation: AtomicU64,
    generation: SlotWords,
    tag_lo: SlotWords,
    tag_hi: SlotWords,
}

impl Sealer {
    /// Bytes per slot of the records (generation and tag), charged with each region's
    /// page map.
    pub(crate) const BYTES_PER_SLOT: u64 = 24;

    /// A new key; records for up to `max_slots` slots.
    pub(crate) fn new(max_slots: u64) -> Result<Sealer> {
        Ok(Sealer {
            keys: RwLock::new(vec![(0, Some(Arc::new(Key::generate()?)))]),
            next_generation: AtomicU64::new(1),
            generation: SlotWords::new(max_slots),
            tag_lo: SlotWords::new(max_slots),
            tag_hi: SlotWords::new(max_slots),
        })
    }

    fn keys(&self) -> std::sync::RwLockReadGuard<'_, Vec<(Slot, Option<Arc<Key>>)>> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The key new writes use (None: writes are refused).
    fn write_key(&self) -> Option<Arc<Key>> {
        self.keys().last().and_then(|(_, k)| k.clone())
    }

    /// Whether new writes can be encrypted.
    pub(crate) fn can_write(&self) -> bool {
        self.keys().last().is_some_and(|(_, k)| k.is_some())
    }

    /// The key `slot` was written with.
    fn key_of(&self, slot: Slot) -> Option<Arc<Key>> {
        let keys = self.keys();
        let i = keys.partition_point(|(first, _)| *first <= slot);
        keys.get(i.checked_sub(1)?).and_then(|(_, k)| k.clone())
    }

    /// Encrypt `pages` (plaintext, in slot order from `first`) in place, recording
    /// each slot's generation and tag. Returns how many pages could not be encrypted
    /// (no key to write with, which `can_write` rules out, or an AEAD error, which a
    /// page cannot meet): they are wiped and their slots record generation 0, so what
    /// is written there never verifies and the page is lost loudly, never read back
    /// wrong.
    fn seal(&self, first: Slot, pages: &mut [&mut [u8]]) -> usize {
        let key = self.write_key();
        let base = self.next_generation.fetch_add(pages.len() as u64, Relaxed);
        let mut failed = 0;
        for (k, buf) in pages.iter_mut().enumerate() {
            let slot = first + k as Slot;
            let generation = base + k as u64;
            let buf: &mut [u8] = buf;
            let sealed = key.as_ref().and_then(|key| {
                key.get()
                    .seal_in_place_separate_tag(nonce(generation, slot), Aad::empty(), buf)
                    .ok()
            });
            let Some(tag) = sealed else {
                wipe(buf);
                self.set(&self.generation, slot, 0);
                failed += 1;
                continue;
            };
            let t = tag.as_ref();
            self.set(&self.generation, slot, generation);
            self.set(
                &self.tag_lo,
                slot,
                u64::from_le_bytes(t[..8].try_into().expect("8")),
            );
            self.set(
                &self.tag_hi,
                slot,
                u64::from_le_bytes(t[8..].try_into().expect("8")),
            );
        }
        failed
    }

    fn set(&self, words: &SlotWords, slot: Slot, v: u64) {
        if let Some(w) = words.word(slot, true) {
            w.store(v, Relaxed);
        }
    }

    fn get(&self, words: &SlotWords, slot: Slot) -> u64 {
        words.word(slot, false).map_or(0, |w| w.load(Relaxed))
    }

    /// Decrypt `page` (read from `slot`) in place; false if it is not what was last
    /// written there (its tag does not match: then its contents are undefined).
    pub(crate) fn open(&self, slot: Slot, page: &mut [u8]) -> bool {
        let generation = self.get(&self.generation, slot);
        let Some(key) = self.key_of(slot).filter(|_| generation != 0) else {
            return false;
        };
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.get(&self.tag_lo, slot).to_le_bytes());
        t[8..].copy_from_slice(&self.get(&self.tag_hi, slot).to_le_bytes());
        key.get()
            .open_in_place_separate_tag(
                nonce(generation, slot),
                Aad::empty(),
                Tag::from(t),
                page,
                0..,
            )
            .is_ok()
    }

    /// In a forked child: slots from `base` on (its own file) take a new key; the
    /// ones below keep theirs. False if no key could be made (writes stop).
    pub(crate) fn fork_child(&self, base: Slot) -> bool {
        let key = Key::generate().ok().map(Arc::new);
        let made = key.is_some();
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.retain(|(first, _)| *first < base);
        keys.push((base, key));
        made
    }
}

/// Encrypt the pages in `frames` (for slots `first..`) in place, before their write
/// is submitted (their `Writing` entries are in: nothing reads them until it
/// completes). Nothing with encryption off.
pub(crate) fn seal_frames(e: &Engine, frames: &[usize], first: Slot) {
    let Some(sealer) = e.tiers.seal.as_ref() else {
        return;
    };
    let mut pages: Vec<&mut [u8]> = frames.iter().map(|&f| e.frames.page_mut(f)).collect();
    let failed = sealer.seal(first, &mut pages);
    if failed > 0 {
        e.diag.internal(&format!(
            "{failed} pages for slots from {first} could not be encrypted: they will read \
             back as lost"
        ));
    }
}

/// The frame of a completed write to `slot` gets its plaintext back (a fault waits
/// for the page, or the write failed). False: it cannot be (never so, short of the
/// records or the frame being corrupt in RAM); the page's bytes are lost. True with
/// encryption off.
pub(crate) fn open_frame(e: &Engine, slot: Slot, frame: usize) -> bool {
    e.tiers
        .seal
        .as_ref()
        .is_none_or(|s| s.open(slot, e.frames.page_mut(frame)))
}
