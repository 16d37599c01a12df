//! Node agent: gRPC service applying queues, P-states, chains and probes on one node.
fn main() -> anyhow::Result<()> {
    anyhow::bail!("cgloop-node-agent: not built yet")
}
