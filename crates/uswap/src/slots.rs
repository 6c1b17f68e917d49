//! slots (in progress)
