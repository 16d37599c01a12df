//! Kafka export: record batches from the workers become `cgloop.v1.IntRecordBatch` messages on
//! `cgloop.int.v1`, keyed by a bucket of the inner five-tuple (or switch id for queue
//! records), so one flow's records stay on one partition in order.

use anyhow::{Context, Result};
use cgloop_proto::v1::{int_record::Record, IntRecord, IntRecordBatch};
use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::hash::{Hash, Hasher};
use std::time::Duration;

pub const TOPIC: &str = "cgloop.int.v1";
const BUCKETS: u64 = 64;
static SCHEMA: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| cgloop_proto::SCHEMA_VERSION.to_string());

fn bucket(r: &IntRecord) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    match &r.record {
        Some(Record::Flow(f)) => f.five_tuple.hash(&mut h),
        Some(Record::Hop(f)) => f.five_tuple.hash(&mut h),
        Some(Record::Drop(d)) => d.five_tuple.hash(&mut h),
        Some(Record::Queue(q)) => q.switch_id.hash(&mut h),
        None => {}
    }
    h.finish() % BUCKETS
}

/// Group records by key bucket, keeping their order inside each bucket.
pub fn group(records: Vec<IntRecord>) -> Vec<(u64, IntRecordBatch)> {
    let mut groups: Vec<(u64, IntRecordBatch)> = Vec::new();
    for r in records {
        let b = bucket(&r);
        match groups.iter_mut().find(|(k, _)| *k == b) {
            Some((_, batch)) => batch.records.push(r),
            None => groups.push((b, IntRecordBatch { records: vec![r] })),
        }
    }
    groups
}

pub struct KafkaSink {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
}

impl KafkaSink {
    pub fn new(bootstrap: &str, topic: &str) -> Result<Self> {
        // CGLOOP_KAFKA_SECURITY_PROTOCOL & co., shared with every cgloop client.
        let security = cgloop_proto::kafka_security::KafkaSecurity::from_env()
            .context("Kafka security settings")?;
        let mut client = ClientConfig::new();
        for (key, value) in security.properties() {
            client.set(*key, value);
        }
        let producer: ThreadedProducer<DefaultProducerContext> = client
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "1000000")
            .set("message.max.bytes", "4000000")
            .create()
            .with_context(|| format!("creating Kafka producer for {bootstrap}"))?;
        Ok(KafkaSink { producer, topic: topic.to_owned() })
    }

    pub fn send(&self, records: Vec<IntRecord>) -> Result<()> {
        for (b, batch) in group(records) {
            let key = format!("int-{b}");
            let payload = batch.encode_to_vec();
            // The headers cgloop's consumers check (core/src/cgloop/bus/codec.py).
            let headers = OwnedHeaders::new()
                .insert(Header { key: "cgloop-type", value: Some("cgloop.v1.IntRecordBatch") })
                .insert(Header { key: "cgloop-schema-version", value: Some(SCHEMA.as_str()) });
            let mut rec = BaseRecord::to(&self.topic).key(&key).payload(&payload).headers(headers);
            // Full local queue: wait for deliveries instead of losing records.
            loop {
                match self.producer.send(rec) {
                    Ok(()) => break,
                    Err((e, back)) => {
                        if !matches!(e.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::QueueFull)) {
                            return Err(e).context("producing to Kafka");
                        }
                        rec = back;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn flush(&self) -> Result<()> {
        self.producer.flush(Duration::from_secs(30)).context("flushing Kafka producer")
    }
}
