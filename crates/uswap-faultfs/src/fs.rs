//! The FUSE filesystem: a root directory holding `disk` (the served backing file),
//! `control` (the control file) and any files created in it, every data read and write
//! passing through the fault rules.
//!
//! Every file is opened with `FOPEN_DIRECT_IO`: no page cache, so each read and write of
//! a program (O_DIRECT or not, through a loop device or not) reaches these handlers.

use crate::rules::{self, Faults, ReadPlan, Store, WritePlan};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// Name of the served backing file in the mount.
pub const DISK_NAME: &str = "disk";
/// Name of the control file in the mount.
pub const CONTROL_NAME: &str = "control";

const DISK_INO: u64 = 2;
const CONTROL_INO: u64 = 3;
const FIRST_CREATED_INO: u64 = 4;

/// Attributes and entries are not cached: sizes change under the kernel's feet.
const TTL: Duration = Duration::ZERO;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeKind {
    Disk,
    Control,
    Created,
}

#[derive(Debug)]
struct Node {
    kind: NodeKind,
    /// The data (none for the control file).
    file: Option<Arc<File>>,
    /// Its name, or `#INO` once unlinked (for events).
    label: String,
    /// Still has a name in the root directory.
    linked: bool,
    /// Open handles.
    opens: u32,
    perm: u16,
    uid: u32,
    gid: u32,
    created: SystemTime,
}

/// An open handle: its inode, and for the control file the status text taken at the
/// first read (so that one `cat` sees one consistent status).
#[derive(Debug)]
struct Handle {
    ino: u64,
    status: Option<Arc<Vec<u8>>>,
}

#[derive(Debug, Default)]
struct Tree {
    names: BTreeMap<String, u64>,
    nodes: HashMap<u64, Node>,
    handles: HashMap<u64, Handle>,
    next_ino: u64,
    next_fh: u64,
}

/// A data file as one request sees it.
struct DataFile {
    file: Arc<File>,
    ino: u64,
    label: String,
    kind: NodeKind,
}

/// What the filesystem and its owner (the harness, the binary) share.
#[derive(Debug)]
pub struct State {
    faults: Mutex<Faults>,
    tree: Mutex<Tree>,
    /// Where created files' data lives (each one is unlinked at once, kept open).
    files_dir: PathBuf,
    disk_len: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// Serve `disk` (an existing file of fixed length) and create new files' data in
    /// `files_dir`.
    pub fn new(disk: &Path, files_dir: &Path) -> std::io::Result<Arc<State>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(disk)?;
        let disk_len = file.metadata()?.len();
        let now = SystemTime::now();
        let mut tree = Tree {
            next_ino: FIRST_CREATED_INO,
            next_fh: 1,
            ..Tree::default()
        };
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        for (ino, name, kind, file, perm) in [
            (
                DISK_INO,
                DISK_NAME,
                NodeKind::Disk,
                Some(Arc::new(file)),
                0o600,
            ),
            (CONTROL_INO, CONTROL_NAME, NodeKind::Control, None, 0o600),
        ] {
            tree.names.insert(name.to_string(), ino);
            tree.nodes.insert(
                ino,
                Node {
                    kind,
                    file,
                    label: name.to_string(),
                    linked: true,
                    opens: 0,
                    perm,
                    uid,
                    gid,
                    created: now,
                },
            );
        }
        Ok(Arc::new(State {
            faults: Mutex::new(Faults::default()),
            tree: Mutex::new(tree),
            files_dir: files_dir.to_path_buf(),
            disk_len,
        }))
    }

    /// Run control commands (the control language, see the crate docs). All or nothing:
    /// a bad command applies none and is returned as the error.
    pub fn control(&self, text: &str) -> Result<(), String> {
        let commands = match rules::parse_commands(text) {
            Ok(c) => c,
            Err(e) => {
                lock(&self.faults).set_last_error(e.clone());
                return Err(e);
            }
        };
        let corrupt = lock(&self.faults).apply(commands);
        for (range, xor) in corrupt {
            self.corrupt(range, xor)
                .map_err(|e| format!("corrupt: {e}"))?;
        }
        Ok(())
    }

    /// XOR the stored bytes of `range` of every data file with `xor`.
    fn corrupt(&self, range: std::ops::Range<u64>, xor: u8) -> std::io::Result<()> {
        let files: Vec<(u64, String, Arc<File>)> = lock(&self.tree)
            .nodes
            .iter()
            .filter_map(|(i, n)| n.file.clone().map(|f| (*i, n.label.clone(), f)))
            .collect();
        for (ino, label, f) in files {
            let len = f.metadata()?.len();
            let r = range.start.min(len)..range.end.min(len);
            if r.is_empty() {
                continue;
            }
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            f.read_exact_at(&mut buf, r.start)?;
            buf.iter_mut().for_each(|b| *b ^= xor);
            f.write_all_at(&buf, r.start)?;
            lock(&self.faults).record_corrupt(ino, &label, r);
        }
        Ok(())
    }

    /// Run `f` on the rules, events and counters.
    pub fn with_faults<T>(&self, f: impl FnOnce(&Faults) -> T) -> T {
        f(&lock(&self.faults))
    }

    /// The status text (what reading the control file gives).
    pub fn status(&self) -> String {
        lock(&self.faults).status()
    }

    /// Length of the served `disk`.
    pub fn disk_len(&self) -> u64 {
        self.disk_len
    }

    fn attr(&self, ino: u64, n: &Node) -> FileAttr {
        let size = match &n.file {
            Some(f) => f.metadata().map(|m| m.len()).unwrap_or(0),
            None => 0,
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: n.created,
            mtime: n.created,
            ctime: n.created,
            crtime: n.created,
            kind: FileType::RegularFile,
            perm: n.perm,
            nlink: u32::from(n.linked),
            uid: n.uid,
            gid: n.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn root_attr(&self) -> FileAttr {
        let t = SystemTime::UNIX_EPOCH;
        FileAttr {
            ino: INodeNo::ROOT,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn getattr_of(&self, ino: u64) -> Result<FileAttr, Errno> {
        if ino == INodeNo::ROOT.0 {
            return Ok(self.root_attr());
        }
        let tree = lock(&self.tree);
        let n = tree.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        Ok(self.attr(ino, n))
    }

    /// The data file behind handle `fh`.
    fn data_file(&self, fh: u64) -> Result<DataFile, Errno> {
        let tree = lock(&self.tree);
        let ino = tree.handles.get(&fh).ok_or(Errno::EBADF)?.ino;
        let n = tree.nodes.get(&ino).ok_or(Errno::EBADF)?;
        Ok(DataFile {
            file: n.file.clone().ok_or(Errno::EINVAL)?,
            ino,
            label: n.label.clone(),
            kind: n.kind,
        })
    }

    fn read_data(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let DataFile {
            file, ino, label, ..
        } = self.data_file(fh)?;
        let plan = lock(&self.faults).plan_read(ino, &label, offset, u64::from(size));
        let flips = match plan {
            ReadPlan::Fail(e) => return Err(Errno::from_i32(e)),
            ReadPlan::Flip(f) => f,
        };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        buf.truncate(got);
        for (r, xor) in flips {
            let from = (r.start - offset) as usize;
            let to = ((r.end - offset) as usize).min(got);
            if from < to {
                buf[from..to].iter_mut().for_each(|b| *b ^= xor);
            }
        }
        Ok(buf)
    }

    fn write_data(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let DataFile {
            file,
            ino,
            label,
            kind,
        } = self.data_file(fh)?;
        // The disk has a fixed length, like a block device.
        let data = if kind == NodeKind::Disk {
            if offset >= self.disk_len {
                return Err(Errno::ENOSPC);
            }
            &data[..data.len().min((self.disk_len - offset) as usize)]
        } else {
            data
        };
        let plan = lock(&self.faults).plan_write(ino, &label, offset, data.len() as u64);
        let runs = match plan {
            WritePlan::Fail(e) => return Err(Errno::from_i32(e)),
            WritePlan::Store(r) => r,
        };
        for (r, how) in runs {
            let part = &data[(r.start - offset) as usize..(r.end - offset) as usize];
            match how {
                Store::Skip => {}
                Store::Keep => file.write_all_at(part, r.start)?,
                Store::Xor(x) => {
                    let flipped: Vec<u8> = part.iter().map(|b| b ^ x).collect();
                    file.write_all_at(&flipped, r.start)?;
                }
            }
        }
        Ok(data.len() as u32)
    }

    fn control_read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let text = {
            let mut tree = lock(&self.tree);
            let h = tree.handles.get_mut(&fh).ok_or(Errno::EBADF)?;
            if offset == 0 || h.status.is_none() {
                h.status = Some(Arc::new(self.status().into_bytes()));
            }
            h.status.clone().expect("set above")
        };
        let from = (offset as usize).min(text.len());
        let to = (from + size as usize).min(text.len());
        Ok(text[from..to].to_vec())
    }

    fn open_handle(&self, ino: u64) -> Result<(u64, FopenFlags), Errno> {
        let mut tree = lock(&self.tree);
        let n = tree.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        n.opens += 1;
        let flags = if n.kind == NodeKind::Control {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NONSEEKABLE
        } else {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        };
        let fh = tree.next_fh;
        tree.next_fh += 1;
        tree.handles.insert(fh, Handle { ino, status: None });
        Ok((fh, flags))
    }

    /// Forget a node that has no name and no open handle (its data goes with its fd).
    fn maybe_drop(tree: &mut Tree, ino: u64) {
        if tree
            .nodes
            .get(&ino)
            .is_some_and(|n| !n.linked && n.opens == 0)
        {
            tree.nodes.remove(&ino);
        }
    }

    fn create_file(
        &self,
        req: &Request,
        name: &str,
        mode: u32,
        umask: u32,
    ) -> Result<(u64, FileAttr), Errno> {
        if name.contains('/') || name.is_empty() {
            return Err(Errno::EINVAL);
        }
        let mut tree = lock(&self.tree);
        if tree.names.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = tree.next_ino;
        tree.next_ino += 1;
        // The data: a file in files_dir, unlinked at once (gone when the node goes).
        let path = self
            .files_dir
            .join(format!("created-{}-{ino}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        let node = Node {
            kind: NodeKind::Created,
            file: Some(Arc::new(file)),
            label: name.to_string(),
            linked: true,
            opens: 0,
            perm: (mode & !umask & 0o7777) as u16,
            uid: req.uid(),
            gid: req.gid(),
            created: SystemTime::now(),
        };
        let attr = self.attr(ino, &node);
        tree.names.insert(name.to_string(), ino);
        tree.nodes.insert(ino, node);
        Ok((ino, attr))
    }
}

/// The [`Filesystem`] served by fuser; shares [`State`] with its owner.
#[derive(Debug)]
pub struct FaultFs {
    state: Arc<State>,
}

impl FaultFs {
    pub fn new(state: Arc<State>) -> FaultFs {
        FaultFs { state }
    }
}

fn name_str(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::EINVAL)
}

impl Filesystem for FaultFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large requests (the kernel caps them at fs.fuse.max_pages_limit pages).
        let _ = config.set_max_write(4 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let Ok(name) = name_str(name) else {
            return reply.error(Errno::ENOENT);
        };
        let tree = lock(&self.state.tree);
        match tree
            .names
            .get(name)
            .and_then(|i| tree.nodes.get(i).map(|n| (*i, n)))
        {
            Some((ino, n)) => reply.entry(&TTL, &self.state.attr(ino, n), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state.getattr_of(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Only the size of created files changes (truncate); writing to the control
        // file with O_TRUNC is fine; times and modes are accepted and ignored.
        if let Some(size) = size {
            let node = {
                let tree = lock(&self.state.tree);
                tree.nodes.get(&ino.0).map(|n| (n.kind, n.file.clone()))
            };
            match node {
                None if ino != INodeNo::ROOT => return reply.error(Errno::ENOENT),
                Some((NodeKind::Created, Some(f))) => {
                    if let Err(e) = f.set_len(size) {
                        return reply.error(e.into());
                    }
                }
                Some((NodeKind::Disk, _)) if size != self.state.disk_len => {
                    return reply.error(Errno::EPERM)
                }
                _ => {}
            }
        }
        match self.state.getattr_of(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let Ok(name) = name_str(name) else {
            return reply.error(Errno::ENOENT);
        };
        let mut tree = lock(&self.state.tree);
        let Some(&ino) = tree.names.get(name) else {
            return reply.error(Errno::ENOENT);
        };
        let n = tree.nodes.get_mut(&ino).expect("named nodes exist");
        if n.kind != NodeKind::Created {
            return reply.error(Errno::EPERM);
        }
        n.linked = false;
        n.label = format!("#{ino}");
        tree.names.remove(name);
        State::maybe_drop(&mut tree, ino);
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state.open_handle(ino.0) {
            Ok((fh, flags)) => reply.opened(FileHandle(fh), flags),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let created = name_str(name).and_then(|n| self.state.create_file(req, n, mode, umask));
        let (ino, attr) = match created {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        match self.state.open_handle(ino) {
            Ok((fh, flags)) => reply.created(&TTL, &attr, Generation(0), FileHandle(fh), flags),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let r = if ino.0 == CONTROL_INO {
            self.state.control_read(fh.0, offset, size)
        } else {
            self.state.read_data(fh.0, offset, size)
        };
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino.0 == CONTROL_INO {
            // One write: whole commands (a line, or several).
            let r = std::str::from_utf8(data)
                .map_err(|_| "control: not UTF-8".to_string())
                .and_then(|t| self.state.control(t));
            return match r {
                Ok(()) => reply.written(data.len() as u32),
                Err(_) => reply.error(Errno::EINVAL),
            };
        }
        match self.state.write_data(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut tree = lock(&self.state.tree);
        tree.handles.remove(&fh.0);
        if let Some(n) = tree.nodes.get_mut(&ino.0) {
            n.opens = n.opens.saturating_sub(1);
        }
        State::maybe_drop(&mut tree, ino.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every write went to the backing file already; its durability is not tested.
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let tree = lock(&self.state.tree);
        let mut entries = vec![
            (INodeNo::ROOT, FileType::Directory, ".".to_string()),
            (INodeNo::ROOT, FileType::Directory, "..".to_string()),
        ];
        entries.extend(
            tree.names
                .iter()
                .map(|(n, i)| (INodeNo(*i), FileType::RegularFile, n.clone())),
        );
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The disk the data lives on.
        // SAFETY: statvfs is plain old data; all-zero is a valid value.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        let path = std::ffi::CString::new(self.state.files_dir.as_os_str().as_encoded_bytes())
            .unwrap_or_default();
        // SAFETY: statvfs fills the struct we own from a NUL-terminated path.
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return reply.error(std::io::Error::last_os_error().into());
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let DataFile { file, kind, .. } = match self.state.data_file(fh.0) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        if kind == NodeKind::Disk && offset.saturating_add(length) > self.state.disk_len {
            return reply.error(Errno::ENOSPC);
        }
        // SAFETY: fallocate on an fd we own, with a byte range.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, length as i64) };
        if r != 0 {
            return reply.error(std::io::Error::last_os_error().into());
        }
        reply.ok();
    }
}
