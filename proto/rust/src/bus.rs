//! The Kafka bus as declared once in `proto/cgloop/v1/bus.proto`: the topic table, the header
//! names and the librdkafka settings of every producer. prost generates no code for custom
//! options, so this module reads them from the descriptor set the build embeds (the same
//! options the Python side reads from its generated descriptors, `cgloop.contracts.bus`).
//! Kept free of rdkafka like the rest of the crate: producers apply `producer_properties` with
//! `ClientConfig::set` and build their headers from `message_headers`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::LazyLock;

use crate::descriptor;
use crate::kafka_security::KafkaSecurity;
pub use crate::v1::{BusHeader, BusProducer, BusTopic, ProducerSettings, TopicSpec};

static TABLE: LazyLock<Table> = LazyLock::new(|| {
    // The bytes are fixed at build time and decoded by this module's tests: a failure here is
    // a broken bus.proto, not bad input.
    Table::from_descriptors(crate::descriptor_set()).unwrap_or_else(|e| panic!("bus.proto: {e}"))
});

struct Table {
    topics: BTreeMap<i32, TopicSpec>,
    headers: BTreeMap<i32, String>,
    producers: BTreeMap<i32, ProducerSettings>,
}

impl Table {
    fn from_descriptors(bytes: &[u8]) -> Result<Self, String> {
        let values = |name: &str| descriptor::enum_values(bytes, name);
        let mut table = Table {
            topics: BTreeMap::new(),
            headers: BTreeMap::new(),
            producers: BTreeMap::new(),
        };
        for v in values("BusTopic")? {
            let spec = v.options.and_then(|o| o.topic);
            let spec = spec.ok_or(format!("{} declares no (topic) option", v.name))?;
            table.topics.insert(v.number, spec);
        }
        for v in values("BusHeader")? {
            let name = v.options.and_then(|o| o.header_name).unwrap_or_default();
            if name.is_empty() {
                return Err(format!("{} declares no (header_name) option", v.name));
            }
            table.headers.insert(v.number, name);
        }
        for v in values("BusProducer")? {
            let settings = v
                .options
                .and_then(|o| o.producer_settings)
                .unwrap_or_default();
            table.producers.insert(v.number, settings);
        }
        if table
            .producers
            .get(&(BusProducer::Default as i32))
            .is_none_or(|s| s.librdkafka.is_empty())
        {
            return Err("BUS_PRODUCER_DEFAULT declares no producer_settings".into());
        }
        Ok(table)
    }
}

/// A topic's declaration. `BusTopic::Unspecified` names no topic (a programming error).
pub fn topic(t: BusTopic) -> &'static TopicSpec {
    TABLE
        .topics
        .get(&(t as i32))
        .unwrap_or_else(|| panic!("{} names no topic", t.as_str_name()))
}

/// Every topic, in declaration order.
pub fn topics() -> impl Iterator<Item = (BusTopic, &'static TopicSpec)> {
    TABLE
        .topics
        .iter()
        .filter_map(|(n, spec)| BusTopic::try_from(*n).ok().map(|t| (t, spec)))
}

/// The Kafka name of a header. `BusHeader::Unspecified` names none (a programming error).
pub fn header(h: BusHeader) -> &'static str {
    TABLE
        .headers
        .get(&(h as i32))
        .unwrap_or_else(|| panic!("{} names no header", h.as_str_name()))
}

/// The headers every message on `t` carries: its batch type and the schema version.
pub fn message_headers(t: BusTopic) -> [(&'static str, String); 2] {
    [
        (header(BusHeader::Type), topic(t).batch_type.clone()),
        (
            header(BusHeader::SchemaVersion),
            crate::SCHEMA_VERSION.to_string(),
        ),
    ]
}

/// The librdkafka settings `p` runs with: BUS_PRODUCER_DEFAULT's, then `p`'s own named ones.
pub fn producer_settings(p: BusProducer) -> BTreeMap<&'static str, &'static str> {
    let mut settings = BTreeMap::new();
    for which in [BusProducer::Default, p] {
        if let Some(declared) = TABLE.producers.get(&(which as i32)) {
            settings.extend(
                declared
                    .librdkafka
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            );
        }
    }
    settings
}

/// Why `p` differs from the default ("" when it does not).
pub fn producer_reason(p: BusProducer) -> &'static str {
    TABLE
        .producers
        .get(&(p as i32))
        .map_or("", |s| s.reason.as_str())
}

/// Every librdkafka property a producer of component `p` starts with: its security settings,
/// the bootstrap servers and client id, then the declared settings (last, so nothing before
/// them can change them). Callers add only what is theirs at run time (buffer budget,
/// delivery timeout) and must not set a declared key again; each component's tests check it.
pub fn producer_properties(
    p: BusProducer,
    bootstrap: &str,
    client_id: &str,
    security: &KafkaSecurity,
) -> Vec<(String, String)> {
    let mut props: Vec<(String, String)> = security
        .properties()
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    props.push(("bootstrap.servers".into(), bootstrap.into()));
    props.push(("client.id".into(), client_id.into()));
    props.extend(
        producer_settings(p)
            .into_iter()
            .map(|(k, v)| (k.into(), v.into())),
    );
    props
}

/// A JSON string literal (for the tables' JSON readings; the crate takes no JSON library).
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_object<'a>(entries: impl Iterator<Item = (String, String)> + 'a) -> String {
    let body: Vec<String> = entries
        .map(|(k, v)| format!("{}: {v}", json_string(&k)))
        .collect();
    format!("{{{}}}", body.join(", "))
}

/// The whole table as JSON, the shape `cgloop.contracts.bus.table()` returns in Python (a
/// cross-language test compares the two): topics by enum name, header names by enum name, and
/// each producer's effective settings and reason.
pub fn table_json() -> String {
    let topics = json_object(topics().map(|(t, s)| {
        let fields = [
            ("name", json_string(&s.name)),
            ("batch_type", json_string(&s.batch_type)),
            ("partitions", s.partitions.to_string()),
            ("retention_hours", s.retention_hours.to_string()),
            ("key", json_string(&s.key)),
            ("description", json_string(&s.description)),
        ];
        let spec = json_object(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
        (t.as_str_name().to_string(), spec)
    }));
    let headers = json_object(TABLE.headers.iter().filter_map(|(n, name)| {
        let h = BusHeader::try_from(*n).ok()?;
        Some((h.as_str_name().to_string(), json_string(name)))
    }));
    let producers = json_object(TABLE.producers.keys().filter_map(|n| {
        let p = BusProducer::try_from(*n).ok()?;
        let settings = json_object(
            producer_settings(p)
                .into_iter()
                .map(|(k, v)| (k.to_string(), json_string(v))),
        );
        let entry = format!(
            "{{\"librdkafka\": {settings}, \"reason\": {}}}",
            json_string(producer_reason(p))
        );
        Some((p.as_str_name().to_string(), entry))
    }));
    format!("{{\"topics\": {topics}, \"headers\": {headers}, \"producers\": {producers}}}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn every_topic_header_and_producer_is_declared() {
        let names: Vec<&str> = topics().map(|(_, s)| s.name.as_str()).collect();
        assert_eq!(names.len(), 7, "{names:?}");
        assert!(
            names
                .iter()
                .all(|n| n.starts_with("cgloop.") && n.ends_with(".v1")),
            "{names:?}"
        );
        for (t, spec) in topics() {
            assert!(spec.batch_type.starts_with("cgloop.v1."), "{t:?}: {spec:?}");
            assert!(
                spec.partitions >= 1 && spec.retention_hours >= 1,
                "{t:?}: {spec:?}"
            );
        }
        assert_eq!(header(BusHeader::Type), "cgloop-type");
        assert_eq!(header(BusHeader::SchemaVersion), "cgloop-schema-version");
    }

    #[test]
    fn batch_types_are_declared_messages() {
        // The type header a Rust producer sends must name a real cgloop.v1 message.
        let set = descriptor::FileDescriptorSet::decode(crate::descriptor_set())
            .expect("embedded descriptors");
        let declared: Vec<String> = set
            .file
            .iter()
            .filter(|f| f.package == "cgloop.v1")
            .flat_map(|f| {
                f.message_type
                    .iter()
                    .map(|m| format!("cgloop.v1.{}", m.name))
            })
            .collect();
        for (t, spec) in topics() {
            assert!(
                declared.contains(&spec.batch_type),
                "{t:?}: {}",
                spec.batch_type
            );
        }
    }

    #[test]
    fn every_producer_is_idempotent_and_differences_are_explained() {
        for p in [
            BusProducer::Python,
            BusProducer::FlowProbe,
            BusProducer::IntCollector,
            BusProducer::NodeAgent,
        ] {
            let s = producer_settings(p);
            assert_eq!(s.get("enable.idempotence"), Some(&"true"), "{p:?}");
            assert_eq!(s.get("acks"), Some(&"all"), "{p:?}");
            let own = TABLE
                .producers
                .get(&(p as i32))
                .map_or(0, |d| d.librdkafka.len());
            assert!(
                own == 0 || !producer_reason(p).is_empty(),
                "{p:?} differs without a reason"
            );
        }
        assert_eq!(
            producer_settings(BusProducer::NodeAgent).get("linger.ms"),
            Some(&"0")
        );
        assert_eq!(
            producer_settings(BusProducer::FlowProbe).get("linger.ms"),
            Some(&"5")
        );
    }

    #[test]
    fn declared_settings_come_last_in_the_properties() {
        let security = KafkaSecurity::default();
        let props = producer_properties(BusProducer::IntCollector, "b:9092", "x", &security);
        let last: BTreeMap<&str, &str> = props
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        for (k, v) in producer_settings(BusProducer::IntCollector) {
            assert_eq!(last.get(k), Some(&v), "{k}");
        }
        assert_eq!(last.get("bootstrap.servers"), Some(&"b:9092"));
    }

    #[test]
    fn a_descriptor_set_without_the_options_is_refused() {
        let empty = descriptor::FileDescriptorSet { file: vec![] }.encode_to_vec();
        let err = Table::from_descriptors(&empty).err().unwrap_or_default();
        assert!(err.contains("BusTopic"), "{err}");
    }

    #[test]
    fn table_json_names_every_topic() {
        let json = table_json();
        for (t, spec) in topics() {
            assert!(
                json.contains(t.as_str_name()) && json.contains(&spec.name),
                "{json}"
            );
        }
        assert_eq!(json_string("a\"b\\\n"), "\"a\\\"b\\\\\\u000a\"");
    }
}
