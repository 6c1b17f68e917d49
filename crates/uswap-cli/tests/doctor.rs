//! `uswap doctor`: passes on this machine, and fails with the right advice when
//! userfaultfd is denied, when the swap place is a tmpfs, and when io_uring is refused.

mod common;

use common::{support, uswap_exe};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn doctor(cmd: Command) -> (Output, String) {
    let out = common::run_with_deadline(cmd, 120);
    let stdout = text(&out.stdout);
    (out, stdout)
}

/// The line of check `what`, and the fix lines under it.
fn check<'a>(stdout: &'a str, what: &str) -> (&'a str, Vec<&'a str>) {
    let mut lines = stdout.lines();
    let line = lines
        .find(|l| l.get(6..).is_some_and(|r| r.starts_with(what)))
        .unwrap_or_else(|| panic!("no {what} line in:\n{stdout}"));
    let fixes = lines
        .take_while(|l| l.starts_with(' '))
        .map(str::trim)
        .collect();
    (line, fixes)
}

#[test]
fn doctor_passes_here() {
    let mut cmd = Command::new(uswap_exe());
    cmd.arg("doctor");
    let (out, stdout) = doctor(cmd);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("\nFAIL"), "{stdout}");
    for what in [
        "userfaultfd",
        "uffd features",
        "io_uring",
        "swap place",
        "settings",
    ] {
        let (line, _) = check(&stdout, what);
        assert!(line.starts_with("OK "), "{line}");
    }
    assert!(
        stdout
            .trim_end()
            .ends_with("uswap run will work here with these settings")
            || stdout.contains("uswap run will work here with these settings ("),
        "{stdout}"
    );
}

/// A file's mode, set now and put back on drop.
struct ModeGuard {
    path: PathBuf,
    mode: u32,
}

impl ModeGuard {
    fn set(path: &Path, mode: u32) -> ModeGuard {
        let old = std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        ModeGuard {
            path: path.to_path_buf(),
            mode: old,
        }
    }
}

impl Drop for ModeGuard {
    fn drop(&mut self) {
        let _ = std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(self.mode));
    }
}

/// A sysctl file's value, set now and put back on drop.
struct SysctlGuard {
    path: &'static str,
    old: String,
}

impl SysctlGuard {
    fn set(path: &'static str, value: &str) -> SysctlGuard {
        let old = std::fs::read_to_string(path).unwrap().trim().to_string();
        std::fs::write(path, value).unwrap();
        SysctlGuard { path, old }
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, &self.old);
    }
}

#[test]
fn doctor_fails_with_advice_when_userfaultfd_is_denied() {
    support::need_root("running uswap doctor as another user");
    // Denied to an unprivileged user: the sysctl at 0 and the device for root alone
    // (this machine's defaults; set only where they differ, and put back).
    let sysctl = "/proc/sys/vm/unprivileged_userfaultfd";
    let _sysctl = (std::fs::read_to_string(sysctl).unwrap().trim() != "0")
        .then(|| SysctlGuard::set(sysctl, "0"));
    let dev = Path::new("/dev/userfaultfd");
    let _dev = (dev.exists()
        && std::fs::metadata(dev).unwrap().permissions().mode() & 0o777 != 0o600)
        .then(|| ModeGuard::set(dev, 0o600));
    // nobody writes the preload library to its own cache, removed afterwards.
    let cache = support::TempDir::new(&common::tmpdir(), "doctor-nobody-cache");
    support::sh("chown", &["nobody:nogroup", cache.path().to_str().unwrap()]);
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(uswap_exe())
        .arg("doctor")
        .env("XDG_CACHE_HOME", cache.path())
        .env_remove("XDG_RUNTIME_DIR");
    let (out, stdout) = doctor(cmd);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let (line, fixes) = check(&stdout, "userfaultfd");
    assert!(line.starts_with("FAIL "), "{stdout}");
    assert!(line.contains("uid 65534"), "{line}");
    assert!(line.contains("vm.unprivileged_userfaultfd = 0"), "{line}");
    assert!(line.contains("/dev/userfaultfd mode 600"), "{line}");
    assert!(line.contains("UFFD_USER_MODE_ONLY"), "{line}");
    assert!(
        fixes[0].starts_with("fix: sudo sysctl -w vm.unprivileged_userfaultfd=1"),
        "{fixes:?}"
    );
    assert!(
        fixes
            .iter()
            .any(|f| f.contains("sudo setfacl -m u:nobody:rw /dev/userfaultfd")),
        "{fixes:?}"
    );
    // The kernel's features are still read (through a user-mode-only descriptor).
    let (line, _) = check(&stdout, "uffd features");
    assert!(line.starts_with("OK "), "{line}");
    let (line, _) = check(&stdout, "settings");
    assert!(
        line.starts_with("FAIL ") && line.contains("userfaultfd"),
        "{line}"
    );
    assert!(stdout.contains("uswap run will NOT work here"), "{stdout}");
}

#[test]
fn doctor_refuses_a_tmpfs_swap_place() {
    let fs = support::Mount::virtual_fs(&common::tmpdir(), "tmpfs", "size=16m");
    let mut cmd = Command::new(uswap_exe());
    cmd.args(["doctor", "--swap-file"]).arg(fs.path());
    let (out, stdout) = doctor(cmd);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let (line, fixes) = check(&stdout, "swap place");
    assert!(line.starts_with("FAIL "), "{stdout}");
    assert!(line.contains("tmpfs"), "{line}");
    assert!(line.contains("frees no RAM"), "{line}");
    assert!(fixes[0].contains("--swap-file"), "{fixes:?}");
    let (line, _) = check(&stdout, "settings");
    assert!(line.starts_with("FAIL "), "{line}");
    // Everything else is fine here.
    for what in ["userfaultfd", "io_uring"] {
        let (line, _) = check(&stdout, what);
        assert!(line.starts_with("OK "), "{line}");
    }
}

#[test]
fn doctor_fails_with_advice_when_a_seccomp_filter_refuses_io_uring() {
    // A seccomp filter on io_uring_setup for the doctor alone (as a container's profile
    // has it), instead of kernel.io_uring_disabled, which would fail every other
    // process's io_uring on the machine while it is set.
    let mut cmd = Command::new(common::cprog("no_io_uring"));
    cmd.arg(uswap_exe()).arg("doctor");
    let (out, stdout) = doctor(cmd);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let (line, fixes) = check(&stdout, "io_uring");
    assert!(line.starts_with("FAIL "), "{stdout}");
    assert!(
        line.contains("seccomp filter refuses io_uring_setup"),
        "{line}"
    );
    assert!(
        fixes[0].contains("io_uring_setup") && fixes[0].contains("--security-opt seccomp="),
        "{fixes:?}"
    );
    let (line, _) = check(&stdout, "settings");
    assert!(
        line.starts_with("FAIL ") && line.contains("io_uring"),
        "{line}"
    );
    let (line, _) = check(&stdout, "userfaultfd");
    assert!(line.starts_with("OK "), "{line}");
}

#[test]
fn doctor_rejects_bad_options() {
    let out = Command::new(uswap_exe())
        .args(["doctor", "--budget", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(uswap_exe())
        .args(["doctor", "--tier", "remote"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("--remote"),
        "{}",
        text(&out.stdout)
    );
}
