//! Self-monitoring shared by cgloop's Rust daemons (the probe, the INT collector, the node
//! agent): one Prometheus endpoint ([`serve`], `GET /metrics` in the OpenMetrics text format)
//! and one log set-up ([`LogArgs`]: `RUST_LOG` filters, `CGLOOP_LOG_FORMAT=text|json` as the
//! Python daemons read it), and the check of `CGLOOP_*` variables against their declaration
//! ([`settings::refuse_unknown_settings`]).
pub mod settings;
pub use settings::refuse_unknown_settings;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use anyhow::{anyhow, Result};
pub use prometheus_client;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// The registry in the OpenMetrics text format, as `/metrics` serves it.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut body = String::new();
    encode(&mut body, registry)?;
    Ok(body)
}

/// Serves `registry` on `addr` (`GET /metrics`) from a background thread; returns the bound
/// address (port 0 picks one).
pub fn serve(registry: Arc<Registry>, addr: SocketAddr) -> Result<SocketAddr> {
    let server =
        tiny_http::Server::http(addr).map_err(|e| anyhow!("metrics endpoint {addr}: {e}"))?;
    let bound = server.server_addr().to_ip().unwrap_or(addr);
    thread::Builder::new().name("metrics".into()).spawn(move || {
        for request in server.incoming_requests() {
            let body = (request.url() == "/metrics").then(|| render(&registry).ok()).flatten();
            let response = if let Some(body) = body {
                tiny_http::Response::from_string(body).with_header(
                    "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"
                        .parse::<tiny_http::Header>()
                        .expect("static header"),
                )
            } else {
                tiny_http::Response::from_string("not found: try /metrics\n").with_status_code(404)
            };
            let _ = request.respond(response);
        }
    })?;
    Ok(bound)
}

/// A daemon's endpoint when metrics are on by default: serves on `addr` (None: disabled) and
/// logs where; a failure (port in use, address not local) is logged in one line and the daemon
/// goes on without metrics.
pub fn serve_or_warn(registry: Arc<Registry>, addr: MetricsAddr) -> Option<SocketAddr> {
    let (bound, failure) = try_serve(registry, addr);
    if let Some(bound) = bound {
        tracing::info!(addr = %bound, "metrics on http://{bound}/metrics");
    }
    if let Some(line) = failure {
        tracing::warn!("{line}");
    }
    bound
}

/// [`serve_or_warn`] for a daemon that must print something else first (a readiness line):
/// the bound address, or the one line to log about why there is none.
pub fn try_serve(registry: Arc<Registry>, addr: MetricsAddr) -> (Option<SocketAddr>, Option<String>) {
    let Some(addr) = addr.0 else { return (None, None) };
    match serve(registry, addr) {
        Ok(bound) => (Some(bound), None),
        Err(e) => (
            None,
            Some(format!(
                "no metrics: cannot listen on {addr} ({e:#}); running without /metrics \
                 (--metrics-addr moves it, --metrics-addr off disables it)"
            )),
        ),
    }
}

/// `--metrics-addr`: host:port, or `off` (or empty) to disable the endpoint, as the Python
/// daemons read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsAddr(pub Option<SocketAddr>);

impl MetricsAddr {
    /// A daemon's default endpoint: 127.0.0.1 and the port proto/cgloop/v1/ops.proto declares.
    pub fn default_for(daemon: cgloop_proto::ops::Daemon) -> Self {
        Self(Some(cgloop_proto::ops::default_metrics_addr(daemon)))
    }
}

/// Prints as it parses: host:port, or empty when disabled.
impl std::fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => Ok(()),
        }
    }
}

impl std::str::FromStr for MetricsAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s == "off" {
            return Ok(Self(None));
        }
        s.parse().map(|a| Self(Some(a))).map_err(|_| {
            format!("{s:?} is not host:port (e.g. 127.0.0.1:9460); `off` or an empty value disables metrics")
        })
    }
}

/// A counter fed with a running total kept elsewhere (worker or kernel counters): each
/// [`TotalCounter::observe`] adds the growth since the previous one, so a total seen twice
/// counts once.
#[derive(Clone, Debug, Default)]
pub struct TotalCounter {
    counter: Counter,
    last: Arc<AtomicU64>,
}

impl TotalCounter {
    pub fn observe(&self, total: u64) {
        let prev = self.last.fetch_max(total, Ordering::Relaxed);
        self.counter.inc_by(total.saturating_sub(prev));
    }

    pub fn get(&self) -> u64 {
        self.counter.get()
    }
}

impl TypedMetric for TotalCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for TotalCounter {
    fn encode(&self, encoder: MetricEncoder) -> std::fmt::Result {
        self.counter.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// The log settings every Rust daemon takes (flatten into its arguments).
#[derive(clap::Args, Clone, Debug)]
pub struct LogArgs {
    /// Log format on stderr: text or json (one object per line). Verbosity follows RUST_LOG
    /// (e.g. RUST_LOG=debug or RUST_LOG=cgloop_node_agent=debug; default info).
    #[arg(long, env = "CGLOOP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

impl LogArgs {
    /// Installs the global subscriber (once; later calls do nothing). A malformed RUST_LOG is
    /// reported and `info` used instead.
    pub fn init(&self) {
        let (subscriber, bad) = self.subscriber();
        if tracing::subscriber::set_global_default(subscriber).is_ok() {
            if let Some(e) = bad {
                tracing::warn!("RUST_LOG is not a valid filter ({e}); logging at info");
            }
        }
    }

    /// The subscriber, and RUST_LOG's error when it is set but malformed.
    fn subscriber(&self) -> (Box<dyn tracing::Subscriber + Send + Sync>, Option<String>) {
        use tracing_subscriber::EnvFilter;
        let (filter, bad) = match EnvFilter::try_from_default_env() {
            Ok(f) => (f, None),
            Err(e) if std::env::var_os(EnvFilter::DEFAULT_ENV).is_some() => {
                (EnvFilter::new("info"), Some(e.to_string()))
            }
            Err(_) => (EnvFilter::new("info"), None),
        };
        let builder = tracing_subscriber::fmt().with_writer(|| LossyStderr).with_env_filter(filter);
        let sub: Box<dyn tracing::Subscriber + Send + Sync> = match self.log_format {
            LogFormat::Text => Box::new(builder.finish()),
            LogFormat::Json => Box::new(builder.json().flatten_event(true).finish()),
        };
        (sub, bad)
    }
}

/// Stderr that drops what it cannot write: a closed or full log pipe must not stop a daemon
/// (tracing-subscriber reports a failed write with `eprintln!`, which panics on a closed stderr).
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_registry_and_survives_a_port_in_use() {
        let mut registry = Registry::with_prefix("cgloop_test");
        let c: Counter = Counter::default();
        registry.register("things", "Things counted", c.clone());
        c.inc_by(3);
        let registry = Arc::new(registry);
        let bound = serve_or_warn(registry.clone(), "127.0.0.1:0".parse().unwrap()).unwrap();
        let body = get(bound, "/metrics");
        assert!(body.contains("cgloop_test_things_total 3"), "{body}");
        assert!(get(bound, "/").contains("404"));
        // The same port again: refused, logged, no panic.
        assert_eq!(serve_or_warn(registry.clone(), MetricsAddr(Some(bound))), None);
        let (none, why) = try_serve(registry, MetricsAddr(Some(bound)));
        assert!(none.is_none() && why.unwrap().contains(&bound.to_string()));
    }

    #[test]
    fn a_total_seen_twice_counts_once() {
        let c = TotalCounter::default();
        c.observe(5);
        c.observe(5);
        c.observe(7);
        c.observe(6); // an older reading never takes back
        assert_eq!(c.get(), 7);
    }

    #[test]
    fn an_empty_address_disables_and_a_bad_one_is_named() {
        let parse = |s: &str| s.parse::<MetricsAddr>().map(|a| a.0);
        assert_eq!(parse(""), Ok(None));
        assert_eq!(parse("off"), Ok(None));
        assert_eq!(parse("127.0.0.1:9460"), Ok(Some("127.0.0.1:9460".parse().unwrap())));
        let collector = MetricsAddr::default_for(cgloop_proto::ops::Daemon::IntCollector);
        assert!(collector.0.unwrap().ip().is_loopback(), "{collector}");
        assert_eq!(MetricsAddr(None).to_string().parse::<MetricsAddr>().unwrap().0, None);
        let e = parse("localhost").unwrap_err();
        assert!(e.contains("\"localhost\"") && e.contains("host:port"), "{e}");
    }

    #[test]
    fn the_log_format_comes_from_the_flag_or_cgloop_log_format() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            log: LogArgs,
        }
        let cli = Cli::try_parse_from(["x", "--log-format", "json"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
        let e = Cli::try_parse_from(["x", "--log-format", "xml"]).err().unwrap().to_string();
        assert!(e.contains("text") && e.contains("json"), "{e}");
    }
}
