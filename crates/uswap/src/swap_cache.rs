//! swap_cache (in progress)
