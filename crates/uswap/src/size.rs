//! Human sizes: `4k`, `256M`, `2G`, `1.5G`, `2GiB`, plain bytes.

use crate::error::{Error, Result};

/// Parse a size such as `256M`, `2G`, `2GiB`, `4k`, `1.5g` or `1048576` (bytes).
/// Suffixes are binary (K = 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = |why: &str| Error::InvalidSize {
        input: s.to_string(),
        reason: why.to_string(),
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad("empty"));
    }
    let lower = t.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (num, suffix) = lower.split_at(digits_end);
    if num.is_empty() {
        return Err(bad("no number"));
    }
    let shift = match suffix.trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad("unknown unit (use K, M, G or T)")),
    };
    let bytes = if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| bad("not a number"))?;
        let b = v * (1u64 << shift) as f64;
        if !b.is_finite() || b >= u64::MAX as f64 {
            return Err(bad("too large"));
        }
        b as u64
    } else {
        let v: u64 = num.parse().map_err(|_| bad("not a number"))?;
        v.checked_mul(1u64 << shift)
            .ok_or_else(|| bad("too large"))?
    };
    Ok(bytes)
}

/// Format bytes for humans, e.g. `256.0 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("123").unwrap(), 123);
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "G", "12Q", "1.2.3M", "-5M", "99999999999999999999T"] {
            assert!(parse_size(s).is_err(), "{s} parsed");
        }
    }
}
