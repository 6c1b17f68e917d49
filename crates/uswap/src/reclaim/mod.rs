//! Reclaim: keeps everything the engine holds under the budget.
//!
//! Two lists (`lists.rs`), like the kernel's active/inactive LRUs but built from what
//! user space can see (faults, not accessed bits): units with resident pages in a
//! CLOCK with a second-chance bit set by every fault in the unit, and clean pages in
//! the swap cache in the order they got there. Eviction (`evict.rs`) takes a unit
//! whole into frames; dirty pages go to writeback, clean ones with a valid slot stay
//! as clean cache copies (no write), which trimming drops oldest first. A fault on a
//! page still in the cache is the cheap second chance.
//!
//! The reclaim thread (`run`, the kernel's kswapd) works between the watermarks; a
//! fault that would cross the limit reclaims directly (`make_room`).

mod evict;
mod lists;

pub(crate) use lists::{
    lru_add, lru_add_in_place, note_refault, push_inactive, reserve_lru, ReclaimLists,
};

use crate::budget::Room;
use crate::engine::Engine;
use crate::pagemap::RegionInner;
use crate::ring::TOKEN_TIMEOUT;
use crate::threads::ThreadCtx;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pages a direct reclaim frees beyond what the fault needs, so that the next faults
/// do not reclaim again at once.
const DIRECT_BATCH: i64 = 256;

/// Before a fault maps up to `want` pages: reserve them, reclaiming directly if
/// usage plus every fault's reservation would cross the budget; wake the reclaim
/// thread above the high watermark. The reservation lasts as long as the returned
/// guard: the fault charges its pages while holding it, and charges nothing past it
/// (`Budget::take_room` for more), so two threads never both take the last room, and
/// a new region's page map waits for them.
///
/// None: no room, and a fork is pending, which holds back the other threads whose
/// I/O would make it; the caller puts the fault back and leaves the engine.
pub(crate) fn make_room<'a>(
    e: &'a Engine,
    ctx: &mut ThreadCtx,
    r: &RegionInner,
    want: i64,
) -> Option<Room<'a>> {
    let mut stalled = 0;
    crate::memcg::follow(e);
    loop {
        // While writes pause (swap full, or the device refusing) and a fault's
        // reclaim already found nothing in this pause, looking again for each fault
        // is the spin a forked child out of swap once spent 93.7 s in (2.2 s with
        // room): over budget at once, until the pause ends.
        if stalled == 0 && e.writeback.reclaim_futile() {
            stalled = 2;
        }
        // After two passes of reclaim without progress: over budget rather than a
        // hung fault (said once).
        if e.budget.try_reserve(want, stalled >= 2) {
            break;
        }
        if stalled == 0 {
            r.counters.direct_reclaim.fetch_add(1, Relaxed);
            // Reclaim has fallen behind: the reclaim thread works beside this one
            // (the kernel's slow path wakes kswapd before it reclaims directly).
            e.threads.wake_kswapd();
        }
        let target =
            e.budget.fault_limit_pages() - e.budget.unclaimed_pages() - want - DIRECT_BATCH;
        if !reclaim(e, ctx, Goal::Pages(target)) {
            if e.fork.pending() {
                return None;
            }
            stalled += 1;
            if stalled >= 2 {
                e.writeback.note_futile();
                e.diag.over_budget();
            }
        }
    }
    wake_if_high(e);
    Some(e.budget.room(want))
}

/// After a fault reserved room: wake the reclaim thread above the high watermark.
/// What is promised counts, not only what is charged: a direct reclaim stops just
/// under its target, and the fault's own pages, reserved but not charged yet, then take
/// usage over the watermark. Read from usage alone, the reclaim thread slept through
/// whole passes of a stream (3.6 s of swap-w-seq 2m's 4 s on `compressed+file`, a
/// prototype's trace, 2026-11-25) while the fault thread compressed every unit itself.
pub(crate) fn wake_if_high(e: &Engine) {
    if e.budget.promised_pages() > e.budget.high_pages() {
        e.threads.wake_kswapd();
    }
}

/// Where a reclaim brings usage.
pub(crate) enum Goal {
    /// A fault's: at most this many pages.
    Pages(i64),
    /// A pass of the reclaim thread: `kswapd_goal`, read again at every step. It moves
    /// with what faults hold reserved: fixed for a whole pass, a reservation of the
    /// moment (a stream's fault reserves for the units it reads ahead, and hands most
    /// of it back) had it reclaim that much below the low watermark, or everything
    /// when reservations passed it.
    Background,
}

/// Reclaim until usage is at most the goal; false if it gave up (nothing more can go
/// now).
pub(crate) fn reclaim(e: &Engine, ctx: &mut ThreadCtx, goal: Goal) -> bool {
    let mut idle = 0;
    let mut cqes = Vec::new();
    let background = matches!(goal, Goal::Background);
    loop {
        let target = match goal {
            Goal::Pages(n) => n,
            Goal::Background => kswapd_goal(e),
        };
        if e.budget.usage_pages() <= target || e.threads.is_shutdown() {
            break;
        }
        // Spare zeroed THPs nobody is about to take go first (`spare.rs`).
        if e.spares.idle() && crate::spare::drop(e, usize::MAX) > 0 {
            continue;
        }
        // So do warm 2 MiB frames once units stopped coming in (`frames.rs`).
        if crate::frames::warm_units_idle(e) && crate::frames::drop_warm_units(e) > 0 {
            continue;
        }
        let need = e.budget.usage_pages() - target;
        let dropped = lists::trim_inactive(e, need, true);
        if dropped >= need {
            continue;
        }
        // Pages under writeback become droppable when their writes complete: evict
        // only what they do not cover, then ahead of need up to a margin
        // (`evict::may_evict_ahead`), and otherwise wait for completions below. The
        // margin keeps a queue of writes for the device and gives a read stream room
        // for unit readahead instead of dropping what was just read ahead.
        let uncovered = need - dropped - e.tiers.inflight.write_pages.load(Relaxed);
        let moved = evict::evict_lru(e, ctx, uncovered.max(0));
        // Nothing left to evict: the compressed pool's oldest pages go to the file.
        let written = if dropped == 0 && moved == 0 {
            crate::tier::compressed::balance(e, ctx, uncovered.max(0) as u64)
        } else {
            0
        };
        ctx.ring.submit();
        if dropped > 0 || moved > 0 || written > 0 {
            idle = 0;
            continue;
        }
        // Copies read ahead of a stream (passed over above) go when no write in flight
        // will free room, or after ~10 ms of waiting for one: waiting for a write is
        // worth it, a read that would have to come again is not worth more.
        // The reclaim thread takes them only where faults need the room (`needed`):
        // between the watermarks its work is ahead of need, and woken as often as
        // faults now wake it, it dropped a unit read ahead that the stream then read
        // again (`tests/units.rs`, `a_rewrite_stream_reads_each_unit_once`).
        if (!background || needed(e))
            && (e.tiers.inflight.write_pages.load(Relaxed) == 0 || idle >= 200)
            && lists::trim_inactive(e, need - dropped, false) > 0
        {
            idle = 0;
            continue;
        }
        // Nothing droppable now: what remains is under I/O. Wait for our own writes;
        // other threads' complete on their rings.
        if ctx.io_pending() {
            if ctx.failed.is_empty() {
                ctx.sleep();
            }
            cqes.clear();
            ctx.ring.reap(&mut cqes);
            crate::fault::process_cqes(e, ctx, &cqes);
        } else if e.fork.pending() {
            // Other threads wait outside the engine for a fork, which waits for this
            // one: give up for now (the caller leaves and comes back).
            return false;
        } else if e.tiers.inflight.requests.load(Relaxed) > 0 && idle < 200_000 {
            // Another thread's I/O will make pages droppable: the budget is a promise,
            // so wait for it (bounded at ~10 s against a stuck device).
            idle += 1;
            e.threads.wake_kswapd();
            std::thread::sleep(Duration::from_micros(50));
        } else if crate::spare::drop(e, 1) > 0 {
            // Nothing will free room but a spare zeroed THP: it goes. (Not before:
            // dropped, its memory goes back to the host, and making it again costs
            // more than waiting for a write.)
            idle = 0;
        } else if crate::frames::drop_warm_units(e) > 0 {
            // So do warm 2 MiB frames (their charge goes: the limit rises).
            idle = 0;
        } else if background && lists::trim_inactive(e, need - dropped, false) > 0 {
            // The copies read ahead that the pass spared (above) rather than give up:
            // a pass that gives up lets waiting in-thread faults and a new region's
            // page map go over the budget.
            idle = 0;
        } else {
            // Nothing in flight and nothing evictable (pinned pages, or writeback
            // refused by the device): proceed rather than hang or spin.
            return false;
        }
    }
    true
}

/// Whether room is needed now, not ahead of need: usage above the high watermark,
/// in-thread faults waiting for the reclaim thread, or a new region's page map
/// waiting.
fn needed(e: &Engine) -> bool {
    let b = &e.budget;
    b.usage_pages() > b.high_pages() || e.threads.room_awaited() || b.metadata_waits()
}

/// Where a pass of the reclaim thread brings usage: the low watermark less what is
/// reserved, so that what is promised ends under it (usage alone against a wake-up
/// read from what is promised: a pass with usage already under `low` and reservations
/// over the gap between the watermarks returned at once, and the loop began another,
/// spinning as long as the fault held its room).
fn kswapd_goal(e: &Engine) -> i64 {
    let b = &e.budget;
    b.low_pages() - b.unclaimed_pages()
}

/// Whether the reclaim thread has a pass to make (to `kswapd_goal`): once what faults
/// have promised is over the high watermark (as at the wake-up, `wake_if_high`), or
/// while a new region's page map waits for room.
fn kswapd_due(e: &Engine) -> bool {
    let b = &e.budget;
    !e.threads.is_shutdown() && (b.metadata_waits() || b.promised_pages() > b.high_pages())
}

/// When [`give_back_swap_space`] last looked.
struct GiveBackLook {
    emptied: u64,
    at: Instant,
}

/// Disk space of swap slots nobody uses goes back to the filesystem once more than half
/// of the file is free (the file grows as pages are evicted: a burst, children holding
/// the slots of a fork, a region dropped, would otherwise keep its peak for good). The
/// blocks come back when a cluster is written again. Not on every free: a stream that
/// rewrites its pages frees and reuses clusters all the time, and writing into a hole
/// costs the filesystem an allocation. Looked at when a cluster became free since the
/// last look, else once a second (frees that empty no cluster can still take the file
/// past half free): the look sums every cluster's count.
fn give_back_swap_space(e: &Engine, last: &mut GiveBackLook) {
    let emptied = e.slots.clusters_emptied();
    if emptied == last.emptied && last.at.elapsed() < Duration::from_secs(1) {
        return;
    }
    *last = GiveBackLook {
        emptied,
        at: Instant::now(),
    };
    let used = e.slots.used();
    let file = e.tiers.file();
    if file.worth_giving_back(used) {
        e.slots
            .for_each_empty_cluster(|first| file.give_back(first, crate::slots::CLUSTER_SLOTS));
    }
}

/// The reclaim thread.
pub(crate) fn run(e: &Arc<Engine>, mut ctx: ThreadCtx) {
    // Background reclaim yields to the program and the fault threads (nice 19): at
    // the default priority it ran 1 ms stretches on the CPU where the program and its
    // fault thread hand a fault back and forth, while the other vCPU idled (perf
    // sched: 1.2 ms scheduling delays per fault). Measured on swap-w-seq 2 GiB /
    // 256 MiB, --unit 2m: the first pass went from 1.5-1.8 s to 1.1-1.2 s. If it
    // falls behind, faults reclaim directly, as before.
    crate::sys::mem::set_thread_nice(19);
    ctx.arm_polls();
    let mut cqes = Vec::new();
    // A pass that could not reach its target (writeback refused, pages pinned) is
    // not repeated until something changes: a wake-up, a completion, or the
    // writeback pause ending.
    let mut futile = false;
    let mut give_back_look = GiveBackLook {
        emptied: u64::MAX,
        at: Instant::now(),
    };
    loop {
        if e.threads.is_shutdown() && !ctx.io_pending() {
            break;
        }
        crate::memcg::follow(e);
        let publish_in = crate::live::tick(e);
        {
            let _a = e.fork.enter();
            crate::fork::arm_child_polls(e, &mut ctx);
            crate::frames::tune_warm_units(e);
            give_back_swap_space(e, &mut give_back_look);
        }
        if !futile {
            // A compressed pool past its share writes its oldest back first (zswap's
            // shrink worker), also while reclaim runs: else, with a stream keeping
            // reclaim busy, the pool keeps its oldest pages and refuses every new one.
            let due = kswapd_due(e);
            let wrote_back = if !due || crate::tier::compressed::wants_writeback(e) {
                let _a = e.fork.enter();
                crate::tier::compressed::balance(e, &mut ctx, 0)
            } else {
                0
            };
            if wrote_back > 0 {
                ctx.ring.submit();
            }
            if due {
                let _a = e.fork.enter();
                let pass = e.threads.kswapd_pass_begins();
                futile = !reclaim(e, &mut ctx, Goal::Background);
                if futile {
                    e.writeback.note_futile();
                }
                e.threads.kswapd_pass_ends(pass, futile);
                continue;
            }
            if wrote_back > 0 {
                continue;
            }
            let made_spare = {
                let _a = e.fork.enter();
                crate::spare::refill(e)
            };
            if made_spare {
                continue;
            }
        }
        e.threads.kswapd_sleeps(true);
        // Re-check after publishing that we sleep (a waker may have missed us).
        if !futile && kswapd_due(e) {
            e.threads.kswapd_sleeps(false);
            continue;
        }
        match (futile, e.writeback.blocked_for()) {
            (true, Some(d)) => ctx
                .ring
                .wait_for(d.max(std::time::Duration::from_millis(1))),
            // Following a memory cgroup: awake to read it again (also while a pass
            // could not reach its target: the cgroup may leave less room by now).
            _ if e.memcg.is_some() => ctx.ring.wait_for(crate::memcg::sleep_for(e)),
            (true, None) => ctx.ring.wait_for(std::time::Duration::from_millis(100)),
            // Warm 2 MiB frames go once units stop coming in (`frames.rs`): awake to
            // see that.
            _ if crate::frames::warm_units_held(e) => ctx
                .ring
                .wait_for(publish_in.min(std::time::Duration::from_millis(1100))),
            // Awake for the next live record (`live.rs`), when the pool publishes.
            _ if publish_in != std::time::Duration::MAX => ctx.ring.wait_for(publish_in),
            _ => ctx.ring.wait(),
        }
        e.threads.kswapd_sleeps(false);
        // While writes pause and a pass found nothing, a wake-up (each fault over
        // the budget wakes it) is no reason for another pass: the pause's end is.
        futile = e.writeback.reclaim_futile();
        // Completions take unit locks: inside the engine (no fork meanwhile).
        let _a = e.fork.enter();
        cqes.clear();
        ctx.ring.reap(&mut cqes);
        cqes.retain(|&(ud, _)| ud != TOKEN_TIMEOUT);
        crate::fault::process_cqes(e, &mut ctx, &cqes);
    }
    // The pool is closing: its record goes with it (inside the engine: no fork copies
    // the record's lock held).
    let _a = e.fork.enter();
    e.live.close();
}
