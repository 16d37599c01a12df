//! UDP receive path: several SO_REUSEPORT sockets on one port, one worker thread per socket,
//! each draining its socket with recvmmsg(2) in batches and owning its own state (no locks on
//! the packet path). The kernel spreads report sources over the sockets by 4-tuple hash, so
//! one switch's reports always reach the same worker.
//!
//! Reports carry no integrity check, so whoever can reach the port can create records: a
//! [`SourceFilter`] (`--allow-source`) drops datagrams from other sources before they are
//! parsed, and counts them (`refused_source`).

use crate::parse::{parse_packet, IntDetect};
use crate::state::{EventConfig, State};
use anyhow::{Context, Result};
use cgloop_proto::v1::IntRecord;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cgloop_proto::host::now_ns;

/// Datagrams per recvmmsg(2) call. 256 amortises the syscall and the socket lock over more
/// datagrams than the former 64 (bench/int-collector: measured side by side); buffers are
/// MAX_DATAGRAM each but only the bytes received are touched.
pub const DEFAULT_BATCH: usize = 256;
pub const MAX_DATAGRAM: usize = 9216;

/// A UDP socket bound with SO_REUSEPORT (and a large receive buffer), blocking with a short
/// timeout so workers can run their timers.
pub fn bind_reuseport(addr: SocketAddr, rcvbuf: usize) -> Result<UdpSocket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .context("creating UDP socket")?;
    sock.set_reuse_address(true).context("SO_REUSEADDR")?;
    sock.set_reuse_port(true).context("SO_REUSEPORT")?;
    // SO_RCVBUFFORCE (CAP_NET_ADMIN) goes past net.core.rmem_max, which is 208 KB by default:
    // a few ms of reports at line rate. Without the capability, SO_RCVBUF (capped); a smaller
    // buffer only means earlier drops.
    let size = libc::c_int::try_from(rcvbuf).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt with a pointer to a c_int that lives for the call.
    let forced = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } == 0;
    if !forced {
        let _ = sock.set_recv_buffer_size(rcvbuf);
    }
    sock.set_read_timeout(Some(Duration::from_millis(10))).context("SO_RCVTIMEO")?;
    sock.bind(&addr.into()).with_context(|| format!("binding {addr}"))?;
    Ok(sock.into())
}

/// An allowed source network: an address and a prefix length ("10.0.0.0/24", "::1/128"; a
/// bare address is a host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, p) = s.trim().split_once('/').map_or((s.trim(), None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?}: not an IP address or CIDR (e.g. 10.0.0.0/24)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("{s:?}: prefix length must be 0..{max}")),
            },
        };
        Ok(Self { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, unmapped(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// An IPv4-mapped IPv6 source (a socket bound to `[::]`) as the IPv4 address it is.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Which sources' reports are parsed; empty = any.
#[derive(Debug, Clone, Default)]
pub struct SourceFilter {
    nets: Vec<Cidr>,
}

impl SourceFilter {
    pub fn any() -> Self {
        Self::default()
    }

    pub fn only(nets: Vec<Cidr>) -> Self {
        Self { nets }
    }

    pub fn is_any(&self) -> bool {
        self.nets.is_empty()
    }

    pub fn allows(&self, ip: Option<IpAddr>) -> bool {
        self.is_any() || ip.is_some_and(|ip| self.nets.iter().any(|n| n.contains(ip)))
    }
}

/// Reusable recvmmsg(2) buffers for one socket, with each datagram's source address.
pub struct Batch {
    bufs: Vec<[u8; MAX_DATAGRAM]>,
    iovecs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    msgs: Vec<libc::mmsghdr>,
}

// The raw pointers only point into `bufs`, owned by the same struct and never moved after new().
unsafe impl Send for Batch {}

impl Batch {
    pub fn new(batch: usize) -> Box<Self> {
        let batch = batch.clamp(1, 1024);
        // SAFETY: sockaddr_storage is plain data; all zeroes is a valid (AF_UNSPEC) value.
        let name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut b = Box::new(Batch {
            bufs: vec![[0u8; MAX_DATAGRAM]; batch],
            iovecs: Vec::with_capacity(batch),
            names: vec![name; batch],
            msgs: Vec::with_capacity(batch),
        });
        for i in 0..batch {
            let base = b.bufs[i].as_mut_ptr().cast();
            b.iovecs.push(libc::iovec { iov_base: base, iov_len: MAX_DATAGRAM });
        }
        for i in 0..batch {
            // SAFETY: mmsghdr is plain data; zeroed is its documented initial state.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut b.iovecs[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_name = (&mut b.names[i] as *mut libc::sockaddr_storage).cast();
            b.msgs.push(m);
        }
        b
    }

    pub fn capacity(&self) -> usize {
        self.msgs.len()
    }

    /// Receive up to `capacity()` datagrams (blocks until one arrives or the socket timeout).
    pub fn recv(&mut self, sock: &UdpSocket) -> std::io::Result<usize> {
        for m in &mut self.msgs {
            m.msg_len = 0;
            // The kernel writes the source's length here: reset to the buffer's on every call.
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        }
        // SAFETY: msgs/iovecs point at `bufs`, all alive for the call; lengths are correct.
        let n = unsafe {
            libc::recvmmsg(sock.as_raw_fd(), self.msgs.as_mut_ptr(), self.msgs.len() as u32, libc::MSG_WAITFORONE, std::ptr::null_mut())
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    pub fn datagram(&self, i: usize) -> &[u8] {
        let len = (self.msgs[i].msg_len as usize).min(MAX_DATAGRAM);
        &self.bufs[i][..len]
    }

    /// The source address of datagram `i` of the last `recv` (None if the kernel gave none).
    pub fn source(&self, i: usize) -> Option<IpAddr> {
        let name = &self.names[i];
        let len = self.msgs[i].msg_hdr.msg_namelen as usize;
        match i32::from(name.ss_family) {
            libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
                // SAFETY: the kernel wrote a sockaddr_in (family and length checked).
                let sin = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
            }
            libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
                // SAFETY: the kernel wrote a sockaddr_in6 (family and length checked).
                let sin6 = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
                Some(unmapped(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))))
            }
            _ => None,
        }
    }
}

/// Counters shared by all workers (read by the stats printer).
#[derive(Default)]
pub struct Stats {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub reports: AtomicU64,
    pub records: AtomicU64,
    pub malformed: AtomicU64,
    pub flows: AtomicU64,
    pub by_reason: Mutex<HashMap<String, u64>>,
    /// Datagrams from sources outside the allow-list (dropped unparsed).
    pub refused_source: AtomicU64,
    /// When refusals were last logged (ns since the epoch; logged at most every 10 s).
    refusal_logged_ns: AtomicU64,
}

impl Stats {
    pub fn snapshot(&self) -> serde_json::Value {
        let reports = self.reports.load(Ordering::Relaxed);
        let records = self.records.load(Ordering::Relaxed);
        let by_reason = self.by_reason.lock().map(|m| m.clone()).unwrap_or_default();
        serde_json::json!({
            "packets": self.packets.load(Ordering::Relaxed),
            "bytes": self.bytes.load(Ordering::Relaxed),
            "reports": reports,
            "records": records,
            "filter_ratio": if records > 0 { reports as f64 / records as f64 } else { 0.0 },
            "malformed": self.malformed.load(Ordering::Relaxed),
            "malformed_by_reason": by_reason,
            "flows": self.flows.load(Ordering::Relaxed),
            "refused_source": self.refused_source.load(Ordering::Relaxed),
        })
    }

    /// Logs refused sources at most once per interval over all workers (a flood of spoofed
    /// datagrams must not become a flood of log lines).
    fn log_refusals(&self, now: u64, last: Option<IpAddr>) {
        const EVERY_NS: u64 = 10_000_000_000;
        let prev = self.refusal_logged_ns.load(Ordering::Relaxed);
        if now.saturating_sub(prev) < EVERY_NS
            || self.refusal_logged_ns.compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        tracing::warn!(
            refused_source = self.refused_source.load(Ordering::Relaxed),
            last_source = last.map(|ip| ip.to_string()),
            "reports from sources not in --allow-source dropped unparsed"
        );
    }
}

/// One worker accepting reports from any source (see [`filtered_worker`]).
#[allow(clippy::too_many_arguments)] // one call site per caller; a struct would only rename them
pub fn worker(
    sock: UdpSocket,
    detect: IntDetect,
    cfg: EventConfig,
    source_id: String,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    sink: crossbeam_channel::Sender<Vec<IntRecord>>,
    batch_size: usize,
) -> Result<()> {
    filtered_worker(sock, detect, cfg, source_id, stats, stop, sink, batch_size, SourceFilter::any())
}

/// One worker: source filter, then parse + state + events on its own socket; record batches
/// go to `sink`.
#[allow(clippy::too_many_arguments)]
pub fn filtered_worker(
    sock: UdpSocket,
    detect: IntDetect,
    cfg: EventConfig,
    source_id: String,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    sink: crossbeam_channel::Sender<Vec<IntRecord>>,
    batch_size: usize,
    sources: SourceFilter,
) -> Result<()> {
    let mut batch = Batch::new(batch_size);
    let mut state = State::new(cfg, source_id);
    let mut out: Vec<IntRecord> = Vec::new();
    let mut errors: HashMap<(&'static str, &'static str), u64> = HashMap::new();
    let mut last_tick = Instant::now();
    let (mut packets, mut bytes, mut malformed) = (0u64, 0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let n = match batch.recv(&sock) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => 0,
            Err(e) => return Err(e).context("recvmmsg"),
        };
        let now = now_ns();
        for i in 0..n {
            if !sources.is_any() {
                let from = batch.source(i);
                if !sources.allows(from) {
                    stats.refused_source.fetch_add(1, Ordering::Relaxed);
                    stats.log_refusals(now, from);
                    continue;
                }
            }
            let d = batch.datagram(i);
            packets += 1;
            bytes += d.len() as u64;
            let res = parse_packet(d, &detect, &mut |r| match r {
                Ok(r) => state.ingest(&r, now, &mut out),
                Err(e) => {
                    malformed += 1;
                    *errors.entry(e.reason()).or_default() += 1;
                }
            });
            if let Err(e) = res {
                malformed += 1;
                *errors.entry(e.reason()).or_default() += 1;
            }
        }
        if last_tick.elapsed() >= Duration::from_millis(10) || n == 0 {
            last_tick = Instant::now();
            state.tick(now, &mut out);
            publish(&stats, &state, &mut packets, &mut bytes, &mut malformed, &mut errors);
        }
        if !out.is_empty() && (out.len() >= 256 || n < batch.capacity()) {
            let _ = sink.send(std::mem::take(&mut out));
        }
    }
    state.tick(now_ns(), &mut out);
    publish(&stats, &state, &mut packets, &mut bytes, &mut malformed, &mut errors);
    if !out.is_empty() {
        let _ = sink.send(out);
    }
    Ok(())
}

fn publish(
    stats: &Stats,
    state: &State,
    packets: &mut u64,
    bytes: &mut u64,
    malformed: &mut u64,
    errors: &mut HashMap<(&'static str, &'static str), u64>,
) {
    stats.packets.fetch_add(std::mem::take(packets), Ordering::Relaxed);
    stats.bytes.fetch_add(std::mem::take(bytes), Ordering::Relaxed);
    stats.malformed.fetch_add(std::mem::take(malformed), Ordering::Relaxed);
    // Reports/records are cumulative per worker: publish deltas.
    let c = state.counters;
    thread_local! {
        static LAST: std::cell::Cell<(u64, u64, u64)> = const { std::cell::Cell::new((0, 0, 0)) };
    }
    LAST.with(|last| {
        let (r, rec, f) = last.get();
        stats.reports.fetch_add(c.reports - r, Ordering::Relaxed);
        stats.records.fetch_add(c.records - rec, Ordering::Relaxed);
        stats.flows.fetch_add(c.flows - f, Ordering::Relaxed);
        last.set((c.reports, c.records, c.flows));
    });
    if !errors.is_empty() {
        if let Ok(mut m) = stats.by_reason.lock() {
            for ((kind, what), n) in errors.drain() {
                *m.entry(format!("{kind}:{what}")).or_default() += n;
            }
        }
    }
}
