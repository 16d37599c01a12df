//! Coalesces postcards into TR v2.0 datagrams (one group header, up to N individual reports,
//! §2.7) and sends them to the collector over UDP.
//!
//! Sequence numbers (§3.2, 22 bits, per (Node ID, hw_id) and destination) count individual
//! reports: a datagram's group header carries the number of its first report and the next
//! datagram's starts after its last, so a collector can tell how many reports it missed, not
//! only how many datagrams.
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::encode::{self, Postcard, GROUP_HEADER_BYTES, SEQ_MASK};

/// Where datagrams go (a trait so that tests can collect them).
pub trait Transport {
    fn send(&mut self, datagram: &[u8]) -> io::Result<()>;
}

/// A connected UDP socket on an ephemeral local port: on loopback when the collector is (the
/// lab's default, nothing bound beyond it), else on the family's unspecified address so the
/// kernel picks the route's source.
pub struct Udp(UdpSocket);

impl Udp {
    pub fn connect(collector: SocketAddr) -> Result<Self> {
        let ip: IpAddr = match (collector.ip().is_loopback(), collector.is_ipv4()) {
            (true, true) => Ipv4Addr::LOCALHOST.into(),
            (true, false) => Ipv6Addr::LOCALHOST.into(),
            (false, true) => Ipv4Addr::UNSPECIFIED.into(),
            (false, false) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let s = UdpSocket::bind(SocketAddr::new(ip, 0)).context("binding the INT exporter's UDP socket")?;
        s.connect(collector)
            .with_context(|| format!("int_export.collector {collector}: connect"))?;
        Ok(Self(s))
    }
}

impl Transport for Udp {
    fn send(&mut self, datagram: &[u8]) -> io::Result<()> {
        self.0.send(datagram).map(|_| ())
    }
}

/// What one flush did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub datagrams: u64,
    pub reports: u64,
    /// Datagrams the socket refused (their reports are lost; the sequence moves on, so the
    /// collector sees the gap).
    pub errors: u64,
    pub lost_reports: u64,
}

impl std::ops::AddAssign for Sent {
    fn add_assign(&mut self, o: Sent) {
        self.datagrams += o.datagrams;
        self.reports += o.reports;
        self.errors += o.errors;
        self.lost_reports += o.lost_reports;
    }
}

pub struct Batcher<T: Transport> {
    transport: T,
    node_id: u32,
    hw_id: u8,
    max_reports: usize,
    max_bytes: usize,
    flush_after: Duration,
    /// Sequence number of the next report.
    seq: u32,
    buf: Vec<u8>,
    count: usize,
    /// When the oldest report in `buf` arrived.
    since: Option<Instant>,
    last_error: Option<io::Error>,
}

impl<T: Transport> Batcher<T> {
    pub fn new(
        transport: T,
        node_id: u32,
        hw_id: u8,
        max_reports: usize,
        max_bytes: usize,
        flush_after: Duration,
    ) -> Self {
        Self {
            transport,
            node_id,
            hw_id,
            max_reports: max_reports.max(1),
            max_bytes: max_bytes.max(GROUP_HEADER_BYTES + encode::MAX_REPORT_BYTES),
            flush_after,
            seq: 0,
            buf: Vec::with_capacity(max_bytes),
            count: 0,
            since: None,
            last_error: None,
        }
    }

    /// Adds one report, sending the datagram first if it would not fit.
    pub fn push(&mut self, p: &Postcard, now: Instant) -> Sent {
        let mut sent = Sent::default();
        if self.count > 0 && self.buf.len() + encode::report_len(p) > self.max_bytes {
            sent += self.flush();
        }
        if self.count == 0 {
            self.buf.clear();
            encode::group_header(&mut self.buf, self.hw_id, self.seq, self.node_id);
            self.since = Some(now);
        }
        encode::individual_report(&mut self.buf, p);
        self.count += 1;
        if self.count >= self.max_reports {
            sent += self.flush();
        }
        sent
    }

    /// Sends a partly filled datagram whose oldest report has waited `flush_after`.
    pub fn flush_if_due(&mut self, now: Instant) -> Sent {
        match self.since {
            Some(t) if now.duration_since(t) >= self.flush_after => self.flush(),
            _ => Sent::default(),
        }
    }

    /// How long until a waiting datagram is due (None: nothing waits).
    pub fn due_in(&self, now: Instant) -> Option<Duration> {
        self.since.map(|t| self.flush_after.saturating_sub(now.duration_since(t)))
    }

    /// Sends what is waiting.
    pub fn flush(&mut self) -> Sent {
        if self.count == 0 {
            return Sent::default();
        }
        let n = self.count as u64;
        let result = self.transport.send(&self.buf);
        self.seq = (self.seq.wrapping_add(self.count as u32)) & SEQ_MASK;
        self.count = 0;
        self.since = None;
        self.buf.clear();
        match result {
            Ok(()) => Sent { datagrams: 1, reports: n, ..Sent::default() },
            Err(e) => {
                self.last_error = Some(e);
                Sent { errors: 1, lost_reports: n, ..Sent::default() }
            }
        }
    }

    /// The most recent send error, once (the caller logs it).
    pub fn take_error(&mut self) -> Option<io::Error> {
        self.last_error.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int_export::encode::report_len;

    #[test]
    fn a_loopback_collector_is_sent_to_from_loopback_only() {
        let collector = UdpSocket::bind("127.0.0.1:0").unwrap();
        let udp = Udp::connect(collector.local_addr().unwrap()).unwrap();
        let local = udp.0.local_addr().unwrap();
        assert!(local.ip().is_loopback(), "bound to {local}");
        let mut udp = udp;
        udp.send(b"postcard").unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = collector.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"postcard"[..], local));
    }

    #[derive(Default)]
    struct Collect {
        datagrams: Vec<Vec<u8>>,
        fail: bool,
    }

    impl Transport for &mut Collect {
        fn send(&mut self, d: &[u8]) -> io::Result<()> {
            if self.fail {
                return Err(io::Error::from(io::ErrorKind::ConnectionRefused));
            }
            self.datagrams.push(d.to_vec());
            Ok(())
        }
    }

    fn card(inner_len: usize) -> Postcard {
        let mut inner = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        inner.resize(inner_len, 0);
        Postcard {
            ingress_ifindex: 0,
            egress_ifindex: 2,
            hop_latency_ns: 1,
            queue_id: 1,
            queue_occupancy: 0,
            ingress_ts_ns: 0,
            egress_ts_ns: 1,
            congested: false,
            inner,
            inner_v6: false,
        }
    }

    fn seq_of(d: &[u8]) -> u32 {
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]) & SEQ_MASK
    }

    #[test]
    fn reports_coalesce_up_to_the_count_and_sequences_count_reports() {
        let mut c = Collect::default();
        let t0 = Instant::now();
        let mut b = Batcher::new(&mut c, 1, 0, 3, 1400, Duration::from_millis(1));
        let mut total = Sent::default();
        for _ in 0..7 {
            total += b.push(&card(28), t0);
        }
        assert_eq!(b.flush_if_due(t0), Sent::default(), "not due yet");
        assert_eq!(b.due_in(t0), Some(Duration::from_millis(1)));
        total += b.flush_if_due(t0 + Duration::from_millis(2));
        assert_eq!(total, Sent { datagrams: 3, reports: 7, ..Sent::default() });
        drop(b);
        let seqs: Vec<u32> = c.datagrams.iter().map(|d| seq_of(d)).collect();
        assert_eq!(seqs, vec![0, 3, 6]);
        assert_eq!(c.datagrams[0].len(), GROUP_HEADER_BYTES + 3 * report_len(&card(28)));
    }

    #[test]
    fn a_datagram_never_exceeds_the_byte_limit_and_errors_keep_the_sequence_moving() {
        let mut c = Collect::default();
        let t0 = Instant::now();
        let one = report_len(&card(128));
        let limit = GROUP_HEADER_BYTES + 2 * one + one / 2;
        let mut b = Batcher::new(&mut c, 1, 0, 64, limit, Duration::from_millis(1));
        for _ in 0..5 {
            b.push(&card(128), t0);
        }
        b.flush();
        drop(b);
        assert!(c.datagrams.iter().all(|d| d.len() <= limit));
        assert_eq!(c.datagrams.len(), 3);
        c.fail = true;
        let mut b = Batcher::new(&mut c, 1, 0, 2, 1400, Duration::from_millis(1));
        let s = b.push(&card(28), t0);
        assert_eq!(s, Sent::default());
        let s = b.push(&card(28), t0);
        assert_eq!(s, Sent { errors: 1, lost_reports: 2, ..Sent::default() });
        assert!(b.take_error().is_some());
        assert_eq!(b.seq, 2);
    }

    #[test]
    fn the_sequence_wraps_at_22_bits() {
        let mut c = Collect::default();
        let mut b = Batcher::new(&mut c, 1, 0, 2, 1400, Duration::from_millis(1));
        b.seq = SEQ_MASK;
        b.push(&card(28), Instant::now());
        b.push(&card(28), Instant::now());
        assert_eq!(b.seq, 1);
        drop(b);
        assert_eq!(seq_of(&c.datagrams[0]), SEQ_MASK);
    }
}
