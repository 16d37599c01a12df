//! The two host facts every component reads the same way: the record clock and interface
//! indexes. Records carry `timestamp_ns` as Unix-epoch nanoseconds (RecordHeader in
//! proto/cgloop/v1/common.proto); the probe, the INT collector and the node agent all stamp them
//! here, so a change of clock is made once. Interfaces are named by operators and keyed by index
//! in the kernel (BPF maps, netlink); the probe and the agent resolve them here.
use std::ffi::CString;
use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock time as Unix-epoch nanoseconds (CLOCK_REALTIME); 0 if the clock is before 1970.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Index of the interface `name` in this network namespace. Errors: `InvalidInput` for a name
/// with a NUL byte, `NotFound` when no such interface exists.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} contains NUL"),
        )
    })?;
    // SAFETY: c is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("interface {name:?} not found in this network namespace (see `ip link`)"),
        ));
    }
    Ok(idx)
}

/// Name of the interface `ifindex`, or `ifindex<N>` when it no longer exists (for messages).
pub fn ifname(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return format!("ifindex{ifindex}");
    }
    // SAFETY: on success buf holds a NUL-terminated name.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_resolves_both_ways() {
        let lo = ifindex("lo").expect("every network namespace has lo");
        assert_eq!(ifname(lo), "lo");
    }

    #[test]
    fn unknown_and_malformed_names_are_refused_by_kind() {
        let e = ifindex("cgl-no-such0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("cgl-no-such0"), "{e}");
        assert_eq!(
            ifindex("a\0b").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(ifname(u32::MAX), format!("ifindex{}", u32::MAX));
    }

    #[test]
    fn clock_is_unix_epoch_nanoseconds() {
        // 2020-01-01 in ns: a clock in seconds or on CLOCK_MONOTONIC would be far below it.
        assert!(now_ns() > 1_577_836_800_000_000_000);
    }
}
