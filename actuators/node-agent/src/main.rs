//! Node agent: gRPC service applying queues, P-states, chains and probes on one node.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use cgloop_node_agent::agent::Agent;
use cgloop_node_agent::config::Config;
use cgloop_node_agent::power_glue::Power;
use cgloop_node_agent::probes::Probes;
use cgloop_node_agent::reflect::{ReflectOptions, Reflector};
use cgloop_node_agent::metrics::{CountedSanctions, CountedView, Metrics};
use cgloop_node_agent::queue_view::SanctionSource;
use cgloop_node_agent::service::Service;
use cgloop_node_agent::audit::{Audit, KafkaSink, Recorder};
use cgloop_node_agent::{export, tls};
use cgloop_proto::v1::node_agent_service_server::NodeAgentServiceServer;
use cgloop_proto::ops::Daemon;
use clap::{Parser, Subcommand};
use tonic::transport::Server;

#[derive(Parser)]
#[command(name = "cgloop-node-agent", version, about = "cgloop node agent (gRPC, mutual TLS)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: cgloop_obs::LogArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the NodeAgentService (mutual TLS only).
    Serve {
        /// TOML configuration (bounds, journal, power); defaults apply without it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// host:port, or unix:/path for a Unix socket (still mutual TLS).
        #[arg(long, default_value = "127.0.0.1:7443")]
        listen: String,
        /// Directory with ca.pem, server.pem and server.key (see `certs`).
        #[arg(long)]
        tls_dir: PathBuf,
        /// Overrides the configuration's journal path.
        #[arg(long)]
        journal: Option<PathBuf>,
        /// Overrides the configuration's node id.
        #[arg(long)]
        node_id: Option<String>,
        /// Validate and report every request without touching the kernel.
        #[arg(long)]
        dry_run: bool,
        /// Kafka bootstrap servers for probe records (overrides the configuration).
        #[arg(long)]
        kafka: Option<String>,
        /// Serve Prometheus metrics (GET /metrics, plain HTTP) on this host:port; `off` (or
        /// empty) disables them. Loopback by default; a port in use is logged and the agent
        /// runs without them.
        #[arg(long, env = "CGLOOP_NODE_AGENT_METRICS_ADDR", default_value_t = cgloop_obs::MetricsAddr::default_for(Daemon::NodeAgent))]
        metrics_addr: cgloop_obs::MetricsAddr,
    },
    /// Generate lab certificates: a CA (reused if present), a server and a client certificate.
    Certs {
        #[arg(long)]
        out: PathBuf,
        /// DNS names or IP addresses of the agent (the first is the common name).
        #[arg(long = "server-name", default_values = ["localhost", "127.0.0.1"])]
        server_names: Vec<String>,
        #[arg(long, default_value = "policy-engine")]
        client_name: String,
    },
    /// Answer the agent's UDP probes (the far end of active probes). Only probe requests are
    /// answered, never another reflector's reply.
    Reflect {
        /// Address to answer on: loopback unless set (e.g. 0.0.0.0:7799 or the client's
        /// address, for probes from the edge node).
        #[arg(long, default_value = "127.0.0.1:7799")]
        listen: SocketAddr,
        /// Replies per second at most (0: no cap); the excess is dropped and counted.
        #[arg(long, default_value_t = ReflectOptions::default().max_replies_per_s)]
        max_replies_per_s: u32,
    },
}

fn main() -> Result<()> {
    cgloop_obs::refuse_unknown_settings("cgloop-node-agent");
    let cli = Cli::parse();
    cli.log.init();
    match cli.command {
        Command::Certs { out, server_names, client_name } => {
            tls::generate(&out, &server_names, &client_name)?;
            println!("lab certificates written to {}", out.display());
            Ok(())
        }
        Command::Reflect { listen, max_replies_per_s } => {
            let reflector = Reflector::bind(listen, ReflectOptions { max_replies_per_s })
                .with_context(|| format!("reflector on {listen}"))?;
            // Tests and scripts wait for this line.
            println!("reflecting UDP probes on {}", reflector.local_addr()?);
            reflector.run(&AtomicBool::new(false)).with_context(|| format!("reflector on {listen}"))
        }
        Command::Serve { config, listen, tls_dir, journal, node_id, dry_run, kafka, metrics_addr } => {
            let mut config = match config {
                Some(p) => Config::load(&p)?,
                None => Config::default(),
            };
            if let Some(j) = journal {
                config.journal_path = j;
            }
            if let Some(n) = node_id {
                config.node_id = n;
            }
            config.dry_run |= dry_run;
            if let Some(k) = kafka {
                config.kafka_bootstrap = k;
            }
            serve(config, listen, tls_dir, metrics_addr)
        }
    }
}

fn serve(config: Config, listen: String, tls_dir: PathBuf, metrics_addr: cgloop_obs::MetricsAddr) -> Result<()> {
    let tls = tls::server_config(&tls_dir)?;
    let metrics = Arc::new(Metrics::default());
    cgloop_obs::serve_or_warn(metrics.registry(), metrics_addr);
    let power = Power::start(&config.power);
    let sink = if config.kafka_bootstrap.is_empty() {
        None
    } else {
        Some(export::start(
            &config.kafka_bootstrap,
            &config.probe_topic,
            &config.node_id,
            Duration::from_millis(config.probe_export_delay_ms),
        )?)
    };
    let probes = Probes::new(config.node_id.clone(), sink);
    let samples = (!config.kafka_bootstrap.is_empty() && config.node_sample_interval_ms > 0).then(|| {
        (
            config.cpu_accounting.cgroup.clone(),
            config.kafka_bootstrap.clone(),
            config.node_topic.clone(),
            config.node_id.clone(),
            Duration::from_millis(config.node_sample_interval_ms),
        )
    });
    // The node micro loop's audit (its actions on the actions topic) when Kafka is set.
    let audit_sink = match config.kafka_bootstrap.as_str() {
        "" => None,
        bootstrap => Some(KafkaSink::new(bootstrap, &config.action_topic, &config.node_id)?),
    };
    let (recorder, guard) = (Recorder::new(&config.node_id), config.guard.clone());
    let int_export = config.int_export.clone();
    let (agent, warnings) = Agent::start(config, power, probes)?;
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let agent = Arc::new(agent);
    let audit = match audit_sink {
        None => None,
        Some(sink) => {
            let interval = Duration::from_millis(guard.audit_interval_ms);
            // RFC 9957 sanctions: the datapath's, drained per interval (None: no LL class).
            let sanctions = agent.sanctions().map(|inner| {
                Arc::new(CountedSanctions { inner, metrics: metrics.clone() }) as Arc<dyn SanctionSource>
            });
            Some(Audit::start(recorder, Box::new(sink), guard.audit_queue, interval, sanctions)?)
        }
    };
    if let Some(a) = audit.clone() {
        agent.on_frequency_change(move |c| a.core_frequency(&c));
    }
    // The latency guard, on the queue monitor's ticks (a monitor that cannot read its queues
    // says why, and the guard does not act).
    let view = Arc::new(CountedView { inner: agent.queue_view(), metrics: metrics.clone() });
    let stop_guard = Arc::new(AtomicBool::new(false));
    let moves = metrics.clone();
    let on_move = move |m: &_| {
        moves.guard_move(m);
        if let Some(a) = &audit {
            a.guard_move(m)
        }
    };
    agent.start_guard(view, on_move, stop_guard.clone())?;
    if let Some((cgroup, bootstrap, topic, node_id, interval)) = samples {
        let cpu: Box<dyn cgloop_node_agent::nodes::CpuSource> = match cgroup {
            Some(dir) => Box::new(cgloop_node_agent::cpu_acct::CgroupCpu::attach(&dir)?),
            None => Box::new(cgloop_node_agent::nodes::ProcStat),
        };
        cgloop_node_agent::nodes::start(&bootstrap, &topic, &node_id, interval, agent.clone(), cpu)?;
    }
    watch_sampler(&agent, metrics.clone(), stop_guard.clone())?;
    // The INT source (`[int_export]`): postcards of the agent's queues to the INT collector.
    let _int = match &int_export {
        Some(s) => {
            let weak = Arc::downgrade(&agent);
            let managed = move || weak.upgrade().map(|a| a.managed_interfaces()).unwrap_or_default();
            cgloop_node_agent::int_export::start(s, agent.int_maps()?, Box::new(managed), metrics.int_export.clone())?
        }
        None => None,
    };
    let result = run_server(agent.clone(), listen, tls, metrics);
    // Whatever ended the server (signal or error): what was acknowledged goes to the journal.
    stop_guard.store(true, std::sync::atomic::Ordering::Relaxed);
    agent.shutdown();
    result
}

/// The queue sampler's health on /metrics, read twice a second.
fn watch_sampler(agent: &Arc<Agent>, metrics: Arc<Metrics>, stop: Arc<AtomicBool>) -> Result<()> {
    let agent = Arc::downgrade(agent);
    std::thread::Builder::new()
        .name("sampler-health".into())
        .spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Some(agent) = agent.upgrade() else { return };
                let status = agent.micro_loop_status();
                metrics.observe_sampler(agent.sampler_ticks(), status.acting, status.queue_sample_age_ns);
                drop(agent);
                std::thread::sleep(Duration::from_millis(500));
            }
        })
        .context("starting the sampler-health thread")?;
    Ok(())
}

fn run_server(
    agent: Arc<Agent>,
    listen: String,
    tls: tonic::transport::ServerTlsConfig,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        // grpc.health.v1: the whole server ("") and cgloop.v1.NodeAgentService, SERVING while
        // the agent serves (behind the same mutual TLS).
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<NodeAgentServiceServer<Service>>().await;
        let server = Server::builder()
            .tls_config(tls)?
            .add_service(health_service)
            .add_service(NodeAgentServiceServer::new(Service::with_metrics(agent, metrics)));
        if let Some(path) = listen.strip_prefix("unix:") {
            let _ = std::fs::remove_file(path);
            let listener = tokio::net::UnixListener::bind(path)
                .with_context(|| format!("binding unix socket {path}"))?;
            // Tests and scripts wait for this line.
            println!("cgloop-node-agent listening on unix:{path} (mTLS)");
            server
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), shutdown)
                .await
                .context("serving gRPC")
        } else {
            let addr: SocketAddr = listen
                .parse()
                .with_context(|| format!("--listen {listen:?} is neither host:port nor unix:/path"))?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            println!("cgloop-node-agent listening on {} (mTLS)", listener.local_addr()?);
            server
                .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), shutdown)
                .await
                .context("serving gRPC")
        }
    })
}
