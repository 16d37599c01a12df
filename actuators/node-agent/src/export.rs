//! Probe records to Kafka: batches of `ProbeRecord` (a `ProbeRecordBatch` per message) on the
//! probes topic, keyed by probe id, with the cgloop type and schema headers. Topic, headers and
//! producer settings are the bus table's (proto/cgloop/v1/bus.proto, `BUS_PRODUCER_NODE_AGENT`).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cgloop_proto::bus::{self, BusProducer, BusTopic};
use cgloop_proto::kafka_security::KafkaSecurity;
use cgloop_proto::v1::{ProbeRecord, ProbeRecordBatch};
use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const MAX_BATCH: usize = 500;

/// The agent's librdkafka configuration: the declared settings (linger 0: it batches itself,
/// see bus.proto) and nothing of its own.
fn client_config(bootstrap: &str, client_id: &str, security: &KafkaSecurity) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in bus::producer_properties(BusProducer::NodeAgent, bootstrap, client_id, security) {
        client.set(key, value);
    }
    client
}

/// The agent's Kafka producer: it sends what it is given at once (callers batch).
pub fn producer(bootstrap: &str, client_id: &str) -> Result<BaseProducer> {
    // CGLOOP_KAFKA_SECURITY_PROTOCOL & co., shared with every cgloop client.
    let security = KafkaSecurity::from_env().context("Kafka security settings")?;
    client_config(bootstrap, client_id, &security)
        .create()
        .with_context(|| format!("creating the Kafka producer {client_id} for {bootstrap}"))
}

/// The cgloop type and schema headers every message on `topic` carries.
pub fn headers(topic: BusTopic) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    for (key, value) in bus::message_headers(topic) {
        headers = headers.insert(Header { key, value: Some(value.as_str()) });
    }
    headers
}

/// Starts the exporter thread; the returned sender is the probes' record sink. A record waits
/// at most `max_delay` before it is handed to the producer.
pub fn start(
    bootstrap: &str,
    topic: &str,
    client_id: &str,
    max_delay: Duration,
) -> Result<mpsc::Sender<ProbeRecord>> {
    // the batching is ours (max_delay)
    let producer = producer(bootstrap, client_id)?;
    let (tx, rx) = mpsc::channel::<ProbeRecord>();
    let topic = topic.to_string();
    std::thread::Builder::new()
        .name("probe-export".into())
        .spawn(move || run(producer, rx, &topic, max_delay))
        .context("starting the probe exporter thread")?;
    Ok(tx)
}

fn run(producer: BaseProducer, rx: mpsc::Receiver<ProbeRecord>, topic: &str, max_delay: Duration) {
    let mut pending: Vec<ProbeRecord> = Vec::new();
    // when the oldest pending record must be sent
    let mut due: Option<Instant> = None;
    loop {
        let wait = due.map_or(max_delay, |d| d.saturating_duration_since(Instant::now()));
        match rx.recv_timeout(wait) {
            Ok(r) => {
                due.get_or_insert_with(|| Instant::now() + max_delay);
                pending.push(r);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                send(&producer, topic, &mut pending);
                let _ = producer.flush(Duration::from_secs(5));
                return;
            }
        }
        if pending.len() >= MAX_BATCH || due.is_some_and(|d| Instant::now() >= d) {
            send(&producer, topic, &mut pending);
            due = None;
        }
        producer.poll(Duration::ZERO);
    }
}

/// One message per probe session, so a key (probe id) always lands on one partition in order.
fn send(producer: &BaseProducer, topic: &str, pending: &mut Vec<ProbeRecord>) {
    let mut by_probe: std::collections::BTreeMap<String, Vec<ProbeRecord>> = Default::default();
    for r in pending.drain(..) {
        by_probe.entry(r.probe_id.clone()).or_default().push(r);
    }
    for (probe_id, records) in by_probe {
        let payload = ProbeRecordBatch { records }.encode_to_vec();
        let record = BaseRecord::to(topic)
            .key(probe_id.as_str())
            .payload(&payload)
            .headers(headers(BusTopic::Probes));
        if let Err((e, _)) = producer.send(record) {
            tracing::warn!("probe records of {probe_id} not queued for Kafka: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_producer_runs_with_the_declared_settings() {
        let client = client_config("broker:9092", "node-1", &KafkaSecurity::default());
        let declared = bus::producer_settings(BusProducer::NodeAgent);
        assert_eq!(declared.get("enable.idempotence"), Some(&"true"));
        for (key, value) in declared {
            assert_eq!(client.get(key), Some(value), "{key}");
        }
        assert_eq!(client.get("client.id"), Some("node-1"));
    }

    #[test]
    fn messages_carry_the_declared_headers() {
        use rdkafka::message::Headers;
        let h = headers(BusTopic::Nodes);
        let got: Vec<(&str, Option<&[u8]>)> = h.iter().map(|h| (h.key, h.value)).collect();
        let want = bus::message_headers(BusTopic::Nodes);
        assert_eq!(got.len(), want.len());
        for ((k, v), (wk, wv)) in got.iter().zip(&want) {
            assert_eq!((*k, *v), (*wk, Some(wv.as_bytes())));
        }
    }
}
