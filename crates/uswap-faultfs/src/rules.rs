//! Fault rules: the control language, and what each read or write of a data file meets.
//!
//! Everything here is plain bookkeeping (no I/O), so that it is tested without FUSE: the
//! filesystem asks for a plan before each request ([`Faults::plan_read`],
//! [`Faults::plan_write`]) and carries it out.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::ops::Range;

/// The kinds of fault, named as in the control language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A read overlapping the range fails (the whole request) with `errno`.
    FailRead,
    /// A write overlapping the range fails (the whole request, nothing stored).
    FailWrite,
    /// A write reports success but the bytes inside the range are not stored.
    DropWrite,
    /// A write reports success but only the first `keep` bytes of its part inside the
    /// range are stored; the rest of that part keeps the old bytes.
    TearWrite,
    /// A read returns the bytes inside the range XORed with `xor` (the stored bytes stay).
    FlipRead,
    /// A write stores the bytes inside the range XORed with `xor`.
    FlipWrite,
    /// `corrupt`: the stored bytes of the range were XORed with `xor` at once.
    Corrupt,
    /// Not a rule: a read returned bytes that an earlier fault left different from what
    /// was last written there (dropped, torn, flipped on write, corrupted, or a failed
    /// write's old bytes). The reader got wrong data unless it checks.
    LostRead,
}

impl Kind {
    /// The name in the control language and in the status.
    pub fn name(self) -> &'static str {
        match self {
            Kind::FailRead => "fail-read",
            Kind::FailWrite => "fail-write",
            Kind::DropWrite => "drop-write",
            Kind::TearWrite => "tear-write",
            Kind::FlipRead => "flip-read",
            Kind::FlipWrite => "flip-write",
            Kind::Corrupt => "corrupt",
            Kind::LostRead => "lost-read",
        }
    }

    /// A command name (not `lost-read`, which is only observed).
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "fail-read" => Kind::FailRead,
            "fail-write" => Kind::FailWrite,
            "drop-write" => Kind::DropWrite,
            "tear-write" => Kind::TearWrite,
            "flip-read" => Kind::FlipRead,
            "flip-write" => Kind::FlipWrite,
            "corrupt" => Kind::Corrupt,
            _ => return None,
        })
    }

    /// Does the fault lose or change data written (as opposed to failing visibly)?
    pub fn is_silent(self) -> bool {
        matches!(
            self,
            Kind::DropWrite | Kind::TearWrite | Kind::FlipRead | Kind::FlipWrite | Kind::Corrupt
        )
    }

    /// Every kind, in counter order.
    pub const ALL: [Kind; 8] = [
        Kind::FailRead,
        Kind::FailWrite,
        Kind::DropWrite,
        Kind::TearWrite,
        Kind::FlipRead,
        Kind::FlipWrite,
        Kind::Corrupt,
        Kind::LostRead,
    ];
}

/// One fault rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Number given when it was added (1, 2, ...), shown in events.
    pub id: u64,
    pub kind: Kind,
    /// Byte range of every data file it applies to.
    pub range: Range<u64>,
    /// `fail-*`: the error returned.
    pub errno: i32,
    /// `flip-*`: the mask.
    pub xor: u8,
    /// `tear-write`: bytes kept of each write's part inside the range.
    pub keep: u64,
    /// Requests it may still hit; `None`: no limit.
    pub remaining: Option<u64>,
    /// Requests it hit so far.
    pub hits: u64,
}

/// One injected fault: which request met which rule, and exactly which bytes it affected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// 1, 2, ... in the order they happened.
    pub seq: u64,
    pub kind: Kind,
    /// The rule's id (0 for `corrupt` and `lost-read`).
    pub rule: u64,
    /// The file's name when it happened (`#INO` once unlinked).
    pub file: String,
    /// The request's byte range (for `corrupt`: the range corrupted).
    pub request: Range<u64>,
    /// The bytes affected: not returned (`fail-read`), not stored (`fail-write`,
    /// `drop-write`, the lost part of `tear-write`), XORed (`flip-*`, `corrupt`), or
    /// returned wrong (`lost-read`: one event per contiguous run).
    pub affected: Range<u64>,
}

/// What reached the filesystem and what was injected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Read requests of data files that reached the filesystem, and their bytes.
    pub reads: u64,
    pub read_bytes: u64,
    /// Write requests of data files, and their bytes.
    pub writes: u64,
    pub write_bytes: u64,
    /// Per kind (in `Kind::ALL` order): requests hit and bytes affected.
    hits: [u64; 8],
    bytes: [u64; 8],
    /// Events not kept in the log (it holds at most `EVENT_LOG_MAX`).
    pub events_dropped: u64,
}

impl Counters {
    /// Requests that met a fault of `kind`.
    pub fn hits(&self, kind: Kind) -> u64 {
        self.hits[kind as usize]
    }
    /// Bytes affected by faults of `kind`.
    pub fn bytes(&self, kind: Kind) -> u64 {
        self.bytes[kind as usize]
    }
}

/// Events kept in the log; later ones are only counted.
pub const EVENT_LOG_MAX: usize = 100_000;

/// How a run of bytes of a write is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// As given.
    Keep,
    /// Not at all (old bytes stay).
    Skip,
    /// XORed with the mask.
    Xor(u8),
}

/// What to do with a write request.
#[derive(Debug, PartialEq, Eq)]
pub enum WritePlan {
    /// Fail it with this errno; store nothing.
    Fail(i32),
    /// Store it in these runs (covering the request in order), then report success.
    Store(Vec<(Range<u64>, Store)>),
}

/// What to do with a read request.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadPlan {
    /// Fail it with this errno.
    Fail(i32),
    /// Read it, then XOR these ranges of it with their masks.
    Flip(Vec<(Range<u64>, u8)>),
}

/// A parsed control command.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Add a rule (its `id` and `hits` are filled in when added).
    Add(Rule),
    /// XOR the stored bytes of `range` of every data file with `xor`, now.
    Corrupt { range: Range<u64>, xor: u8 },
    /// Remove every rule.
    Clear,
    /// Empty the event log and zero the counters.
    ClearLog,
    /// Both.
    Reset,
}

/// The rules, the event log and the counters of one mount.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Vec<Rule>,
    next_id: u64,
    events: Vec<Event>,
    next_seq: u64,
    counters: Counters,
    last_error: Option<String>,
    /// Per file (inode): bytes whose stored content may differ from what was last
    /// written there. Kept across `reset` (it describes the data, not the log).
    tainted: HashMap<u64, RangeSet>,
}

/// Disjoint, non-adjacent byte ranges: start → end.
#[derive(Debug, Default)]
struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    /// The ranges overlapping `r`, clipped to it, in order.
    fn overlapping(&self, r: &Range<u64>) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = self
            .0
            .range(..r.end)
            .rev()
            .take_while(|(_, &e)| e > r.start)
            .map(|(&s, &e)| s.max(r.start)..e.min(r.end))
            .collect();
        out.reverse();
        out
    }

    fn remove(&mut self, r: &Range<u64>) {
        for o in self.overlapping(r) {
            // `o` is clipped: find the whole range it came from.
            let (&s, &e) = self
                .0
                .range(..=o.start)
                .next_back()
                .expect("overlap exists");
            self.0.remove(&s);
            if s < r.start {
                self.0.insert(s, r.start);
            }
            if e > r.end {
                self.0.insert(r.end, e);
            }
        }
    }

    fn add(&mut self, r: &Range<u64>) {
        let (mut start, mut end) = (r.start, r.end);
        // Everything overlapping or touching `r` merges into it.
        let touching: Vec<(u64, u64)> = self
            .0
            .range(..=r.end)
            .rev()
            .take_while(|(_, &e)| e >= r.start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.0.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }
}

fn overlap(a: &Range<u64>, b: &Range<u64>) -> Option<Range<u64>> {
    let r = a.start.max(b.start)..a.end.min(b.end);
    (r.start < r.end).then_some(r)
}

/// A number: decimal or `0x` hex, with an optional binary suffix `k`, `m`, `g`, `t`
/// (KiB, MiB, GiB, TiB).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("bad number {s:?} (want e.g. 4096, 0x1000, 64k, 2M)");
    let (digits, mult) = match s.as_bytes().last().map(|c| c.to_ascii_lowercase()) {
        Some(b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g') => (&s[..s.len() - 1], 1 << 30),
        Some(b't') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n = if let Some(hex) = digits.strip_prefix("0x").or(digits.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).map_err(|_| bad())?
    } else {
        digits.parse::<u64>().map_err(|_| bad())?
    };
    n.checked_mul(mult).ok_or_else(bad)
}

fn parse_errno(s: &str) -> Result<i32, String> {
    Ok(match s {
        "EIO" => libc::EIO,
        "ENOSPC" => libc::ENOSPC,
        "EROFS" => libc::EROFS,
        "ENXIO" => libc::ENXIO,
        "ENODEV" => libc::ENODEV,
        "EINVAL" => libc::EINVAL,
        "EAGAIN" => libc::EAGAIN,
        "EDQUOT" => libc::EDQUOT,
        _ => match s.parse::<i32>() {
            Ok(n) if n > 0 && n < 4096 => n,
            _ => return Err(format!("bad errno {s:?} (want EIO, ENOSPC, EROFS, ENXIO, ENODEV, EINVAL, EAGAIN, EDQUOT or a number)")),
        },
    })
}

fn errno_name(e: i32) -> String {
    match e {
        libc::EIO => "EIO".into(),
        libc::ENOSPC => "ENOSPC".into(),
        libc::EROFS => "EROFS".into(),
        libc::ENXIO => "ENXIO".into(),
        libc::ENODEV => "ENODEV".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EAGAIN => "EAGAIN".into(),
        libc::EDQUOT => "EDQUOT".into(),
        n => n.to_string(),
    }
}

/// Parse one command (one line; `#` starts a comment; an empty line is `None`).
pub fn parse_command(line: &str) -> Result<Option<Command>, String> {
    let line = line.split('#').next().unwrap_or("").trim();
    let mut words = line.split_whitespace();
    let Some(verb) = words.next() else {
        return Ok(None);
    };
    let rest: Vec<&str> = words.collect();
    let no_args = |c: Command| {
        if rest.is_empty() {
            Ok(Some(c))
        } else {
            Err(format!(
                "{verb}: takes no arguments, got {:?}",
                rest.join(" ")
            ))
        }
    };
    match verb {
        "clear" => return no_args(Command::Clear),
        "clear-log" => return no_args(Command::ClearLog),
        "reset" => return no_args(Command::Reset),
        _ => {}
    }
    let kind = Kind::parse(verb).ok_or_else(|| {
        format!(
            "unknown command {verb:?} (want fail-read, fail-write, drop-write, tear-write, \
             flip-read, flip-write, corrupt, clear, clear-log or reset)"
        )
    })?;
    // The range: `all`, or START LEN.
    let (range, opts) = match rest.first() {
        Some(&"all") => (0..u64::MAX, &rest[1..]),
        Some(start) if rest.len() >= 2 && !rest[1].contains('=') => {
            let start = parse_size(start)?;
            let len = parse_size(rest[1])?;
            if len == 0 {
                return Err(format!("{verb}: empty range (LEN 0)"));
            }
            let end = start
                .checked_add(len)
                .ok_or_else(|| format!("{verb}: range past 2^64"))?;
            (start..end, &rest[2..])
        }
        _ => return Err(format!("{verb}: want a range: START LEN, or all")),
    };
    let mut rule = Rule {
        id: 0,
        kind,
        range,
        errno: libc::EIO,
        xor: 0xff,
        keep: 4096,
        remaining: None,
        hits: 0,
    };
    for opt in opts {
        let (k, v) = opt
            .split_once('=')
            .ok_or_else(|| format!("{verb}: bad option {opt:?} (want NAME=VALUE)"))?;
        let allowed = match k {
            "errno" => matches!(kind, Kind::FailRead | Kind::FailWrite),
            "xor" => matches!(kind, Kind::FlipRead | Kind::FlipWrite | Kind::Corrupt),
            "keep" => kind == Kind::TearWrite,
            "count" => kind != Kind::Corrupt,
            _ => false,
        };
        if !allowed {
            return Err(format!("{verb}: option {k:?} does not apply"));
        }
        match k {
            "errno" => rule.errno = parse_errno(v)?,
            "xor" => {
                let x = parse_size(v)?;
                if x == 0 || x > 0xff {
                    return Err(format!("{verb}: xor={v} must be a byte mask 1..=0xff"));
                }
                rule.xor = x as u8;
            }
            "keep" => rule.keep = parse_size(v)?,
            "count" => {
                let n = parse_size(v)?;
                if n == 0 {
                    return Err(format!("{verb}: count=0 would never fire"));
                }
                rule.remaining = Some(n);
            }
            _ => unreachable!("checked above"),
        }
    }
    if kind == Kind::Corrupt {
        return Ok(Some(Command::Corrupt {
            range: rule.range,
            xor: rule.xor,
        }));
    }
    Ok(Some(Command::Add(rule)))
}

/// Parse a batch: lines (or `;`-separated commands). All or nothing.
pub fn parse_commands(text: &str) -> Result<Vec<Command>, String> {
    let mut out = Vec::new();
    for part in text.split(['\n', ';']) {
        if let Some(c) = parse_command(part).map_err(|e| format!("{e} (in {:?})", part.trim()))? {
            out.push(c);
        }
    }
    Ok(out)
}

impl Faults {
    /// Apply parsed commands; returns the `corrupt` requests, which the filesystem
    /// carries out (and reports with [`Faults::record_corrupt`]).
    pub fn apply(&mut self, commands: Vec<Command>) -> Vec<(Range<u64>, u8)> {
        let mut corrupt = Vec::new();
        for c in commands {
            match c {
                Command::Add(mut r) => {
                    self.next_id += 1;
                    r.id = self.next_id;
                    r.hits = 0;
                    self.rules.push(r);
                }
                Command::Corrupt { range, xor } => corrupt.push((range, xor)),
                Command::Clear => self.rules.clear(),
                Command::ClearLog => self.clear_log(),
                Command::Reset => {
                    self.rules.clear();
                    self.clear_log();
                }
            }
        }
        corrupt
    }

    fn clear_log(&mut self) {
        self.events.clear();
        self.counters = Counters::default();
    }

    /// Keep the text of the last refused command, for the status.
    pub fn set_last_error(&mut self, e: String) {
        self.last_error = Some(e);
    }

    /// The rules now (spent ones included, with `remaining == Some(0)`).
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The events so far (at most [`EVENT_LOG_MAX`]).
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn record(
        &mut self,
        kind: Kind,
        rule: u64,
        file: &str,
        request: Range<u64>,
        affected: Range<u64>,
    ) {
        self.counters.hits[kind as usize] += 1;
        self.counters.bytes[kind as usize] += affected.end - affected.start;
        self.next_seq += 1;
        if self.events.len() < EVENT_LOG_MAX {
            self.events.push(Event {
                seq: self.next_seq,
                kind,
                rule,
                file: file.to_string(),
                request,
                affected,
            });
        } else {
            self.counters.events_dropped += 1;
        }
    }

    /// Record a `corrupt` carried out on file `ino` named `file`.
    pub fn record_corrupt(&mut self, ino: u64, file: &str, range: Range<u64>) {
        self.tainted.entry(ino).or_default().add(&range);
        self.record(Kind::Corrupt, 0, file, range.clone(), range);
    }

    /// The rules of `kinds` that overlap `req` and may still fire, by index.
    fn matching(&self, req: &Range<u64>, kinds: &[Kind]) -> Vec<(usize, Range<u64>)> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| kinds.contains(&r.kind) && r.remaining != Some(0))
            .filter_map(|(i, r)| overlap(&r.range, req).map(|o| (i, o)))
            .collect()
    }

    /// Count a hit of rule `i` and log it.
    fn hit(&mut self, i: usize, file: &str, req: &Range<u64>, affected: Range<u64>) {
        let r = &mut self.rules[i];
        r.hits += 1;
        if let Some(n) = r.remaining.as_mut() {
            *n -= 1;
        }
        let (kind, id) = (r.kind, r.id);
        self.record(kind, id, file, req.clone(), affected);
    }

    /// Plan a read of `len` bytes at `offset` of file `ino` named `file`.
    pub fn plan_read(&mut self, ino: u64, file: &str, offset: u64, len: u64) -> ReadPlan {
        let req = offset..offset.saturating_add(len);
        self.counters.reads += 1;
        self.counters.read_bytes += len;
        if len == 0 {
            return ReadPlan::Flip(Vec::new());
        }
        if let Some((i, _)) = self.matching(&req, &[Kind::FailRead]).into_iter().next() {
            let errno = self.rules[i].errno;
            self.hit(i, file, &req, req.clone());
            return ReadPlan::Fail(errno);
        }
        let mut flips = Vec::new();
        for (i, o) in self.matching(&req, &[Kind::FlipRead]) {
            flips.push((o.clone(), self.rules[i].xor));
            self.hit(i, file, &req, o);
        }
        let lost = self
            .tainted
            .get(&ino)
            .map(|t| t.overlapping(&req))
            .unwrap_or_default();
        for o in lost {
            self.record(Kind::LostRead, 0, file, req.clone(), o);
        }
        ReadPlan::Flip(flips)
    }

    /// Plan a write of `len` bytes at `offset` of file `ino` named `file`.
    pub fn plan_write(&mut self, ino: u64, file: &str, offset: u64, len: u64) -> WritePlan {
        let req = offset..offset.saturating_add(len);
        self.counters.writes += 1;
        self.counters.write_bytes += len;
        if len == 0 {
            return WritePlan::Store(Vec::new());
        }
        if let Some((i, _)) = self.matching(&req, &[Kind::FailWrite]).into_iter().next() {
            let errno = self.rules[i].errno;
            self.hit(i, file, &req, req.clone());
            // The old bytes stay where the writer wanted new ones.
            self.tainted.entry(ino).or_default().add(&req);
            return WritePlan::Fail(errno);
        }
        let mut runs = vec![(req.clone(), Store::Keep)];
        let rules = [Kind::DropWrite, Kind::TearWrite, Kind::FlipWrite];
        for (i, o) in self.matching(&req, &rules) {
            let rule = &self.rules[i];
            let (affected, how) = match rule.kind {
                Kind::DropWrite => (o, Store::Skip),
                Kind::TearWrite => {
                    let lost = o.start.saturating_add(rule.keep)..o.end;
                    if lost.start >= lost.end {
                        continue; // the whole part fits in `keep`: nothing torn
                    }
                    (lost, Store::Skip)
                }
                Kind::FlipWrite => (o, Store::Xor(rule.xor)),
                _ => unreachable!("only write rules matched"),
            };
            paint(&mut runs, &affected, how);
            self.hit(i, file, &req, affected);
        }
        let t = self.tainted.entry(ino).or_default();
        for (r, how) in &runs {
            match how {
                Store::Keep => t.remove(r),
                Store::Skip | Store::Xor(_) => t.add(r),
            }
        }
        WritePlan::Store(runs)
    }

    /// The status: rules, counters, events, as lines of `WORD key=value ...`.
    pub fn status(&self) -> String {
        let mut s = String::new();
        for r in &self.rules {
            let _ = write!(s, "rule {} {} {}", r.id, r.kind.name(), fmt_range(&r.range));
            match r.kind {
                Kind::FailRead | Kind::FailWrite => {
                    let _ = write!(s, " errno={}", errno_name(r.errno));
                }
                Kind::FlipRead | Kind::FlipWrite => {
                    let _ = write!(s, " xor={:#04x}", r.xor);
                }
                Kind::TearWrite => {
                    let _ = write!(s, " keep={}", r.keep);
                }
                _ => {}
            }
            match r.remaining {
                Some(n) => {
                    let _ = write!(s, " remaining={n}");
                }
                None => s.push_str(" remaining=unlimited"),
            }
            let _ = writeln!(s, " hits={}", r.hits);
        }
        let c = &self.counters;
        let _ = writeln!(
            s,
            "counters reads={} read_bytes={} writes={} write_bytes={} events_dropped={}",
            c.reads, c.read_bytes, c.writes, c.write_bytes, c.events_dropped
        );
        for k in Kind::ALL {
            let _ = writeln!(
                s,
                "injected {} hits={} bytes={}",
                k.name(),
                c.hits(k),
                c.bytes(k)
            );
        }
        if let Some(e) = &self.last_error {
            let _ = writeln!(s, "last_error {e}");
        }
        for e in &self.events {
            let _ = writeln!(
                s,
                "event {} {} rule={} file={} request={} affected={}",
                e.seq,
                e.kind.name(),
                e.rule,
                e.file,
                fmt_range(&e.request),
                fmt_range(&e.affected)
            );
        }
        s
    }
}

/// `START LEN` or `all`: the control language's form.
fn fmt_range(r: &Range<u64>) -> String {
    if *r == (0..u64::MAX) {
        "all".into()
    } else {
        format!("{} {}", r.start, r.end - r.start)
    }
}

/// Set the runs of `runs` inside `what` to `how`: skipping beats XOR beats keeping, and
/// two XORs combine.
fn paint(runs: &mut Vec<(Range<u64>, Store)>, what: &Range<u64>, how: Store) {
    let mut out = Vec::with_capacity(runs.len() + 2);
    for (r, old) in runs.drain(..) {
        let Some(o) = overlap(&r, what) else {
            out.push((r, old));
            continue;
        };
        if r.start < o.start {
            out.push((r.start..o.start, old));
        }
        let new = match (old, how) {
            (Store::Skip, _) | (_, Store::Skip) => Store::Skip,
            (Store::Xor(a), Store::Xor(b)) => Store::Xor(a ^ b),
            (Store::Xor(a), Store::Keep) | (Store::Keep, Store::Xor(a)) => Store::Xor(a),
            (Store::Keep, Store::Keep) => Store::Keep,
        };
        out.push((o.clone(), new));
        if o.end < r.end {
            out.push((o.end..r.end, old));
        }
    }
    // Merge neighbours that are stored alike (fewer writes).
    for (r, how) in out {
        match runs.last_mut() {
            Some((last, lh)) if *lh == how && last.end == r.start => last.end = r.end,
            _ => runs.push((r, how)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(cmds: &str) -> Faults {
        let mut f = Faults::default();
        let c = f.apply(parse_commands(cmds).unwrap());
        assert!(c.is_empty());
        f
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn commands_parse_with_options_and_refuse_nonsense() {
        let c = parse_commands("fail-read 4k 8k errno=ENOSPC count=2 # a comment\n\nclear; reset")
            .unwrap();
        assert_eq!(c.len(), 3);
        match &c[0] {
            Command::Add(r) => {
                assert_eq!(r.kind, Kind::FailRead);
                assert_eq!(r.range, 4096..12288);
                assert_eq!(r.errno, libc::ENOSPC);
                assert_eq!(r.remaining, Some(2));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c[1], Command::Clear);
        assert_eq!(c[2], Command::Reset);
        match parse_command("tear-write all keep=512").unwrap().unwrap() {
            Command::Add(r) => assert_eq!((r.range, r.keep), (0..u64::MAX, 512)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_command("corrupt 0 1 xor=0x01").unwrap(),
            Some(Command::Corrupt {
                range: 0..1,
                xor: 1
            })
        );
        for bad in [
            "frobnicate 0 1",
            "fail-read",
            "fail-read 0",
            "fail-read 0 0",
            "fail-read 0 1 xor=1",
            "drop-write 0 1 errno=EIO",
            "flip-read 0 1 xor=0",
            "flip-read 0 1 xor=256",
            "fail-write 0 1 count=0",
            "fail-write 0 1 errno=EWHAT",
            "clear now",
            "fail-read 18446744073709551615 2",
        ] {
            assert!(parse_command(bad).is_err(), "{bad} was accepted");
        }
        // A batch with one bad command applies nothing.
        assert!(parse_commands("fail-read 0 1\nbogus").is_err());
    }

    #[test]
    fn fail_read_fails_overlapping_requests_only() {
        let mut f = faults("fail-read 8192 4096");
        assert_eq!(f.plan_read(9, "d", 0, 8192), ReadPlan::Flip(vec![]));
        assert_eq!(f.plan_read(9, "d", 12288, 4096), ReadPlan::Flip(vec![]));
        assert_eq!(f.plan_read(9, "d", 4096, 8192), ReadPlan::Fail(libc::EIO));
        assert_eq!(f.events().len(), 1);
        assert_eq!(f.events()[0].affected, 4096..12288);
        assert_eq!(f.counters().hits(Kind::FailRead), 1);
        assert_eq!(f.counters().reads, 3);
    }

    #[test]
    fn write_runs_follow_the_rules() {
        let mut f = faults("drop-write 4096 4096\nflip-write 6144 4096 xor=0x0f");
        let plan = f.plan_write(9, "d", 0, 16384);
        assert_eq!(
            plan,
            WritePlan::Store(vec![
                (0..4096, Store::Keep),
                (4096..8192, Store::Skip),
                (8192..10240, Store::Xor(0x0f)),
                (10240..16384, Store::Keep),
            ])
        );
        let ev = f.events();
        assert_eq!(ev.len(), 2);
        assert_eq!(
            (ev[0].kind, ev[0].affected.clone()),
            (Kind::DropWrite, 4096..8192)
        );
        // The flip's event names all it touched (the dropped part was not stored anyway).
        assert_eq!(
            (ev[1].kind, ev[1].affected.clone()),
            (Kind::FlipWrite, 6144..10240)
        );
    }

    #[test]
    fn tear_keeps_the_first_bytes_of_each_request_part() {
        let mut f = faults("tear-write 1M 2M keep=4k");
        let plan = f.plan_write(9, "d", 1 << 20, 1 << 20);
        assert_eq!(
            plan,
            WritePlan::Store(vec![
                ((1 << 20)..(1 << 20) + 4096, Store::Keep),
                ((1 << 20) + 4096..(2 << 20), Store::Skip),
            ])
        );
        // A request whose part fits in `keep` is not torn and not counted.
        assert_eq!(
            f.plan_write(9, "d", 0, (1 << 20) + 100),
            WritePlan::Store(vec![(0..(1 << 20) + 100, Store::Keep)])
        );
        assert_eq!(f.counters().hits(Kind::TearWrite), 1);
        assert_eq!(f.counters().bytes(Kind::TearWrite), (1 << 20) - 4096);
    }

    #[test]
    fn range_sets_add_remove_and_clip() {
        let mut t = RangeSet::default();
        t.add(&(10..20));
        t.add(&(30..40));
        t.add(&(20..25)); // touches: merges
        assert_eq!(t.overlapping(&(0..100)), vec![10..25, 30..40]);
        t.remove(&(12..35));
        assert_eq!(t.overlapping(&(0..100)), vec![10..12, 35..40]);
        assert_eq!(t.overlapping(&(11..36)), vec![11..12, 35..36]);
        t.add(&(0..100));
        assert_eq!(t.overlapping(&(0..1000)), vec![0..100]);
        t.remove(&(0..100));
        assert!(t.overlapping(&(0..1000)).is_empty());
    }

    #[test]
    fn lost_reads_follow_what_was_stored() {
        let mut f = faults("drop-write 4096 4096 count=1\nfail-write 20000 10 count=1");
        f.plan_write(9, "d", 0, 16384); // the drop: 4096..8192 keeps old bytes
        assert_eq!(f.plan_read(9, "d", 0, 4096), ReadPlan::Flip(vec![]));
        f.plan_read(9, "d", 0, 16384);
        let lost: Vec<_> = f
            .events()
            .iter()
            .filter(|e| e.kind == Kind::LostRead)
            .cloned()
            .collect();
        assert_eq!(lost.len(), 1);
        assert_eq!(
            (lost[0].request.clone(), lost[0].affected.clone()),
            (0..16384, 4096..8192)
        );
        // Another file is not affected; a good write over the bytes heals them.
        f.plan_read(8, "e", 0, 16384);
        f.plan_write(9, "d", 6000, 4000);
        f.plan_read(9, "d", 0, 16384);
        assert_eq!(f.events().last().unwrap().affected, 4096..6000);
        // A failed write leaves the old bytes too.
        assert_eq!(f.plan_write(9, "d", 19990, 20), WritePlan::Fail(libc::EIO));
        f.plan_read(9, "d", 19000, 2000);
        assert_eq!(f.events().last().unwrap().affected, 19990..20010);
        assert_eq!(f.counters().hits(Kind::LostRead), 3);
    }

    #[test]
    fn count_limits_a_rule_and_fail_beats_the_rest() {
        let mut f = faults("flip-read 0 10 count=1\nfail-write 0 4096 count=1\ndrop-write 0 4096");
        assert_eq!(
            f.plan_read(9, "d", 0, 4096),
            ReadPlan::Flip(vec![(0..10, 0xff)])
        );
        assert_eq!(f.plan_read(9, "d", 0, 4096), ReadPlan::Flip(vec![]));
        assert_eq!(f.plan_write(9, "d", 0, 4096), WritePlan::Fail(libc::EIO));
        assert_eq!(
            f.plan_write(9, "d", 0, 4096),
            WritePlan::Store(vec![(0..4096, Store::Skip)])
        );
        assert_eq!(f.rules()[0].remaining, Some(0));
        assert!(f
            .status()
            .contains("rule 1 flip-read 0 10 xor=0xff remaining=0 hits=1"));
        // The dropped write left its bytes wrong: reading them is a lost read.
        f.plan_read(9, "d", 100, 10);
        assert_eq!(f.events().last().unwrap().kind, Kind::LostRead);
        assert_eq!(f.events().last().unwrap().affected, 100..110);
        f.apply(vec![Command::Reset]);
        assert!(f.rules().is_empty() && f.events().is_empty());
        assert_eq!(f.counters(), &Counters::default());
    }
}
