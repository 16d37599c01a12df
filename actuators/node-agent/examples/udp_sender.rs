//! Low-CPU UDP traffic source for bench/node-agent: one datagram every `interval_us`, paced
//! with absolute-deadline `clock_nanosleep` (no busy spinning, so on a 2-core machine it leaves
//! the other core to the agent). Each datagram starts with its send time (CLOCK_REALTIME ns,
//! u64 big-endian) and a sequence number (u64 big-endian), then `payload`.
//!
//! usage: udp_sender SRC_ADDR:PORT DST_ADDR:PORT INTERVAL_US COUNT(0 = until killed) [PAYLOAD]
use std::net::UdpSocket;

fn now(clock: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is valid for writing.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        return Err("usage: udp_sender SRC:PORT DST:PORT INTERVAL_US COUNT [PAYLOAD]".into());
    }
    let sock = UdpSocket::bind(&args[1]).map_err(|e| format!("bind {}: {e}", args[1]))?;
    sock.connect(&args[2]).map_err(|e| format!("connect {}: {e}", args[2]))?;
    let interval_ns: i64 = args[3].parse::<i64>().map_err(|e| format!("INTERVAL_US: {e}"))? * 1000;
    let count: u64 = args[4].parse().map_err(|e| format!("COUNT: {e}"))?;
    let payload = args.get(5).map(String::as_bytes).unwrap_or_default();
    let mut buf = vec![0u8; 16 + payload.len()];
    buf[16..].copy_from_slice(payload);
    let mut next = now(libc::CLOCK_MONOTONIC);
    let mut seq = 0u64;
    while count == 0 || seq < count {
        let t = now(libc::CLOCK_REALTIME);
        let ns = t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64;
        buf[..8].copy_from_slice(&ns.to_be_bytes());
        buf[8..16].copy_from_slice(&seq.to_be_bytes());
        // A full queue (ENOBUFS) or an unreachable peer is skipped, not fatal: pacing goes on.
        let _ = sock.send(&buf);
        seq += 1;
        next.tv_nsec += interval_ns;
        while next.tv_nsec >= 1_000_000_000 {
            next.tv_nsec -= 1_000_000_000;
            next.tv_sec += 1;
        }
        // SAFETY: valid timespec; absolute deadline, so drift does not accumulate.
        unsafe {
            libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &next, std::ptr::null_mut())
        };
    }
    Ok(())
}
