//! Active probes: UDP echo with sequence numbers and send timestamps at randomised intervals
//! (Gallenmüller thesis: periodic probes alias with periodic interference), answered by a cgloop
//! reflector (`cgloop-node-agent reflect`, crate::reflect, which also has the packet layout).
//! Each probe becomes a ProbeRecord; the session keeps
//! RTT percentiles for GetState.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cgloop_proto::host::now_ns;
use cgloop_proto::v1::{
    LatencySummary, ProbeMethod, ProbeRecord, ProbeSpec, ProbeStatus, RecordHeader,
};
use rand::RngExt;

use crate::config::Bounds;
use crate::error::{AgentError, AgentResult};
use crate::reflect::{self, HEADER_BYTES};
use crate::{invalid, out_of_bounds};

/// IPv4 + UDP header bytes in front of the payload (the spec's packet_bytes is the IP length).
const IP_UDP_V4: usize = 28;
const IP_UDP_V6: usize = 48;
/// RTT samples kept per session for percentiles.
const WINDOW: usize = 10_000;

#[derive(Debug, Default)]
struct Stats {
    sent: u64,
    received: u64,
    lost: u64,
    rtts: VecDeque<u64>,
}

struct Session {
    spec: ProbeSpec,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
}

/// Running sessions and where their records go.
pub struct Probes {
    sessions: BTreeMap<String, Session>,
    sink: Option<mpsc::Sender<ProbeRecord>>,
    source_id: String,
}

impl Probes {
    /// `sink` receives every probe record (the Kafka exporter); None keeps them local.
    pub fn new(source_id: String, sink: Option<mpsc::Sender<ProbeRecord>>) -> Self {
        Self { sessions: BTreeMap::new(), sink, source_id }
    }

    pub fn validate(spec: &ProbeSpec, bounds: &Bounds) -> AgentResult<SocketAddr> {
        if spec.probe_id.is_empty() || spec.probe_id.len() > 128 {
            invalid!("spec.probe_id must be 1..128 bytes");
        }
        match ProbeMethod::try_from(spec.method).unwrap_or(ProbeMethod::Unspecified) {
            ProbeMethod::UdpEcho => {}
            ProbeMethod::Unspecified => invalid!("spec.method is unspecified"),
            other => {
                return Err(AgentError::Unimplemented(format!(
                    "probe method {other:?} is not implemented by this agent; use PROBE_METHOD_UDP_ECHO"
                )))
            }
        }
        let ip: IpAddr = match spec.target_addr.len() {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&spec.target_addr[..]).unwrap_or_default())),
            16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&spec.target_addr[..]).unwrap_or_default())),
            n => invalid!("spec.target_addr is {n} bytes; 4 (IPv4) or 16 (IPv6) expected"),
        };
        if spec.target_port == 0 || spec.target_port > 65535 {
            invalid!("spec.target_port {} is not within 1..65535", spec.target_port);
        }
        if spec.dscp > 63 {
            invalid!("spec.dscp {} is not within 0..63", spec.dscp);
        }
        if spec.ecn > 3 {
            invalid!("spec.ecn {} is not within 0..3", spec.ecn);
        }
        if spec.interval_ns < bounds.min_probe_interval_ns {
            out_of_bounds!("spec.interval_ns {} is below the bound {}", spec.interval_ns, bounds.min_probe_interval_ns);
        }
        if spec.interval_jitter_ns >= spec.interval_ns {
            invalid!("spec.interval_jitter_ns {} must be below interval_ns {}", spec.interval_jitter_ns, spec.interval_ns);
        }
        if spec.timeout_ns == 0 || spec.timeout_ns > 60_000_000_000 {
            invalid!("spec.timeout_ns {} is not within 1 ns..60 s", spec.timeout_ns);
        }
        if spec.overdue_after_ns >= spec.timeout_ns && spec.overdue_after_ns != 0 {
            invalid!(
                "spec.overdue_after_ns {} must be below spec.timeout_ns {} (0 turns it off)",
                spec.overdue_after_ns,
                spec.timeout_ns
            );
        }
        let overhead = if ip.is_ipv4() { IP_UDP_V4 } else { IP_UDP_V6 };
        let min = (overhead + HEADER_BYTES) as u32;
        if spec.packet_bytes != 0 && (spec.packet_bytes < min || spec.packet_bytes > bounds.max_probe_bytes) {
            out_of_bounds!("spec.packet_bytes {} is not within {min}..{}", spec.packet_bytes, bounds.max_probe_bytes);
        }
        Ok(SocketAddr::new(ip, spec.target_port as u16))
    }

    /// Starts (or replaces) a session; returns the replaced spec.
    pub fn start(&mut self, spec: &ProbeSpec, bounds: &Bounds, dry: bool) -> AgentResult<Option<ProbeSpec>> {
        let target = Self::validate(spec, bounds)?;
        if !self.sessions.contains_key(&spec.probe_id) && self.sessions.len() >= bounds.max_probes {
            out_of_bounds!("{} probes running; the bound is {}", self.sessions.len(), bounds.max_probes);
        }
        let previous = self.sessions.get(&spec.probe_id).map(|s| s.spec.clone());
        if dry {
            return Ok(previous);
        }
        self.stop(&spec.probe_id, false);
        let socket = open_socket(target, spec)
            .map_err(|e| AgentError::Kernel(anyhow::anyhow!("probe socket to {target}: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let runner = Runner {
            spec: spec.clone(),
            socket,
            target,
            stop: stop.clone(),
            stats: stats.clone(),
            sink: self.sink.clone(),
            source_id: self.source_id.clone(),
        };
        std::thread::Builder::new()
            .name(format!("probe-{}", spec.probe_id))
            .spawn(move || runner.run())
            .map_err(|e| AgentError::Kernel(anyhow::anyhow!("starting the probe thread: {e}")))?;
        self.sessions.insert(spec.probe_id.clone(), Session { spec: spec.clone(), stop, stats });
        Ok(previous)
    }

    pub fn stop(&mut self, probe_id: &str, dry: bool) -> Option<ProbeSpec> {
        if dry {
            return self.sessions.get(probe_id).map(|s| s.spec.clone());
        }
        let s = self.sessions.remove(probe_id)?;
        s.stop.store(true, Ordering::Relaxed);
        Some(s.spec)
    }

    pub fn specs(&self) -> Vec<ProbeSpec> {
        self.sessions.values().map(|s| s.spec.clone()).collect()
    }

    pub fn status(&self) -> Vec<ProbeStatus> {
        self.sessions
            .values()
            .map(|s| {
                let st = s.stats.lock().unwrap_or_else(|p| p.into_inner());
                ProbeStatus {
                    probe_id: s.spec.probe_id.clone(),
                    sent_packets: st.sent,
                    received_packets: st.received,
                    lost_packets: st.lost,
                    rtt: Some(summary(st.rtts.iter().copied())),
                }
            })
            .collect()
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        for s in self.sessions.values() {
            s.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// Nearest-rank percentiles of the samples.
pub fn summary(samples: impl Iterator<Item = u64>) -> LatencySummary {
    let mut v: Vec<u64> = samples.collect();
    if v.is_empty() {
        return LatencySummary::default();
    }
    v.sort_unstable();
    let q = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    LatencySummary {
        samples: v.len() as u64,
        p50_ns: q(0.50),
        p90_ns: q(0.90),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
        max_ns: v[v.len() - 1],
    }
}

fn open_socket(target: SocketAddr, spec: &ProbeSpec) -> std::io::Result<UdpSocket> {
    let bind: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(target)?;
    let tos: libc::c_int = ((spec.dscp << 2) | spec.ecn) as libc::c_int;
    let (level, opt) = if target.is_ipv4() {
        (libc::IPPROTO_IP, libc::IP_TOS)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
    };
    // SAFETY: setsockopt with a valid fd and an int option value.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            opt,
            (&tos as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(socket)
}

/// What a probe record says about its packet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Answered,
    /// Still unanswered after `overdue_after_ns` (rtt_ns is a lower bound).
    Overdue,
    Lost,
}

struct Runner {
    spec: ProbeSpec,
    socket: UdpSocket,
    target: SocketAddr,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
    sink: Option<mpsc::Sender<ProbeRecord>>,
    source_id: String,
}

impl Runner {
    fn run(self) {
        let mut rng = rand::rng();
        let tag: u32 = rng.random();
        let local = self.socket.local_addr().ok();
        let payload_len = if self.spec.packet_bytes == 0 {
            HEADER_BYTES
        } else {
            self.spec.packet_bytes as usize - if self.target.is_ipv4() { IP_UDP_V4 } else { IP_UDP_V6 }
        };
        let timeout = Duration::from_nanos(self.spec.timeout_ns);
        let overdue_after =
            (self.spec.overdue_after_ns > 0).then(|| Duration::from_nanos(self.spec.overdue_after_ns));
        // sequence -> (sent at, sent ns, overdue notice given)
        let mut in_flight: HashMap<u64, (Instant, u64, bool)> = HashMap::new();
        let mut seq: u64 = 0;
        let mut record_seq: u64 = 0;
        let mut next_send = Instant::now();
        let mut buf = vec![0u8; 2048];
        let mut packet = vec![0u8; payload_len];
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next_send {
                let sent_ns = now_ns();
                reflect::write_request(&mut packet, tag, seq, sent_ns);
                if self.socket.send(&packet).is_ok() {
                    in_flight.insert(seq, (now, sent_ns, false));
                    self.stats.lock().unwrap_or_else(|p| p.into_inner()).sent += 1;
                }
                seq += 1;
                // Uniform in interval ± jitter (validated: jitter < interval).
                let lo = self.spec.interval_ns - self.spec.interval_jitter_ns;
                let hi = self.spec.interval_ns + self.spec.interval_jitter_ns;
                next_send = now + Duration::from_nanos(rng.random_range(lo..=hi));
            }
            // Wait for replies until the next send or the next overdue notice (or 50 ms, to
            // notice stop).
            let mut until = next_send;
            if let Some(after) = overdue_after {
                for (at, _, noticed) in in_flight.values() {
                    if !noticed {
                        until = until.min(*at + after);
                    }
                }
            }
            let wait = until
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_micros(50), Duration::from_millis(50));
            let _ = self.socket.set_read_timeout(Some(wait));
            if let Ok(n) = self.socket.recv(&mut buf) {
                let received_ns = now_ns();
                let at = Instant::now();
                // Only a reflector's reply to this session counts (not an echo of the request).
                if let Some(s) = reflect::reply_sequence(&buf[..n], tag) {
                    if let Some((sent_at, sent_ns, _)) = in_flight.remove(&s) {
                        let rtt = at.duration_since(sent_at).as_nanos() as u64;
                        {
                            let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                            st.received += 1;
                            st.rtts.push_back(rtt);
                            if st.rtts.len() > WINDOW {
                                st.rtts.pop_front();
                            }
                        }
                        self.emit(&mut record_seq, local, s, n, sent_ns, received_ns, rtt, Fate::Answered);
                    }
                }
            }
            let now = Instant::now();
            // Notice the probes unanswered for overdue_after: their RTT is at least that.
            if let Some(after) = overdue_after {
                let mut late: Vec<(u64, u64, u64)> = Vec::new();
                for (s, (at, ns, noticed)) in in_flight.iter_mut() {
                    let waited = now.duration_since(*at);
                    if !*noticed && waited >= after && waited <= timeout {
                        *noticed = true;
                        late.push((*s, *ns, waited.as_nanos() as u64));
                    }
                }
                late.sort_unstable();
                for (s, sent_ns, waited) in late {
                    self.emit(&mut record_seq, local, s, payload_len, sent_ns, 0, waited, Fate::Overdue);
                }
            }
            // Expire the probes whose reply is overdue.
            let expired: Vec<(u64, u64)> = in_flight
                .iter()
                .filter(|(_, (at, _, _))| now.duration_since(*at) > timeout)
                .map(|(s, (_, ns, _))| (*s, *ns))
                .collect();
            for (s, sent_ns) in expired {
                in_flight.remove(&s);
                self.stats.lock().unwrap_or_else(|p| p.into_inner()).lost += 1;
                self.emit(&mut record_seq, local, s, payload_len, sent_ns, 0, 0, Fate::Lost);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        record_seq: &mut u64,
        local: Option<SocketAddr>,
        probe_sequence: u64,
        payload: usize,
        sent_ns: u64,
        received_ns: u64,
        rtt_ns: u64,
        fate: Fate,
    ) {
        let Some(sink) = &self.sink else { return };
        let v4 = self.target.is_ipv4();
        let addr = |a: IpAddr| match a {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        *record_seq += 1;
        let record = ProbeRecord {
            header: Some(RecordHeader {
                schema_version: cgloop_proto::SCHEMA_VERSION,
                source_id: format!("{}/probe/{}", self.source_id, self.spec.probe_id),
                sequence: *record_seq,
                timestamp_ns: sent_ns,
            }),
            probe_id: self.spec.probe_id.clone(),
            method: ProbeMethod::UdpEcho as i32,
            source_addr: local.map(|l| addr(l.ip())).unwrap_or_default(),
            target_addr: self.spec.target_addr.clone(),
            source_port: local.map(|l| l.port() as u32).unwrap_or(0),
            target_port: self.spec.target_port,
            dscp: self.spec.dscp,
            ecn: self.spec.ecn,
            probe_sequence,
            packet_bytes: (payload + if v4 { IP_UDP_V4 } else { IP_UDP_V6 }) as u32,
            sent_ns,
            received_ns,
            rtt_ns,
            lost: fate == Fate::Lost,
            overdue: fate == Fate::Overdue,
            ..Default::default()
        };
        let _ = sink.send(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(port: u16) -> ProbeSpec {
        ProbeSpec {
            probe_id: "p1".into(),
            method: ProbeMethod::UdpEcho as i32,
            target_addr: vec![127, 0, 0, 1],
            target_port: port as u32,
            dscp: 46,
            ecn: 0,
            interval_ns: 2_000_000,
            interval_jitter_ns: 1_000_000,
            packet_bytes: 100,
            timeout_ns: 200_000_000,
            overdue_after_ns: 0,
        }
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let s = summary(1..=100u64);
        assert_eq!((s.samples, s.p50_ns, s.p90_ns, s.p99_ns, s.max_ns), (100, 50, 90, 99, 100));
        assert_eq!(summary(std::iter::empty()).samples, 0);
    }

    #[test]
    fn bad_specs_are_refused_by_field() {
        let b = Bounds::default();
        let mut s = spec(9);
        s.target_addr = vec![1, 2, 3];
        assert!(Probes::validate(&s, &b).unwrap_err().to_string().contains("target_addr"));
        let mut s = spec(9);
        s.interval_ns = 10;
        assert!(matches!(Probes::validate(&s, &b).unwrap_err(), AgentError::OutOfBounds(_)));
        let mut s = spec(9);
        s.method = ProbeMethod::TwampLight as i32;
        assert!(matches!(Probes::validate(&s, &b).unwrap_err(), AgentError::Unimplemented(_)));
        let mut s = spec(9);
        s.interval_jitter_ns = s.interval_ns;
        assert!(Probes::validate(&s, &b).unwrap_err().to_string().contains("jitter"));
        let mut s = spec(9);
        s.overdue_after_ns = s.timeout_ns;
        assert!(Probes::validate(&s, &b).unwrap_err().to_string().contains("overdue_after_ns"));
    }

    /// A target that never answers: every probe gets its overdue notice (RTT at least
    /// overdue_after) before it is declared lost, and each in that order.
    #[test]
    fn unanswered_probes_are_noticed_overdue_before_they_are_lost() {
        // a bound UDP socket that never replies
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let mut s = spec(port);
        s.interval_ns = 5_000_000;
        s.interval_jitter_ns = 1_000_000;
        s.overdue_after_ns = 10_000_000;
        s.timeout_ns = 40_000_000;
        let (tx, rx) = mpsc::channel();
        let mut probes = Probes::new("test".into(), Some(tx));
        probes.start(&s, &Bounds::default(), false).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut records = Vec::new();
        while records.iter().filter(|r: &&ProbeRecord| r.lost).count() < 5 && Instant::now() < deadline {
            if let Ok(r) = rx.recv_timeout(Duration::from_millis(100)) {
                records.push(r);
            }
        }
        probes.stop("p1", false);
        drop(silent);
        let lost: Vec<u64> = records.iter().filter(|r| r.lost).map(|r| r.probe_sequence).collect();
        assert!(lost.len() >= 5, "only {} losses in {} records", lost.len(), records.len());
        for seq in lost {
            let of_seq: Vec<&ProbeRecord> = records.iter().filter(|r| r.probe_sequence == seq).collect();
            assert_eq!(of_seq.len(), 2, "probe {seq}: one notice, then the loss");
            let (notice, loss) = (of_seq[0], of_seq[1]);
            assert!(notice.overdue && !notice.lost && notice.received_ns == 0);
            // noticed no earlier than overdue_after, and well before the timeout
            assert!((10_000_000..40_000_000).contains(&notice.rtt_ns), "{}", notice.rtt_ns);
            assert!(loss.lost && !loss.overdue && loss.rtt_ns == 0);
            assert_eq!(notice.sent_ns, loss.sent_ns);
        }
    }

    #[test]
    fn udp_echo_against_a_loopback_reflector_measures_rtt_and_loss() {
        let stop = Arc::new(AtomicBool::new(false));
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let s2 = stop.clone();
        let reflector = std::thread::spawn(move || reflect::reflect(([127, 0, 0, 1], port).into(), s2));
        std::thread::sleep(Duration::from_millis(50));
        let (tx, rx) = mpsc::channel();
        let mut probes = Probes::new("test".into(), Some(tx));
        probes.start(&spec(port), &Bounds::default(), false).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut records = Vec::new();
        while records.len() < 20 && Instant::now() < deadline {
            if let Ok(r) = rx.recv_timeout(Duration::from_millis(100)) {
                records.push(r);
            }
        }
        let status = probes.status();
        probes.stop("p1", false);
        stop.store(true, Ordering::Relaxed);
        reflector.join().unwrap().unwrap();
        assert!(records.len() >= 20, "only {} records", records.len());
        assert!(records.iter().all(|r| !r.lost && r.rtt_ns > 0 && r.dscp == 46 && r.packet_bytes == 100));
        let seqs: Vec<u64> = records.iter().map(|r| r.probe_sequence).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let st = &status[0];
        assert!(st.received_packets > 0 && st.rtt.as_ref().unwrap().p50_ns > 0);
        // Randomised gaps: the send times are not all the same distance apart.
        let gaps: Vec<u64> = records.windows(2).map(|w| w[1].sent_ns - w[0].sent_ns).collect();
        let min = *gaps.iter().min().unwrap();
        let max = *gaps.iter().max().unwrap();
        assert!(max - min > 200_000, "gaps look periodic: {gaps:?}");
    }
}
