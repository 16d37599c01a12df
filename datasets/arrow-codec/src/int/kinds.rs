//! One `IntRecord` walked on the wire: the oneof's kinds, each decoded with prost, and the
//! unknown-field check against the fields int.proto / common.proto declare ([`Known`]).

use cgloop_proto::v1::{IntDropRecord, IntFlowRecord, IntHopRecord, IntQueueRecord, RecordHeader};
use prost::Message;

use crate::encoder::RowError;
use crate::error::{check_header, Check};
use crate::wire::{key, skip, unknown, FieldAt, WireError, LENGTH_DELIMITED};

use super::DEFAULTS;

/// The kinds one `IntRecord` carries (one, from every producer; none for an empty record).
#[derive(Default)]
pub(super) struct Kinds {
    pub(super) hop: Option<IntHopRecord>,
    pub(super) flow: Option<IntFlowRecord>,
    pub(super) queue: Option<IntQueueRecord>,
    pub(super) drop: Option<IntDropRecord>,
}

impl Kinds {
    /// Decodes one `IntRecord` body: a kind that comes again merges (as prost merges a oneof
    /// member); different kinds are all kept (as ClickHouse's decoder keeps them). A field no
    /// message here has is refused, at any depth, as the strict decoder refuses it (prost
    /// would drop it silently, so each kind's body is walked against [`KNOWN`] first).
    pub(super) fn decode(mut buf: &[u8]) -> Result<Self, WireError> {
        fn merge<M: Message + Default>(
            slot: &mut Option<M>,
            field: &'static str,
            known: &'static Known,
            wire_type: u8,
            buf: &mut &[u8],
        ) -> Result<(), WireError> {
            let at = FieldAt {
                message: "IntRecord",
                field,
                wire_type,
            };
            let body = at.bytes(buf)?;
            // prost's errors first (its words for a malformed body), then the unknown fields.
            // prost drops those, so a body holding one re-encodes shorter; a body every field
            // of which prost kept re-encodes to its own length when it was written canonically,
            // as every encoder we know writes it: only a body that does not is walked field by
            // field (the walk alone cost ~20% of a call).
            let first = slot.is_none();
            let message = slot.get_or_insert_with(M::default);
            message.merge(body)?;
            if !first || message.encoded_len() != body.len() {
                known.check(body)?;
            }
            Ok(())
        }
        let mut kinds = Kinds::default();
        let b = &mut buf;
        while !b.is_empty() {
            let (tag, wt) = key(b)?;
            match tag {
                1 => merge(&mut kinds.hop, "hop", &KNOWN_HOP_RECORD, wt, b)?,
                2 => merge(&mut kinds.flow, "flow", &KNOWN_FLOW_RECORD, wt, b)?,
                3 => merge(&mut kinds.queue, "queue", &KNOWN_QUEUE_RECORD, wt, b)?,
                4 => merge(&mut kinds.drop, "drop", &KNOWN_DROP_RECORD, wt, b)?,
                _ => return Err(unknown("IntRecord", tag, wt, b)),
            }
        }
        Ok(kinds)
    }

    /// The strict decoder's checks of each kind's header (every kind present: ClickHouse's
    /// decoder would store each); none at all is an empty envelope. The rows' views pick a
    /// record's kind by a non-empty source id, so a record without one would be stored nowhere.
    pub(super) fn check(&self, version: Option<u32>) -> Result<(), RowError> {
        fn one(
            message: &'static str,
            header: Option<&RecordHeader>,
            version: Option<u32>,
        ) -> Result<(), RowError> {
            let (present, h) = match header {
                Some(h) => (true, h),
                None => (false, &DEFAULTS.header),
            };
            check_header(present, h.schema_version, h.source_id.as_bytes(), version)
                .map_err(|check| RowError::Refused(message, check))
        }
        let mut any = false;
        if let Some(r) = &self.hop {
            one("IntHopRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if let Some(r) = &self.flow {
            one("IntFlowRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if let Some(r) = &self.queue {
            one("IntQueueRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if let Some(r) = &self.drop {
            one("IntDropRecord", r.header.as_ref(), version)?;
            any = true;
        }
        if any {
            Ok(())
        } else {
            Err(RowError::Refused("IntRecord", Check::EmptyEnvelope))
        }
    }
}

/// The fields of one message of int.proto / common.proto: (number, nested message or None for
/// a scalar). Only the numbers matter here; prost has checked the wire types already.
struct Known {
    message: &'static str,
    fields: &'static [(u32, Option<&'static Known>)],
}

impl Known {
    /// Err(Unknown) for the first field, at any depth, that its message does not have.
    fn check(&'static self, mut buf: &[u8]) -> Result<(), WireError> {
        let b = &mut buf;
        while !b.is_empty() {
            let (tag, wt) = key(b)?;
            match self.fields.iter().find(|(n, _)| *n == tag) {
                Some((_, Some(nested))) if wt == LENGTH_DELIMITED => {
                    let at = FieldAt {
                        message: self.message,
                        field: nested.message,
                        wire_type: wt,
                    };
                    nested.check(at.bytes(b)?)?;
                }
                Some(_) => skip(tag, wt, b)?,
                None => {
                    return Err(WireError::Unknown {
                        message: self.message,
                        tag,
                    })
                }
            }
        }
        Ok(())
    }
}

const fn scalars<const N: usize>(first: u32) -> [(u32, Option<&'static Known>); N] {
    let mut out = [(0, None); N];
    let mut i = 0;
    while i < N {
        out[i] = (first + i as u32, None);
        i += 1;
    }
    out
}

static KNOWN_HEADER: Known = Known {
    message: "RecordHeader",
    fields: &scalars::<4>(1),
};
static KNOWN_FIVE_TUPLE: Known = Known {
    message: "FiveTuple",
    fields: &scalars::<5>(1),
};
static KNOWN_HOP: Known = Known {
    message: "IntHop",
    fields: &scalars::<14>(1),
};
static KNOWN_HOP_RECORD: Known = Known {
    message: "IntHopRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, Some(&KNOWN_FIVE_TUPLE)),
        (3, None),
        (4, Some(&KNOWN_HOP)),
    ],
};
static KNOWN_FLOW_RECORD: Known = Known {
    message: "IntFlowRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, Some(&KNOWN_FIVE_TUPLE)),
        (3, None),
        (4, Some(&KNOWN_HOP)),
        (5, None),
        (6, None),
        (7, None),
        (8, None),
        (9, None),
    ],
};
static KNOWN_QUEUE_RECORD: Known = Known {
    message: "IntQueueRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, None),
        (3, None),
        (4, None),
        (5, None),
        (6, None),
        (7, None),
        (8, None),
    ],
};
static KNOWN_DROP_RECORD: Known = Known {
    message: "IntDropRecord",
    fields: &[
        (1, Some(&KNOWN_HEADER)),
        (2, None),
        (3, None),
        (4, None),
        (5, None),
        (6, None),
        (7, None),
        (8, Some(&KNOWN_FIVE_TUPLE)),
    ],
};

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use prost_types::field_descriptor_proto::Type;
    use prost_types::FileDescriptorSet;

    use super::*;

    /// Every table of known fields is the proto's own message, field for field: the tables are
    /// written out for speed, and this keeps them a reading of the contract, not a second copy
    /// that can drift (a field added to int.proto or common.proto fails here until added).
    #[test]
    fn known_tables_are_the_protos_messages() {
        let set = FileDescriptorSet::decode(cgloop_proto::descriptor_set()).expect("descriptors");
        let messages: Vec<_> = set
            .file
            .iter()
            .filter(|f| f.package() == "cgloop.v1")
            .flat_map(|f| f.message_type.iter())
            .collect();
        let tables = [
            &KNOWN_HEADER,
            &KNOWN_FIVE_TUPLE,
            &KNOWN_HOP,
            &KNOWN_HOP_RECORD,
            &KNOWN_FLOW_RECORD,
            &KNOWN_QUEUE_RECORD,
            &KNOWN_DROP_RECORD,
        ];
        for known in tables {
            let message = messages
                .iter()
                .find(|m| m.name() == known.message)
                .unwrap_or_else(|| panic!("{} is not a cgloop.v1 message", known.message));
            let mut declared: Vec<(u32, Option<String>)> = message
                .field
                .iter()
                .map(|f| {
                    let nested = (f.r#type() == Type::Message)
                        .then(|| f.type_name().rsplit('.').next().unwrap_or_default().to_owned());
                    (f.number() as u32, nested)
                })
                .collect();
            declared.sort();
            let mut table: Vec<(u32, Option<String>)> = known
                .fields
                .iter()
                .map(|(n, k)| (*n, k.map(|k| k.message.to_owned())))
                .collect();
            table.sort();
            assert_eq!(table, declared, "{}", known.message);
        }
    }
}
