use super::*;
use crate::wire::WireError;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use cgloop_proto::samples;
use cgloop_proto::v1::int_record::Record;
use cgloop_proto::v1::{IntFlowRecord, IntHopRecord};
use cgloop_proto::v1::{IntRecord, IntRecordBatch};
use prost::Message;

fn encode(records: Vec<IntRecord>) -> Vec<u8> {
    IntRecordBatch { records }.encode_to_vec()
}

/// The reference path: prost decodes the whole batch (its oneof keeps one kind a record),
/// each record becomes a row. None where prost rejects the payloads.
fn reference(payloads: &[Vec<u8>]) -> Option<Result<RecordBatch, i32>> {
    let mut columns = IntColumns::default();
    for p in payloads {
        for r in IntRecordBatch::decode(&p[..]).ok()?.records {
            let mut kinds = Kinds::default();
            match r.record {
                Some(Record::Hop(m)) => kinds.hop = Some(m),
                Some(Record::Flow(m)) => kinds.flow = Some(m),
                Some(Record::Queue(m)) => kinds.queue = Some(m),
                Some(Record::Drop(m)) => kinds.drop = Some(m),
                None => {}
            }
            if let Err(value) = columns.push_row(&kinds) {
                return Some(Err(value));
            }
        }
    }
    Some(Ok(
        crate::encoder::to_record_batch(&columns).expect("valid columns")
    ))
}

fn col<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
}

/// Every kind, records missing their nested messages (not their headers: the strict
/// checks refuse those), IPv6.
fn varied_payloads() -> Vec<Vec<u8>> {
    let sample = samples::sample_int_record_batch();
    let mut bare = vec![];
    for r in &sample.records {
        let mut r = r.clone();
        match r.record.as_mut() {
            Some(Record::Hop(h)) => {
                h.hop = None;
                h.five_tuple = None;
            }
            Some(Record::Flow(f)) => {
                f.hops.push(IntHop::default());
                f.path_switch_ids.clear();
                if let Some(t) = f.five_tuple.as_mut() {
                    t.src_addr = vec![0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
                }
            }
            Some(Record::Queue(q)) => q.queue_latency_ns = 0,
            Some(Record::Drop(d)) => d.five_tuple = None,
            None => {}
        }
        bare.push(r);
    }
    vec![sample.encode_to_vec(), encode(bare)]
}

#[test]
fn rows_equal_prosts_decode_one_kind_a_row() {
    let payloads = varied_payloads();
    let got = IntEncoder::record_batch(&payloads).expect("valid");
    let want = reference(&payloads).expect("valid").expect("valid reasons");
    assert_eq!(got, want);
    assert_eq!(got.num_rows(), 8);
    // Spot checks against the sample itself.
    let sample = samples::sample_int_record_batch();
    let Some(Record::Flow(flow)) = &sample.records[1].record else {
        panic!("the sample's second record is a flow record")
    };
    let reason = col(&got, "flow_reason").as_string::<i32>();
    assert_eq!(reason.value(1), "INT_EVENT_REASON_LATENCY_CHANGE");
    // Not a flow record: the decoder's default name, as ClickHouse writes it.
    assert_eq!(reason.value(0), "INT_EVENT_REASON_UNSPECIFIED");
    let hops = col(&got, "flow_hops").as_list::<i32>();
    assert_eq!(hops.value_length(0), 0);
    assert_eq!(hops.value_length(1), 2);
    let hop = hops.value(1);
    let latency = hop
        .as_struct()
        .column_by_name("hop_latency_ns")
        .expect("field");
    let latency: Vec<u64> = latency.as_primitive::<UInt64Type>().values().to_vec();
    assert_eq!(
        latency,
        flow.hops
            .iter()
            .map(|h| h.hop_latency_ns)
            .collect::<Vec<_>>()
    );
    let raw = hop
        .as_struct()
        .column_by_name("egress_tx_utilization_raw")
        .expect("field");
    assert_eq!(
        raw.as_primitive::<UInt32Type>().value(1),
        flow.hops[1].egress_tx_utilization_raw
    );
    let ids = col(&got, "flow_path_switch_ids").as_list::<i32>();
    let ids = ids.value(1);
    assert_eq!(
        ids.as_primitive::<UInt32Type>().values().to_vec(),
        flow.path_switch_ids
    );
    let util = col(&got, "queue_egress_tx_utilization").as_primitive::<Float64Type>();
    assert_eq!(util.value(2), 0.875);
    assert!(col(&got, "queue_congested").as_boolean().value(2));
    let drops = col(&got, "drop_drop_count").as_primitive::<UInt64Type>();
    assert_eq!(drops.value(3), 17);
    // The second payload: the kinds without their nested messages.
    let source = col(&got, "hop_header_source_id").as_string::<i32>();
    assert_eq!(source.value(4), "int-collector-1");
    let switch = col(&got, "hop_hop_switch_id").as_primitive::<UInt32Type>();
    assert_eq!(switch.value(4), 0, "a hop record without its hop");
    assert_eq!(
        col(&got, "hop_five_tuple_src_addr")
            .as_binary::<i32>()
            .value(4),
        b""
    );
    assert_eq!(hops.value_length(5), 3, "two hops and an empty one");
    assert_eq!(ids.len(), 2);
    assert_eq!(
        col(&got, "flow_five_tuple_src_addr")
            .as_binary::<i32>()
            .value(5)
            .len(),
        16
    );
}

#[test]
fn schema_is_int_ingests_columns() {
    let schema = IntEncoder::schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names.len(), 66);
    assert_eq!(names[0], "hop_header_schema_version");
    assert_eq!(names[29], "flow_hops");
    assert_eq!(
        names[59..],
        [
            "hop_hop_l2_ingress_port",
            "hop_hop_l2_egress_port",
            "hop_hop_buffer_id",
            "hop_hop_buffer_occupancy_cells",
            "hop_hop_egress_tx_utilization_raw",
            "flow_reporter_switch_id",
            "flow_report_count",
        ]
    );
    let DataType::List(item) = schema.field(29).data_type() else {
        panic!("flow_hops is a list")
    };
    let DataType::Struct(fields) = item.data_type() else {
        panic!("of structs")
    };
    assert_eq!(fields.len(), 14);
    assert!(schema.fields().iter().all(|f| !f.is_nullable()));
}

#[test]
fn every_bit_flip_decodes_as_prost_or_is_rejected_by_both() {
    let payload = varied_payloads().swap_remove(1);
    let (mut same, mut rejected) = (0, 0);
    for bit in 0..payload.len() * 8 {
        let mut flipped = payload.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let payloads = [flipped];
        match (IntEncoder::record_batch(&payloads), reference(&payloads)) {
            (Ok(got), Some(Ok(want))) => {
                assert_eq!(got, want, "bit {bit}");
                same += 1;
            }
            (Err(CodecError::UnknownEnum { value, .. }), Some(Err(want))) => {
                assert_eq!(value, want, "bit {bit}");
                rejected += 1;
            }
            (Err(CodecError::Decode { .. }), None) => rejected += 1,
            // The strict decoder's refusals, which prost does not make.
            (
                Err(
                    CodecError::Refused { .. }
                    | CodecError::Decode {
                        source: WireError::Unknown { .. },
                        ..
                    },
                ),
                Some(_),
            ) => rejected += 1,
            (got, want) => panic!(
                "bit {bit}: ours {:?}, prost's {:?}",
                got.map(|b| b.num_rows()),
                want.map(|w| w.map(|b| b.num_rows()))
            ),
        }
    }
    assert!(same > 0 && rejected > 0, "{same} same, {rejected} rejected");
}

#[test]
fn two_kinds_in_one_record_fill_both_as_clickhouse_does() {
    let sample = samples::sample_int_record_batch();
    let hop = IntRecord {
        record: sample.records[0].record.clone(),
    }
    .encode_to_vec();
    let flow = IntRecord {
        record: sample.records[1].record.clone(),
    }
    .encode_to_vec();
    let body = [hop, flow].concat();
    let payload = IntRecordBatch::default().encode_to_vec(); // empty
    let mut payload = payload;
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut payload);
    prost::encoding::encode_varint(body.len() as u64, &mut payload);
    payload.extend_from_slice(&body);
    let got = IntEncoder::record_batch(&[payload]).expect("valid");
    assert_eq!(got.num_rows(), 1);
    assert_eq!(
        col(&got, "hop_header_sequence")
            .as_primitive::<UInt64Type>()
            .value(0),
        7
    );
    assert_eq!(
        col(&got, "flow_header_sequence")
            .as_primitive::<UInt64Type>()
            .value(0),
        8
    );
}

#[test]
fn errors_name_the_payload_and_record() {
    let good = samples::sample_int_record_batch().encode_to_vec();
    // The second record's body claims more bytes than there are.
    let first = samples::sample_int_record_batch().records[0].clone();
    let mut bad = encode(vec![first.clone()]);
    bad.extend_from_slice(&[0x0a, 0x05, 0x0a, 0x64, 0x01]);
    let err = int_to_arrow(&[good.clone(), bad]).expect_err("malformed");
    let text = err.to_string();
    assert!(
        text.starts_with("payload 1: not a cgloop.v1.IntRecordBatch (record 1): "),
        "{text}"
    );
    let flow = IntFlowRecord {
        header: Some(RecordHeader {
            schema_version: 1,
            source_id: "s".into(),
            ..Default::default()
        }),
        reason: 99,
        ..Default::default()
    };
    let unknown = encode(vec![
        first,
        IntRecord {
            record: Some(Record::Flow(flow)),
        },
    ]);
    let err = int_to_arrow(&[good, unknown]).expect_err("unknown reason");
    assert_eq!(
        err.to_string(),
        "payload 1, record 1: reason 99 is not a cgloop.v1.IntEventReason value"
    );
    assert!(
        matches!(
            err,
            CodecError::UnknownEnum {
                index: 1,
                record: 1,
                field: "reason",
                value: 99,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn stream_is_byte_for_byte_arrows_own() {
    let payloads = varied_payloads();
    let batch = IntEncoder::record_batch(&payloads).expect("valid");
    let mut w = StreamWriter::try_new(Vec::new(), batch.schema_ref()).expect("writer");
    w.write(&batch).expect("write");
    w.finish().expect("finish");
    let want = w.into_inner().expect("bytes");
    let mut encoder = IntEncoder::new();
    let mut out = Vec::new();
    encoder
        .encode_into(&payloads[..1], &mut out)
        .expect("valid");
    encoder.encode_into(&payloads, &mut out).expect("valid"); // reused
    assert_eq!(out, want);
    let read: Vec<RecordBatch> = StreamReader::try_new(&out[..], None)
        .expect("stream")
        .map(|b| b.expect("batch"))
        .collect();
    assert_eq!(read, vec![batch]);
    let none: [&[u8]; 0] = [];
    let empty = int_to_arrow(&none).expect("empty is fine");
    let reader = StreamReader::try_new(&empty[..], None).expect("stream");
    assert_eq!(reader.schema(), IntEncoder::schema());
}

#[test]
fn records_the_strict_decoder_refuses_are_refused_naming_payload_and_record() {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let sample = samples::sample_int_record_batch();
    let good = sample.encode_to_vec();
    let mut anonymous = sample.clone();
    if let Some(Record::Flow(f)) = anonymous.records[1].record.as_mut() {
        f.header.as_mut().expect("a header").source_id.clear();
    }
    let mut unreadable = sample.clone();
    if let Some(Record::Drop(d)) = unreadable.records[3].record.as_mut() {
        d.header.as_mut().expect("a header").schema_version = 99;
    }
    let mut headless = sample.clone();
    if let Some(Record::Queue(q)) = headless.records[2].record.as_mut() {
        q.header = None;
    }
    let mut empty = sample.clone();
    empty.records.insert(1, IntRecord::default());
    // The words after "payload 1: " are those of cgloop.bus.codec.decode_payload.
    let cases = [
        (
            anonymous.encode_to_vec(),
            "payload 1: record 1 (IntFlowRecord): header has no source_id",
        ),
        (
            unreadable.encode_to_vec(),
            "payload 1: record 3 (IntDropRecord): schema_version 99 not readable \
             (this build reads 1..1)",
        ),
        (
            headless.encode_to_vec(),
            "payload 1: record 2 (IntQueueRecord): missing header",
        ),
        (
            empty.encode_to_vec(),
            "payload 1: record 1 (IntRecord): empty envelope, none of its records is set",
        ),
        (
            Vec::new(),
            "payload 1: cgloop.v1.IntRecordBatch with no records",
        ),
    ];
    for (bad, want) in cases {
        let err = int_to_arrow(&[good.clone(), bad]).expect_err(want);
        assert_eq!(err.to_string(), want);
        assert_eq!(err.payload_index(), Some(1));
    }
    // An unknown field deep inside a kind (prost drops it; the strict decoder refuses it):
    // field 15 of the hop of a hop record.
    let Some(Record::Hop(hop)) = sample.records[0].record.clone() else {
        panic!("the sample's first record is a hop record")
    };
    let mut inner = hop.hop.expect("a hop").encode_to_vec();
    encode_key(15, WireType::Varint, &mut inner);
    encode_varint(1, &mut inner);
    let mut body = IntHopRecord { hop: None, ..hop }.encode_to_vec();
    encode_key(4, WireType::LengthDelimited, &mut body);
    encode_varint(inner.len() as u64, &mut body);
    body.extend_from_slice(&inner);
    let mut record = Vec::new();
    encode_key(1, WireType::LengthDelimited, &mut record);
    encode_varint(body.len() as u64, &mut record);
    record.extend_from_slice(&body);
    let mut batch = Vec::new();
    encode_key(1, WireType::LengthDelimited, &mut batch);
    encode_varint(record.len() as u64, &mut batch);
    batch.extend_from_slice(&record);
    assert!(IntRecordBatch::decode(&batch[..]).is_ok(), "prost skips it");
    let err = int_to_arrow(&[good, batch]).expect_err("unknown field");
    assert!(
        err.to_string().ends_with("IntHop: unknown field 15"),
        "{err}"
    );
}
