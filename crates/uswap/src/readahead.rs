//! readahead (in progress)
