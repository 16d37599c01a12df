//! UDP receive path: several SO_REUSEPORT sockets on one port, one worker thread per socket,
//! each draining its socket with recvmmsg(2) in batches and owning its own state (no locks on
//! the packet path). The kernel spreads report sources over the sockets by 4-tuple hash, so
//! one switch's reports always reach the same worker.

use crate::parse::{parse_packet, IntDetect};
use crate::state::{EventConfig, State};
use anyhow::{Context, Result};
use cgloop_proto::v1::IntRecord;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// Reusable recvmmsg(2) buffers for one socket.
pub struct Batch {
    bufs: Vec<[u8; MAX_DATAGRAM]>,
    iovecs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

// The raw pointers only point into `bufs`, owned by the same struct and never moved after new().
unsafe impl Send for Batch {}

impl Batch {
    pub fn new(batch: usize) -> Box<Self> {
        let batch = batch.clamp(1, 1024);
        let mut b = Box::new(Batch { bufs: vec![[0u8; MAX_DATAGRAM]; batch], iovecs: Vec::with_capacity(batch), msgs: Vec::with_capacity(batch) });
        for i in 0..batch {
            let base = b.bufs[i].as_mut_ptr().cast();
            b.iovecs.push(libc::iovec { iov_base: base, iov_len: MAX_DATAGRAM });
        }
        for i in 0..batch {
            // SAFETY: mmsghdr is plain data; zeroed is its documented initial state.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut b.iovecs[i];
            m.msg_hdr.msg_iovlen = 1;
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
        })
    }
}

pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// One worker: parse + state + events on its own socket; record batches go to `sink`.
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
