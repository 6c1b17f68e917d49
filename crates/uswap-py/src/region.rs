//! `uswap.Region`: out-of-core memory that Python sees through the buffer protocol.

use crate::pool::{counters_dict, lock};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

/// A region and the number of buffers exported from it. While any export lives the
/// region cannot be closed, so the memory under a memoryview or an array stays mapped.
pub struct RegionCell {
    state: Mutex<RegionState>,
}

struct RegionState {
    /// None once closed. An Arc so that an engine call can run with the GIL released
    /// without holding this lock.
    region: Option<Arc<uswap::Region>>,
    exports: usize,
}

impl RegionCell {
    /// Take the region out (closing it) unless a buffer is exported from it.
    pub fn take_if_unused(&self) -> Option<Arc<uswap::Region>> {
        let mut s = lock(&self.state);
        if s.exports == 0 {
            s.region.take()
        } else {
            None
        }
    }
}

/// Out-of-core memory from Pool.region(size): read and write it through
/// memoryview(region) (writable, no copy), numpy.frombuffer(region, ...), or any
/// API that takes a buffer. Pages beyond the pool's budget live in the swap file.
///
/// len(region) is its size in bytes. close() unmaps it and frees its swap; it raises
/// BufferError while a memoryview or array still uses the memory (as mmap does).
/// A region also closes when it is garbage-collected.
#[pyclass(module = "uswap", frozen, weakref)]
pub struct Region {
    cell: Arc<RegionCell>,
    /// Bytes asked for: the length of the buffer (the mapping is rounded up to 2 MiB).
    size: usize,
    addr: usize,
}

impl Region {
    pub fn new(region: uswap::Region, size: usize) -> Region {
        let addr = region.as_ptr() as usize;
        Region {
            cell: Arc::new(RegionCell {
                state: Mutex::new(RegionState {
                    region: Some(Arc::new(region)),
                    exports: 0,
                }),
            }),
            size,
            addr,
        }
    }

    pub fn cell(&self) -> &Arc<RegionCell> {
        &self.cell
    }

    fn live(&self) -> PyResult<Arc<uswap::Region>> {
        lock(&self.cell.state)
            .region
            .clone()
            .ok_or_else(closed_error)
    }
}

fn closed_error() -> PyErr {
    PyValueError::new_err("the region is closed")
}

#[pymethods]
impl Region {
    /// # Safety
    /// Called by Python with a `Py_buffer` to fill (the buffer protocol).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let mut s = lock(&this.cell.state);
        if s.region.is_none() {
            return Err(closed_error());
        }
        // SAFETY: `view` is the caller's Py_buffer; the memory is `size` bytes, mapped
        // read-write, and stays mapped while this export lives (close() refuses until
        // __releasebuffer__). FillInfo takes a new reference to `slf` into view->obj.
        let r = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                this.addr as *mut std::ffi::c_void,
                this.size as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if r != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        s.exports += 1;
        Ok(())
    }

    /// # Safety
    /// Called by Python once for each buffer `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut s = lock(&self.cell.state);
        s.exports = s.exports.saturating_sub(1);
    }

    fn __len__(&self) -> PyResult<usize> {
        self.live().map(|_| self.size)
    }

    /// Start address of the memory (for ctypes and C code); valid until close().
    #[getter]
    fn address(&self) -> PyResult<usize> {
        self.live().map(|_| self.addr)
    }

    /// Whether the region is closed.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.cell.state).region.is_none()
    }

    /// This region's counters (and the pool's gauges) as a dict, like Pool.counters().
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let region = self.live()?;
        let c = py.detach(move || region.counters());
        counters_dict(py, &c)
    }

    /// Unmap the region and free its swap. Raises BufferError while a memoryview or
    /// array uses it (release those first); closing twice is allowed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let region = {
            let mut s = lock(&self.cell.state);
            if s.exports > 0 {
                return Err(PyBufferError::new_err(format!(
                    "cannot close a region while {} buffer(s) (memoryview, array) use it",
                    s.exports
                )));
            }
            s.region.take()
        };
        py.detach(move || drop(region));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        if self.closed() {
            "<uswap.Region closed>".to_string()
        } else {
            format!("<uswap.Region size={} at {:#x}>", self.size, self.addr)
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // No export can be left: each holds a reference to this object.
        let region = lock(&self.cell.state).region.take();
        if let Some(region) = region {
            // Unmapping waits for the engine: not with the GIL held.
            Python::attach(|py| py.detach(move || drop(region)));
        }
    }
}
