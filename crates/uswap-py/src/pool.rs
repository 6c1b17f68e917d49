//! `uswap.Pool`: a resident budget and a swap tier shared by regions.

use crate::errors::{invalid_option, to_py};
use crate::region::{Region, RegionCell};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

/// A size from Python: an int of bytes, or a string such as "256M" (`uswap::parse_size`).
pub fn size_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let invalid = |input: String, reason: &str| {
        to_py(uswap::Error::InvalidSize {
            input,
            reason: format!("{what}: {reason}"),
        })
    };
    if obj.is_instance_of::<PyBool>() {
        Err(PyTypeError::new_err(format!(
            "{what} must be an int (bytes) or a string such as '256M', not bool"
        )))
    } else if obj.is_instance_of::<PyInt>() {
        let n: i128 = obj
            .extract()
            .map_err(|_| invalid(obj.to_string(), "too large"))?;
        u64::try_from(n)
            .map_err(|_| invalid(n.to_string(), if n < 0 { "negative" } else { "too large" }))
    } else if let Ok(s) = obj.cast::<PyString>() {
        let s = s.to_str()?;
        uswap::parse_size(s).map_err(|e| match e {
            uswap::Error::InvalidSize { input, reason } => invalid(input, &reason),
            other => to_py(other),
        })
    } else {
        Err(PyTypeError::new_err(format!(
            "{what} must be an int (bytes) or a string such as '256M', not {}",
            obj.get_type().name()?
        )))
    }
}

/// The tiers a pool can page to, by the name `Pool(tier=...)` takes (the engine's
/// `TierKind` names): "file", "compressed", "compressed+file", "remote",
/// "compressed+remote".
pub fn tiers() -> Vec<&'static str> {
    uswap::TierKind::ALL.iter().map(|t| t.name()).collect()
}

/// The tier options of `Pool(...)`.
pub struct TierOptions<'a> {
    pub tier: Option<&'a str>,
    pub compressor: Option<&'a str>,
    pub compressed_max: Option<u32>,
    pub incompressible: Option<&'a str>,
    pub remote: Option<&'a str>,
}

/// The tier options on the builder. `compressor` and `compressed_max` only with a
/// compressed tier, `remote` only (and always) with a remote one: elsewhere they would be
/// silently ignored.
fn apply_tier(b: uswap::PoolBuilder, o: &TierOptions<'_>) -> PyResult<uswap::PoolBuilder> {
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|t| format!("{t:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let kind: uswap::TierKind = o.tier.unwrap_or("file").parse().map_err(|_| {
        invalid_option(format!(
            "unknown tier {:?}: uswap has {}",
            o.tier.unwrap_or_default(),
            quoted(&tiers())
        ))
    })?;
    let mut b = b.tier(kind);
    let compressed: Vec<&str> = tiers()
        .into_iter()
        .filter(|t| t.parse().is_ok_and(uswap::TierKind::is_compressed))
        .collect();
    if !kind.is_compressed() && (o.compressor.is_some() || o.compressed_max.is_some()) {
        return Err(invalid_option(format!(
            "compressor and compressed_max apply to the compressed tiers ({}), not to \
             tier={:?}",
            quoted(&compressed),
            kind.name()
        )));
    }
    match (o.remote, kind.is_remote()) {
        (None | Some(""), true) => {
            return Err(invalid_option(format!(
                "tier={:?} needs remote=\"redis://HOST:PORT[,HOST:PORT...]\" (the Redis \
                 Cluster to page to)",
                kind.name()
            )))
        }
        (Some(_), false) => {
            return Err(invalid_option(format!(
                "remote applies to tier=\"remote\" or tier=\"compressed+remote\", not to \
                 tier={:?}",
                kind.name()
            )))
        }
        (Some(r), true) => b = b.remote(r),
        (None, false) => {}
    }
    if let Some(c) = o.compressor {
        b = b.compressor(c.parse().map_err(invalid_option)?);
    }
    if let Some(p) = o.compressed_max {
        if !(1..=90).contains(&p) {
            return Err(invalid_option(format!(
                "compressed_max must be a percent of the budget, 1-90, not {p}"
            )));
        }
        b = b.compressed_max_percent(p);
    }
    if let Some(i) = o.incompressible {
        if !matches!(
            kind,
            uswap::TierKind::CompressedFile | uswap::TierKind::CompressedRemote
        ) {
            return Err(invalid_option(format!(
                "incompressible applies to tier=\"compressed+file\" or \
                 tier=\"compressed+remote\" (a pool with a tier behind it), not to tier={:?}",
                kind.name()
            )));
        }
        b = b.store_incompressible(match i {
            "store" => true,
            "pass" => false,
            _ => {
                return Err(invalid_option(format!(
                    "incompressible must be \"store\" or \"pass\", not {i:?}"
                )))
            }
        });
    }
    Ok(b)
}

fn unit_arg(unit: &str) -> PyResult<uswap::UnitPolicy> {
    match unit.to_ascii_lowercase().as_str() {
        "4k" => Ok(uswap::UnitPolicy::Small),
        "2m" => Ok(uswap::UnitPolicy::Huge),
        "auto" => Ok(uswap::UnitPolicy::Auto),
        _ => Err(invalid_option(format!(
            "unit must be '4k', '2m' or 'auto', not {unit:?}"
        ))),
    }
}

fn readahead_arg(ra: &str) -> PyResult<uswap::ReadaheadPolicy> {
    match ra.to_ascii_lowercase().as_str() {
        "vma" => Ok(uswap::ReadaheadPolicy::Vma),
        "cluster" => Ok(uswap::ReadaheadPolicy::Cluster),
        "off" => Ok(uswap::ReadaheadPolicy::Off),
        _ => Err(invalid_option(format!(
            "readahead must be 'vma', 'cluster' or 'off', not {ra:?}"
        ))),
    }
}

/// The engine's counters as a dict, with the names the CLI prints (`uswap::Counters`
/// serialized).
pub fn counters_dict<'py>(py: Python<'py>, c: &uswap::Counters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(c) {
        for (name, v) in map {
            match v.as_u64() {
                Some(n) => d.set_item(name, n)?,
                None => d.set_item(name, v.as_f64())?,
            }
        }
    }
    Ok(d)
}

/// A resident budget and a swap tier, shared by the regions made from it.
///
/// Pool(budget="256M", *, swap_file=None, swap_size=None, unit="auto", tier=None,
///      compressor=None, compressed_max=None, incompressible=None, remote=None,
///      readahead="vma",
///      fault_threads=1, encrypt=False)
///
/// Sizes are ints (bytes) or strings such as "256M" or "2G". `swap_file`: a directory
/// (an unnamed file is made in it), a new file path, or a block device; default $TMPDIR.
/// `swap_size`: fixed swap capacity (default: grows with the regions). `unit`: "4k",
/// "2m" or "auto". `tier`: None or "file" (the swap file), "compressed" (compressed RAM
/// in the budget, no disk), "compressed+file" (compressed RAM in front of the swap
/// file), "remote" (a Redis Cluster), "compressed+remote"; `compressor`: "lz4"
/// (default), "lz4:ACCELERATION" (2-64), "zstd" or "zstd:LEVEL"; `compressed_max`: the compressed pool's share of
/// the budget in percent, 1-90 (default 90 with a tier behind the pool, 50 with
/// "compressed"); `incompressible`: with "compressed+file" or "compressed+remote", what
/// becomes of a page that does not compress: "store" (default: kept in the pool as it
/// is while the pool is under its share, a fault on it a copy from RAM) or "pass"
/// (straight on to the file or the cluster); `remote`: the
/// cluster of the remote tiers,
/// "redis://HOST:PORT[,HOST:PORT...]". Bad values raise uswap.InvalidOptionError (a
/// ValueError). `encrypt`: encrypt what goes to the swap file (or the
/// cluster), under a key made at start and never written anywhere. Use it as a context
/// manager, or call close().
#[pyclass(module = "uswap", frozen, weakref)]
pub struct Pool {
    /// None once closed. An Arc so that an engine call can run with the GIL released
    /// without holding this lock.
    pool: Mutex<Option<Arc<uswap::Pool>>>,
    /// The regions made from this pool, for close().
    regions: Mutex<Vec<Weak<RegionCell>>>,
    budget: u64,
    swap_location: String,
}

impl Pool {
    fn live(&self) -> PyResult<Arc<uswap::Pool>> {
        lock(&self.pool)
            .clone()
            .ok_or_else(|| PyValueError::new_err("the pool is closed"))
    }
}

/// Lock a mutex that is never held across a blocking call or Python code.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(signature = (budget=None, *, swap_file=None, swap_size=None, unit="auto", tier=None,
                        compressor=None, compressed_max=None, incompressible=None, remote=None,
                        readahead="vma", fault_threads=1, encrypt=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        budget: Option<&Bound<'_, PyAny>>,
        swap_file: Option<PathBuf>,
        swap_size: Option<&Bound<'_, PyAny>>,
        unit: &str,
        tier: Option<&str>,
        compressor: Option<&str>,
        compressed_max: Option<u32>,
        incompressible: Option<&str>,
        remote: Option<&str>,
        readahead: &str,
        fault_threads: usize,
        encrypt: bool,
    ) -> PyResult<Self> {
        let mut b = uswap::Pool::builder()
            .encrypt(encrypt)
            .unit(unit_arg(unit)?)
            .readahead(readahead_arg(readahead)?)
            .fault_threads(fault_threads);
        if let Some(budget) = budget {
            b = b.budget(size_arg(budget, "budget")?);
        }
        if let Some(p) = swap_file {
            b = b.swap_file(p);
        }
        if let Some(s) = swap_size {
            b = b.swap_size(size_arg(s, "swap_size")?);
        }
        b = apply_tier(
            b,
            &TierOptions {
                tier,
                compressor,
                compressed_max,
                incompressible,
                remote,
            },
        )?;
        let pool = py.detach(move || b.build()).map_err(to_py)?;
        Ok(Pool {
            budget: pool.budget(),
            swap_location: pool.swap_location().display().to_string(),
            pool: Mutex::new(Some(Arc::new(pool))),
            regions: Mutex::new(Vec::new()),
        })
    }

    /// A new region of `size` bytes (int or string such as "1G"), zero-filled, that
    /// supports the buffer protocol: memoryview(region) is writable, no copy.
    fn region(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<Region> {
        let size = size_arg(size, "size")?;
        let pool = self.live()?;
        let region = py.detach(move || pool.region(size)).map_err(to_py)?;
        let region = Region::new(region, size as usize);
        let mut regions = lock(&self.regions);
        regions.retain(|w| w.strong_count() > 0);
        regions.push(Arc::downgrade(region.cell()));
        Ok(region)
    }

    /// The pool's counters (totals over its regions, and gauges) as a dict named like
    /// the CLI's: pswpin, pswpout, majflt, resident_bytes, peak_used_bytes, ...
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let pool = self.live()?;
        let c = py.detach(move || pool.counters());
        counters_dict(py, &c)
    }

    /// Close the pool: no new regions; every region made from it that no memoryview or
    /// array uses any more is closed now. Regions still in use stay valid until they are
    /// released; the engine stops and its swap file goes with the last of them.
    /// Closing twice is allowed.
    fn close(&self, py: Python<'_>) {
        let pool = lock(&self.pool).take();
        let cells: Vec<Arc<RegionCell>> = lock(&self.regions)
            .drain(..)
            .filter_map(|w| w.upgrade())
            .collect();
        let unused: Vec<_> = cells.iter().filter_map(|c| c.take_if_unused()).collect();
        py.detach(move || {
            drop(unused);
            drop(cells);
            drop(pool);
        });
    }

    /// Whether close() was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.pool).is_none()
    }

    /// The resident budget in bytes: as the pool started, or as set_budget() changed it.
    #[getter]
    fn budget(&self) -> u64 {
        lock(&self.pool)
            .as_ref()
            .map_or(self.budget, |p| p.budget())
    }

    /// Change the budget while the pool runs (an int, or a string such as "128M"):
    /// growing, it may hold more at once; shrinking, the limit drops now and the engine
    /// evicts down to it in the background (a fault meanwhile waits for room; the
    /// regions' bytes are kept). From 8 MiB up to the budget the pool started
    /// with; other values raise uswap.InvalidSizeError. `uswap set PID --budget`
    /// does the same from another process.
    fn set_budget(&self, py: Python<'_>, budget: &Bound<'_, PyAny>) -> PyResult<()> {
        let bytes = size_arg(budget, "budget")?;
        let pool = self.live()?;
        py.detach(move || pool.set_budget(bytes))
            .map_err(crate::errors::to_py)
    }

    /// Where the swap lives (the directory of the unnamed swap file, or the device).
    #[getter]
    fn swap_location(&self) -> &str {
        &self.swap_location
    }

    /// Swap capacity in bytes now.
    #[getter]
    fn swap_capacity(&self, py: Python<'_>) -> PyResult<u64> {
        let pool = self.live()?;
        Ok(py.detach(move || pool.swap_capacity()))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<uswap.Pool budget={} swap={:?}{}>",
            uswap::format_size(self.budget),
            self.swap_location,
            if self.closed() { " closed" } else { "" }
        )
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Stopping the engine joins its threads: not with the GIL held.
        if let Some(pool) = lock(&self.pool).take() {
            Python::attach(|py| py.detach(move || drop(pool)));
        }
    }
}
