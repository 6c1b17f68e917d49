//! `uswap doctor`: whether `uswap run` works on this machine, as this user, with these
//! settings; each thing it needs checked the way the engine does it (a userfaultfd
//! opened, an io_uring set up, the swap place opened, a pool started), and what to do
//! about each that is missing.

use crate::{mounts, preload, run, tier};
use clap::Args;
use std::path::Path;
use uswap::host;

pub const HELP: &str = "\
Each line says OK, WARN (a run works, but not as well as it could) or FAIL (a run will
not work), what was found, and for WARN and FAIL the command that fixes it. The last
check starts a pool with the settings given, as `uswap run` does before it starts
PROGRAM. Give the options the run will have: the swap place is checked where
--swap-file puts it, a remote tier's cluster is connected to.

Exit status: 0 when `uswap run` will work here with these settings (no FAIL), 1 when
it will not, 2 for bad options.

Examples:
  uswap doctor
  uswap doctor --swap-file /mnt/nvme/swap --budget 2G
  uswap doctor --tier remote --remote redis://10.0.0.5:7000";

/// `uswap doctor` options: those of `uswap run` that decide whether it can start.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub place: crate::PlaceArgs,
    #[command(flatten)]
    pub tiers: tier::TierArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
struct Check {
    level: Level,
    what: &'static str,
    found: String,
    /// Commands or steps that fix it, best first.
    fixes: Vec<String>,
}

impl Check {
    fn ok(what: &'static str, found: impl Into<String>) -> Check {
        Check {
            level: Level::Ok,
            what,
            found: found.into(),
            fixes: Vec::new(),
        }
    }

    fn bad(
        level: Level,
        what: &'static str,
        found: impl Into<String>,
        fixes: Vec<String>,
    ) -> Check {
        Check {
            level,
            what,
            found: found.into(),
            fixes,
        }
    }

    fn print(&self) {
        let tag = match self.level {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        println!("{tag:<5} {:<13} {}", self.what, self.found);
        for (i, f) in self.fixes.iter().enumerate() {
            let lead = if i == 0 { "fix:" } else { "or: " };
            println!("{:19}{lead} {f}", "");
        }
    }
}

/// What the process runs as and under, read once.
struct Facts {
    uid: u32,
    user: String,
    /// Seccomp mode of this process (2: a filter, as in most containers).
    seccomp: u32,
    kernel: String,
}

impl Facts {
    fn read() -> Facts {
        let uid = preload::own_uid().unwrap_or(u32::MAX);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let seccomp = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Facts {
            uid,
            user: user_name(uid).unwrap_or_else(|| uid.to_string()),
            seccomp,
            kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_else(|| "?".into()),
        }
    }
}

/// The name of `id` in /etc/passwd or /etc/group (the third field of each line).
fn name_of(db: &str, id: u32) -> Option<String> {
    let text = std::fs::read_to_string(db).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.get(2)?.parse::<u32>().ok()? == id).then(|| f[0].to_string())
    })
}

fn user_name(uid: u32) -> Option<String> {
    name_of("/etc/passwd", uid)
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// userfaultfd: the system call or /dev/userfaultfd, for faults in kernel mode too.
fn check_userfaultfd(u: &host::Userfaultfd, f: &Facts) -> Check {
    const WHAT: &str = "userfaultfd";
    let sysctl = read_trimmed("/proc/sys/vm/unprivileged_userfaultfd");
    let sysctl_text = format!(
        "vm.unprivileged_userfaultfd = {}",
        sysctl.as_deref().unwrap_or("(absent)")
    );
    let dev = Path::new("/dev/userfaultfd");
    let dev_text = match std::fs::metadata(dev) {
        Ok(m) => {
            use std::os::unix::fs::MetadataExt;
            format!(
                "/dev/userfaultfd mode {:o} owner {}:{}",
                m.mode() & 0o777,
                user_name(m.uid()).unwrap_or_else(|| m.uid().to_string()),
                name_of("/etc/group", m.gid()).unwrap_or_else(|| m.gid().to_string())
            )
        }
        Err(_) => "no /dev/userfaultfd (Linux before 6.1)".into(),
    };
    if u.syscall.is_ok() {
        let why = if f.uid == 0 {
            "as root".to_string()
        } else if sysctl.as_deref() == Some("1") {
            sysctl_text
        } else {
            "with CAP_SYS_PTRACE".to_string()
        };
        return Check::ok(WHAT, format!("the system call is allowed ({why})"));
    }
    if u.device.is_ok() {
        return Check::ok(WHAT, format!("allowed through {dev_text}"));
    }
    let syscall_err = u
        .syscall
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    let dev_err = u
        .device
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    let mut found = format!(
        "not permitted to {} (uid {}): userfaultfd(2): {syscall_err} ({sysctl_text}); \
         /dev/userfaultfd: {dev_err} ({dev_text})",
        f.user, f.uid
    );
    if u.user_mode_only.is_ok() {
        found.push_str(
            "; only UFFD_USER_MODE_ONLY is allowed, which is not enough: uswap must also \
             serve the faults a program's system calls take on its memory",
        );
    }
    let mut fixes = vec![
        "sudo sysctl -w vm.unprivileged_userfaultfd=1   (to keep it: echo \
         vm.unprivileged_userfaultfd=1 | sudo tee /etc/sysctl.d/60-uswap.conf)"
            .to_string(),
    ];
    if dev.exists() {
        fixes.push(format!(
            "sudo setfacl -m u:{}:rw /dev/userfaultfd   (this user only; a udev rule keeps \
             it across reboots)",
            f.user
        ));
    }
    if f.seccomp == 2 {
        found.push_str("; this process runs under a seccomp filter (a container?)");
        fixes.push(
            "in a container: allow the userfaultfd system call in its seccomp profile \
             (docker/podman run --security-opt seccomp=PROFILE.json)"
                .into(),
        );
    }
    fixes.push("run uswap as root".into());
    Check::bad(Level::Fail, WHAT, found, fixes)
}

/// The kernel's userfaultfd features the engine is built on.
fn check_features(u: &host::Userfaultfd, f: &Facts) -> Check {
    const WHAT: &str = "uffd features";
    let Some(feat) = u.features else {
        return Check::bad(
            Level::Fail,
            WHAT,
            format!(
                "unknown: no userfaultfd could be opened at all (Linux {})",
                f.kernel
            ),
            vec!["see userfaultfd above".into()],
        );
    };
    let list = [
        ("UFFDIO_MOVE", feat.move_pages, "6.8"),
        ("UFFDIO_POISON", feat.poison, "6.6"),
        ("write-protect", feat.write_protect, "5.7"),
        ("THREAD_ID", feat.thread_id, "4.14"),
    ];
    let missing: Vec<String> = list
        .iter()
        .filter(|(_, has, _)| !has)
        .map(|(name, _, since)| format!("{name} (Linux {since})"))
        .collect();
    if missing.is_empty() {
        Check::ok(
            WHAT,
            format!(
                "UFFDIO_MOVE, UFFDIO_POISON, write-protect, THREAD_ID (Linux {})",
                f.kernel
            ),
        )
    } else {
        Check::bad(
            Level::Fail,
            WHAT,
            format!("Linux {} lacks {}", f.kernel, missing.join(", ")),
            vec!["boot Linux 6.8 or later".into()],
        )
    }
}

/// Why io_uring_setup failed, and how to fix it: from its errno, kernel.io_uring_disabled
/// (absent before Linux 6.6), whether a seccomp filter is on, and whether this process
/// is root or in kernel.io_uring_group.
fn io_uring_advice(
    errno: Option<i32>,
    disabled: Option<u32>,
    seccomp: bool,
    privileged: bool,
) -> (String, Vec<String>) {
    let sysctl_fix = "sudo sysctl -w kernel.io_uring_disabled=0   (to keep it: echo \
                      kernel.io_uring_disabled=0 | sudo tee /etc/sysctl.d/60-uswap.conf)"
        .to_string();
    match (errno, disabled) {
        (Some(libc::ENOMEM), _) => (
            "out of locked memory for the rings (RLIMIT_MEMLOCK)".into(),
            vec![
                "ulimit -l 1024 (shell), LimitMEMLOCK=1M (systemd unit), --ulimit \
                 memlock=1048576 (docker)"
                    .into(),
            ],
        ),
        (_, Some(2)) => (
            "io_uring is disabled for every process: kernel.io_uring_disabled = 2".into(),
            vec![sysctl_fix],
        ),
        (_, Some(1)) if !privileged => (
            "io_uring is disabled for processes outside kernel.io_uring_group: \
             kernel.io_uring_disabled = 1"
                .into(),
            vec![
                sysctl_fix,
                "add this user to the group whose id is in /proc/sys/kernel/io_uring_group".into(),
            ],
        ),
        (Some(libc::EPERM | libc::ENOSYS), _) if seccomp => (
            "a seccomp filter refuses io_uring_setup (container runtimes' default \
             profiles often do)"
                .into(),
            vec![
                "allow io_uring_setup, io_uring_enter and io_uring_register in the \
                 container's seccomp profile (docker/podman run --security-opt \
                 seccomp=PROFILE.json)"
                    .into(),
            ],
        ),
        (Some(libc::ENOSYS), _) => (
            "this kernel has no io_uring (built without CONFIG_IO_URING)".into(),
            vec!["boot a kernel with CONFIG_IO_URING=y (Linux 6.8 or later)".into()],
        ),
        (e, _) => (
            format!(
                "io_uring_setup fails: {}",
                e.map_or("unknown error".into(), |e| {
                    std::io::Error::from_raw_os_error(e).to_string()
                })
            ),
            vec![sysctl_fix],
        ),
    }
}

/// The check, and the errno when io_uring_setup failed.
fn check_io_uring(f: &Facts) -> (Check, Option<i32>) {
    const WHAT: &str = "io_uring";
    match host::io_uring() {
        Ok(entries) => (
            Check::ok(
                WHAT,
                format!("io_uring_setup works ({entries} entries per engine thread)"),
            ),
            None,
        ),
        Err(e) => {
            let errno = match &e {
                uswap::Error::Sys { source, .. } => source.raw_os_error(),
                _ => None,
            };
            let disabled =
                read_trimmed("/proc/sys/kernel/io_uring_disabled").and_then(|v| v.parse().ok());
            let in_group = read_trimmed("/proc/sys/kernel/io_uring_group")
                .and_then(|g| g.parse::<u32>().ok())
                .is_some_and(in_group);
            let (why, fixes) =
                io_uring_advice(errno, disabled, f.seccomp == 2, f.uid == 0 || in_group);
            (
                Check::bad(Level::Fail, WHAT, format!("{why} ({e})"), fixes),
                errno,
            )
        }
    }
}

/// Whether this process has group `gid` (as its group or a supplementary one).
fn in_group(gid: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().any(|l| {
        (l.starts_with("Gid:") || l.starts_with("Groups:"))
            && l.split_whitespace()
                .skip(1)
                .any(|g| g.parse::<u32>() == Ok(gid))
    })
}

/// The swap place, opened as the engine opens it (O_DIRECT; RAM refused).
fn check_swap_place(args: &DoctorArgs) -> Check {
    const WHAT: &str = "swap place";
    let kind = args.tiers.tier.kind();
    if !matches!(
        kind,
        uswap::TierKind::File | uswap::TierKind::CompressedFile
    ) {
        return Check::ok(
            WHAT,
            format!("no swap file with --tier {}", args.tiers.tier.name()),
        );
    }
    let given = args.place.swap_file.as_deref();
    let max = args.place.max_swap.unwrap_or(uswap::MaxSwap::DEFAULT);
    let fix_place = || {
        vec![format!(
            "give --swap-file a directory on a disk filesystem that takes O_DIRECT (ext4, \
             xfs, btrfs), e.g. --swap-file /var/tmp{}",
            if given.is_some() {
                ""
            } else {
                ", or set TMPDIR to one"
            }
        )]
    };
    let sf = match uswap::SwapFile::open_capped(given, None, max, None) {
        Ok(sf) => sf,
        Err(e @ uswap::Error::SwapInRam { .. }) => {
            return Check::bad(
                Level::Fail,
                WHAT,
                format!("{e}: swapping to RAM frees no RAM"),
                fix_place(),
            )
        }
        Err(e) => return Check::bad(Level::Fail, WHAT, e.to_string(), fix_place()),
    };
    let mut found = format!("{}; O_DIRECT works", sf.place());
    let fs = mounts::of_path(sf.desc()).or_else(|| sf.desc().parent().and_then(mounts::of_path));
    if let Some(m) = fs {
        found.push_str(&format!(
            "; {} ({}) at {}",
            m.fstype,
            m.source,
            m.point.display()
        ));
    }
    if let Some(free) = sf.fs_free_bytes() {
        found.push_str(&format!("; {} free", uswap::format_size(free)));
    }
    let cap = sf.max_bytes();
    found.push_str(&format!("; grows to at most {}", uswap::format_size(cap)));
    if let Some(z) = sf.zram() {
        return Check::bad(
            Level::Warn,
            WHAT,
            format!("{found}; it is on {z}, compressed RAM: swapped pages still take RAM"),
            fix_place(),
        );
    }
    if cap < args.place.budget {
        return Check::bad(
            Level::Warn,
            WHAT,
            format!(
                "{found}: less than the budget ({}); once full, pages stay in RAM over the budget",
                uswap::format_size(args.place.budget)
            ),
            vec![
                "free space there, raise --max-swap, or choose a bigger place with --swap-file"
                    .into(),
            ],
        );
    }
    Check::ok(WHAT, found)
}

/// This process's memory cgroup and its limit: a run stays under the room it leaves.
fn check_memcg(budget: u64) -> Check {
    const WHAT: &str = "memory cgroup";
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let path = cgroups
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            (ctrl.split(',').any(|c| c == "memory")).then(|| format!("{path} (v1)"))
        })
        .or_else(|| {
            cgroups
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(|p| format!("{p} (v2)")))
        })
        .unwrap_or_else(|| "none".into());
    match uswap::memcg::limit() {
        None => Check::ok(WHAT, format!("{path}: no limit below the machine's RAM")),
        Some(limit) if limit <= budget => Check::bad(
            Level::Warn,
            WHAT,
            format!(
                "{path}: limit {} is not above the budget {}: uswap keeps under the room \
                 the cgroup leaves, so the budget is not what holds",
                uswap::format_size(limit),
                uswap::format_size(budget)
            ),
            vec![
                "give a --budget below the limit, or use --fill-memcg to take the cgroup's room"
                    .into(),
            ],
        ),
        Some(limit) => Check::ok(
            WHAT,
            format!(
                "{path}: limit {}; uswap also stays under the room it leaves",
                uswap::format_size(limit)
            ),
        ),
    }
}

/// The bracketed choice of a THP setting file ("always [madvise] never" → "madvise").
fn thp_choice(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

/// Transparent huge pages: the engine maps its 2 MiB units with MADV_HUGEPAGE.
fn check_thp() -> Check {
    const WHAT: &str = "THP";
    let dir = Path::new("/sys/kernel/mm/transparent_hugepage");
    let read = |f: &str| read_trimmed(dir.join(f));
    let (Some(enabled), Some(defrag)) = (read("enabled"), read("defrag")) else {
        return Check::bad(
            Level::Warn,
            WHAT,
            "this kernel has no transparent huge pages: 2 MiB units are mapped as 4 KiB pages",
            vec!["boot a kernel with CONFIG_TRANSPARENT_HUGEPAGE=y".into()],
        );
    };
    let enabled = thp_choice(&enabled).unwrap_or("?").to_string();
    let defrag = thp_choice(&defrag).unwrap_or("?").to_string();
    let shmem = read("shmem_enabled")
        .and_then(|s| thp_choice(&s).map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let found =
        format!("enabled {enabled}, defrag {defrag}, shmem_enabled {shmem} (uswap uses no shmem)");
    if enabled == "never" {
        return Check::bad(
            Level::Warn,
            WHAT,
            format!("{found}: uswap's 2 MiB units are mapped as 4 KiB pages (slower faults)"),
            vec!["echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled".into()],
        );
    }
    if matches!(defrag.as_str(), "never" | "defer") {
        return Check::bad(
            Level::Warn,
            WHAT,
            format!(
                "{found}: huge pages for uswap's units (MADV_HUGEPAGE) only when free ones \
                 are at hand; more 4 KiB pages"
            ),
            vec!["echo defer+madvise | sudo tee /sys/kernel/mm/transparent_hugepage/defrag".into()],
        );
    }
    Check::ok(WHAT, found)
}

/// RLIMIT_MEMLOCK, from /proc/self/limits: "unlimited" or bytes.
fn memlock_limit() -> Option<(String, Option<u64>)> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .next()?
        .to_string();
    let bytes = soft.parse().ok();
    Some((soft, bytes))
}

fn check_memlock(io_uring_failed_enomem: bool) -> Check {
    const WHAT: &str = "memlock";
    let Some((soft, bytes)) = memlock_limit() else {
        return Check::ok(WHAT, "RLIMIT_MEMLOCK unknown (no /proc/self/limits)");
    };
    let shown = bytes.map_or(soft, uswap::format_size);
    let found = format!(
        "RLIMIT_MEMLOCK {shown} (io_uring's rings count against it before Linux 5.12; \
         memory a program locks stays resident, outside the budget)"
    );
    if io_uring_failed_enomem {
        return Check::bad(
            Level::Fail,
            WHAT,
            found,
            vec!["ulimit -l 1024, LimitMEMLOCK=1M in a systemd unit, or --ulimit memlock=1048576 for docker".into()],
        );
    }
    Check::ok(WHAT, found)
}

/// The library `uswap run` preloads.
fn check_preload() -> Check {
    const WHAT: &str = "preload";
    match preload::library() {
        Ok(lib) => Check::ok(WHAT, format!("{} ({})", lib.path.display(), lib.origin)),
        Err(e) => Check::bad(
            Level::Fail,
            WHAT,
            e,
            vec![format!(
                "set HOME or XDG_RUNTIME_DIR to a writable directory of this user, or {} \
                 to a libuswap_preload.so",
                preload::OVERRIDE
            )],
        ),
    }
}

/// What `uswap run` does before it starts PROGRAM: a pool with these settings.
/// `explained`: a check before failed, which is why this one does too.
fn check_pool(args: &DoctorArgs, explained: bool) -> Check {
    const WHAT: &str = "settings";
    if let Err(e) = args.tiers.check() {
        return Check::bad(Level::Fail, WHAT, e, vec!["correct the options".into()]);
    }
    let b = run::pool_builder(
        args.place.budget,
        &args.tiers,
        args.place.encrypt,
        args.place.swap_file.as_deref(),
        args.place.max_swap,
    );
    match b.build() {
        Ok(pool) => Check::ok(
            WHAT,
            format!(
                "a pool with a {} budget starts (tier {}; swap: {})",
                uswap::format_size(args.place.budget),
                args.tiers.tier.name(),
                pool.swap_place()
            ),
        ),
        Err(e) => Check::bad(
            Level::Fail,
            WHAT,
            format!("a pool with these settings does not start: {e}"),
            vec![if explained {
                "fix what the lines above say".into()
            } else {
                "change what the error names (a cluster that answers at --remote, a \
                 --swap-file that can be made, a budget that fits in RAM, ...)"
                    .into()
            }],
        ),
    }
}

pub fn main(args: DoctorArgs) -> i32 {
    let facts = Facts::read();
    println!(
        "uswap doctor: can `uswap run` work here? (user {}, uid {}, Linux {})",
        facts.user, facts.uid, facts.kernel
    );
    let uffd = host::userfaultfd();
    let (io_uring, io_uring_errno) = check_io_uring(&facts);
    let mut checks = vec![
        check_userfaultfd(&uffd, &facts),
        check_features(&uffd, &facts),
        io_uring,
        check_swap_place(&args),
        check_memcg(args.place.budget),
        check_thp(),
        check_memlock(io_uring_errno == Some(libc::ENOMEM)),
        check_preload(),
    ];
    let explained = checks.iter().any(|c| c.level == Level::Fail);
    checks.push(check_pool(&args, explained));
    for c in &checks {
        c.print();
    }
    let fails = checks.iter().filter(|c| c.level == Level::Fail).count();
    let warns = checks.iter().filter(|c| c.level == Level::Warn).count();
    if fails == 0 {
        println!(
            "uswap run will work here with these settings{}",
            match warns {
                0 => String::new(),
                n => format!(" ({n} warning{} above)", if n == 1 { "" } else { "s" }),
            }
        );
        0
    } else {
        println!(
            "uswap run will NOT work here with these settings: {fails} problem{} (FAIL) above",
            if fails == 1 { "" } else { "s" }
        );
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_uring_advice_names_the_sysctl_when_disabled() {
        let (why, fixes) = io_uring_advice(Some(libc::EPERM), Some(2), false, true);
        assert!(why.contains("kernel.io_uring_disabled = 2"), "{why}");
        assert!(
            fixes[0].contains("sysctl -w kernel.io_uring_disabled=0"),
            "{fixes:?}"
        );
        let (why, fixes) = io_uring_advice(Some(libc::EPERM), Some(1), false, false);
        assert!(why.contains("io_uring_group"), "{why}");
        assert!(fixes[0].contains("kernel.io_uring_disabled=0"), "{fixes:?}");
    }

    #[test]
    fn io_uring_advice_names_seccomp_under_a_filter() {
        let (why, fixes) = io_uring_advice(Some(libc::EPERM), Some(0), true, true);
        assert!(why.contains("seccomp"), "{why}");
        assert!(fixes[0].contains("seccomp="), "{fixes:?}");
        // root with io_uring_disabled = 1 is allowed: a refusal is the filter's
        let (why, _) = io_uring_advice(Some(libc::EPERM), Some(1), true, true);
        assert!(why.contains("seccomp"), "{why}");
    }

    #[test]
    fn io_uring_advice_names_memlock_on_enomem() {
        let (why, fixes) = io_uring_advice(Some(libc::ENOMEM), Some(0), false, false);
        assert!(why.contains("RLIMIT_MEMLOCK"), "{why}");
        assert!(fixes[0].contains("ulimit -l"), "{fixes:?}");
    }

    #[test]
    fn thp_choice_reads_the_bracketed_word() {
        assert_eq!(thp_choice("always [madvise] never"), Some("madvise"));
        assert_eq!(
            thp_choice("always defer [defer+madvise] madvise never"),
            Some("defer+madvise")
        );
        assert_eq!(thp_choice("always"), None);
    }
}
