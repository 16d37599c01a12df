//! `cgloop.arrowcodec`: the Python face of [`crate::FlowEncoder`] and [`crate::IntEncoder`].

use std::os::raw::{c_int, c_void};
use std::sync::{Mutex, PoisonError};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyMemoryView;

use crate::{Batch, CodecError, Encoder, FlowEncoder, IntEncoder};

/// Idle encoders (warm column vectors) and idle stream buffers, taken by the next calls: a
/// call then touches no fresh memory (page faults of fresh buffers were ~40% of a call).
/// At most `KEEP_IDLE` of each are kept; a stream buffer only up to `KEEP_MAX_BYTES`.
static FLOW_ENCODERS: Mutex<Vec<FlowEncoder>> = Mutex::new(Vec::new());
static INT_ENCODERS: Mutex<Vec<IntEncoder>> = Mutex::new(Vec::new());
static STREAMS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
const KEEP_IDLE: usize = 2;
const KEEP_MAX_BYTES: usize = 1 << 30;

fn take<T>(pool: &Mutex<Vec<T>>) -> Option<T> {
    pool.lock().unwrap_or_else(PoisonError::into_inner).pop()
}

fn give<T>(pool: &Mutex<Vec<T>>, item: T) {
    let mut idle = pool.lock().unwrap_or_else(PoisonError::into_inner);
    if idle.len() < KEEP_IDLE {
        idle.push(item);
    }
}

/// The bytes of one stream, owned by Rust, read through the buffer protocol (read-only).
/// Its buffer goes back to the pool when the last view of it is released.
#[pyclass(frozen, module = "cgloop.arrowcodec")]
struct ArrowStream {
    data: Vec<u8>,
}

#[pymethods]
impl ArrowStream {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let data = &slf.get().data;
        // SAFETY: `data` is neither changed nor freed while the object lives (a frozen
        // class, no method takes it mutably), and the view holds a reference to the object
        // (`PyBuffer_FillInfo` sets `view.obj`), so the pointer stays valid for the view.
        // Read-only: a request for a writable buffer fails with BufferError.
        let filled = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut c_void,
                data.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if filled == -1 {
            Err(PyErr::fetch(slf.py()))
        } else {
            Ok(())
        }
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }
}

impl Drop for ArrowStream {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        if data.capacity() <= KEEP_MAX_BYTES {
            give(&STREAMS, data);
        }
    }
}

create_exception!(
    arrowcodec,
    PayloadError,
    PyValueError,
    "One payload is refused: `index` is its position in the call (set it aside and \
     convert the others); the text names it and what is wrong."
);

/// Decode Kafka payloads of cgloop.flows.v1 (each a FlowRecordBatch) into one Arrow IPC
/// stream shaped like cgloop.flow_ingest, returned as a read-only memoryview. Raises
/// PayloadError (a ValueError) with the bad payload's index.
#[pyfunction]
#[pyo3(signature = (payloads, schema_versions=None))]
fn flows_to_arrow<'py>(
    py: Python<'py>,
    payloads: Vec<PyBackedBytes>,
    schema_versions: Option<Vec<u32>>,
) -> PyResult<Bound<'py, PyMemoryView>> {
    to_stream(py, &payloads, schema_versions, &FLOW_ENCODERS)
}

/// Decode Kafka payloads of cgloop.int.v1 (each an IntRecordBatch) into one Arrow IPC
/// stream shaped like cgloop.int_ingest, returned as a read-only memoryview. Raises
/// PayloadError (a ValueError) with the bad payload's index.
#[pyfunction]
#[pyo3(signature = (payloads, schema_versions=None))]
fn int_to_arrow<'py>(
    py: Python<'py>,
    payloads: Vec<PyBackedBytes>,
    schema_versions: Option<Vec<u32>>,
) -> PyResult<Bound<'py, PyMemoryView>> {
    to_stream(py, &payloads, schema_versions, &INT_ENCODERS)
}

/// One call: an idle encoder of the kind and an idle stream buffer from the pools, the
/// stream written without the GIL, handed out as a memoryview over the buffer.
fn to_stream<'py, C: Batch + Send>(
    py: Python<'py>,
    payloads: &[PyBackedBytes],
    versions: Option<Vec<u32>>,
    encoders: &'static Mutex<Vec<Encoder<C>>>,
) -> PyResult<Bound<'py, PyMemoryView>> {
    if let Some(v) = &versions {
        if v.len() != payloads.len() {
            return Err(PyValueError::new_err(format!(
                "{} schema_versions for {} payloads: one a payload expected",
                v.len(),
                payloads.len()
            )));
        }
    }
    // The whole conversion holds no Python object: other threads run meanwhile.
    let data = py
        .detach(|| {
            let mut encoder = take(encoders).unwrap_or_default();
            let mut out = take(&STREAMS).unwrap_or_default();
            let written = encoder.encode_versioned(payloads, versions.as_deref(), &mut out);
            give(encoders, encoder);
            match written {
                Ok(()) => Ok(out),
                Err(e) => {
                    give(&STREAMS, out);
                    Err(e)
                }
            }
        })
        .map_err(|e| to_py(py, e))?;
    let stream = Bound::new(py, ArrowStream { data })?;
    PyMemoryView::from(stream.as_any())
}

fn to_py(py: Python<'_>, e: CodecError) -> PyErr {
    if let CodecError::Arrow(_) = e {
        return PyRuntimeError::new_err(e.to_string());
    }
    let Some(index) = e.payload_index() else {
        return PyValueError::new_err(e.to_string());
    };
    let err = PayloadError::new_err(e.to_string());
    match err.value(py).setattr("index", index) {
        Ok(()) => err,
        Err(failed) => failed,
    }
}

#[pymodule]
fn arrowcodec(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ArrowStream>()?;
    m.add("PayloadError", m.py().get_type::<PayloadError>())?;
    m.add_function(wrap_pyfunction!(flows_to_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(int_to_arrow, m)?)?;
    Ok(())
}
