//! fork(2) support: the child gets its own copy-on-write view of every region,
//! swapped-out pages included (see `prepare_fork` and the `after_fork_*` hooks,
//! which a program's `pthread_atfork` handlers call — the preload library does).

/// Call right before fork() (pthread_atfork "prepare"): quiesces every pool's
/// threads so that no engine lock is held across the fork.
pub fn prepare_fork() {
    for e in crate::engine::live_engines() {
        e.fork_prepare();
    }
}

/// Call in the parent right after fork().
pub fn after_fork_parent() {
    for e in crate::engine::live_engines() {
        e.fork_parent();
    }
}

/// Call in the child right after fork(): gives the child's regions their own
/// engine (new userfaultfd, threads, rings and swap file for new writes).
pub fn after_fork_child() {
    for e in crate::engine::live_engines() {
        e.fork_child();
    }
}
