//! Kafka export: record batches from the workers become `cgloop.v1.IntRecordBatch` messages on
//! the INT topic (`BusTopic::Int` in proto/cgloop/v1/bus.proto, with the producer settings
//! declared there), keyed by a bucket of the inner five-tuple (or switch id for queue
//! records), so one flow's records stay on one partition in order.

use anyhow::{Context, Result};
use cgloop_proto::bus::{self, BusProducer, BusTopic};
use cgloop_proto::kafka_security::KafkaSecurity;
use cgloop_proto::v1::{int_record::Record, IntRecord, IntRecordBatch};
use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BUCKETS: u64 = 64;
/// Records per Kafka message: a recvmmsg burst can put more than the broker's default 1 MB
/// message limit into one bucket; at 60-400 B a record (a flow record grows with its hops),
/// 2000 keep a message under it.
const MAX_RECORDS_PER_MESSAGE: usize = 2000;

/// The topic the collector produces to unless told otherwise.
pub fn default_topic() -> &'static str {
    &bus::topic(BusTopic::Int).name
}

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

/// The collector's librdkafka configuration: the declared producer settings and nothing of its
/// own (its messages are bounded by `MAX_RECORDS_PER_MESSAGE`).
fn client_config(bootstrap: &str, security: &KafkaSecurity) -> ClientConfig {
    let mut client = ClientConfig::new();
    let props =
        bus::producer_properties(BusProducer::IntCollector, bootstrap, "cgloop-int-collector", security);
    for (key, value) in props {
        client.set(key, value);
    }
    client
}

/// Counts the messages whose delivery failed (librdkafka gave up: their records are lost).
#[derive(Clone, Default)]
pub struct Delivery(Arc<AtomicU64>);

impl Delivery {
    pub fn errors(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl ClientContext for Delivery {}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
            // The first failure and then one in 1000: a lost broker must not flood the log.
            if n == 1 || n % 1000 == 0 {
                tracing::warn!(errors = n, "Kafka delivery failed: {e}");
            }
        }
    }
}

pub struct KafkaSink {
    producer: ThreadedProducer<Delivery>,
    topic: String,
    pub delivery: Delivery,
}

impl KafkaSink {
    pub fn new(bootstrap: &str, topic: &str) -> Result<Self> {
        // CGLOOP_KAFKA_SECURITY_PROTOCOL & co., shared with every cgloop client.
        let security = KafkaSecurity::from_env().context("Kafka security settings")?;
        let delivery = Delivery::default();
        let producer: ThreadedProducer<Delivery> = client_config(bootstrap, &security)
            .create_with_context(delivery.clone())
            .with_context(|| format!("creating Kafka producer for {bootstrap}"))?;
        Ok(KafkaSink { producer, topic: topic.to_owned(), delivery })
    }

    pub fn send(&self, records: Vec<IntRecord>) -> Result<()> {
        for (b, mut batch) in group(records) {
            let key = format!("int-{b}");
            while !batch.records.is_empty() {
                let rest = batch.records.split_off(batch.records.len().min(MAX_RECORDS_PER_MESSAGE));
                self.send_batch(&key, &batch)?;
                batch.records = rest;
            }
        }
        Ok(())
    }

    fn send_batch(&self, key: &str, batch: &IntRecordBatch) -> Result<()> {
        let payload = batch.encode_to_vec();
        // The headers cgloop's consumers check (BusHeader in bus.proto).
        let mut headers = OwnedHeaders::new();
        for (key, value) in bus::message_headers(BusTopic::Int) {
            headers = headers.insert(Header { key, value: Some(value.as_str()) });
        }
        let mut rec = BaseRecord::to(&self.topic).key(key).payload(&payload).headers(headers);
        // Full local queue: wait for deliveries instead of losing records.
        loop {
            match self.producer.send(rec) {
                Ok(()) => return Ok(()),
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

    pub fn flush(&self) -> Result<()> {
        self.producer.flush(Duration::from_secs(30)).context("flushing Kafka producer")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_producer_runs_with_the_declared_settings() {
        let client = client_config("broker:9092", &KafkaSecurity::default());
        let declared = bus::producer_settings(BusProducer::IntCollector);
        assert!(declared.contains_key("enable.idempotence"), "{declared:?}");
        for (key, value) in declared {
            assert_eq!(client.get(key), Some(value), "{key}");
        }
        assert_eq!(client.get("bootstrap.servers"), Some("broker:9092"));
    }
}
