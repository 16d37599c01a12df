//! INT report collector: parses Telemetry Reports, keeps per-flow/per-hop state, exports changes to Kafka
fn main() -> anyhow::Result<()> {
    anyhow::bail!("cgloop-int-collector: not built yet")
}
