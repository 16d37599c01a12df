//! The probe packet and the reflector (`cgloop-node-agent reflect`), the far end of UDP echo
//! probes.
//!
//! The reflector answers only probe requests: the exact layout the agent's prober writes,
//! with the reply flag clear. Its answer carries the flag, and a reflector never answers a
//! packet with the flag set, so two reflectors cannot keep a datagram bouncing between them,
//! and arbitrary UDP payloads get nothing back. Replies are also capped per second (a
//! spoofed source can make the reflector answer someone else, never more than it was sent).

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Probe packet (the UDP payload), big-endian:
///
/// ```text
/// 0 magic "cglp" | 4 version | 5 flags (bit 0: reply) | 6 payload length (u16)
/// 8 session tag (u32) | 12 sequence (u64) | 20 send time, ns since the epoch (u64)
/// 28.. zero padding up to the payload length
/// ```
pub const MAGIC: u32 = 0x6367_6c70; // "cglp"
pub const VERSION: u8 = 1;
pub const FLAG_REPLY: u8 = 0x01;
pub const HEADER_BYTES: usize = 28;
/// Largest probe payload (an IPv4 datagram of 64 KiB less its headers).
pub const MAX_PAYLOAD: usize = 65_507;

/// Writes a probe request into `packet` (its whole length is the payload; the caller keeps
/// the padding zeroed).
pub fn write_request(packet: &mut [u8], tag: u32, seq: u64, sent_ns: u64) {
    let len = u16::try_from(packet.len()).unwrap_or(u16::MAX);
    packet[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    packet[4] = VERSION;
    packet[5] = 0;
    packet[6..8].copy_from_slice(&len.to_be_bytes());
    packet[8..12].copy_from_slice(&tag.to_be_bytes());
    packet[12..20].copy_from_slice(&seq.to_be_bytes());
    packet[20..28].copy_from_slice(&sent_ns.to_be_bytes());
}

/// The sequence of a reply to session `tag`, if `d` is one.
pub fn reply_sequence(d: &[u8], tag: u32) -> Option<u64> {
    let ok = d.len() >= HEADER_BYTES
        && d[0..4] == MAGIC.to_be_bytes()
        && d[4] == VERSION
        && d[5] == FLAG_REPLY
        && usize::from(u16::from_be_bytes([d[6], d[7]])) == d.len()
        && d[8..12] == tag.to_be_bytes();
    ok.then(|| u64::from_be_bytes(d[12..20].try_into().unwrap_or_default()))
}

/// Why a reflector did not answer a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a probe: too short or long, wrong magic, version, length or padding.
    NotAProbe,
    /// A reply (another reflector's answer): answering it would start a loop.
    Reply,
}

/// Turns a probe request into its reply in place; refuses anything else.
pub fn make_reply(d: &mut [u8]) -> Result<(), Refusal> {
    if d.len() < HEADER_BYTES
        || d.len() > MAX_PAYLOAD
        || d[0..4] != MAGIC.to_be_bytes()
        || d[4] != VERSION
        || usize::from(u16::from_be_bytes([d[6], d[7]])) != d.len()
    {
        return Err(Refusal::NotAProbe);
    }
    match d[5] {
        0 => {}
        FLAG_REPLY => return Err(Refusal::Reply),
        _ => return Err(Refusal::NotAProbe),
    }
    if d[HEADER_BYTES..].iter().any(|&b| b != 0) {
        return Err(Refusal::NotAProbe);
    }
    d[5] = FLAG_REPLY;
    Ok(())
}

#[derive(Debug, Clone, Copy)]
pub struct ReflectOptions {
    /// Replies per second at most (0: no cap); the excess is dropped and counted.
    pub max_replies_per_s: u32,
}

impl Default for ReflectOptions {
    fn default() -> Self {
        // A full agent probes at most 32 sessions at 1 ms (bounds.max_probes and
        // min_probe_interval_ns): 32,000/s; a client is probed by an edge node or two.
        Self { max_replies_per_s: 10_000 }
    }
}

/// What a reflector did, since it started.
#[derive(Debug, Default)]
pub struct ReflectStats {
    pub answered: AtomicU64,
    pub not_a_probe: AtomicU64,
    pub replies_ignored: AtomicU64,
    pub rate_limited: AtomicU64,
}

impl ReflectStats {
    fn refused(&self) -> u64 {
        self.not_a_probe.load(Ordering::Relaxed)
            + self.replies_ignored.load(Ordering::Relaxed)
            + self.rate_limited.load(Ordering::Relaxed)
    }
}

/// A token bucket: `rate` per second, bursts of a tenth of a second (at least 10).
struct Bucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u32) -> Self {
        let rate = f64::from(rate);
        let capacity = (rate / 10.0).max(10.0);
        Self { rate, capacity, tokens: capacity, at: Instant::now() }
    }

    fn take(&mut self, now: Instant) -> bool {
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Refusals are logged at most this often (a flood must not become a log flood).
const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct Reflector {
    socket: UdpSocket,
    options: ReflectOptions,
    stats: Arc<ReflectStats>,
}

impl Reflector {
    pub fn bind(listen: SocketAddr, options: ReflectOptions) -> std::io::Result<Self> {
        Self::from_socket(UdpSocket::bind(listen)?, options)
    }

    pub fn from_socket(socket: UdpSocket, options: ReflectOptions) -> std::io::Result<Self> {
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(Self { socket, options, stats: Arc::default() })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    pub fn stats(&self) -> Arc<ReflectStats> {
        self.stats.clone()
    }

    /// Answers probe requests until `stop`.
    pub fn run(&self, stop: &AtomicBool) -> std::io::Result<()> {
        let mut buf = vec![0u8; 65_536];
        let mut bucket = (self.options.max_replies_per_s > 0).then(|| Bucket::new(self.options.max_replies_per_s));
        let (mut logged_at, mut logged) = (Instant::now(), 0u64);
        let mut last_refused: Option<SocketAddr> = None;
        let s = &self.stats;
        while !stop.load(Ordering::Relaxed) {
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => match make_reply(&mut buf[..n]) {
                    Ok(()) if bucket.as_mut().is_none_or(|b| b.take(Instant::now())) => {
                        if self.socket.send_to(&buf[..n], from).is_ok() {
                            s.answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(()) => {
                        s.rate_limited.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(r) => {
                        let counter = match r {
                            Refusal::NotAProbe => &s.not_a_probe,
                            Refusal::Reply => &s.replies_ignored,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        last_refused = Some(from);
                    }
                },
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
            let refused = s.refused();
            if refused > logged && logged_at.elapsed() >= LOG_EVERY {
                tracing::warn!(
                    "reflector: {} datagrams not answered in the last {}s (not a probe: {}, replies: {}, over \
                     {}/s: {}, in total); the last unanswered came from {}",
                    refused - logged,
                    logged_at.elapsed().as_secs(),
                    s.not_a_probe.load(Ordering::Relaxed),
                    s.replies_ignored.load(Ordering::Relaxed),
                    self.options.max_replies_per_s,
                    s.rate_limited.load(Ordering::Relaxed),
                    last_refused.map_or_else(|| "-".to_string(), |a| a.to_string()),
                );
                (logged_at, logged) = (Instant::now(), refused);
            }
        }
        Ok(())
    }
}

/// Answers probe requests on `listen` with the default options until `stop`.
pub fn reflect(listen: SocketAddr, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    Reflector::bind(listen, ReflectOptions::default())?.run(&stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(len: usize) -> Vec<u8> {
        let mut p = vec![0u8; len];
        write_request(&mut p, 0xfeed, 7, 123);
        p
    }

    type Running = (SocketAddr, Arc<ReflectStats>, Arc<AtomicBool>, std::thread::JoinHandle<()>);

    fn run(r: Reflector) -> Running {
        let (addr, stats, stop) = (r.local_addr().unwrap(), r.stats(), Arc::new(AtomicBool::new(false)));
        let s = stop.clone();
        (addr, stats, stop, std::thread::spawn(move || r.run(&s).unwrap()))
    }

    fn started(options: ReflectOptions) -> Running {
        run(Reflector::bind("127.0.0.1:0".parse().unwrap(), options).unwrap())
    }

    fn stopped(r: Running) {
        r.2.store(true, Ordering::Relaxed);
        r.3.join().unwrap();
    }

    /// Waits (bounded) until `done` holds.
    fn until(done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn client() -> UdpSocket {
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        c
    }

    #[test]
    fn a_request_becomes_a_reply_and_nothing_else_does() {
        let mut p = request(60);
        make_reply(&mut p).unwrap();
        assert_eq!(reply_sequence(&p, 0xfeed), Some(7));
        assert_eq!(reply_sequence(&p, 0xbeef), None, "another session's reply");
        assert_eq!(make_reply(&mut p), Err(Refusal::Reply), "a reply is never answered");
        assert_eq!(reply_sequence(&request(60), 0xfeed), None, "a request is not a reply");
        for bad in [
            b"hello".to_vec(),
            vec![0u8; 64],
            { let mut p = request(60); p[4] = 2; p },           // version
            { let mut p = request(60); p[5] = 0x80; p },        // unknown flag
            { let mut p = request(60); p[7] ^= 1; p },          // length
            { let mut p = request(60); p[40] = 1; p },          // padding
            request(60)[..HEADER_BYTES - 1].to_vec(),
        ] {
            let mut b = bad.clone();
            assert_eq!(make_reply(&mut b), Err(Refusal::NotAProbe), "{bad:?}");
        }
    }

    /// issue 17 finding 3: the reflector echoed any payload.
    #[test]
    fn the_reflector_answers_probes_only() {
        let stop = Arc::new(AtomicBool::new(false));
        let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let s2 = stop.clone();
        let t = std::thread::spawn(move || reflect(([127, 0, 0, 1], port).into(), s2));
        std::thread::sleep(Duration::from_millis(50));
        let c = client();
        c.connect(("127.0.0.1", port)).unwrap();
        let mut buf = [0u8; 2048];
        c.send(b"not a probe").unwrap();
        let mut reply = request(60);
        make_reply(&mut reply).unwrap();
        c.send(&reply).unwrap();
        assert!(c.recv(&mut buf).is_err(), "answered garbage or a reply");
        c.send(&request(60)).unwrap();
        let n = c.recv(&mut buf).expect("the probe is answered");
        assert_eq!(reply_sequence(&buf[..n], 0xfeed), Some(7));
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap().unwrap();
    }

    /// issue 17 finding 3: two reflectors and one datagram made 263,754 datagrams in 2 s.
    #[test]
    fn two_reflectors_do_not_ping_pong() {
        let a_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let from_a = a_socket.try_clone().unwrap();
        let a = run(Reflector::from_socket(a_socket, ReflectOptions { max_replies_per_s: 0 }).unwrap());
        let b = started(ReflectOptions { max_replies_per_s: 0 });
        // One probe request from A's address to B, and one arbitrary datagram: B answers the
        // request to A, A does not answer the reply, and nobody answers the garbage.
        from_a.send_to(&request(60), b.0).unwrap();
        from_a.send_to(b"ping", b.0).unwrap();
        until(|| b.1.not_a_probe.load(Ordering::Relaxed) == 1 && a.1.replies_ignored.load(Ordering::Relaxed) == 1);
        let count = |s: &ReflectStats| {
            [&s.answered, &s.not_a_probe, &s.replies_ignored, &s.rate_limited].map(|c| c.load(Ordering::Relaxed))
        };
        assert_eq!(count(&b.1), [1, 1, 0, 0], "B: answered, not a probe, replies, rate-limited");
        assert_eq!(count(&a.1), [0, 0, 1, 0], "A: answered, not a probe, replies, rate-limited");
        stopped(a);
        stopped(b);
    }

    #[test]
    fn replies_beyond_the_rate_cap_are_dropped_and_counted() {
        let r = started(ReflectOptions { max_replies_per_s: 1 });
        let c = client();
        // A bucket of 10 (the minimum burst) refilled at 1/s: most of 30 requests at once go
        // unanswered.
        for _ in 0..30 {
            c.send_to(&request(60), r.0).unwrap();
        }
        let s = r.1.clone();
        until(|| s.answered.load(Ordering::Relaxed) + s.rate_limited.load(Ordering::Relaxed) == 30);
        stopped(r);
        let answered = s.answered.load(Ordering::Relaxed);
        assert!((10..30).contains(&answered), "{answered}");
        assert_eq!(s.rate_limited.load(Ordering::Relaxed) + answered, 30);
    }
}
