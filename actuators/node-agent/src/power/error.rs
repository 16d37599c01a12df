//! Errors of the power module: each names the file, map, core or field that was wrong.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    #[error("sysfs {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sysfs {path}: cannot parse {value:?}: {reason}")]
    Parse {
        path: PathBuf,
        value: String,
        reason: String,
    },
    /// The kernel accepted the write but reads back something else (clamped, refused silently).
    #[error("sysfs {path}: wrote {wrote:?} but the kernel reports {read:?}")]
    NotApplied {
        path: PathBuf,
        wrote: String,
        read: String,
    },
    /// A power policy outside the configured bounds or the hardware's capabilities.
    #[error("invalid power policy: {0}")]
    InvalidPolicy(String),
    #[error("fn_stats map {path}: {reason}")]
    Map { path: PathBuf, reason: String },
    #[error("counter trace line {line}: {reason}")]
    Trace { line: usize, reason: String },
}

pub type Result<T, E = PowerError> = std::result::Result<T, E>;
