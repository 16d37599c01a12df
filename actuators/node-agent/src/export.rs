//! Probe records to Kafka: batches of `ProbeRecord` (a `ProbeRecordBatch` per message) on
//! `cgloop.probes.v1`, keyed by probe id, with the cgloop type and schema headers
//! (core/src/cgloop/bus/codec.py decodes them).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cgloop_proto::v1::{ProbeRecord, ProbeRecordBatch};
use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TYPE_HEADER: &str = "cgloop-type";
const SCHEMA_HEADER: &str = "cgloop-schema-version";
const MAX_BATCH: usize = 500;

/// The agent's Kafka producer: it sends what it is given at once (callers batch).
pub fn producer(bootstrap: &str, client_id: &str) -> Result<BaseProducer> {
    // CGLOOP_KAFKA_SECURITY_PROTOCOL & co., shared with every cgloop client.
    let security = cgloop_proto::kafka_security::KafkaSecurity::from_env()
        .context("Kafka security settings")?;
    let mut client = ClientConfig::new();
    for (key, value) in security.properties() {
        client.set(*key, value);
    }
    client
        .set("bootstrap.servers", bootstrap)
        .set("client.id", client_id)
        .set("linger.ms", "0")
        .create()
        .with_context(|| format!("creating the Kafka producer {client_id} for {bootstrap}"))
}

/// The cgloop type and schema headers every message carries (`type_name` is the batch's
/// full protobuf name, e.g. `cgloop.v1.ProbeRecordBatch`).
pub fn headers(type_name: &str) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header { key: TYPE_HEADER, value: Some(type_name) })
        .insert(Header {
            key: SCHEMA_HEADER,
            value: Some(cgloop_proto::SCHEMA_VERSION.to_string().as_str()),
        })
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
            .headers(headers("cgloop.v1.ProbeRecordBatch"));
        if let Err((e, _)) = producer.send(record) {
            tracing::warn!("probe records of {probe_id} not queued for Kafka: {e}");
        }
    }
}
