use super::*;
use crate::encoder::*;
use crate::error::*;
use crate::wire::*;
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::Array;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use cgloop_proto::samples;
use cgloop_proto::v1::{FiveTuple, FlowRecord, FlowRecordBatch, Log2Histogram, RecordHeader};
use prost::Message;

impl FlowColumns {
    /// The reference path: one record as prost decoded it, as one row.
    fn append(&mut self, r: &FlowRecord) -> Result<(), i32> {
        let h = r.header.clone().unwrap_or_default();
        let t = r.five_tuple.clone().unwrap_or_default();
        let none = Log2Histogram::default();
        let sizes = r.size_histogram_bytes.as_ref().unwrap_or(&none);
        let gaps = r.inter_arrival_histogram_ns.as_ref().unwrap_or(&none);
        self.size_histogram_bytes_buckets
            .values
            .extend(&sizes.buckets);
        self.inter_arrival_histogram_ns_buckets
            .values
            .extend(&gaps.buckets);
        let row = Row {
            has_header: r.header.is_some(),
            header_schema_version: h.schema_version,
            header_source_id: h.source_id.as_bytes(),
            header_sequence: h.sequence,
            header_timestamp_ns: h.timestamp_ns,
            five_tuple_src_addr: &t.src_addr,
            five_tuple_dst_addr: &t.dst_addr,
            five_tuple_src_port: t.src_port,
            five_tuple_dst_port: t.dst_port,
            five_tuple_ip_protocol: t.ip_protocol,
            direction: r.direction,
            vlan_id: r.vlan_id,
            ifindex: r.ifindex,
            interface_name: r.interface_name.as_bytes(),
            interval_start_ns: r.interval_start_ns,
            interval_end_ns: r.interval_end_ns,
            is_final: r.is_final,
            packets: r.packets,
            bytes: r.bytes,
            first_seen_ns: r.first_seen_ns,
            last_seen_ns: r.last_seen_ns,
            size_min_bytes: r.size_min_bytes,
            size_max_bytes: r.size_max_bytes,
            size_sum_bytes: r.size_sum_bytes,
            size_sum_squares_bytes2: r.size_sum_squares_bytes2,
            max_burst_packets: r.max_burst_packets,
            burst_count: r.burst_count,
            ecn_not_ect_packets: r.ecn_not_ect_packets,
            ecn_ect0_packets: r.ecn_ect0_packets,
            ecn_ect1_packets: r.ecn_ect1_packets,
            ecn_ce_packets: r.ecn_ce_packets,
            last_dscp: r.last_dscp,
            tcp_flags_seen: r.tcp_flags_seen,
            rtp: r.rtp.unwrap_or_default(),
        };
        self.push_row(&row)
    }
}

fn encode(records: Vec<FlowRecord>) -> Vec<u8> {
    FlowRecordBatch { records }.encode_to_vec()
}

/// A header the strict checks accept (version 1, a source id).
fn header(sequence: u64) -> Option<RecordHeader> {
    Some(RecordHeader {
        schema_version: 1,
        source_id: "s".into(),
        sequence,
        ..Default::default()
    })
}

/// A record with nothing but its header.
fn bare() -> FlowRecord {
    FlowRecord {
        header: header(0),
        ..Default::default()
    }
}

/// Ours refused what prost accepts for a reason prost does not check: the strict decoder's
/// (a header, a version, a source id, records, no unknown field).
fn strict_refusal(e: &CodecError) -> bool {
    matches!(
        e,
        CodecError::Refused { .. }
            | CodecError::NoRecords { .. }
            | CodecError::Decode {
                source: WireError::Unknown { .. },
                ..
            }
    )
}

fn read_stream(bytes: &[u8]) -> Vec<RecordBatch> {
    let reader = StreamReader::try_new(bytes, None).expect("a valid IPC stream");
    reader.map(|b| b.expect("a valid batch")).collect()
}

fn col<'a>(batch: &'a RecordBatch, name: &str) -> &'a ArrayRef {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
}

#[test]
fn sample_round_trips_through_the_stream() {
    let sample = samples::sample_flow_record_batch();
    let record = sample.records[0].clone();
    let stream = flows_to_arrow(&[sample.encode_to_vec()]).expect("decodes");
    let batches = read_stream(&stream);
    assert_eq!(batches.len(), 1, "one record batch");
    let b = &batches[0];
    assert_eq!(b.num_rows(), 1);
    assert_eq!(b.num_columns(), 44);
    let h = record.header.as_ref().expect("sample has a header");
    assert_eq!(
        col(b, "header_source_id").as_string::<i32>().value(0),
        h.source_id
    );
    assert_eq!(
        col(b, "header_sequence")
            .as_primitive::<UInt64Type>()
            .value(0),
        h.sequence
    );
    let t = record.five_tuple.as_ref().expect("sample has a five-tuple");
    assert_eq!(
        col(b, "five_tuple_src_addr").as_binary::<i32>().value(0),
        &t.src_addr[..]
    );
    assert_eq!(
        col(b, "five_tuple_dst_port")
            .as_primitive::<UInt32Type>()
            .value(0),
        t.dst_port
    );
    let direction = Direction::try_from(record.direction)
        .expect("valid")
        .as_str_name();
    assert_eq!(col(b, "direction").as_string::<i32>().value(0), direction);
    assert_eq!(
        col(b, "packets").as_primitive::<UInt64Type>().value(0),
        record.packets
    );
    assert_eq!(col(b, "is_final").as_boolean().value(0), record.is_final);
    let hist = col(b, "size_histogram_bytes_buckets")
        .as_list::<i32>()
        .value(0);
    let want = &record
        .size_histogram_bytes
        .as_ref()
        .expect("histogram")
        .buckets;
    assert_eq!(
        hist.as_primitive::<UInt64Type>().values().as_ref(),
        &want[..]
    );
    let rtp = record.rtp.as_ref().expect("sample has RTP");
    assert_eq!(
        col(b, "rtp_jitter_ns")
            .as_primitive::<UInt64Type>()
            .value(0),
        rtp.jitter_ns
    );
    assert_eq!(b.schema().as_ref(), flow_schema().as_ref());
}

#[test]
fn absent_parts_take_the_decoders_defaults() {
    let bare = FlowRecord {
        packets: 3,
        ..bare()
    };
    let stream = flows_to_arrow(&[encode(vec![bare])]).expect("decodes");
    let b = &read_stream(&stream)[0];
    assert_eq!(col(b, "header_source_id").as_string::<i32>().value(0), "s");
    assert_eq!(
        col(b, "header_sequence")
            .as_primitive::<UInt64Type>()
            .value(0),
        0
    );
    assert_eq!(
        col(b, "five_tuple_src_addr").as_binary::<i32>().value(0),
        b""
    );
    assert_eq!(
        col(b, "direction").as_string::<i32>().value(0),
        "DIRECTION_UNSPECIFIED"
    );
    let sizes = col(b, "size_histogram_bytes_buckets").as_list::<i32>();
    assert!(sizes.is_valid(0), "an empty list, not a null");
    assert_eq!(sizes.value(0).len(), 0);
    assert_eq!(col(b, "rtp_ssrc").as_primitive::<UInt32Type>().value(0), 0);
    assert_eq!(col(b, "packets").as_primitive::<UInt64Type>().value(0), 3);
    assert!(b.columns().iter().all(|c| c.null_count() == 0));
}

#[test]
fn payloads_concatenate_in_order_with_repeated_histograms() {
    let rec = |seq: u64, buckets: Vec<u64>| FlowRecord {
        header: header(seq),
        inter_arrival_histogram_ns: Some(Log2Histogram { buckets }),
        direction: Direction::Ingress as i32,
        ..Default::default()
    };
    let payloads = vec![
        encode(vec![rec(1, vec![1, 2, 3]), rec(2, vec![])]),
        encode(vec![rec(3, vec![0, 0, 0, 0, 9])]),
    ];
    let b = flow_record_batch(&payloads).expect("decodes");
    let seqs = col(&b, "header_sequence").as_primitive::<UInt64Type>();
    assert_eq!(seqs.values().as_ref(), &[1, 2, 3]);
    let gaps = col(&b, "inter_arrival_histogram_ns_buckets").as_list::<i32>();
    let lists: Vec<Vec<u64>> = (0..3)
        .map(|i| gaps.value(i).as_primitive::<UInt64Type>().values().to_vec())
        .collect();
    assert_eq!(lists, vec![vec![1, 2, 3], vec![], vec![0, 0, 0, 0, 9]]);
    assert_eq!(
        col(&b, "direction").as_string::<i32>().value(2),
        "DIRECTION_INGRESS"
    );
}

#[test]
fn nearly_empty_records_are_refused_before_the_columns_are_sized() {
    // 400 000 empty records: 800 kB on the wire, over 100 MB of fixed-width columns.
    let empty = [0x0a_u8, 0x00].repeat(400_000);
    let err = flows_to_arrow(&[empty]).expect_err("refused");
    assert!(
        matches!(
            err,
            CodecError::Expands {
                records: 400_000,
                total: 800_000,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().ends_with("nearly empty records"), "{err}");
    // The same records, fewer: within the floor, decoded, and refused for what they lack
    // (a small batch of empty records is odd, not dangerous).
    let few = [0x0a_u8, 0x00].repeat(1000);
    assert!(matches!(
        flows_to_arrow(&[few]),
        Err(CodecError::Refused {
            check: Check::NoHeader,
            ..
        })
    ));
    // Real records are far below the factor: 100 000 sample records pass.
    let sample = samples::sample_flow_record_batch().encode_to_vec();
    assert!(flows_to_arrow(&vec![sample; 100_000]).is_ok());
    assert!(
        fixed_row_bytes(&flow_schema()) > 200,
        "flows have ~40 fixed-width columns"
    );
}

#[test]
fn malformed_payload_is_an_error_naming_its_index() {
    let good = samples::sample_flow_record_batch().encode_to_vec();
    // Field 1, wire type 2, length 100 with only 2 bytes behind it.
    let truncated = vec![0x0a, 100, 1, 2];
    let err = flows_to_arrow(&[good.clone(), good.clone(), truncated]).expect_err("bad");
    let text = err.to_string();
    assert!(matches!(err, CodecError::Decode { index: 2, .. }), "{text}");
    assert!(
        text.starts_with("payload 2: not a cgloop.v1.FlowRecordBatch (record 0): "),
        "{text}"
    );
    // Random bytes never panic, whatever they decode to.
    let mut x: u32 = 12345;
    for len in 0..300usize {
        let junk: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let _ = flows_to_arrow(&[good.as_slice(), junk.as_slice()]);
    }
}

/// The reference: prost decodes the whole batch into fresh messages, appended one by one.
fn reference(payloads: &[Vec<u8>]) -> Option<RecordBatch> {
    let mut cols = FlowColumns::default();
    for p in payloads {
        let batch = FlowRecordBatch::decode(&p[..]).ok()?;
        for r in &batch.records {
            cols.append(r).ok()?;
        }
    }
    to_record_batch(&cols).ok()
}

/// A payload written by hand with what protobuf encoders may send but prost's own encoder
/// never writes: a nested message and a scalar twice (merged, the last scalar wins),
/// unpacked and packed buckets, a histogram twice (concatenated); with `unknown`, unknown
/// fields of every wire type, a group among them, and an unknown field of the batch itself
/// (which prost skips and the strict decoder refuses).
fn hand_written_payload(unknown: bool) -> Vec<u8> {
    use prost::encoding::{encode_key, encode_varint, WireType::*};
    fn delimited(tag: u32, body: &[u8], out: &mut Vec<u8>) {
        encode_key(tag, LengthDelimited, out);
        encode_varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }
    let mut r = Vec::new();
    let first = RecordHeader {
        schema_version: 1,
        source_id: "a".into(),
        sequence: 1,
        ..Default::default()
    };
    delimited(1, &first.encode_to_vec(), &mut r);
    let again = RecordHeader {
        sequence: 2,
        ..Default::default()
    };
    delimited(1, &again.encode_to_vec(), &mut r);
    for packets in [5, 6] {
        encode_key(10, Varint, &mut r);
        encode_varint(packets, &mut r);
    }
    let mut hist = Vec::new();
    encode_key(1, Varint, &mut hist);
    encode_varint(7, &mut hist);
    delimited(1, &[3, 4], &mut hist);
    delimited(18, &hist, &mut r);
    delimited(18, &hist, &mut r);
    if unknown {
        encode_key(99, Varint, &mut r);
        encode_varint(300, &mut r);
        delimited(100, b"xyz", &mut r);
        encode_key(101, ThirtyTwoBit, &mut r);
        r.extend_from_slice(&[1, 2, 3, 4]);
        encode_key(102, SixtyFourBit, &mut r);
        r.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        encode_key(103, StartGroup, &mut r);
        encode_key(1, Varint, &mut r);
        encode_varint(1, &mut r);
        encode_key(103, EndGroup, &mut r);
    }
    let tuple = FiveTuple {
        src_addr: vec![10, 0, 0, 1],
        src_port: 9,
        ..Default::default()
    };
    delimited(2, &tuple.encode_to_vec(), &mut r);
    encode_key(3, Varint, &mut r);
    encode_varint(Direction::Egress as u64, &mut r);
    let mut batch = Vec::new();
    delimited(1, &r, &mut batch);
    if unknown {
        encode_key(5, Varint, &mut batch);
        encode_varint(1, &mut batch);
    }
    batch
}

#[test]
fn record_at_a_time_decode_equals_prost() {
    // Records that leave out different parts, so one row must not leak into the next;
    // then every single-bit flip of the payloads, valid or not.
    let sample = samples::sample_flow_record_batch().records[0].clone();
    let mut no_rtp = sample.clone();
    no_rtp.rtp = None;
    no_rtp.header = header(9);
    let mut no_tuple = sample.clone();
    no_tuple.five_tuple = None;
    no_tuple.size_histogram_bytes = None;
    no_tuple.interface_name.clear();
    let payload = encode(vec![sample.clone(), no_rtp, bare(), no_tuple, sample]);
    let odd = hand_written_payload(false);
    // prost skips unknown fields; the strict decoder (and so this codec) refuses them.
    let unknown = [hand_written_payload(true)];
    assert!(reference(&unknown).is_some());
    let err = flow_record_batch(&unknown).expect_err("unknown fields");
    assert!(
        err.to_string()
            .ends_with("(record 0): FlowRecord: unknown field 99"),
        "{err}"
    );
    let b = flow_record_batch(std::slice::from_ref(&odd)).expect("valid");
    assert_eq!(col(&b, "header_source_id").as_string::<i32>().value(0), "a");
    let seq = col(&b, "header_sequence").as_primitive::<UInt64Type>();
    assert_eq!(seq.value(0), 2);
    let packets = col(&b, "packets").as_primitive::<UInt64Type>();
    assert_eq!(packets.value(0), 6);
    let sizes = col(&b, "size_histogram_bytes_buckets")
        .as_list::<i32>()
        .value(0);
    let sizes = sizes.as_primitive::<UInt64Type>().values().to_vec();
    assert_eq!(sizes, vec![7, 3, 4, 7, 3, 4]);
    for payload in [payload, odd] {
        let want = reference(std::slice::from_ref(&payload)).expect("valid");
        assert_eq!(
            flow_record_batch(std::slice::from_ref(&payload)).expect("valid"),
            want
        );
        let (mut same, mut rejected) = (0, 0);
        for bit in 0..payload.len() * 8 {
            let mut flipped = payload.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let payloads = [flipped];
            match (flow_record_batch(&payloads), reference(&payloads)) {
                (Ok(got), Some(want)) => {
                    assert_eq!(got, want, "bit {bit}");
                    same += 1;
                }
                (Err(_), None) => rejected += 1,
                (Err(e), Some(_)) if strict_refusal(&e) => rejected += 1,
                (got, want) => panic!("bit {bit}: {got:?} but prost gives {want:?}"),
            }
        }
        assert!(
            same > 100 && rejected > 10,
            "{same} equal, {rejected} rejected"
        );
        // Every truncation too (a payload cut anywhere).
        for cut in 0..payload.len() {
            let payloads = [payload[..cut].to_vec()];
            match (flow_record_batch(&payloads), reference(&payloads)) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "cut {cut}"),
                (Err(_), None) => {}
                (Err(e), Some(_)) if strict_refusal(&e) => {}
                (got, want) => panic!("cut {cut}: {got:?} but prost gives {want:?}"),
            }
        }
    }
}

#[test]
fn varints_decode_as_prosts() {
    use prost::encoding::{decode_varint, encode_varint};
    let mut cases: Vec<Vec<u8>> = Vec::new();
    for shift in 0..64 {
        for v in [1u64 << shift, (1u64 << shift) - 1, u64::MAX >> shift] {
            let mut b = Vec::new();
            encode_varint(v, &mut b);
            cases.push(b);
        }
    }
    // Random bytes, mostly with the continuation bit: overlong, too long, 10th byte > 1.
    let mut x: u32 = 2463534242;
    for len in 0..14 {
        for _ in 0..2000 {
            cases.push(
                (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        (x as u8) | if x & 0x300 != 0 { 0x80 } else { 0 }
                    })
                    .collect(),
            );
        }
    }
    for case in cases {
        // Alone, and with bytes after it (the word-at-a-time path reads ahead).
        for tail in [
            &[][..],
            &[0x81, 0x01, 0xff, 0x00, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
        ] {
            let bytes = [&case[..], tail].concat();
            let (mut ours, mut theirs) = (&bytes[..], &bytes[..]);
            let got = varint(&mut ours).ok();
            let want = decode_varint(&mut theirs).ok();
            assert_eq!(got, want, "{bytes:02x?}");
            if want.is_some() {
                assert_eq!(ours.len(), theirs.len(), "{bytes:02x?}");
            }
        }
    }
}

#[test]
fn unknown_direction_is_an_error_not_a_row() {
    let bad = FlowRecord {
        direction: 7,
        ..bare()
    };
    let payload = encode(vec![bare(), bad]);
    let err = flows_to_arrow(&[payload]).expect_err("unknown enum value");
    assert!(
        matches!(
            err,
            CodecError::UnknownEnum {
                index: 0,
                record: 1,
                field: "direction",
                value: 7,
                ..
            }
        ),
        "{err}"
    );
}

/// The stream as `arrow-ipc`'s own StreamWriter writes the same columns.
fn arrow_writer_stream(batch: &RecordBatch) -> Vec<u8> {
    let mut w = StreamWriter::try_new(Vec::new(), batch.schema_ref()).expect("writer");
    w.write(batch).expect("write");
    w.finish().expect("finish");
    w.into_inner().expect("bytes")
}

fn varied_payloads() -> Vec<Vec<u8>> {
    let sample = samples::sample_flow_record_batch().records[0].clone();
    let mut v6 = sample.clone();
    if let Some(t) = v6.five_tuple.as_mut() {
        t.src_addr = vec![0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    }
    v6.is_final = false;
    v6.direction = Direction::Ingress as i32;
    v6.interface_name = "veth-gw1-\u{fc}".into();
    let mut no_rtp = sample.clone();
    no_rtp.rtp = None;
    no_rtp.header = header(3);
    // 9 rows in the second payload: the boolean column spans two bytes.
    let many: Vec<FlowRecord> = (0..9u64)
        .map(|i| {
            let mut r = sample.clone();
            r.packets = i;
            r.is_final = i % 3 == 0;
            r
        })
        .collect();
    vec![encode(vec![sample, v6, bare(), no_rtp]), encode(many)]
}

#[test]
fn stream_is_byte_for_byte_arrows_own() {
    let payloads = varied_payloads();
    let want = arrow_writer_stream(&flow_record_batch(&payloads).expect("decodes"));
    assert_eq!(flows_to_arrow(&payloads).expect("decodes"), want);
    let none: [&[u8]; 0] = [];
    let empty = arrow_writer_stream(&flow_record_batch(&none).expect("empty"));
    assert_eq!(flows_to_arrow(&none).expect("empty"), empty);
}

#[test]
fn a_reused_encoder_keeps_nothing_of_the_previous_call() {
    let payloads = varied_payloads();
    let small = [encode(vec![bare()])];
    let mut encoder = FlowEncoder::new();
    let mut out = Vec::new();
    encoder.encode_into(&payloads, &mut out).expect("decodes");
    let first = out.clone();
    // A failing call in between leaves nothing behind either.
    let bad = [payloads[0].clone(), vec![0x0a, 100, 1, 2]];
    assert!(encoder.encode_into(&bad, &mut out).is_err());
    encoder.encode_into(&small, &mut out).expect("decodes");
    assert_eq!(out, flows_to_arrow(&small).expect("decodes"));
    encoder.encode_into(&payloads, &mut out).expect("decodes");
    assert_eq!(out, first);
    let batches = read_stream(&out);
    assert_eq!(batches, vec![reference(&payloads).expect("valid")]);
}

#[test]
fn no_payloads_give_an_empty_stream() {
    let none: [&[u8]; 0] = [];
    let stream = flows_to_arrow(&none).expect("empty is fine");
    let batches = read_stream(&stream);
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    let reader = StreamReader::try_new(&stream[..], None).expect("valid stream");
    assert_eq!(reader.schema().as_ref(), flow_schema().as_ref());
}

#[test]
fn records_the_strict_decoder_refuses_are_refused_naming_payload_and_record() {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let good = encode(vec![bare(), bare()]);
    let with = |r: FlowRecord| encode(vec![bare(), r]);
    let unreadable = RecordHeader {
        schema_version: 99,
        source_id: "s".into(),
        ..Default::default()
    };
    let anonymous = RecordHeader {
        schema_version: 1,
        ..Default::default()
    };
    let no_records = "payload 1: cgloop.v1.FlowRecordBatch with no records";
    // The words after "payload 1: " are those of cgloop.bus.codec.decode_payload.
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            with(FlowRecord {
                header: None,
                ..bare()
            }),
            "payload 1: record 1 (FlowRecord): missing header",
        ),
        (
            with(FlowRecord {
                header: Some(unreadable),
                ..bare()
            }),
            "payload 1: record 1 (FlowRecord): schema_version 99 not readable \
             (this build reads 1..1)",
        ),
        (
            with(FlowRecord {
                header: Some(anonymous),
                ..bare()
            }),
            "payload 1: record 1 (FlowRecord): header has no source_id",
        ),
        (encode(vec![]), no_records),
        (Vec::new(), no_records),
    ];
    for (bad, want) in cases {
        let err = flows_to_arrow(&[good.clone(), bad, good.clone()]).expect_err(want);
        assert_eq!(err.to_string(), want);
        assert_eq!(err.payload_index(), Some(1));
    }
    // With the Kafka headers' versions, every record must carry its payload's.
    let mut encoder = FlowEncoder::new();
    let mut out = Vec::new();
    encoder
        .encode_versioned(std::slice::from_ref(&good), Some(&[1]), &mut out)
        .expect("agrees");
    let err = encoder
        .encode_versioned(&[good.clone(), good.clone()], Some(&[1, 2]), &mut out)
        .expect_err("disagrees");
    assert_eq!(
        err.to_string(),
        "payload 1: record 0 (FlowRecord): schema_version 1 disagrees with the \
         cgloop-schema-version header 2"
    );
    // An unknown field at any depth (here in the header), as the strict decoder.
    let mut h = header(1).expect("a header").encode_to_vec();
    encode_key(9, WireType::Varint, &mut h);
    encode_varint(1, &mut h);
    let mut r = Vec::new();
    encode_key(1, WireType::LengthDelimited, &mut r);
    encode_varint(h.len() as u64, &mut r);
    r.extend_from_slice(&h);
    let mut batch = Vec::new();
    encode_key(1, WireType::LengthDelimited, &mut batch);
    encode_varint(r.len() as u64, &mut batch);
    batch.extend_from_slice(&r);
    let err = flows_to_arrow(&[good, batch]).expect_err("unknown header field");
    assert_eq!(err.payload_index(), Some(1));
    assert!(
        err.to_string().ends_with("RecordHeader: unknown field 9"),
        "{err}"
    );
}
