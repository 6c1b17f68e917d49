//! `uswap._uswap`: the native part of the Python package `uswap` (python/uswap). It
//! wraps the public API of the `uswap` crate: Pool, Region (with the buffer protocol),
//! counters, the errors as exceptions, and the fork hooks.
//!
//! The GIL is released around every call that can wait on the engine: building and
//! closing a pool, creating and closing a region, reading counters. Page faults on
//! region memory need no GIL: the engine's threads serve them.

mod errors;
mod pool;
mod region;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The engine allocates apart from the interpreter's and its extensions' `malloc`
/// (`uswap::EngineHeap`): a C extension's signal handler that touches a region while
/// its thread is inside `malloc` must not wait for an engine thread that waits for it.
#[global_allocator]
static HEAP: uswap::EngineHeap = uswap::EngineHeap;

/// Parse a size such as "256M", "2G", "4k" or 1048576 into bytes (binary units).
#[pyfunction]
fn parse_size(size: &Bound<'_, PyAny>) -> PyResult<u64> {
    pool::size_arg(size, "size")
}

/// Format bytes for humans, e.g. "256.0 MiB".
#[pyfunction]
fn format_size(bytes: u64) -> String {
    uswap::format_size(bytes)
}

// fork: `uswap/__init__.py` registers these with os.register_at_fork, so that a child
// made by os.fork() (and multiprocessing's "fork" start method) gets its own
// copy-on-write view of every region, swapped-out pages included. They keep the GIL:
// the forking thread holds it across fork anyway, and the engine needs no Python.

/// Before os.fork(): quiesce every pool's threads.
#[pyfunction]
fn _prepare_fork() {
    uswap::prepare_fork();
}

/// In the parent after os.fork().
#[pyfunction]
fn _after_fork_parent() {
    uswap::after_fork_parent();
}

/// In the child after os.fork(): new userfaultfd, threads and swap file for its pools.
#[pyfunction]
fn _after_fork_child() {
    uswap::after_fork_child();
}

/// The bytes of libuswap_preload.so built with this module (for `python -m uswap run`),
/// or None when it was built without the `bundle-preload` feature.
#[pyfunction]
fn _preload_image(py: Python<'_>) -> Option<Bound<'_, PyBytes>> {
    #[cfg(feature = "bundle-preload")]
    {
        static IMAGE: &[u8] = include_bytes!(env!("USWAP_PRELOAD_SO"));
        Some(PyBytes::new(py, IMAGE))
    }
    #[cfg(not(feature = "bundle-preload"))]
    {
        let _ = py;
        None
    }
}

#[pymodule]
fn _uswap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<pool::Pool>()?;
    m.add_class::<region::Region>()?;
    m.add("TIERS", pool::tiers())?;
    m.add("UNIT_SIZE", uswap::UNIT_SIZE)?;
    m.add("PAGE_SIZE", uswap::PAGE_SIZE)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(format_size, m)?)?;
    m.add_function(wrap_pyfunction!(_prepare_fork, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_parent, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_child, m)?)?;
    m.add_function(wrap_pyfunction!(_preload_image, m)?)?;
    Ok(())
}
