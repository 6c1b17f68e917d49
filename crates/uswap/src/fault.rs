//! fault (in progress)
/// The engine shared by a pool's threads.
pub struct Engine;
