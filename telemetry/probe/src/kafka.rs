//! Producing flow-record batches to the flows topic (`BusTopic::Flows` in
//! proto/cgloop/v1/bus.proto, with the settings declared there for `BUS_PRODUCER_FLOW_PROBE`).
//!
//! Records are grouped by five-tuple hash into `KEY_BUCKETS` batches per sweep, each keyed by its
//! bucket, so one flow always lands on one partition (per-flow order kept) while a sweep still
//! produces few, large messages. The hash is the conversation's (`conversation_bucket`): both
//! directions of a flow share a partition, so the analytics worker that owns it in a consumer
//! group sees the conversation whole (the classifier compares the two directions). librdkafka buffers within `buffer_bytes` and reconnects by
//! itself; what does not fit, or times out undelivered, is dropped and counted.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use cgloop_proto::bus::{self, BusProducer, BusTopic};
use cgloop_proto::kafka_security::KafkaSecurity;
use cgloop_proto::v1::{FlowRecord, FlowRecordBatch};
use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::sweep::five_tuple_hash_of_record;

const KEY_BUCKETS: u64 = 64;
/// Records per Kafka message: ~200 B each keeps messages well under the 1 MB default limit.
const MAX_RECORDS_PER_MESSAGE: usize = 2000;

/// Delivery counters, shared with the metrics endpoint.
#[derive(Debug, Default)]
pub struct KafkaStats {
    pub records_sent: AtomicU64,
    pub records_delivered: AtomicU64,
    /// Records dropped: the buffer was full, or delivery failed after retries/timeout.
    pub records_dropped: AtomicU64,
    pub messages_failed: AtomicU64,
}

struct Context_ {
    stats: Arc<KafkaStats>,
}

impl ClientContext for Context_ {}

impl ProducerContext for Context_ {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &DeliveryResult<'_>, records: Self::DeliveryOpaque) {
        match result {
            Ok(_) => self
                .stats
                .records_delivered
                .fetch_add(*records as u64, Ordering::Relaxed),
            Err(_) => {
                self.stats.messages_failed.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .records_dropped
                    .fetch_add(*records as u64, Ordering::Relaxed)
            }
        };
    }
}

pub struct FlowProducer {
    producer: ThreadedProducer<Context_>,
    pub stats: Arc<KafkaStats>,
    pub message_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct KafkaConfig {
    pub bootstrap: String,
    /// Memory budget of the outgoing buffer.
    pub buffer_bytes: u64,
    /// How long a batch may wait for the broker before it is dropped.
    pub message_timeout: Duration,
}

/// The probe's librdkafka configuration: the declared producer settings, then only what is the
/// probe's own at run time (its buffer budget and delivery timeout).
fn client_config(cfg: &KafkaConfig, security: &KafkaSecurity) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in
        bus::producer_properties(BusProducer::FlowProbe, &cfg.bootstrap, "cgloop-probe", security)
    {
        client.set(key, value);
    }
    client
        .set(
            "queue.buffering.max.kbytes",
            (cfg.buffer_bytes / 1024).max(1).to_string(),
        )
        .set(
            "message.timeout.ms",
            cfg.message_timeout.as_millis().to_string(),
        )
        .set("log.connection.close", "false");
    client
}

/// The key bucket of a record's conversation: its five-tuple hash with the endpoints in a fixed
/// order (the smaller address and port first, as analytics' `conversation_key`), so both
/// directions of a flow land in the same bucket.
fn conversation_bucket(r: &FlowRecord) -> u64 {
    let mut key = FlowRecord { five_tuple: r.five_tuple.clone(), ..Default::default() };
    if let Some(t) = key.five_tuple.as_mut() {
        if (t.dst_addr.as_slice(), t.dst_port) < (t.src_addr.as_slice(), t.src_port) {
            std::mem::swap(&mut t.src_addr, &mut t.dst_addr);
            std::mem::swap(&mut t.src_port, &mut t.dst_port);
        }
    }
    five_tuple_hash_of_record(&key) % KEY_BUCKETS
}

impl FlowProducer {
    pub fn new(cfg: &KafkaConfig) -> Result<Self> {
        let stats = Arc::new(KafkaStats::default());
        // CGLOOP_KAFKA_SECURITY_PROTOCOL & co., shared with every cgloop client.
        let security = KafkaSecurity::from_env().context("Kafka security settings")?;
        let producer = client_config(cfg, &security)
            .create_with_context(Context_ {
                stats: stats.clone(),
            })
            .with_context(|| format!("creating a Kafka producer for {}", cfg.bootstrap))?;
        Ok(Self {
            producer,
            stats,
            message_timeout: cfg.message_timeout,
        })
    }

    /// Queues the records (never blocks); records that do not fit the buffer are counted dropped.
    pub fn send(&self, records: Vec<FlowRecord>) {
        let mut buckets: Vec<Vec<FlowRecord>> = (0..KEY_BUCKETS).map(|_| Vec::new()).collect();
        for r in records {
            buckets[conversation_bucket(&r) as usize].push(r);
        }
        for (bucket, records) in buckets.into_iter().enumerate() {
            let key = format!("flows-{bucket:02}");
            let mut records = records;
            while !records.is_empty() {
                let rest = records.split_off(records.len().min(MAX_RECORDS_PER_MESSAGE));
                self.send_batch(&key, FlowRecordBatch { records });
                records = rest;
            }
        }
    }

    fn send_batch(&self, key: &str, batch: FlowRecordBatch) {
        let n = batch.records.len();
        let payload = batch.encode_to_vec();
        let mut headers = OwnedHeaders::new();
        for (key, value) in bus::message_headers(BusTopic::Flows) {
            headers = headers.insert(Header { key, value: Some(value.as_str()) });
        }
        let record = BaseRecord::with_opaque_to(&bus::topic(BusTopic::Flows).name, Box::new(n))
            .key(key)
            .payload(&payload)
            .headers(headers);
        self.stats
            .records_sent
            .fetch_add(n as u64, Ordering::Relaxed);
        if let Err((e, _)) = self.producer.send(record) {
            self.stats
                .records_dropped
                .fetch_add(n as u64, Ordering::Relaxed);
            if !matches!(
                e,
                KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
            ) {
                self.stats.messages_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Messages waiting for the broker.
    pub fn queue_depth(&self) -> i32 {
        self.producer.in_flight_count()
    }

    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.producer
            .flush(timeout)
            .context("flushing flow records to Kafka")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgloop_proto::v1::FiveTuple;
    use std::collections::HashSet;

    fn record(src: [u8; 4], sport: u32, dst: [u8; 4], dport: u32) -> FlowRecord {
        FlowRecord {
            five_tuple: Some(FiveTuple {
                src_addr: src.to_vec(),
                dst_addr: dst.to_vec(),
                src_port: sport,
                dst_port: dport,
                ip_protocol: 17,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn both_directions_of_a_conversation_share_a_bucket() {
        let (mut buckets, mut directional) = (HashSet::new(), HashSet::new());
        for i in 0..200u32 {
            let (a, b) = ([10, 0, (i >> 8) as u8, i as u8], [192, 0, 2, 7]);
            let up = conversation_bucket(&record(a, 40_000 + i, b, 9000));
            assert_eq!(up, conversation_bucket(&record(b, 9000, a, 40_000 + i)), "{i}");
            buckets.insert(up);
            let down = record(b, 9000, a, 40_000 + i);
            directional.insert(five_tuple_hash_of_record(&down) % KEY_BUCKETS);
        }
        // same addresses, the ports decide the order
        let same = [10, 0, 0, 1];
        assert_eq!(
            conversation_bucket(&record(same, 1, same, 2)),
            conversation_bucket(&record(same, 2, same, 1))
        );
        // spread over the buckets about as the directional hash spreads the same flows
        assert!(
            buckets.len() * 2 >= directional.len(),
            "{} buckets, directional {}",
            buckets.len(),
            directional.len()
        );
    }

    #[test]
    fn the_producer_runs_with_the_declared_settings() {
        let cfg = KafkaConfig {
            bootstrap: "broker:9092".into(),
            buffer_bytes: 64 << 20,
            message_timeout: Duration::from_secs(7),
        };
        let client = client_config(&cfg, &KafkaSecurity::default());
        let declared = bus::producer_settings(BusProducer::FlowProbe);
        assert!(declared.contains_key("enable.idempotence"), "{declared:?}");
        for (key, value) in declared {
            assert_eq!(client.get(key), Some(value), "{key}");
        }
        assert_eq!(client.get("message.timeout.ms"), Some("7000"));
    }
}
