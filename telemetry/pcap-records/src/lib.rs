//! `cgloop.pcaprecords`: the probe's pcap twin (telemetry/probe's library) for Python. Training,
//! `cgloop analytics pcap`/`detect-pcap` and the dataset importers take their records from here,
//! so they see exactly the records the probe exports: one packet → record path in cgloop.
//!
//! The result is one serialized `cgloop.v1.FlowRecordBatch` holding every record in export
//! order (the binary writes the same records as one length-delimited batch per sweep). Protobuf,
//! not Arrow: every consumer (features, detectors, the store's sink) takes FlowRecord messages,
//! and the bytes are the bus contract itself, comparable byte for byte with the binary's.
use anyhow::Result;
use cgloop_probe::pcap::{self, Capture, FlowSettings, PcapConfig, PcapSummary};
use cgloop_proto::v1::FlowRecordBatch;
use prost::Message;

/// What a capture gave: the encoded FlowRecordBatch and the run's counters.
pub struct Records {
    pub batch: Vec<u8>,
    pub summary: PcapSummary,
}

/// Every record of `capture`, in the order the probe's sweeps export them.
pub fn read(capture: &Capture<'_>, cfg: &PcapConfig) -> Result<Records> {
    let mut batch = FlowRecordBatch::default();
    let summary = pcap::run(capture, cfg, &mut |records| {
        batch.records.extend(records);
        Ok(())
    })?;
    Ok(Records {
        batch: batch.encode_to_vec(),
        summary,
    })
}

/// Settings as the binary's flags spell them (its defaults when not given).
pub fn config(
    flow: &FlowSettings,
    interval_ms: u64,
    direction: &str,
    name: &str,
) -> Result<PcapConfig> {
    let direction = pcap::direction_from_name(direction)?;
    Ok(PcapConfig::new(flow, interval_ms, direction, name))
}

#[cfg(feature = "python")]
mod python {
    use std::path::PathBuf;

    use cgloop_probe::pcap::{defaults, Capture, Damaged, FlowSettings};
    use pyo3::create_exception;
    use pyo3::exceptions::{PyOSError, PyValueError};
    use pyo3::prelude::*;
    use pyo3::pybacked::PyBackedBytes;
    use pyo3::types::{PyBytes, PyDict};

    create_exception!(
        pcaprecords,
        CaptureError,
        PyValueError,
        "A damaged capture: `packet` (1-based) and `offset` (its record's byte offset in the \
         uncompressed stream) say where."
    );

    /// The capture's bytes (bytes or bytearray, not copied) or a file path (str, os.PathLike).
    #[derive(FromPyObject)]
    enum Source {
        Bytes(PyBackedBytes),
        Path(PathBuf),
    }

    fn to_py(py: Python<'_>, e: anyhow::Error) -> PyErr {
        if let Some(d) = e.downcast_ref::<Damaged>() {
            let err = CaptureError::new_err(d.to_string());
            let value = err.value(py);
            if let Err(failed) = value
                .setattr("packet", d.packet)
                .and_then(|()| value.setattr("offset", d.offset))
            {
                return failed;
            }
            return err;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            // The file could not be read at all (missing, no permission): an OSError naming it.
            return PyOSError::new_err((io.raw_os_error().unwrap_or(0), format!("{e:#}")));
        }
        PyValueError::new_err(format!("{e:#}"))
    }

    /// read(capture, *, interval_ms=100, direction="unspecified", burst_gap_us=1000,
    /// rtp_clock_hz=90000, rtp=True, idle_timeout_ms=10000, tcp_end_timeout_ms=1000,
    /// source_id=None, name=None) -> (bytes, dict)
    #[pyfunction]
    #[pyo3(signature = (
        capture, *, interval_ms=defaults::INTERVAL_MS, direction="unspecified",
        burst_gap_us=defaults::BURST_GAP_US, rtp_clock_hz=defaults::RTP_CLOCK_HZ, rtp=true,
        idle_timeout_ms=defaults::IDLE_TIMEOUT_MS,
        tcp_end_timeout_ms=defaults::TCP_END_TIMEOUT_MS, source_id=None, name=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn read<'py>(
        py: Python<'py>,
        capture: Source,
        interval_ms: u64,
        direction: &str,
        burst_gap_us: u64,
        rtp_clock_hz: u32,
        rtp: bool,
        idle_timeout_ms: u64,
        tcp_end_timeout_ms: u64,
        source_id: Option<String>,
        name: Option<String>,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyDict>)> {
        let flow = FlowSettings {
            burst_gap_us,
            rtp_clock_hz,
            rtp,
            idle_timeout_ms,
            tcp_end_timeout_ms,
            source_id,
        };
        let name = name.unwrap_or_else(|| match &capture {
            Source::Path(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            Source::Bytes(_) => "capture".into(),
        });
        let cfg = super::config(&flow, interval_ms, direction, &name)
            .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
        // Parsing and accounting hold no Python object: other threads run meanwhile.
        let out = py
            .detach(|| match &capture {
                Source::Path(p) => super::read(&Capture::File(p), &cfg),
                Source::Bytes(data) => super::read(&Capture::Bytes { name: &name, data }, &cfg),
            })
            .map_err(|e| to_py(py, e))?;
        let counters = PyDict::new(py);
        for (k, v) in out.summary.counters() {
            counters.set_item(k, v)?;
        }
        Ok((PyBytes::new(py, &out.batch), counters))
    }

    #[pymodule]
    fn pcaprecords(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("CaptureError", m.py().get_type::<CaptureError>())?;
        m.add("DEFAULT_INTERVAL_MS", defaults::INTERVAL_MS)?;
        m.add("DEFAULT_BURST_GAP_US", defaults::BURST_GAP_US)?;
        m.add("DEFAULT_RTP_CLOCK_HZ", defaults::RTP_CLOCK_HZ)?;
        m.add("DEFAULT_IDLE_TIMEOUT_MS", defaults::IDLE_TIMEOUT_MS)?;
        m.add("DEFAULT_TCP_END_TIMEOUT_MS", defaults::TCP_END_TIMEOUT_MS)?;
        m.add_function(wrap_pyfunction!(read, m)?)?;
        Ok(())
    }
}
