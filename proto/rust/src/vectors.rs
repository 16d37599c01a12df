//! The test vectors: each sample record with its file name and its message type.
//!
//! A vector's name is the stem of its file (`<name>.bin`) and the key of the Python
//! `cgloop.contracts.SAMPLES` dict; the list is the single place tying the three together.

use prost::{DecodeError, Message};

use crate::samples;
use crate::v1::{
    ActionBatch, DeadLetter, DetectionBatch, FlowRecordBatch, IntRecordBatch, NodeSampleBatch,
    ProbeRecordBatch,
};

/// One sample message type: how to build its canonical bytes and how to re-encode foreign ones.
pub struct Vector {
    pub name: &'static str,
    /// Protobuf message type, e.g. "cgloop.v1.FlowRecordBatch".
    pub message: &'static str,
    /// Encoded canonical sample.
    pub sample_bytes: fn() -> Vec<u8>,
    /// Decodes with this vector's message type and encodes the result again.
    pub reencode: fn(&[u8]) -> Result<Vec<u8>, DecodeError>,
}

fn reencode<M: Message + Default>(bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
    Ok(M::decode(bytes)?.encode_to_vec())
}

macro_rules! vector {
    ($name:literal, $sample:path, $message:ty) => {
        Vector {
            name: $name,
            message: concat!("cgloop.v1.", stringify!($message)),
            sample_bytes: || $sample().encode_to_vec(),
            reencode: reencode::<$message>,
        }
    };
}

pub static VECTORS: &[Vector] = &[
    vector!(
        "flow_record_batch",
        samples::sample_flow_record_batch,
        FlowRecordBatch
    ),
    vector!(
        "int_record_batch",
        samples::sample_int_record_batch,
        IntRecordBatch
    ),
    vector!(
        "probe_record_batch",
        samples::sample_probe_record_batch,
        ProbeRecordBatch
    ),
    vector!(
        "node_sample_batch",
        samples::sample_node_sample_batch,
        NodeSampleBatch
    ),
    vector!(
        "detection_batch",
        samples::sample_detection_batch,
        DetectionBatch
    ),
    vector!("action_batch", samples::sample_action_batch, ActionBatch),
    vector!("dead_letter", samples::sample_dead_letter, DeadLetter),
];

/// The vector with this name, if any.
pub fn find(name: &str) -> Option<&'static Vector> {
    VECTORS.iter().find(|vector| vector.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_round_trips_byte_for_byte() {
        for vector in VECTORS {
            let bytes = (vector.sample_bytes)();
            assert!(!bytes.is_empty(), "{} encodes to nothing", vector.name);
            let again = (vector.reencode)(&bytes).expect(vector.name);
            assert_eq!(bytes, again, "{} changed on round trip", vector.name);
        }
    }

    #[test]
    fn samples_round_trip_to_equal_messages() {
        fn check<M: Message + Default + PartialEq + std::fmt::Debug>(sample: M) {
            assert_eq!(
                M::decode(sample.encode_to_vec().as_slice()).unwrap(),
                sample
            );
        }
        check(samples::sample_flow_record_batch());
        check(samples::sample_int_record_batch());
        check(samples::sample_probe_record_batch());
        check(samples::sample_node_sample_batch());
        check(samples::sample_detection_batch());
        check(samples::sample_action_batch());
        check(samples::sample_dead_letter());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let garbage: [&[u8]; 4] = [
            &[0xff; 16],               // field number 0x1f.., wire type 7: invalid
            &[0x0a, 0x40, 0x01],       // length-delimited field longer than the buffer
            &[0x08, 0x80, 0x80, 0x80], // truncated varint
            &[0x0a, 0x02, 0x0f, 0xff], // nested message with an invalid wire type
        ];
        for vector in VECTORS {
            for bytes in garbage {
                assert!(
                    (vector.reencode)(bytes).is_err(),
                    "{} accepted {bytes:02x?}",
                    vector.name
                );
            }
        }
    }

    #[test]
    fn truncated_samples_are_rejected() {
        for vector in VECTORS {
            let bytes = (vector.sample_bytes)();
            // Dropping the last byte always cuts the last field short, whatever its wire type.
            let cut = &bytes[..bytes.len() - 1];
            assert!(
                (vector.reencode)(cut).is_err(),
                "{} accepted a truncated buffer",
                vector.name
            );
        }
    }

    #[test]
    fn names_are_unique_and_findable() {
        let names: std::collections::BTreeSet<_> = VECTORS.iter().map(|v| v.name).collect();
        assert_eq!(names.len(), VECTORS.len(), "duplicate vector names");
        for vector in VECTORS {
            assert_eq!(
                find(vector.name).map(|found| found.message),
                Some(vector.message)
            );
        }
        assert!(find("no_such_vector").is_none());
    }

    #[test]
    fn headers_carry_the_schema_version() {
        let batch = samples::sample_flow_record_batch();
        let header = batch.records[0].header.as_ref().unwrap();
        assert_eq!(header.schema_version, crate::SCHEMA_VERSION);
    }
}
