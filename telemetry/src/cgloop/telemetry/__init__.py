"""Telemetry producers: the XDP flow probe (telemetry/probe) and the INT collector
(telemetry/int-collector), both Rust; this package holds their `cgloop telemetry` commands."""
