//! The engine's errors as Python exceptions: one class per kind of `uswap::Error`, all
//! under `uswap.Error`, each also under the builtin exception a Python user would catch
//! for it (ValueError for bad sizes, MemoryError for a full swap file, ...). The message
//! is the engine's.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    uswap,
    Error,
    pyo3::exceptions::PyException,
    "Base class of every error uswap raises; the message is the engine's."
);

/// (class name, builtin it also derives from, docstring), in the order of `kind_of`.
const KINDS: [(&str, &str, &str); 11] = [
    (
        "UffdNotPermittedError",
        "PermissionError",
        "userfaultfd is not permitted for this process (run as root, or \
         `sysctl vm.unprivileged_userfaultfd=1`, or give access to /dev/userfaultfd).",
    ),
    (
        "UffdFeatureMissingError",
        "OSError",
        "The kernel's userfaultfd lacks a feature uswap needs (Linux 6.8 or later).",
    ),
    (
        "SwapFileError",
        "OSError",
        "The swap file could not be created or opened.",
    ),
    (
        "SwapFullError",
        "MemoryError",
        "The swap file cannot hold a new region (see Pool(swap_size=...)).",
    ),
    (
        "BudgetTooSmallError",
        "ValueError",
        "The budget is too small for the engine (a few 2 MiB units plus metadata).",
    ),
    (
        "BudgetExceedsRamError",
        "ValueError",
        "The budget is larger than the machine's RAM.",
    ),
    (
        "InvalidSizeError",
        "ValueError",
        "A size did not parse (examples: 4096, '4k', '256M', '2G').",
    ),
    (
        "InvalidRegionSizeError",
        "ValueError",
        "A region size of zero, or too large for the address space.",
    ),
    ("SysError", "OSError", "A system call failed."),
    (
        "RemoteError",
        "ConnectionError",
        "The remote tier's Redis Cluster could not be used (bad address, unreachable, down).",
    ),
    (
        "InvalidOptionError",
        "ValueError",
        "A Pool(...) option has a bad value, or does not apply to the tier chosen.",
    ),
];

/// Index of `InvalidOptionError` in `KINDS` (not an engine error: see `invalid_option`).
const INVALID_OPTION: usize = 10;

fn kind_of(e: &uswap::Error) -> usize {
    use uswap::Error::*;
    match e {
        UffdNotPermitted { .. } => 0,
        UffdFeatureMissing { .. } => 1,
        // A swap place refused (in RAM, none found) is a swap-file error too.
        SwapFile { .. } | SwapInRam { .. } | NoSwapPlace { .. } => 2,
        SwapFull { .. } => 3,
        BudgetTooSmall { .. } => 4,
        BudgetExceedsRam { .. } => 5,
        InvalidSize { .. } | SwapSizeTooSmall { .. } | InvalidSetting { .. } => 6,
        InvalidRegionSize { .. } => 7,
        Sys { .. } => 8,
        Remote { .. } => 9,
    }
}

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// Create the classes and add them, and `Error`, to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let base = py.get_type::<Error>();
    m.add("Error", &base)?;
    let builtins = py.import("builtins")?;
    let type_ = builtins.getattr("type")?;
    let mut classes = Vec::with_capacity(KINDS.len());
    for (name, builtin, doc) in KINDS {
        let ns = PyDict::new(py);
        ns.set_item("__doc__", doc)?;
        ns.set_item("__module__", "uswap")?;
        let bases = PyTuple::new(py, [base.as_any(), &builtins.getattr(builtin)?])?;
        let class = type_.call1((name, bases, ns))?.cast_into::<PyType>()?;
        m.add(name, &class)?;
        classes.push(class.unbind());
    }
    CLASSES
        .set(py, classes)
        .map_err(|_| PyTypeError::new_err("uswap's exception classes were made twice"))
}

fn raise(kind: usize, msg: String) -> PyErr {
    Python::attach(|py| match CLASSES.get(py) {
        Some(classes) => PyErr::from_type(classes[kind].bind(py).clone(), msg),
        None => Error::new_err(msg),
    })
}

/// The Python exception for an engine error, with the engine's message.
pub fn to_py(e: uswap::Error) -> PyErr {
    raise(kind_of(&e), e.to_string())
}

/// `uswap.InvalidOptionError` (a `uswap.Error` and a `ValueError`) with `msg`.
pub fn invalid_option(msg: impl Into<String>) -> PyErr {
    raise(INVALID_OPTION, msg.into())
}
