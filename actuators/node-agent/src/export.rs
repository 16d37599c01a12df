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
const FLUSH_EVERY: Duration = Duration::from_millis(200);
const MAX_BATCH: usize = 500;

/// Starts the exporter thread; the returned sender is the probes' record sink.
pub fn start(bootstrap: &str, topic: &str, client_id: &str) -> Result<mpsc::Sender<ProbeRecord>> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("client.id", client_id)
        .set("linger.ms", "5")
        .create()
        .with_context(|| format!("creating the Kafka producer for {bootstrap}"))?;
    let (tx, rx) = mpsc::channel::<ProbeRecord>();
    let topic = topic.to_string();
    std::thread::Builder::new()
        .name("probe-export".into())
        .spawn(move || run(producer, rx, &topic))
        .context("starting the probe exporter thread")?;
    Ok(tx)
}

fn run(producer: BaseProducer, rx: mpsc::Receiver<ProbeRecord>, topic: &str) {
    let mut pending: Vec<ProbeRecord> = Vec::new();
    let mut last = Instant::now();
    loop {
        match rx.recv_timeout(FLUSH_EVERY) {
            Ok(r) => pending.push(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                send(&producer, topic, &mut pending);
                let _ = producer.flush(Duration::from_secs(5));
                return;
            }
        }
        if pending.len() >= MAX_BATCH || (!pending.is_empty() && last.elapsed() >= FLUSH_EVERY) {
            send(&producer, topic, &mut pending);
            last = Instant::now();
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
        let headers = OwnedHeaders::new()
            .insert(Header { key: TYPE_HEADER, value: Some("cgloop.v1.ProbeRecordBatch") })
            .insert(Header {
                key: SCHEMA_HEADER,
                value: Some(cgloop_proto::SCHEMA_VERSION.to_string().as_str()),
            });
        let record = BaseRecord::to(topic).key(probe_id.as_str()).payload(&payload).headers(headers);
        if let Err((e, _)) = producer.send(record) {
            tracing::warn!("probe records of {probe_id} not queued for Kafka: {e}");
        }
    }
}
