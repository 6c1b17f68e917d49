//! The syscall boundary: userfaultfd, mappings and their advice, eventfds, the
//! process's page map. Everything `unsafe` about memory and descriptors lives here;
//! the rest of the engine calls these typed wrappers.

pub mod heap;
pub(crate) mod mem;
pub(crate) mod uffd;
