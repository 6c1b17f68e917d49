//! Mounting the filesystem (mount(2) of `fuse.uswap-faultfs` on a /dev/fuse fd, then
//! fuser's session on that fd in threads of this process) and unmounting it without ever
//! waiting on a hung connection.

use crate::fs::{FaultFs, State};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The `fsname` shown in /proc/mounts (the type is `fuse.uswap-faultfs`).
pub const FS_NAME: &str = "uswap-faultfs";

/// Threads serving requests (uswap keeps many I/Os in flight).
const SERVER_THREADS: usize = 4;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A mounted filesystem and the threads serving it.
#[derive(Debug)]
pub struct Mounted {
    mountpoint: PathBuf,
    session: Option<JoinHandle<io::Result<()>>>,
}

/// Mount `state`'s filesystem on `mountpoint` (an empty directory) and serve it.
pub fn mount(state: Arc<State>, mountpoint: &Path) -> io::Result<Mounted> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| io::Error::new(e.kind(), format!("open /dev/fuse: {e}")))?;
    let dev = OwnedFd::from(dev);
    let data = CString::new(format!(
        "fd={},rootmode=40755,user_id=0,group_id=0,allow_other",
        dev.as_raw_fd()
    ))
    .expect("no NUL");
    let target = cstr(mountpoint)?;
    let source = CString::new(FS_NAME).expect("no NUL");
    let fstype = CString::new(format!("fuse.{FS_NAME}")).expect("no NUL");
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("mount fuse on {}: {e}", mountpoint.display()),
        ));
    }
    // The kernel queued INIT at mount: the session answers it, then serves.
    let mut config = fuser::Config::default();
    config.n_threads = Some(SERVER_THREADS);
    config.clone_fd = true;
    let session =
        match fuser::Session::from_fd(FaultFs::new(state), dev, fuser::SessionACL::All, config) {
            Ok(s) => s,
            Err(e) => {
                force_unmount(mountpoint);
                return Err(io::Error::new(e.kind(), format!("FUSE handshake: {e}")));
            }
        };
    let session = std::thread::Builder::new()
        .name("faultfs-session".into())
        .spawn(move || session.run())
        .inspect_err(|_| force_unmount(mountpoint))?;
    Ok(Mounted {
        mountpoint: mountpoint.to_path_buf(),
        session: Some(session),
    })
}

/// Abort the FUSE connection of the mount at `mountpoint` (every pending and later
/// request fails at once: nothing waits on the server any more), then detach it.
/// `umount2(MNT_FORCE)` on FUSE aborts the connection; it needs no /sys/fs/fuse.
pub fn force_unmount(mountpoint: &Path) {
    if let Ok(c) = cstr(mountpoint) {
        // SAFETY: umount2 with a NUL-terminated path.
        unsafe {
            if libc::umount2(c.as_ptr(), libc::MNT_FORCE) != 0 {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// Abort the connection without unmounting: what a watchdog does to a hung mount
/// (blocked I/O fails with ENOTCONN instead of waiting forever).
pub fn abort(mountpoint: &Path) {
    if let Ok(c) = cstr(mountpoint) {
        // SAFETY: umount2 with a NUL-terminated path; FUSE aborts the connection in
        // umount_begin even when the unmount itself then fails with EBUSY.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_FORCE);
        }
    }
}

/// Is `mountpoint` a mount point now (per /proc/self/mounts)?
pub fn is_mounted(mountpoint: &Path) -> bool {
    mounts().iter().any(|(_, m, _)| m == mountpoint)
}

/// /proc/self/mounts as (source, mount point, type), octal escapes decoded.
pub fn mounts() -> Vec<(String, PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            let (s, m, t) = (w.next()?, w.next()?, w.next()?);
            Some((unescape(s), PathBuf::from(unescape(m)), unescape(t)))
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmount: plainly if nothing uses the mount, else abort the connection and detach
    /// it; then wait (at most `wait`) for the serving threads to end. Every problem met
    /// (busy, threads that did not end, still mounted) is in the error.
    pub fn unmount(mut self, wait: Duration) -> Result<(), String> {
        let mut problems = Vec::new();
        let c = cstr(&self.mountpoint).map_err(|e| e.to_string())?;
        // EBUSY can be passing: a process forked by another thread of this test
        // process holds every descriptor until it execs. Try again for a second.
        let mut tries = 0;
        let result = loop {
            // SAFETY: umount2 with a NUL-terminated path.
            if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
                break Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) || tries == 50 {
                break Err(e);
            }
            tries += 1;
            std::thread::sleep(Duration::from_millis(20));
        };
        let unmounted = result.is_ok();
        if let Err(e) = result {
            if e.raw_os_error() != Some(libc::EINVAL) {
                // Still in use (an open fd, a loop device): abort and detach.
                problems.push(format!(
                    "{} was busy at unmount ({e}): connection aborted, mount detached",
                    self.mountpoint.display()
                ));
            }
            force_unmount(&self.mountpoint);
        }
        let session = self.session.take().expect("unmounted once");
        let deadline = Instant::now() + wait;
        while !session.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !session.is_finished() {
            // Leave the thread behind; the process goes on.
            problems.push(format!("the FUSE session did not end within {wait:?}"));
        } else {
            match session.join() {
                Ok(Ok(())) => {}
                // The unmount tears the connection down; a server thread that was taking a
                // request off /dev/fuse at that moment gets ECONNABORTED instead of ENODEV
                // (fuse_dev_do_read finds its queue disconnected). Nothing was lost: the
                // unmount was ours.
                Ok(Err(e)) if unmounted && e.raw_os_error() == Some(libc::ECONNABORTED) => {}
                Ok(Err(e)) => problems.push(format!("the FUSE session ended with {e}")),
                Err(_) => problems.push("a FUSE session thread panicked".into()),
            }
        }
        if is_mounted(&self.mountpoint) {
            problems.push(format!("{} is still mounted", self.mountpoint.display()));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.session.is_some() {
            force_unmount(&self.mountpoint);
        }
    }
}
