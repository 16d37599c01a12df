//! Request errors, each mapped to the gRPC status a caller can act on.

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Malformed request: a field is missing or has an impossible value.
    #[error("{0}")]
    Invalid(String),
    /// A well-formed value outside the configured bounds.
    #[error("{0}")]
    OutOfBounds(String),
    /// The interface is not one the agent may touch.
    #[error("{0}")]
    Forbidden(String),
    /// A bounded count (e.g. `[guard] max_protected_flows`) would be exceeded.
    #[error("{0}")]
    Exhausted(String),
    #[error("{0}")]
    NotFound(String),
    /// The request needs something that is not in place (e.g. a queue hierarchy first).
    #[error("{0}")]
    Precondition(String),
    /// The action id was already used for a different request.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unimplemented(String),
    /// The kernel refused or failed; the message names the operation.
    #[error("{0:#}")]
    Kernel(anyhow::Error),
}

pub type AgentResult<T> = Result<T, AgentError>;

impl From<AgentError> for tonic::Status {
    fn from(e: AgentError) -> Self {
        let msg = e.to_string();
        match e {
            AgentError::Invalid(_) => tonic::Status::invalid_argument(msg),
            AgentError::OutOfBounds(_) => tonic::Status::out_of_range(msg),
            AgentError::Forbidden(_) => tonic::Status::permission_denied(msg),
            AgentError::Exhausted(_) => tonic::Status::resource_exhausted(msg),
            AgentError::NotFound(_) => tonic::Status::not_found(msg),
            AgentError::Precondition(_) => tonic::Status::failed_precondition(msg),
            AgentError::Conflict(_) => tonic::Status::already_exists(msg),
            AgentError::Unimplemented(_) => tonic::Status::unimplemented(msg),
            AgentError::Kernel(_) => tonic::Status::internal(msg),
        }
    }
}

/// Shorthand for `Err(AgentError::Invalid(format!(..)))`.
#[macro_export]
macro_rules! invalid {
    ($($t:tt)*) => { return Err($crate::error::AgentError::Invalid(format!($($t)*))) };
}

#[macro_export]
macro_rules! out_of_bounds {
    ($($t:tt)*) => { return Err($crate::error::AgentError::OutOfBounds(format!($($t)*))) };
}
