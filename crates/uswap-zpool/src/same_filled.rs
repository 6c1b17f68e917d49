//! Same-filled pages (zswap's name): every 64-bit word of the page equal. Such a page is
//! kept as its word alone, with no object allocated: zeros above all (freed and never
//! written memory), but also pages of one repeated value (0xff.., arrays of one
//! constant). Units are checked whole first, then chunk by chunk.

/// The word that every 64-bit word of `data` equals (native byte order), if they all do.
/// `data.len()` is a multiple of 8 (pages, units and unit chunks are).
pub fn same_filled(data: &[u8]) -> Option<u64> {
    if !data.len().is_multiple_of(8) {
        return None;
    }
    let pattern = word(data.get(..8)?);
    // 64 bytes at a time without an early exit inside, so that it vectorises; most
    // pages differ within the first block and leave at once.
    for block in data.chunks(64) {
        let diff = block
            .chunks_exact(8)
            .fold(0, |acc, w| acc | (word(w) ^ pattern));
        if diff != 0 {
            return None;
        }
    }
    Some(pattern)
}

/// Fill `out` with `pattern` repeated (as `same_filled` read it).
pub(crate) fn fill(out: &mut [u8], pattern: u64) {
    let bytes = pattern.to_ne_bytes();
    if bytes.iter().all(|&b| b == bytes[0]) {
        out.fill(bytes[0]); // memset
        return;
    }
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&bytes);
    }
    let tail = words.into_remainder();
    tail.copy_from_slice(&bytes[..tail.len()]);
}

#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    u64::from_ne_bytes(bytes.try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_only_pages_of_one_word() {
        let mut page = vec![0u8; 4096];
        assert_eq!(same_filled(&page), Some(0));
        fill(&mut page, 0x0102_0304_0506_0708);
        assert_eq!(same_filled(&page), Some(0x0102_0304_0506_0708));
        for i in [0, 7, 8, 63, 64, 2047, 4095] {
            let mut p = page.clone();
            p[i] ^= 1;
            assert_eq!(same_filled(&p), None, "byte {i} changed");
        }
        // Bytes all equal but not aligned to words is still one word.
        page.fill(0xab);
        assert_eq!(same_filled(&page), Some(u64::from_ne_bytes([0xab; 8])));
        assert_eq!(same_filled(&page[..12]), None);
        assert_eq!(same_filled(&[]), None);
        let mut out = vec![1u8; 4096];
        fill(&mut out, 0);
        assert!(out.iter().all(|&b| b == 0));
    }
}
