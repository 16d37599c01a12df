//! The daemons' metrics endpoints as declared once in `proto/cgloop/v1/ops.proto`: each
//! daemon's default Prometheus port on 127.0.0.1. Read from the descriptor set the build embeds,
//! like `bus` (prost generates no code for custom options); Python reads the same options
//! (`cgloop.contracts.ops`) and `tests/test_ops_table.py` compares the two readings.
//!
//! A Rust daemon takes its default `--metrics-addr` from `default_metrics_addr(Daemon::…)`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::LazyLock;

use crate::descriptor;

pub use crate::v1::{Daemon, MetricsEndpoint};

/// Every default endpoint listens here: nothing listens beyond loopback unless configured.
pub const LOOPBACK: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// The block the declared ports lie in (ops.proto).
pub const PORT_BLOCK: std::ops::RangeInclusive<u32> = 9460..=9469;

static TABLE: LazyLock<BTreeMap<i32, MetricsEndpoint>> = LazyLock::new(|| {
    // Fixed at build time and checked by this module's tests: a failure is a broken ops.proto.
    from_descriptors(crate::descriptor_set()).unwrap_or_else(|e| panic!("ops.proto: {e}"))
});

fn from_descriptors(bytes: &[u8]) -> Result<BTreeMap<i32, MetricsEndpoint>, String> {
    let daemons = descriptor::enum_values(bytes, "Daemon")?;
    let mut table = BTreeMap::new();
    for v in &daemons {
        let endpoint = v.options.as_ref().and_then(|o| o.metrics.clone());
        let endpoint = endpoint.ok_or(format!("{} declares no (metrics) option", v.name))?;
        if !PORT_BLOCK.contains(&endpoint.port) {
            return Err(format!(
                "{}: port {} is outside {PORT_BLOCK:?}",
                v.name, endpoint.port
            ));
        }
        table.insert(v.number, endpoint);
    }
    Ok(table)
}

/// A daemon's declared endpoint. `Daemon::Unspecified` names none (a programming error).
pub fn endpoint(d: Daemon) -> &'static MetricsEndpoint {
    TABLE
        .get(&(d as i32))
        .unwrap_or_else(|| panic!("{} declares no metrics endpoint", d.as_str_name()))
}

/// Every daemon's endpoint, in declaration order.
pub fn endpoints() -> impl Iterator<Item = (Daemon, &'static MetricsEndpoint)> {
    TABLE
        .iter()
        .filter_map(|(n, e)| Daemon::try_from(*n).ok().map(|d| (d, e)))
}

/// `127.0.0.1:<port>`: where `d` serves /metrics unless configured otherwise.
pub fn default_metrics_addr(d: Daemon) -> SocketAddr {
    // Ports are checked to lie in PORT_BLOCK when the table is read, so they fit a u16.
    SocketAddr::from((LOOPBACK, endpoint(d).port as u16))
}

/// The whole table as JSON, the shape `cgloop.contracts.ops.table()` returns in Python.
pub fn table_json() -> String {
    let entries: Vec<String> = endpoints()
        .map(|(d, e)| {
            format!(
                "{}: {{\"port\": {}, \"command\": {}, \"description\": {}}}",
                crate::bus::json_string(d.as_str_name()),
                e.port,
                crate::bus::json_string(&e.command),
                crate::bus::json_string(&e.description),
            )
        })
        .collect();
    format!("{{\"daemons\": {{{}}}}}", entries.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn every_daemon_has_a_distinct_loopback_port_in_the_block() {
        let ports: Vec<u32> = endpoints().map(|(_, e)| e.port).collect();
        assert_eq!(ports.len(), 7, "{ports:?}");
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port declared twice: {ports:?}"
        );
        let addr = default_metrics_addr(Daemon::IntCollector);
        assert!(addr.ip().is_loopback(), "{addr}");
        assert_eq!(u32::from(addr.port()), endpoint(Daemon::IntCollector).port);
    }

    #[test]
    fn a_descriptor_set_without_the_enum_is_refused() {
        let empty = descriptor::FileDescriptorSet { file: vec![] }.encode_to_vec();
        let err = from_descriptors(&empty).err().unwrap_or_default();
        assert!(err.contains("Daemon"), "{err}");
    }

    #[test]
    fn table_json_names_every_daemon() {
        let json = table_json();
        for (d, e) in endpoints() {
            assert!(
                json.contains(d.as_str_name()) && json.contains(&e.port.to_string()),
                "{json}"
            );
        }
    }
}
