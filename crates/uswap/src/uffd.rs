//! uffd (in progress)
