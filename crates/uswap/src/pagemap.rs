//! pagemap (in progress)
/// A region's shared state.
pub struct RegionInner;
