//! Test fixtures that change the machine, each undone on drop (also when the test
//! fails): scratch directories, mounts (tmpfs, ramfs, a small ext4 on a loop device),
//! loop devices, and the machine-wide lock of tests that touch kernel swap, zram,
//! zswap or memory cgroups. Shared by the uswap and uswap-cli tests
//! (`#[path = "../../uswap/tests/support/mod.rs"] mod support;`).
#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

/// Build the workspace's C libraries (`libuswap_preload.so`, `libuswap.so`) into
/// `profile_dir` (target/<profile>, the test binary's), which `cargo test` does not do.
///
/// The whole workspace with every target, so that features resolve as for `cargo test
/// --workspace` and that build's artifacts are reused: this then only links the libraries.
/// `-p uswap-preload` or `-p uswap-capi` alone resolves libc, memchr, syn ... with fewer
/// features and built ~120 crates again (~100 s of the first such test on 2 vCPUs).
/// The Python module comes along, as an extension module (as maturin builds it), which
/// leaves libpython's symbols to the interpreter: no libpython needed to link it.
/// scripts/test.sh builds the same before `cargo test`.
pub fn build_cdylibs(profile_dir: &Path) {
    let mut cmd = cargo();
    cmd.args(["build", "--quiet", "--workspace", "--all-targets"])
        .args(["--features", "uswap-py/extension-module", "--target-dir"])
        .arg(profile_dir.parent().expect("target/<profile> has a parent"))
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    let st = cmd.status().expect("run cargo build for the C libraries");
    assert!(
        st.success(),
        "cargo build of the workspace's C libraries failed"
    );
}

/// The cargo that runs the tests, without what `cargo test` set for this test binary.
pub fn cargo() -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    // What `cargo test` sets for this test binary is not the build's: inherited, it
    // reads as changed (`ring`: "the env variable CARGO_MANIFEST_DIR changed") and
    // rebuilds ring and everything above it (~200 s).
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_BIN_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&k.as_ref())
        {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd
}

/// Run a system command; panic with its output when it fails.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd} (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Fail (never skip) when not root: these tests mount, attach loop devices, or change
/// kernel swap.
pub fn need_root(what: &str) {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "{what} needs root (run the tests as root)");
}

/// A fresh directory on the disk that holds the build (never a tmpfs), removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(base: &Path, name: &str) -> TempDir {
        let d = base.join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    /// Names in the directory.
    pub fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A filesystem mounted on a fresh directory; unmounted (and its loop device detached,
/// its image removed) on drop.
pub struct Mount {
    pub dir: TempDir,
    loopdev: Option<LoopDev>,
    image: Option<PathBuf>,
}

impl Mount {
    /// `mount -t FSTYPE -o OPTS none DIR` (tmpfs, ramfs).
    pub fn virtual_fs(base: &Path, fstype: &str, opts: &str) -> Mount {
        need_root("mounting a test filesystem");
        let dir = TempDir::new(base, &format!("mnt-{fstype}"));
        sh(
            "mount",
            &[
                "-t",
                fstype,
                "-o",
                opts,
                "none",
                dir.path().to_str().unwrap(),
            ],
        );
        Mount {
            dir,
            loopdev: None,
            image: None,
        }
    }

    /// A fresh ext4 of `mib` MiB in an image file under `base`, on a loop device.
    pub fn ext4(base: &Path, name: &str, mib: u64) -> Mount {
        need_root("mounting a test filesystem");
        let image = base.join(format!("{name}-{}.img", std::process::id()));
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(mib << 20).unwrap();
        drop(f);
        let loopdev = LoopDev::attach(&image);
        let m = Mount {
            dir: TempDir::new(base, &format!("mnt-{name}")),
            loopdev: Some(loopdev),
            image: Some(image),
        };
        let dev = m.loopdev.as_ref().unwrap().dev.clone();
        // No reserved blocks, no journal: what df says is free is what a file can take.
        sh(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", "-O", "^has_journal", &dev],
        );
        sh("mount", &[&dev, m.dir.path().to_str().unwrap()]);
        m
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Names in the filesystem's root, but ext4's lost+found.
    pub fn entries(&self) -> Vec<String> {
        let mut v = self.dir.entries();
        v.retain(|n| n != "lost+found");
        v
    }

    /// Bytes free for an unprivileged file (statvfs f_bavail).
    pub fn free_bytes(&self) -> u64 {
        free_bytes(self.path())
    }
}

impl Mount {
    /// Wait (up to 10 s) until the free space is back to `free`; fail if it is not.
    pub fn free_space_returns(&self, free: u64) {
        let t0 = std::time::Instant::now();
        while self.free_bytes() != free && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(self.free_bytes(), free, "swap space not given back");
    }
}

/// Open descriptors of any process that point into `dir`.
pub fn fds_into(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if target.starts_with(dir) {
                    found.push(format!("{} -> {}", fd.path().display(), target.display()));
                }
            }
        }
    }
    found
}

/// statvfs f_bavail * f_frsize of the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: statvfs is plain old data; all zeros is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs(3) with a NUL-terminated path and a live struct.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

impl Drop for Mount {
    fn drop(&mut self) {
        let dir = self.dir.path().to_str().unwrap().to_string();
        // A process of the test may still be exiting: retry, then detach lazily.
        let mut ok = false;
        for _ in 0..50 {
            if Command::new("umount")
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success())
            {
                ok = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !ok {
            let _ = Command::new("umount").args(["-l", &dir]).status();
        }
        self.loopdev.take();
        if let Some(img) = self.image.take() {
            let _ = std::fs::remove_file(img);
        }
    }
}

/// A loop device over a file, detached on drop.
pub struct LoopDev {
    pub dev: String,
}

impl LoopDev {
    pub fn attach(file: &Path) -> LoopDev {
        need_root("attaching a loop device");
        LoopDev {
            dev: sh("losetup", &["--find", "--show", file.to_str().unwrap()]),
        }
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// The machine-wide lock of tests that change kernel swap, zram, zswap or memory
/// cgroups (`flock /tmp/uswap-suite.lock`, see HELPERS.md), held until drop. When an
/// ancestor already holds it (the whole suite run under `flock /tmp/uswap-suite.lock
/// scripts/test.sh`), taking it again would wait forever: then this holds nothing.
pub struct MachineLock(Option<std::fs::File>);

pub const MACHINE_LOCK: &str = "/tmp/uswap-suite.lock";

pub fn machine_lock() -> MachineLock {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(MACHINE_LOCK)
        .unwrap_or_else(|e| panic!("open {MACHINE_LOCK}: {e}"));
    let ino = f.metadata().unwrap().ino();
    if lock_holders(ino).iter().any(|&pid| is_ancestor(pid)) {
        return MachineLock(None);
    }
    // SAFETY: flock(2) on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!("waiting for {MACHINE_LOCK} (another test run changes kernel swap or cgroups)");
        // SAFETY: as above, blocking.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(
            r,
            0,
            "flock {MACHINE_LOCK}: {}",
            std::io::Error::last_os_error()
        );
    }
    MachineLock(Some(f))
}

/// Pids holding a FLOCK on inode `ino` (/proc/locks: `1: FLOCK ADVISORY WRITE PID MAJ:MIN:INO 0 EOF`).
fn lock_holders(ino: u64) -> Vec<i32> {
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|w| *w == "FLOCK")?;
            let pid: i32 = f.get(i + 3)?.parse().ok()?;
            let lock_ino: u64 = f.get(i + 4)?.rsplit(':').next()?.parse().ok()?;
            (lock_ino == ino).then_some(pid)
        })
        .collect()
}

fn is_ancestor(pid: i32) -> bool {
    let mut p = std::process::id() as i32;
    while p > 1 {
        if p == pid {
            return true;
        }
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // Field 4 (ppid) comes after the command name in parentheses.
        p = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0);
    }
    false
}

/// A zram device of its own (hot_add), reset and removed on drop. Hold the
/// [`machine_lock`] while it exists: the `--against zram` tests use zram too.
pub struct Zram {
    pub num: u32,
    pub dev: String,
}

impl Zram {
    pub fn hot_add(bytes: u64) -> Zram {
        need_root("adding a zram device");
        if !Path::new("/sys/class/zram-control").exists() {
            let _ = Command::new("modprobe").arg("zram").status();
        }
        let num: u32 = std::fs::read_to_string("/sys/class/zram-control/hot_add")
            .expect("zram hot_add (is the zram module available?)")
            .trim()
            .parse()
            .unwrap();
        let z = Zram {
            num,
            dev: format!("/dev/zram{num}"),
        };
        std::fs::write(format!("/sys/block/zram{num}/disksize"), bytes.to_string()).unwrap();
        // udev may create the node a moment later.
        for _ in 0..100 {
            if Path::new(&z.dev).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        z
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.num), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", self.num.to_string());
    }
}
