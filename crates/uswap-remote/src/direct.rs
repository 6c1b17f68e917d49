//! Reads an engine thread sends itself, on connections of its own to the primaries.
//!
//! Through the store's runtime a read costs two hand-offs between threads on top of its
//! round trip: the engine thread wakes a runtime worker, and the worker wakes the engine
//! thread with the reply. On a 2-vCPU machine each wake-up of a sleeping thread on the
//! other vCPU is tens of µs. `remote-bench` on a local 3+3 cluster: a 4 KiB read through a
//! client p50 128 µs, the same read timed inside the store 81 µs, a bare `GET` of 4 KiB
//! (`redis-benchmark -c 1`) 63 µs.
//!
//! Here the thread that needs the page writes `HMGET` to the primary serving the key's
//! slot (as the store's last `CLUSTER NODES` says) on a non-blocking socket of its own,
//! sleeps in its io_uring on a poll of that socket along with everything else it waits
//! for, and parses the reply itself: one wake-up, the one the reply causes.
//!
//! This is a fast path only. Anything it cannot answer exactly goes to the store's async
//! path, which owns retries, redirects and failover: no route or no connection yet, a
//! connection that broke or stayed silent for `op_timeout`, an error reply (MOVED, ASK,
//! CLUSTERDOWN, NOAUTH, ...), a missing field, a value that fails its checks. A value
//! accepted here passed the same checks as there (checksum, id, generation), so the path
//! cannot return other bytes than the async path would. It is off with TLS (its sockets
//! are plain TCP).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::counters::Counters;
use crate::layout::{self, group_of, slot_of};
use crate::store::{Routes, Shared};
use crate::{Completion, RemoteClient, RemoteError};

/// No new connection to a node for this long after one failed (its reads take the async
/// path meanwhile).
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// A link's read buffer is given back when idle and larger than this (a 2 MiB unit read
/// grows it).
const KEEP_BUFFER: usize = 256 << 10;
/// Bulk strings longer than this are not a reply of ours: the link is broken.
const MAX_BULK: usize = 1 << 30;

/// One engine thread's direct reads. Made by [`RemoteClient::direct`]; see the module docs.
///
/// The caller's loop: [`DirectReads::get_batch`] instead of [`RemoteClient::get_batch`];
/// [`DirectReads::arm`] to learn which sockets to poll (one-shot `POLLIN`, each with its
/// own token); [`DirectReads::readable`] when such a poll fires; completions from
/// [`DirectReads::poll_completions`] (and, for the reads it handed on, from the client's
/// queue as usual); [`DirectReads::expire`] by [`DirectReads::deadline`].
pub struct DirectReads {
    /// false: every read goes through the runtime (TLS, or `direct_reads` off)
    enabled: bool,
    client: RemoteClient,
    routes: Arc<Routes>,
    links: Vec<Link>,
    by_addr: HashMap<String, Option<usize>>,
    done: Vec<Completion>,
    /// the token of the next `get_blocking`
    next_blocking: u64,
    /// every request goes to this node, whatever the routes say (tests: a wrong route
    /// must end in the async path, with the right bytes)
    pinned: Option<String>,
}

/// One connection to one node.
struct Link {
    addr: SocketAddr,
    sock: Option<Socket>,
    /// the connect finished
    connected: bool,
    opened: Instant,
    /// bumped with every new socket: a poll armed on an older one is ignored
    generation: u16,
    /// replies owed, in the order the requests went out
    owed: VecDeque<Owed>,
    /// received bytes not parsed yet: `buf[start..end]`
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// a poll of this socket is armed in the caller's ring
    armed: bool,
    /// no new connection before this
    retry_at: Option<Instant>,
}

struct Owed {
    sent: Instant,
    what: Asked,
}

enum Asked {
    /// `AUTH`: `+OK` expected
    Auth,
    /// `HMGET` of these fields of one key, in order
    Read(Vec<Wanted>),
}

#[derive(Clone, Copy)]
struct Wanted {
    token: u64,
    id: u64,
    generation: u64,
    /// whose value: this store's, or an ancestor's (`Shared::resolve`)
    source: usize,
}

/// A RESP2 reply (the subset of the protocol that `AUTH` and `HMGET` answer with).
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

impl RemoteClient {
    /// Direct reads for this client's thread (see [`DirectReads`]); `None` with TLS or
    /// when `direct_reads` is off.
    pub fn direct(&self) -> Option<DirectReads> {
        let d = self.reader();
        d.enabled.then_some(d)
    }

    /// A reader for [`DirectReads::get_blocking`]: direct when it may be, else every read
    /// through the runtime.
    pub fn reader(&self) -> DirectReads {
        DirectReads {
            enabled: !self.shared.cfg.tls && self.shared.cfg.direct_reads,
            client: self.clone(),
            routes: self.shared.routes.lock().expect("routes").clone(),
            links: Vec::new(),
            by_addr: HashMap::new(),
            done: Vec::new(),
            next_blocking: 1 << 63,
            pinned: None,
        }
    }
}

impl DirectReads {
    fn shared(&self) -> &Shared {
        &self.client.shared
    }

    /// Reads several `(token, id)`, as [`RemoteClient::get_batch`]: one completion per
    /// token, here or (for what it hands on) on the client's queue.
    pub fn get_batch(&mut self, requests: Vec<(u64, u64)>) {
        let mut handed_on = Vec::new();
        let mut by_group: BTreeMap<(usize, u64), Vec<Wanted>> = BTreeMap::new();
        if !self.enabled {
            self.client.get_batch(requests);
            return;
        }
        if self.shared().closed.load(Ordering::Acquire) {
            handed_on = requests;
        } else {
            let live = self.shared().live.lock().expect("live set");
            for (token, id) in requests {
                match self.shared().resolve(&live, id) {
                    Some((source, generation)) => by_group
                        .entry((source, group_of(id)))
                        .or_default()
                        .push(Wanted {
                            token,
                            id,
                            generation,
                            source,
                        }),
                    // the async path answers NotStored
                    None => handed_on.push((token, id)),
                }
            }
        }
        if !by_group.is_empty() {
            let routes = self.shared().routes.lock().expect("routes").clone();
            self.routes = routes;
        }
        let now = Instant::now();
        for ((source, group), wanted) in by_group {
            let key = self.shared().prefix_of(source).group_key(group);
            match self.link_for(&key, now) {
                Some(i) if self.send(i, &key, &wanted, &mut handed_on) => {}
                _ => handed_on.extend(wanted.iter().map(|w| (w.token, w.id))),
            }
        }
        self.hand_on(handed_on);
    }

    /// Every socket that owes replies and has no poll armed: `f(token, fd)`; arm a one-shot
    /// `POLLIN` on `fd` and give `token` to [`DirectReads::readable`] when it fires. Tokens
    /// are below 2^32.
    pub fn arm(&mut self, mut f: impl FnMut(u64, RawFd)) {
        for (i, l) in self.links.iter_mut().enumerate() {
            if let (Some(sock), false, false) = (&l.sock, l.armed, l.owed.is_empty()) {
                l.armed = true;
                f(((l.generation as u64) << 16) | i as u64, sock.as_raw_fd());
            }
        }
    }

    /// The poll with `token` fired: read what arrived and complete what it answers.
    pub fn readable(&mut self, token: u64) {
        let (i, generation) = ((token & 0xffff) as usize, (token >> 16) as u16);
        match self.links.get_mut(i) {
            Some(l) if l.generation == generation => l.armed = false,
            _ => return, // a poll of a socket since replaced
        }
        let mut handed_on = Vec::new();
        if let Err(why) = self.receive(i, &mut handed_on) {
            self.break_link(i, why, &mut handed_on);
        }
        self.hand_on(handed_on);
    }

    /// Moves the completed reads into `out` (appended); returns how many.
    pub fn poll_completions(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }

    /// Replies owed on every connection.
    pub fn owed(&self) -> usize {
        self.links.iter().map(|l| l.owed.len()).sum()
    }

    /// When the oldest request owed runs out of time (`op_timeout`): call
    /// [`DirectReads::expire`] then.
    pub fn deadline(&self) -> Option<Instant> {
        let timeout = self.shared().cfg.op_timeout;
        self.links
            .iter()
            .filter_map(|l| l.owed.front().map(|o| o.sent + timeout))
            .min()
    }

    /// Connections that owe a reply older than `op_timeout` are closed; their reads go to
    /// the async path.
    pub fn expire(&mut self) {
        if self.links.iter().all(|l| l.owed.is_empty()) {
            return; // nothing owed: no clock read on the common path
        }
        let timeout = self.shared().cfg.op_timeout;
        let now = Instant::now();
        let mut handed_on = Vec::new();
        for i in 0..self.links.len() {
            let late = self.links[i]
                .owed
                .front()
                .is_some_and(|o| now >= o.sent + timeout);
            if late {
                Counters::add(&self.shared().counters.timeouts, 1);
                self.break_link(i, "no answer within op_timeout", &mut handed_on);
            }
        }
        self.hand_on(handed_on);
    }

    /// Whether the store is closed (its reads all fail).
    pub fn is_closed(&self) -> bool {
        self.shared().closed.load(Ordering::Acquire)
    }

    /// Reads `id` and waits for it, on this thread: the direct path, or the runtime's
    /// (which retries for up to `retry_for`) when the direct path hands it on. For a caller
    /// that cannot sleep in a ring. Use one `DirectReads` either this way or through
    /// `get_batch`, not both. For up to `poll` the sockets are looked at without sleeping,
    /// the CPU given to any other runnable thread between looks: a reply that arrives
    /// meanwhile costs no wake-up.
    pub fn get_blocking(&mut self, id: u64, poll: Duration) -> Result<Vec<u8>, RemoteError> {
        self.get_all_blocking(&[id], poll)
            .pop()
            .expect("one result per id")
    }

    /// Reads every id of `ids` at once and waits for them all, as
    /// [`DirectReads::get_blocking`]: their results in the order of `ids`.
    pub fn get_all_blocking(
        &mut self,
        ids: &[u64],
        poll: Duration,
    ) -> Vec<Result<Vec<u8>, RemoteError>> {
        let first = self.next_blocking;
        self.next_blocking += ids.len() as u64;
        let cfg = &self.shared().cfg;
        let bound = cfg.retry_for + 2 * cfg.op_timeout;
        let started = Instant::now();
        let mut results: Vec<Option<Result<Vec<u8>, RemoteError>>> =
            ids.iter().map(|_| None).collect();
        let mut unanswered = ids.len();
        self.get_batch(
            ids.iter()
                .enumerate()
                .map(|(k, &id)| (first + k as u64, id))
                .collect(),
        );
        let mut done = Vec::new();
        let mut tokens = Vec::new();
        loop {
            self.poll_completions(&mut done);
            for c in done.drain(..) {
                // completions of earlier calls that gave up waiting are dropped
                let Some(k) = c.token.checked_sub(first).filter(|&k| k < ids.len() as u64) else {
                    continue;
                };
                let r = &mut results[k as usize];
                if r.is_none() {
                    *r = Some(c.result.map(Option::unwrap_or_default));
                    unanswered -= 1;
                }
            }
            let Some(left) = bound
                .checked_sub(started.elapsed())
                .filter(|_| unanswered > 0)
            else {
                return results
                    .into_iter()
                    .map(|r| {
                        r.unwrap_or_else(|| {
                            Err(RemoteError::Unavailable {
                                waited: started.elapsed(),
                                attempts: 1,
                                last: "no answer from the direct path nor the runtime".into(),
                            })
                        })
                    })
                    .collect();
            };
            if self.owed() == 0 {
                self.client.wait_completions(&mut done, left);
                continue;
            }
            tokens.clear();
            let mut fds = Vec::new();
            self.arm(|t, fd| {
                tokens.push(t);
                fds.push(fd);
            });
            let wait = self
                .deadline()
                .map_or(left, |d| d.saturating_duration_since(Instant::now()))
                .min(left);
            let until = (started + poll).min(Instant::now() + wait);
            wait_readable(&fds, until, wait);
            for &t in &tokens {
                self.readable(t);
            }
            self.expire();
        }
    }

    /// Tests: send every request to the node at `addr` (`ip:port`), whatever the routes say.
    #[doc(hidden)]
    pub fn pin_node_for_tests(&mut self, addr: &str) {
        self.pinned = Some(addr.to_string());
    }

    fn hand_on(&mut self, requests: Vec<(u64, u64)>) {
        if !requests.is_empty() {
            Counters::add(
                &self.shared().counters.direct_handed_on,
                requests.len() as u64,
            );
            self.client.get_batch(requests);
        }
    }

    /// The link to the primary of `key`'s slot, connected (else `None`: the request takes
    /// the async path, and a connection is started for the next one).
    fn link_for(&mut self, key: &str, now: Instant) -> Option<usize> {
        let addr = match &self.pinned {
            Some(a) => a.clone(),
            None => self.routes.primary(slot_of(key))?.to_string(),
        };
        let i = match self.by_addr.get(&addr) {
            Some(i) => (*i)?,
            None => {
                // a name rather than an address (cluster-announce-hostname): not here
                let parsed = addr.parse::<SocketAddr>().ok();
                let i = parsed.map(|a| {
                    self.links.push(Link::new(a));
                    self.links.len() - 1
                });
                self.by_addr.insert(addr, i);
                i?
            }
        };
        let auth = self.auth_command();
        let cfg_timeout = self.shared().cfg.op_timeout;
        let l = &mut self.links[i];
        if l.sock.is_none() {
            if l.retry_at.is_some_and(|t| now < t) {
                return None;
            }
            l.open(now)?;
        }
        if !l.connected {
            match l.finish_connect() {
                Ok(true) => {
                    l.connected = true;
                    if let Some(cmd) = auth {
                        if !l.write_all(&cmd) {
                            l.close(now);
                            return None;
                        }
                        l.owed.push_back(Owed {
                            sent: now,
                            what: Asked::Auth,
                        });
                    }
                }
                Ok(false) if now < l.opened + cfg_timeout => return None,
                _ => {
                    l.close(now);
                    return None;
                }
            }
        }
        Some(i)
    }

    fn auth_command(&self) -> Option<Vec<u8>> {
        let cfg = &self.shared().cfg;
        let password = cfg.password.as_ref()?;
        let mut args: Vec<&[u8]> = vec![b"AUTH"];
        if let Some(user) = &cfg.username {
            args.push(user.as_bytes());
        }
        args.push(password.as_bytes());
        Some(command(&args))
    }

    /// Sends `HMGET key fields...` on link `i`; false when it could not (the link is then
    /// closed and its owed reads are in `handed_on`).
    fn send(
        &mut self,
        i: usize,
        key: &str,
        wanted: &[Wanted],
        handed_on: &mut Vec<(u64, u64)>,
    ) -> bool {
        let fields: Vec<String> = wanted
            .iter()
            .map(|w| crate::store::field(w.id, w.generation))
            .collect();
        let mut args: Vec<&[u8]> = vec![b"HMGET", key.as_bytes()];
        args.extend(fields.iter().map(|f| f.as_bytes()));
        let cmd = command(&args);
        let now = Instant::now();
        if !self.links[i].write_all(&cmd) {
            // a command half written leaves the stream unusable
            self.break_link(i, "send failed", handed_on);
            return false;
        }
        self.links[i].owed.push_back(Owed {
            sent: now,
            what: Asked::Read(wanted.to_vec()),
        });
        true
    }

    /// Reads what arrived on link `i` and completes the replies it holds. Err: the link is
    /// unusable (closed by the server, or an answer that is not ours).
    fn receive(&mut self, i: usize, handed_on: &mut Vec<(u64, u64)>) -> Result<(), &'static str> {
        let eof = self.links[i].fill()?;
        loop {
            let l = &mut self.links[i];
            let Some((reply, used)) = parse(&l.buf[l.start..l.end])? else {
                break;
            };
            l.start += used;
            let owed = l.owed.pop_front().ok_or("a reply nobody asked for")?;
            match owed.what {
                Asked::Auth => {
                    if reply != Reply::Simple(b"OK".to_vec()) {
                        // the async path says why (it authenticates the same way)
                        return Err("AUTH refused");
                    }
                }
                Asked::Read(wanted) => self.complete(owed.sent, wanted, reply, handed_on),
            }
        }
        let l = &mut self.links[i];
        if l.start == l.end {
            (l.start, l.end) = (0, 0);
            if l.buf.len() > KEEP_BUFFER {
                l.buf = Vec::new();
            }
        }
        if eof {
            return Err("closed by the server");
        }
        Ok(())
    }

    /// The reply to an `HMGET`: each value that passes the checks completes here; the rest
    /// (missing, damaged, an error reply) go to the async path, which has the final word.
    fn complete(
        &mut self,
        sent: Instant,
        wanted: Vec<Wanted>,
        reply: Reply,
        handed_on: &mut Vec<(u64, u64)>,
    ) {
        let values = match reply {
            Reply::Array(values) if values.len() == wanted.len() => values,
            Reply::Error(e) => {
                if e.starts_with(b"MOVED ") || e.starts_with(b"ASK ") {
                    // a route out of date (the next CLUSTER NODES brings the new one)
                    Counters::add(&self.client.shared.counters.redirects, 1);
                }
                handed_on.extend(wanted.iter().map(|w| (w.token, w.id)));
                return;
            }
            _ => {
                handed_on.extend(wanted.iter().map(|w| (w.token, w.id)));
                return;
            }
        };
        let single = wanted.len() == 1;
        let shared = self.client.shared.clone();
        let c = &shared.counters;
        for (w, value) in wanted.into_iter().zip(values) {
            let opened = match value {
                Reply::Bulk(bytes) => {
                    layout::open(shared.prefix_of(w.source), w.id, w.generation, bytes).ok()
                }
                _ => None,
            };
            let Some(payload) = opened else {
                handed_on.push((w.token, w.id));
                continue;
            };
            Counters::add(&c.reads, 1);
            Counters::add(&c.direct_reads, 1);
            Counters::add(&c.bytes_in, payload.len() as u64);
            if single {
                c.get_latency
                    .lock()
                    .expect("latency")
                    .record(sent.elapsed());
            }
            self.done.push(Completion {
                token: w.token,
                result: Ok(Some(payload)),
            });
        }
    }

    /// Closes link `i`: what it owes goes to the async path.
    fn break_link(&mut self, i: usize, _why: &'static str, handed_on: &mut Vec<(u64, u64)>) {
        let l = &mut self.links[i];
        for o in l.owed.drain(..) {
            if let Asked::Read(wanted) = o.what {
                handed_on.extend(wanted.iter().map(|w| (w.token, w.id)));
            }
        }
        l.close(Instant::now());
        Counters::add(&self.client.shared.counters.connection_losses, 1);
    }
}

impl Link {
    fn new(addr: SocketAddr) -> Link {
        Link {
            addr,
            sock: None,
            connected: false,
            opened: Instant::now(),
            generation: 0,
            owed: VecDeque::new(),
            buf: Vec::new(),
            start: 0,
            end: 0,
            armed: false,
            retry_at: None,
        }
    }

    /// Starts a non-blocking connect (never waits for it).
    fn open(&mut self, now: Instant) -> Option<()> {
        let opened = (|| {
            let s = Socket::new(
                Domain::for_address(self.addr),
                Type::STREAM,
                Some(Protocol::TCP),
            )?;
            s.set_nonblocking(true)?;
            s.set_tcp_nodelay(true)?;
            match s.connect(&self.addr.into()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                Err(e) => return Err(e),
            }
            Ok::<_, std::io::Error>(s)
        })();
        match opened {
            Ok(s) => {
                self.sock = Some(s);
                self.connected = false;
                self.opened = now;
                self.generation = self.generation.wrapping_add(1);
                self.armed = false;
                Some(())
            }
            Err(_) => {
                self.retry_at = Some(now + RECONNECT_PAUSE);
                None
            }
        }
    }

    /// Whether the connect finished: Ok(false) while it runs, Err when it failed.
    fn finish_connect(&self) -> std::io::Result<bool> {
        let s = self.sock.as_ref().ok_or(ErrorKind::NotConnected)?;
        if let Some(e) = s.take_error()? {
            return Err(e);
        }
        match s.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes a whole command without blocking; false when it did not all go out.
    fn write_all(&mut self, cmd: &[u8]) -> bool {
        let Some(s) = self.sock.as_ref() else {
            return false;
        };
        loop {
            // MSG_NOSIGNAL: a connection the server closed must give EPIPE here, not a
            // SIGPIPE that ends the program (whose disposition is its own)
            match s.send_with_flags(cmd, libc::MSG_NOSIGNAL) {
                Ok(n) => return n == cmd.len(),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    /// Reads everything the socket has; Ok(true) at end of stream.
    fn fill(&mut self) -> Result<bool, &'static str> {
        let Some(s) = self.sock.as_ref() else {
            return Ok(false);
        };
        let mut s: &Socket = s;
        loop {
            if self.end == self.buf.len() {
                if self.start > 0 {
                    self.buf.copy_within(self.start..self.end, 0);
                    (self.start, self.end) = (0, self.end - self.start);
                } else {
                    let grown = (self.buf.len() * 2).max(64 << 10);
                    self.buf.resize(grown, 0);
                }
            }
            match s.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(true),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err("receive failed"),
            }
        }
    }

    /// Drops the socket (shut down first, so that a poll still armed on it fires and
    /// lets go of it).
    fn close(&mut self, now: Instant) {
        if let Some(s) = self.sock.take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.connected = false;
        self.armed = false;
        (self.start, self.end) = (0, 0);
        self.buf = Vec::new();
        self.retry_at = Some(now + RECONNECT_PAUSE);
    }
}

/// Waits until one of `fds` is readable (or hung up), or `timeout`: first looks without
/// sleeping until `until` (the CPU given to other runnable threads between looks), as a
/// reply that arrives meanwhile costs no wake-up, then sleeps.
fn wait_readable(fds: &[RawFd], until: Instant, timeout: Duration) {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: poll(2) on an array of `polls.len()` pollfds that lives across the call; the
    // fds are this reader's open sockets. EINTR or an error just ends this wait early.
    let poll = |polls: &mut Vec<libc::pollfd>, ms| unsafe {
        libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms)
    };
    while Instant::now() < until {
        if poll(&mut polls, 0) > 0 {
            return;
        }
        std::thread::yield_now();
    }
    poll(
        &mut polls,
        timeout.as_millis().clamp(1, i32::MAX as u128) as i32,
    );
}

/// A command as a RESP array of bulk strings.
fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One reply from the front of `b`: Ok(None) when it is not all there yet, Err when `b`
/// does not start with a reply this path expects.
fn parse(b: &[u8]) -> Result<Option<(Reply, usize)>, &'static str> {
    // measured first, copied once whole: a big reply arrives in many pieces, and copying
    // its complete values at every piece would be quadratic
    match parse_at(b, 0, false)? {
        None => Ok(None),
        Some(_) => parse_at(b, 0, true),
    }
}

/// `copy`: false only measures (the values of the reply are left empty).
fn parse_at(b: &[u8], depth: u32, copy: bool) -> Result<Option<(Reply, usize)>, &'static str> {
    const BAD: &str = "not a RESP2 reply";
    let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let Some((&kind, line)) = b[..eol].split_first() else {
        return Err(BAD);
    };
    let next = eol + 2;
    let number = || -> Result<i64, &'static str> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or(BAD)
    };
    Ok(Some(match kind {
        b'+' => (Reply::Simple(line.to_vec()), next),
        b'-' => (Reply::Error(line.to_vec()), next),
        b':' => (Reply::Int(number()?), next),
        b'$' => match number()? {
            -1 => (Reply::Nil, next),
            n if n < 0 || n as usize > MAX_BULK => return Err(BAD),
            n => {
                let end = next + n as usize;
                if b.len() < end + 2 {
                    return Ok(None);
                }
                if &b[end..end + 2] != b"\r\n" {
                    return Err(BAD);
                }
                let bytes = if copy {
                    b[next..end].to_vec()
                } else {
                    Vec::new()
                };
                (Reply::Bulk(bytes), end + 2)
            }
        },
        b'*' if depth < 2 => match number()? {
            -1 => (Reply::Nil, next),
            n if !(0..=1 << 20).contains(&n) => return Err(BAD),
            n => {
                let mut items = Vec::with_capacity(n as usize);
                let mut at = next;
                for _ in 0..n {
                    let Some((item, used)) = parse_at(&b[at..], depth + 1, copy)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    at += used;
                }
                (Reply::Array(items), at)
            }
        },
        _ => return Err(BAD),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_whole_or_not_at_all() {
        let reply = b"*3\r\n$5\r\nhello\r\n$-1\r\n$0\r\n\r\n+OK\r\n";
        let whole = 26;
        let (r, used) = parse(reply).unwrap().unwrap();
        assert_eq!(used, whole);
        assert_eq!(
            r,
            Reply::Array(vec![
                Reply::Bulk(b"hello".to_vec()),
                Reply::Nil,
                Reply::Bulk(Vec::new())
            ])
        );
        // every cut short of the whole reply is "not yet", never a wrong reply
        for cut in 0..whole {
            assert_eq!(parse(&reply[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(
            parse(&reply[whole..]).unwrap(),
            Some((Reply::Simple(b"OK".to_vec()), 5))
        );
        assert_eq!(
            parse(b"-MOVED 3999 127.0.0.1:6381\r\n").unwrap(),
            Some((Reply::Error(b"MOVED 3999 127.0.0.1:6381".to_vec()), 28))
        );
        assert_eq!(parse(b":12\r\n").unwrap(), Some((Reply::Int(12), 5)));
        // a bulk string whose end is not where its length says
        assert!(parse(b"$3\r\nabcd\r\n").is_err());
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b"$-7\r\n").is_err());
        assert!(
            parse(b"*1\r\n*1\r\n*1\r\n:1\r\n").is_err(),
            "nesting past what HMGET answers"
        );
    }

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        assert_eq!(
            command(&[b"HMGET", b"k", b"1:a"]),
            b"*3\r\n$5\r\nHMGET\r\n$1\r\nk\r\n$3\r\n1:a\r\n".to_vec()
        );
    }
}
