//! Zero-copy parsers for switch telemetry reports. Nothing here allocates or panics on input:
//! every length is checked through [`wire`] before use.

pub mod inner;
pub mod metadata;
pub mod report;
pub mod wire;

pub use inner::{FlowKey, Inner, InnerType, IntDetect, IntHeader, IntKind};
pub use metadata::{HopMetadata, Layout};
pub use report::{parse_packet, DomainData, Format, Report};
pub use wire::ParseError;
