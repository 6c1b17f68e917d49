//! This process's mounts (/proc/self/mountinfo): what filesystem holds a path, with
//! which options.

use std::path::{Path, PathBuf};

/// One mount.
#[derive(Debug, Clone)]
pub struct Mount {
    /// Where it is mounted.
    pub point: PathBuf,
    /// The filesystem type ("ext4", "tmpfs", ...).
    pub fstype: String,
    /// What is mounted ("/dev/vda1", "tmpfs", ...).
    pub source: String,
    /// The mount's own options ("rw,nosuid,noexec,...").
    options: String,
}

impl Mount {
    /// Whether the mount has option `opt` ("noexec", "ro", ...).
    pub fn has_option(&self, opt: &str) -> bool {
        self.options.split(',').any(|o| o == opt)
    }
}

/// The mount that holds `path` (which must exist): the one whose mount point is the
/// longest prefix of its canonical path, the last such when one is mounted over another.
pub fn of_path(path: &Path) -> Option<Mount> {
    let path = path.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<Mount> = None;
    for m in info.lines().filter_map(parse_line) {
        if path.starts_with(&m.point)
            && best
                .as_ref()
                .is_none_or(|b| m.point.as_os_str().len() >= b.point.as_os_str().len())
        {
            best = Some(m);
        }
    }
    best
}

/// `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_line(line: &str) -> Option<Mount> {
    let (before, after) = line.split_once(" - ")?;
    let f: Vec<&str> = before.split(' ').collect();
    let a: Vec<&str> = after.split(' ').collect();
    Some(Mount {
        point: PathBuf::from(unescape(f.get(4)?)),
        options: f.get(5)?.to_string(),
        fstype: a.first()?.to_string(),
        source: unescape(a.get(1)?),
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d[0] <= b'3' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_line_with_an_escaped_space() {
        let m = parse_line(
            "36 35 98:0 / /mnt/my\\040disk rw,nosuid,noexec shared:1 - ext4 /dev/vdb1 rw",
        )
        .expect("a mount");
        assert_eq!(m.point, Path::new("/mnt/my disk"));
        assert_eq!(m.fstype, "ext4");
        assert_eq!(m.source, "/dev/vdb1");
        assert!(m.has_option("noexec"));
        assert!(!m.has_option("ro"));
    }

    #[test]
    fn the_root_is_mounted() {
        let m = of_path(Path::new("/")).expect("a mount for /");
        assert_eq!(m.point, Path::new("/"));
    }
}
