//! reclaim (in progress)
