//! The probe's pcap twin as a library: the packet parser, the per-flow accounting and the sweeps
//! of the XDP/tc probe, on the BPF programs' own types. The `cgloop-probe` binary (its `pcap`
//! mode and the live exporter's sweeps) and the Python module `cgloop.pcaprecords`
//! (telemetry/pcap-records) both use it, so a capture gives the same records everywhere.
pub mod account;
pub mod bpf_types;
pub mod parse;
pub mod pcap;
pub mod sweep;

pub mod skel {
    #![allow(clippy::all, unused_imports, dead_code, non_camel_case_types)]
    include!(concat!(env!("OUT_DIR"), "/flow_probe.skel.rs"));
}
