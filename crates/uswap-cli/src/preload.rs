//! The library `uswap run` puts in LD_PRELOAD: `$USWAP_PRELOAD` when set, else the copy
//! of `libuswap_preload.so` built into this binary (build.rs), written once to a
//! private file and reused: so that the binary alone, as `cargo install` installs it,
//! runs programs under uswap.
//!
//! A file rather than a memfd: LD_PRELOAD names a path that every process of the
//! program's tree opens again at its exec, long after `uswap run` became the program.
//! `/proc/self/fd/N` of an inherited memfd is lost in any process that closes the
//! descriptors it does not know (Python's subprocess does by default, as do daemons),
//! and `/proc/PID/fd/N` of the first process stops existing when that process exits
//! while its children live on. A file named by its content's hash stays valid for as
//! long as it exists, is shared by every run of the same build, and a different build
//! never overwrites a library a running program still needs.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The bytes of `libuswap_preload.so` built with this binary.
static IMAGE: &[u8] = include_bytes!(env!("USWAP_PRELOAD_SO"));

/// Environment variable: a preload library to use instead of the built-in one (a
/// development build, a debug build of the library).
pub const OVERRIDE: &str = "USWAP_PRELOAD";

/// Where `uswap run` gets the library: the path, and how it came to be there (for
/// `uswap doctor`).
pub struct Library {
    pub path: PathBuf,
    pub origin: &'static str,
}

/// The library for LD_PRELOAD: `$USWAP_PRELOAD`, or the built-in copy written to the
/// first usable of `$XDG_CACHE_HOME/uswap` (`~/.cache/uswap`), `$XDG_RUNTIME_DIR/uswap`
/// and `/tmp/uswap-UID`. Err says what was tried.
pub fn library() -> Result<Library, String> {
    if let Some(p) = std::env::var_os(OVERRIDE).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(Library {
                path: std::path::absolute(&p).unwrap_or(p),
                origin: "$USWAP_PRELOAD",
            })
        } else {
            Err(format!("{OVERRIDE}={} is not a file", p.display()))
        };
    }
    let uid = own_uid().map_err(|e| format!("cannot read this process's user id: {e}"))?;
    let name = format!("libuswap_preload-{:016x}.so", fnv1a64(IMAGE));
    let mut tried = Vec::new();
    for dir in candidate_dirs(uid) {
        match place_in(&dir, &name, uid) {
            Ok(path) => {
                return Ok(Library {
                    path,
                    origin: "built in, written once",
                })
            }
            Err(e) => tried.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(format!(
        "cannot write the built-in libuswap_preload.so to a private directory ({}); set \
         {OVERRIDE} to a copy built with `cargo build --release -p uswap-preload`",
        tried.join("; ")
    ))
}

/// The user's cache first (persistent: a long-running program's children find the
/// library days later), then the session's runtime directory, then /tmp.
fn candidate_dirs(uid: u32) -> Vec<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let mut dirs = Vec::new();
    match (var("XDG_CACHE_HOME"), var("HOME")) {
        (Some(c), _) => dirs.push(c.join("uswap")),
        (None, Some(h)) => dirs.push(h.join(".cache/uswap")),
        (None, None) => {}
    }
    if let Some(r) = var("XDG_RUNTIME_DIR") {
        dirs.push(r.join("uswap"));
    }
    dirs.push(PathBuf::from(format!("/tmp/uswap-{uid}")));
    dirs.retain(|d| d.is_absolute());
    dirs
}

/// The library as `dir/name`: the file there when it is ours and holds exactly the
/// image, else written anew (to a temporary name, then renamed over, so that no
/// process ever maps a half-written file).
fn place_in(dir: &Path, name: &str, uid: u32) -> Result<PathBuf, String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| e.to_string())?;
    // A directory another user made (in /tmp) or can write could swap the library
    // under us: refused. So is one whose mount forbids mapping code (noexec).
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "not a directory of uid {uid} that only it can write (owner {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    if crate::mounts::of_path(dir).is_some_and(|m| m.has_option("noexec")) {
        return Err("mounted noexec (the dynamic loader cannot map code from it)".into());
    }
    let path = dir.join(name);
    if holds_image(&path, uid) {
        return Ok(path);
    }
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o500)
            .open(&tmp)?;
        f.write_all(IMAGE)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.to_string());
    }
    Ok(path)
}

/// Whether `path` is a regular file of `uid`, writable by no one else, holding
/// exactly the built-in library.
fn holds_image(path: &Path, uid: u32) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    meta.is_file()
        && meta.uid() == uid
        && meta.permissions().mode() & 0o022 == 0
        && meta.len() == IMAGE.len() as u64
        && std::fs::read(path).is_ok_and(|b| b == IMAGE)
}

/// The effective user id: the owner of /proc/self (the kernel gives a process's
/// /proc directory its effective ids).
pub fn own_uid() -> std::io::Result<u32> {
    std::fs::metadata("/proc/self").map(|m| m.uid())
}

/// FNV-1a, 64 bits: names the file by its content (the content itself is compared
/// before a file is reused).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_known_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn the_image_is_an_elf_shared_library() {
        assert!(IMAGE.len() > 4096, "{} bytes", IMAGE.len());
        assert_eq!(&IMAGE[..4], b"\x7fELF");
    }
}
