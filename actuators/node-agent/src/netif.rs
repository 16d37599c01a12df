//! The node's interfaces by name, as the agent's requests address them: the host lookup
//! (cgloop_proto::host, shared with the probe) with the agent's error kinds, and the view
//! `chains` compiles and decompiles chains against. A module of its own so that the agent,
//! the chains and the advanced-function runtime all depend on it, not on each other.
use std::io;

pub(crate) use cgloop_proto::host::ifname;

use crate::chains::Interfaces;
use crate::error::{AgentError, AgentResult};

/// Index of interface `name`: `Invalid` for a malformed name, `NotFound` when it is absent.
pub(crate) fn ifindex(name: &str) -> AgentResult<u32> {
    cgloop_proto::host::ifindex(name).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidInput => AgentError::Invalid(e.to_string()),
        _ => AgentError::NotFound(e.to_string()),
    })
}

/// This node's interfaces (the kernel's names and indexes).
pub(crate) struct Ifs;

impl Interfaces for Ifs {
    fn ifindex(&self, name: &str) -> AgentResult<u32> {
        ifindex(name)
    }
    fn name(&self, ifindex: u32) -> String {
        ifname(ifindex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_errors_keep_the_agent_kinds() {
        assert!(matches!(
            ifindex("cgl-no-such0"),
            Err(AgentError::NotFound(_))
        ));
        assert!(matches!(ifindex("a\0b"), Err(AgentError::Invalid(_))));
        assert_eq!(Ifs.name(Ifs.ifindex("lo").expect("lo exists")), "lo");
    }
}
