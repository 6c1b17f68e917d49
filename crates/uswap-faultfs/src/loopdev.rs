//! Loop devices over a file (ioctls of linux/loop.h): attached with autoclear and held
//! open, so that the device goes away when the last user closes it, even if this
//! process dies without cleaning up.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_NAME_SIZE: usize = 64;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// An attached loop device, held open.
#[derive(Debug)]
pub struct LoopDevice {
    path: PathBuf,
    number: u32,
    backing: PathBuf,
    dev: Option<File>,
}

/// The backing file of `/dev/loopN`, if it is attached.
pub fn backing_file(number: u32) -> Option<PathBuf> {
    let s = std::fs::read_to_string(format!("/sys/block/loop{number}/loop/backing_file")).ok()?;
    Some(PathBuf::from(s.trim_end_matches('\n')))
}

/// Every attached loop device: (number, backing file).
pub fn attached() -> Vec<(u32, PathBuf)> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<(u32, PathBuf)> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("loop")?.parse().ok())
        .filter_map(|n| backing_file(n).map(|b| (n, b)))
        .collect();
    out.sort();
    out
}

fn ioctl_err(what: &str, path: &Path) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

impl LoopDevice {
    /// Attach a free loop device to `backing` (read-write) with logical blocks of
    /// `block_size` bytes.
    pub fn attach(backing: &Path, block_size: u32) -> io::Result<LoopDevice> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(backing)
            .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", backing.display())))?;
        let ctl_path = Path::new("/dev/loop-control");
        let ctl = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(ctl_path)
            .map_err(|e| io::Error::new(e.kind(), format!("open /dev/loop-control: {e}")))?;
        let mut name = [0u8; LO_NAME_SIZE];
        let b = backing.as_os_str().as_encoded_bytes();
        let n = b.len().min(LO_NAME_SIZE - 1);
        name[..n].copy_from_slice(&b[..n]);
        // Another process may take the free device first: then ask again.
        for _ in 0..50 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
            let number = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if number < 0 {
                return Err(ioctl_err("LOOP_CTL_GET_FREE on", ctl_path));
            }
            let path = PathBuf::from(format!("/dev/loop{number}"));
            let dev = match open_device(&path) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let config = LoopConfig {
                fd: file.as_raw_fd() as u32,
                block_size,
                info: LoopInfo64 {
                    lo_device: 0,
                    lo_inode: 0,
                    lo_rdevice: 0,
                    lo_offset: 0,
                    lo_sizelimit: 0,
                    lo_number: 0,
                    lo_encrypt_type: 0,
                    lo_encrypt_key_size: 0,
                    lo_flags: LO_FLAGS_AUTOCLEAR,
                    lo_file_name: name,
                    lo_crypt_name: [0; LO_NAME_SIZE],
                    lo_encrypt_key: [0; 32],
                    lo_init: [0; 2],
                },
                reserved: [0; 8],
            };
            // SAFETY: LOOP_CONFIGURE reads one struct loop_config through the pointer.
            let r = unsafe {
                libc::ioctl(
                    dev.as_raw_fd(),
                    LOOP_CONFIGURE,
                    &config as *const LoopConfig,
                )
            };
            if r == 0 {
                return Ok(LoopDevice {
                    path,
                    number: number as u32,
                    backing: backing.to_path_buf(),
                    dev: Some(dev),
                });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "LOOP_CONFIGURE {} over {}: {e}",
                        path.display(),
                        backing.display()
                    ),
                ));
            }
        }
        Err(io::Error::other("no free loop device after 50 tries"))
    }

    /// `/dev/loopN`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn number(&self) -> u32 {
        self.number
    }

    /// Detach: clear it and close it, then wait (at most `wait`) until the kernel shows
    /// it unbound. An error says what is left (e.g. another process still has it open).
    pub fn detach(mut self, wait: Duration) -> Result<(), String> {
        self.release();
        let deadline = Instant::now() + wait;
        loop {
            match backing_file(self.number) {
                Some(b) if b.starts_with(&self.backing) || b == self.backing => {}
                _ => return Ok(()),
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} is still attached to {} {wait:?} after detach (open elsewhere?); \
                     autoclear detaches it when the last user closes it",
                    self.path.display(),
                    self.backing.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn release(&mut self) {
        if let Some(dev) = self.dev.take() {
            // SAFETY: LOOP_CLR_FD takes no argument. With autoclear set it only marks
            // the device; it is unbound when the last opener (this fd, below) closes.
            unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD, 0) };
            drop(dev);
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        self.release();
    }
}

fn open_device(path: &Path) -> io::Result<File> {
    // devtmpfs may add a new node a moment after LOOP_CTL_GET_FREE made it.
    let mut tries = 0;
    loop {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
        {
            Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            r => {
                return r
                    .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))
            }
        }
    }
}

/// Detach (by clearing it) any loop device whose backing file is under `dir`.
pub fn detach_under(dir: &Path) {
    for (n, b) in attached() {
        if b.starts_with(dir) {
            let path = PathBuf::from(format!("/dev/loop{n}"));
            if let Ok(dev) = std::fs::OpenOptions::new().read(true).open(&path) {
                // SAFETY: LOOP_CLR_FD takes no argument.
                unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD, 0) };
            }
        }
    }
}
