//! The fault filesystem itself, seen the way uswap sees a swap device: O_DIRECT pread and
//! pwrite of 4 KiB-aligned buffers, on the file in the mount and through a loop device.
//! Every fault mode changes exactly the bytes its rule names (and the event log says
//! which), everything else is exact, and cleanup leaves nothing (also after a panic or a
//! SIGKILL). Needs root, /dev/fuse and loop devices: without them these tests FAIL.

// Lists of byte ranges, often of one range, are what these tests compare.
#![allow(clippy::single_range_in_vec_init)]

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use uswap_faultfs::harness::{FaultMount, Options};
use uswap_faultfs::{loopdev, mount, Kind};

const PAGE: usize = 4096;
const K: u64 = 1024;

/// Where the test does its I/O.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// The mount's `disk` file, opened O_DIRECT.
    File,
    /// A loop device over it, opened O_DIRECT.
    Loop,
}

fn setup(t: Target, size: u64) -> FaultMount {
    match t {
        Target::File => FaultMount::new(size),
        Target::Loop => FaultMount::with_loop(size),
    }
}

fn open_direct(fm: &FaultMount, t: Target) -> File {
    let path = match t {
        Target::File => fm.disk(),
        Target::Loop => fm.loop_device().expect("loop device").to_path_buf(),
    };
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {} O_DIRECT: {e}", path.display()))
}

/// A page-aligned buffer (O_DIRECT needs one), in safe code.
struct Aligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn zeroed(len: usize) -> Aligned {
        let v = vec![0u8; len + PAGE];
        let off = v.as_ptr().align_offset(PAGE);
        Aligned { v, off, len }
    }
    fn from(data: &[u8]) -> Aligned {
        let mut a = Aligned::zeroed(data.len());
        a.as_mut().copy_from_slice(data);
        a
    }
    fn as_ref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// Deterministic bytes that differ between seeds and between offsets.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn pwrite(f: &File, off: u64, data: &[u8]) -> std::io::Result<usize> {
    f.write_at(Aligned::from(data).as_ref(), off)
}

fn pread(f: &File, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut b = Aligned::zeroed(len);
    let n = f.read_at(b.as_mut(), off)?;
    assert_eq!(n, len, "short O_DIRECT read at {off}");
    Ok(b.as_ref().to_vec())
}

/// The bytes of the real file behind `disk` (no faults on this path).
fn backing(fm: &FaultMount, range: Range<u64>) -> Vec<u8> {
    let mut b = vec![0u8; (range.end - range.start) as usize];
    File::open(fm.backing())
        .unwrap()
        .read_exact_at(&mut b, range.start)
        .unwrap();
    b
}

/// The union of the `affected` ranges of events of `kind`, merged and sorted.
fn affected(fm: &FaultMount, kind: Kind) -> Vec<Range<u64>> {
    let mut r: Vec<Range<u64>> = fm
        .events()
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.affected)
        .collect();
    r.sort_by_key(|x| x.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for x in r {
        match out.last_mut() {
            Some(l) if x.start <= l.end => l.end = l.end.max(x.end),
            _ => out.push(x),
        }
    }
    out
}

/// Assert `got` (bytes at `base`) equals `want` except inside `changed`, where it equals
/// `there`; name the first difference.
fn assert_bytes(got: &[u8], base: u64, want: &[u8], changed: &[Range<u64>], there: &[u8]) {
    for (i, &g) in got.iter().enumerate() {
        let at = base + i as u64;
        let inside = changed.iter().any(|r| r.contains(&at));
        let w = if inside { there[i] } else { want[i] };
        assert_eq!(
            g,
            w,
            "byte {at} ({} a changed range {changed:?})",
            if inside { "inside" } else { "outside" }
        );
    }
}

// ---- unaffected I/O -------------------------------------------------------------------

fn unaffected_io_is_exact_and_reaches_the_filesystem(t: Target) {
    let fm = setup(t, 8 << 20);
    let f = open_direct(&fm, t);
    let data = pattern(1, 2 << 20);
    assert_eq!(pwrite(&f, 1 << 20, &data).unwrap(), data.len());
    assert_eq!(pread(&f, 1 << 20, data.len()).unwrap(), data);
    assert_eq!(backing(&fm, (1 << 20)..(3 << 20)), data, "stored bytes");
    // Zeros elsewhere (the disk starts sparse).
    assert!(pread(&f, 4 << 20, 64 << 10)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    let c = fm.counters();
    // No page cache in the way: every byte went through the handlers.
    assert!(c.write_bytes >= data.len() as u64, "{c:?}");
    assert!(c.read_bytes >= data.len() as u64 + (64 << 10), "{c:?}");
    assert!(fm.events().is_empty(), "{:?}", fm.events());
    drop(f);
    fm.close().unwrap();
}

#[test]
fn unaffected_io_is_exact_on_the_mounted_file() {
    unaffected_io_is_exact_and_reaches_the_filesystem(Target::File);
}

#[test]
fn unaffected_io_is_exact_through_a_loop_device() {
    unaffected_io_is_exact_and_reaches_the_filesystem(Target::Loop);
}

// ---- fail-read ------------------------------------------------------------------------

fn failed_reads_get_eio_only_in_their_range(t: Target) {
    let fm = setup(t, 1 << 20);
    let f = open_direct(&fm, t);
    let data = pattern(2, 128 << 10);
    pwrite(&f, 0, &data).unwrap();
    fm.control("fail-read 64k 4k").unwrap();
    for page in 0..32u64 {
        let off = page * PAGE as u64;
        match pread(&f, off, PAGE) {
            Ok(got) => {
                assert_ne!(page, 16, "read of the failed page succeeded");
                assert_eq!(got, data[off as usize..off as usize + PAGE], "page {page}");
            }
            Err(e) => {
                assert_eq!(page, 16, "page {page} failed: {e}");
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
            }
        }
    }
    let ev = fm.events();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (ev[0].kind, ev[0].affected.clone()),
        (Kind::FailRead, 64 * K..68 * K)
    );
    // Cleared: the page reads again, exact (the data was never harmed).
    fm.control("clear").unwrap();
    assert_eq!(pread(&f, 64 * K, PAGE).unwrap(), data[64 << 10..68 << 10]);
    drop(f);
    fm.close().unwrap();
}

#[test]
fn failed_reads_get_eio_on_the_mounted_file() {
    failed_reads_get_eio_only_in_their_range(Target::File);
}

#[test]
fn failed_reads_get_eio_through_a_loop_device() {
    failed_reads_get_eio_only_in_their_range(Target::Loop);
}

// ---- fail-write -----------------------------------------------------------------------

fn failed_writes_get_eio_and_store_nothing(t: Target) {
    let fm = setup(t, 1 << 20);
    let f = open_direct(&fm, t);
    let old = pattern(3, 128 << 10);
    let new = pattern(4, 128 << 10);
    pwrite(&f, 0, &old).unwrap();
    fm.control("fail-write 64k 4k errno=EIO").unwrap();
    for page in 0..32usize {
        let off = page * PAGE;
        match pwrite(&f, off as u64, &new[off..off + PAGE]) {
            Ok(n) => {
                assert_ne!(page, 16, "write of the failed page succeeded");
                assert_eq!(n, PAGE);
            }
            Err(e) => {
                assert_eq!(page, 16, "page {page} failed: {e}");
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
            }
        }
    }
    let failed = affected(&fm, Kind::FailWrite);
    assert_eq!(failed, vec![64 * K..68 * K]);
    assert_bytes(&pread(&f, 0, 128 << 10).unwrap(), 0, &new, &failed, &old);
    // Reading the old bytes of a failed write is a lost read, and says where.
    assert_eq!(affected(&fm, Kind::LostRead), failed);
    drop(f);
    fm.close().unwrap();
}

#[test]
fn failed_writes_get_eio_on_the_mounted_file() {
    failed_writes_get_eio_and_store_nothing(Target::File);
}

#[test]
fn failed_writes_get_eio_through_a_loop_device() {
    failed_writes_get_eio_and_store_nothing(Target::Loop);
}

// ---- drop-write -----------------------------------------------------------------------

fn dropped_writes_keep_the_old_bytes(t: Target) {
    let fm = setup(t, 1 << 20);
    let f = open_direct(&fm, t);
    let old = pattern(5, 256 << 10);
    let new = pattern(6, 256 << 10);
    pwrite(&f, 0, &old).unwrap();
    fm.control("drop-write 64k 8k").unwrap();
    // One write over it all: reported whole.
    assert_eq!(pwrite(&f, 0, &new).unwrap(), new.len());
    let dropped = affected(&fm, Kind::DropWrite);
    assert_eq!(dropped, vec![64 * K..72 * K], "{:?}", fm.events());
    assert_bytes(&backing(&fm, 0..256 * K), 0, &new, &dropped, &old);
    assert_bytes(&pread(&f, 0, 256 << 10).unwrap(), 0, &new, &dropped, &old);
    assert_eq!(affected(&fm, Kind::LostRead), dropped);
    // count=1: the next write over the range is stored again.
    fm.control("reset; drop-write 0 4k count=1").unwrap();
    pwrite(&f, 0, &old[..PAGE]).unwrap();
    pwrite(&f, 0, &old[..PAGE]).unwrap();
    assert_eq!(backing(&fm, 0..4 * K), old[..PAGE]);
    assert_eq!(fm.counters().hits(Kind::DropWrite), 1);
    drop(f);
    fm.close().unwrap();
}

#[test]
fn dropped_writes_keep_the_old_bytes_on_the_mounted_file() {
    dropped_writes_keep_the_old_bytes(Target::File);
}

#[test]
fn dropped_writes_keep_the_old_bytes_through_a_loop_device() {
    dropped_writes_keep_the_old_bytes(Target::Loop);
}

// ---- tear-write -----------------------------------------------------------------------

fn torn_writes_keep_only_their_first_bytes(t: Target) {
    let fm = setup(t, 1 << 20);
    let f = open_direct(&fm, t);
    let old = pattern(7, 128 << 10);
    let new = pattern(8, 128 << 10);
    pwrite(&f, 0, &old).unwrap();
    fm.control("tear-write 0 128k keep=4k").unwrap();
    assert_eq!(pwrite(&f, 0, &new).unwrap(), new.len());
    let lost = affected(&fm, Kind::TearWrite);
    // Each request kept its first 4 KiB: the write's first page is new, and what is
    // lost is all old bytes. (One 128 KiB write is one FUSE request here; if the kernel
    // split it, each part would keep its own first 4 KiB: the events say so.)
    assert!(
        !lost.is_empty() && lost[0].start == 4 * K,
        "{:?}",
        fm.events()
    );
    for e in fm.events() {
        assert_eq!(e.affected.start, e.request.start + 4 * K, "{e:?}");
        assert_eq!(e.affected.end, e.request.end, "{e:?}");
    }
    assert_bytes(&backing(&fm, 0..128 * K), 0, &new, &lost, &old);
    assert_bytes(&pread(&f, 0, 128 << 10).unwrap(), 0, &new, &lost, &old);
    if matches!(t, Target::File) {
        assert_eq!(lost, vec![4 * K..128 * K]);
    }
    drop(f);
    fm.close().unwrap();
}

#[test]
fn torn_writes_keep_their_first_page_on_the_mounted_file() {
    torn_writes_keep_only_their_first_bytes(Target::File);
}

#[test]
fn torn_writes_keep_their_first_page_through_a_loop_device() {
    torn_writes_keep_only_their_first_bytes(Target::Loop);
}

// ---- flip-read, flip-write, corrupt -----------------------------------------------------

fn xored(data: &[u8], x: u8) -> Vec<u8> {
    data.iter().map(|b| b ^ x).collect()
}

fn flipped_bytes_differ_exactly_where_configured(t: Target) {
    let fm = setup(t, 1 << 20);
    let f = open_direct(&fm, t);
    let data = pattern(9, 64 << 10);
    pwrite(&f, 0, &data).unwrap();

    // On read: returned flipped, stored intact; count=1 lets the retry through.
    fm.control("flip-read 1000 10 xor=0x5a count=1").unwrap();
    let got = pread(&f, 0, 64 << 10).unwrap();
    assert_bytes(&got, 0, &data, &[1000..1010], &xored(&data, 0x5a));
    assert_eq!(
        backing(&fm, 0..64 * K),
        data,
        "flip-read changed the stored bytes"
    );
    assert_eq!(pread(&f, 0, 64 << 10).unwrap(), data, "the retry is exact");
    assert_eq!(affected(&fm, Kind::FlipRead), vec![1000..1010]);

    // On write: stored flipped, and read back so.
    fm.control("reset; flip-write 5000 3 xor=0x01").unwrap();
    pwrite(&f, 0, &data).unwrap();
    let want = [5000..5003];
    assert_bytes(
        &backing(&fm, 0..64 * K),
        0,
        &data,
        &want,
        &xored(&data, 0x01),
    );
    assert_bytes(
        &pread(&f, 0, 64 << 10).unwrap(),
        0,
        &data,
        &want,
        &xored(&data, 0x01),
    );
    assert_eq!(affected(&fm, Kind::LostRead), want);

    // corrupt: the stored bytes, now.
    fm.control("reset; corrupt 8k 2 xor=0x80").unwrap();
    let got = pread(&f, 8 * K, PAGE).unwrap();
    let page = &data[8 << 10..12 << 10];
    assert_bytes(&got, 8 * K, page, &[8 * K..8 * K + 2], &xored(page, 0x80));
    assert_eq!(affected(&fm, Kind::Corrupt), vec![8 * K..8 * K + 2]);
    drop(f);
    fm.close().unwrap();
}

#[test]
fn flipped_bytes_differ_exactly_where_configured_on_the_mounted_file() {
    flipped_bytes_differ_exactly_where_configured(Target::File);
}

#[test]
fn flipped_bytes_differ_exactly_where_configured_through_a_loop_device() {
    flipped_bytes_differ_exactly_where_configured(Target::Loop);
}

// ---- the control file ---------------------------------------------------------------------

#[test]
fn the_control_file_takes_commands_and_shows_rules_counters_and_events() {
    let fm = FaultMount::new(1 << 20);
    let ctl = fm.control_file();
    std::fs::write(&ctl, "fail-read 0 4k count=1 # one read fails\n").unwrap();
    let status = std::fs::read_to_string(&ctl).unwrap();
    assert!(
        status.contains("rule 1 fail-read 0 4096 errno=EIO remaining=1 hits=0"),
        "{status}"
    );
    // A bad batch applies nothing, fails the write, and says why.
    let e = std::fs::write(&ctl, "drop-write 0 4k\nbogus 1 2\n").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    let status = std::fs::read_to_string(&ctl).unwrap();
    assert!(
        status.contains("last_error unknown command \"bogus\""),
        "{status}"
    );
    assert!(!status.contains("drop-write 0 4096"), "{status}");

    let f = open_direct(&fm, Target::File);
    assert_eq!(
        pread(&f, 0, PAGE).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    assert!(
        pread(&f, 0, PAGE).is_ok(),
        "count=1: the second read passes"
    );
    let status = std::fs::read_to_string(&ctl).unwrap();
    for want in [
        "rule 1 fail-read 0 4096 errno=EIO remaining=0 hits=1",
        "injected fail-read hits=1 bytes=4096",
        "event 1 fail-read rule=1 file=disk request=0 4096 affected=0 4096",
    ] {
        assert!(status.contains(want), "no {want:?} in\n{status}");
    }
    // The harness's view is the same state.
    assert_eq!(fm.counters().hits(Kind::FailRead), 1);
    std::fs::write(&ctl, "reset").unwrap();
    assert!(fm.rules().is_empty() && fm.events().is_empty());
    drop(f);
    fm.close().unwrap();
}

// ---- the mount as a swap directory ------------------------------------------------------

#[test]
fn a_new_file_in_the_mount_works_like_uswaps_swap_file_and_o_tmpfile_does_not() {
    let fm = FaultMount::new(1 << 20);
    // uswap's default placement: O_TMPFILE in the directory. FUSE via fuser has none.
    let e = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE | libc::O_DIRECT)
        .open(fm.mountpoint())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    // uswap's other placement: a new path, 0600, unlinked at once while open.
    let path = fm.mountpoint().join("swap");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    std::fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    // SAFETY: fallocate on an fd we own (uswap grows its file so).
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 2 << 20) };
    assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
    let old = pattern(10, 64 << 10);
    let new = pattern(11, 64 << 10);
    pwrite(&f, 0, &old).unwrap();
    fm.control("drop-write 8k 4k").unwrap();
    pwrite(&f, 0, &new).unwrap();
    assert_bytes(
        &pread(&f, 0, 64 << 10).unwrap(),
        0,
        &new,
        &[8 * K..12 * K],
        &old,
    );
    // Events name the unlinked file by inode.
    let ev = fm.events();
    assert!(ev.iter().all(|e| e.file.starts_with('#')), "{ev:?}");
    drop(f);
    // Its data went with the last close: nothing under files/.
    let left: Vec<_> = std::fs::read_dir(fm.dir().join("files")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    fm.close().unwrap();
}

// ---- cleanup ------------------------------------------------------------------------------

fn losetup_a() -> String {
    let out = Command::new("losetup")
        .arg("-a")
        .output()
        .expect("run losetup -a");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Nothing of a setup in `dir` (mount point `dir/mnt`, loop device `dev`) is left.
fn assert_nothing_left(dir: &Path, dev: Option<&Path>) {
    let mnt = dir.join("mnt");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(&*mnt.to_string_lossy()),
        "{} still mounted:\n{mounts}",
        mnt.display()
    );
    assert!(!mount::is_mounted(&mnt));
    let ls = losetup_a();
    assert!(
        !ls.contains(&*dir.to_string_lossy()),
        "loop device left:\n{ls}"
    );
    assert!(
        loopdev::attached().iter().all(|(_, b)| !b.starts_with(dir)),
        "{:?}",
        loopdev::attached()
    );
    if let Some(dev) = dev {
        let n: u32 = dev.to_string_lossy()["/dev/loop".len()..].parse().unwrap();
        // The number may have been taken by another test since: only not by us.
        if let Some(b) = loopdev::backing_file(n) {
            assert!(
                !b.starts_with(dir),
                "{} still over {}",
                dev.display(),
                b.display()
            );
        }
    }
    assert!(!dir.exists(), "{} left", dir.display());
}

#[test]
fn close_leaves_no_mount_no_loop_device_no_files() {
    let fm = FaultMount::with_loop(4 << 20);
    let (dir, dev) = (
        fm.dir().to_path_buf(),
        fm.loop_device().unwrap().to_path_buf(),
    );
    assert!(mount::is_mounted(fm.mountpoint()));
    assert!(losetup_a().contains(&*dir.to_string_lossy()));
    let f = open_direct(&fm, Target::Loop);
    pwrite(&f, 0, &pattern(12, 4096)).unwrap();
    drop(f);
    fm.close().unwrap();
    assert_nothing_left(&dir, Some(&dev));
}

#[test]
fn a_panicking_test_leaves_no_mount_no_loop_device_no_files() {
    let (tx, rx) = std::sync::mpsc::channel();
    let r = std::thread::spawn(move || {
        let fm = FaultMount::with_loop(4 << 20);
        fm.control("fail-read all").unwrap();
        tx.send((
            fm.dir().to_path_buf(),
            fm.loop_device().unwrap().to_path_buf(),
        ))
        .unwrap();
        let f = open_direct(&fm, Target::Loop);
        let e = pread(&f, 0, PAGE).unwrap_err();
        panic!("a test fails here ({e}) with the device open");
    })
    .join();
    assert!(r.is_err(), "the thread was meant to panic");
    let (dir, dev) = rx.recv().unwrap();
    assert_nothing_left(&dir, Some(&dev));
}

#[test]
fn a_busy_mount_is_still_taken_down_and_the_problem_reported() {
    let fm = FaultMount::new(1 << 20);
    let dir = fm.dir().to_path_buf();
    // A file left open on the mount (a leaked fd, a crashed program's last moments).
    let f = open_direct(&fm, Target::File);
    let e = fm.close().unwrap_err();
    assert!(e.contains("busy"), "{e}");
    // The connection is aborted: I/O on the leftover fd fails at once, never hangs.
    let r = pread(&f, 0, PAGE).unwrap_err();
    assert!(
        matches!(
            r.raw_os_error(),
            Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)
        ),
        "{r}"
    );
    drop(f);
    assert_nothing_left(&dir, None);
}

#[test]
fn the_watchdog_aborts_a_mount_that_outlives_its_deadline() {
    let fm = FaultMount::start(Options {
        disk_size: 1 << 20,
        watchdog: Some(Duration::from_secs(2)),
        ..Options::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = fm.dir().to_path_buf();
    let f = open_direct(&fm, Target::File);
    let t0 = Instant::now();
    loop {
        match pread(&f, 0, PAGE) {
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
                break;
            }
            Ok(_) if t0.elapsed() > Duration::from_secs(10) => {
                panic!("the watchdog did not abort the mount within 10 s")
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    drop(f);
    // Cleanup still works on an aborted mount.
    fm.close().unwrap();
    assert_nothing_left(&dir, None);
}

#[test]
fn a_sigkilled_server_is_swept_by_the_next_start() {
    // A private base directory, so the sweep only sees this test's leftovers.
    let base = PathBuf::from(format!(
        "/var/tmp/uswap-faultfs-sweep-test.{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&base).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_uswap-faultfs"))
        .args(["--size", "4M", "--loop", "--dir"])
        .arg(&base)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start uswap-faultfs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut mountpoint = None;
    let t0 = Instant::now();
    for l in lines.by_ref() {
        let l = l.unwrap();
        if let Some(m) = l.strip_prefix("mountpoint ") {
            mountpoint = Some(PathBuf::from(m));
        }
        if l == "ready" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "uswap-faultfs did not start"
        );
    }
    let mnt = mountpoint.expect("uswap-faultfs printed its mount point");
    let dir = mnt.parent().unwrap().to_path_buf();
    assert!(mount::is_mounted(&mnt));
    child.kill().unwrap(); // SIGKILL: no cleanup of its own
    child.wait().unwrap();
    // The dead server's mount is left behind (aborted)...
    assert!(
        mount::is_mounted(&mnt),
        "expected a leftover mount to sweep"
    );
    // ...until the next start sweeps it.
    let fm = FaultMount::start(Options {
        disk_size: 1 << 20,
        base_dir: Some(base.clone()),
        ..Options::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_nothing_left(&dir, None);
    fm.close().unwrap();
    std::fs::remove_dir(&base).unwrap();
}

// ---- run_with_deadline ------------------------------------------------------------------

#[test]
fn run_with_deadline_captures_output_and_kills_a_program_past_its_deadline() {
    use uswap_faultfs::run_with_deadline;
    let out = run_with_deadline(
        Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
        Duration::from_secs(30),
    );
    assert_eq!(
        (out.code(), out.timed_out),
        (Some(3), false),
        "{}",
        out.describe()
    );
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("out\n", "err\n")
    );
    // A hung program (and its children, one process group) is killed at the deadline.
    let out = run_with_deadline(
        Command::new("sh").args(["-c", "echo started; sleep 60 & wait"]),
        Duration::from_secs(2),
    );
    assert!(out.timed_out && out.status.is_none(), "{}", out.describe());
    assert_eq!(out.stdout, "started\n");
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
}
