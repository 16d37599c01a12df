//! Steering reports to workers by their *inner* flow instead of by their sender.
//!
//! SO_REUSEPORT picks a socket by the datagram's 4-tuple, i.e. by reporting switch. With
//! per-hop reports (v0.5 postcards, INT-MX) every switch on a flow's path reports it, so one
//! flow's hops would land on different workers, each assembling part of the path. A classic BPF
//! program attached with SO_ATTACH_REUSEPORT_CBPF runs on the UDP payload (the kernel pulls the
//! UDP header first: net/core/sock_reuseport.c, run_bpf_filter) and returns the socket index:
//! here a hash of the inner packet's IP addresses, found at the offsets of the report formats
//! (Telemetry Report v0.5 nproto 0/1/2, v1.0, v2.0 first individual report with InType 3/4/5,
//! Ethernet with up to two VLAN tags). Anything else (TLV inner contents, truncated packets)
//! returns an out-of-range index, and the kernel falls back to its 4-tuple hash.
//!
//! Addresses only, not ports: the ports' offset depends on the IPv4 IHL, which classic BPF
//! can load only at absolute offsets. One flow always maps to one worker, which is what the
//! state needs; flows between the same two hosts share a worker.

use anyhow::{bail, Result};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const LDB_ABS: u16 = 0x30; // A = pkt[k] (byte)
const LDH_IND: u16 = 0x48; // A = pkt[X + k] (half word)
const LDW_IND: u16 = 0x40; // A = pkt[X + k] (word)
const LDX_IMM: u16 = 0x01; // X = k
const LDX_MEM: u16 = 0x61; // X = M[k]
const ST: u16 = 0x02; // M[k] = A
const RSH_K: u16 = 0x74;
const LSH_K: u16 = 0x64;
const AND_K: u16 = 0x54;
const ADD_K: u16 = 0x04;
const MUL_K: u16 = 0x24;
const MOD_K: u16 = 0x94;
const XOR_X: u16 = 0xac;
const TAX: u16 = 0x07;
const TXA: u16 = 0x87;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const RET_A: u16 = 0x16;
const RET_K: u16 = 0x06;

/// Instruction with symbolic jump targets ("" = the next instruction).
enum I {
    S(u16, u32),
    J(u16, u32, &'static str, &'static str),
    Ja(&'static str),
    L(&'static str),
}

/// The steering program for `n` sockets (n >= 2).
pub fn program(n: u32) -> Vec<libc::sock_filter> {
    use I::*;
    let src = [
        S(LDB_ABS, 0), S(RSH_K, 4),
        J(JEQ_K, 2, "v20", ""), J(JEQ_K, 1, "v10", ""), J(JEQ_K, 0, "v05", "fail"),
        // v0.5: 12-byte fixed header, then nothing / 12-byte drop / 16-byte local header.
        L("v05"), S(LDB_ABS, 0), S(AND_K, 0x0f),
        J(JEQ_K, 0, "v05_0", ""), J(JEQ_K, 1, "v05_1", ""), J(JEQ_K, 2, "v05_2", "fail"),
        L("v05_0"), S(LDX_IMM, 12), Ja("eth"),
        L("v05_1"), S(LDX_IMM, 24), Ja("eth"),
        L("v05_2"), S(LDX_IMM, 28), Ja("eth"),
        // v1.0: header length in words in the low nibble of byte 0.
        L("v10"), S(LDB_ABS, 0), S(AND_K, 0x0f), S(LSH_K, 2), S(TAX, 0), Ja("eth"),
        // v2.0 §3.2/§3.3: group header 8, report header 4; RepType 1 adds 8 + MD Length words.
        L("v20"), S(LDB_ABS, 8), S(RSH_K, 4),
        J(JEQ_K, 1, "v20_int", ""), J(JEQ_K, 0, "v20_inner", "fail"),
        L("v20_inner"), S(LDX_IMM, 12), Ja("v20_type"),
        L("v20_int"), S(LDB_ABS, 10), S(LSH_K, 2), S(ADD_K, 20), S(TAX, 0),
        L("v20_type"), S(LDB_ABS, 8), S(AND_K, 0x0f),
        J(JEQ_K, 3, "eth", ""), J(JEQ_K, 4, "ipv4", ""), J(JEQ_K, 5, "ipv6", "fail"),
        // Ethernet at X, up to two VLAN tags.
        L("eth"), S(LDH_IND, 12),
        J(JEQ_K, 0x8100, "vlan", ""), J(JEQ_K, 0x88a8, "vlan", "eth_type"),
        L("vlan"), S(TXA, 0), S(ADD_K, 4), S(TAX, 0), S(LDH_IND, 12),
        J(JEQ_K, 0x8100, "vlan2", ""), J(JEQ_K, 0x88a8, "vlan2", "eth_type"),
        L("vlan2"), S(TXA, 0), S(ADD_K, 4), S(TAX, 0), S(LDH_IND, 12),
        L("eth_type"), J(JEQ_K, 0x0800, "eth4", ""), J(JEQ_K, 0x86dd, "eth6", "fail"),
        L("eth4"), S(TXA, 0), S(ADD_K, 14), S(TAX, 0), Ja("ipv4"),
        L("eth6"), S(TXA, 0), S(ADD_K, 14), S(TAX, 0), Ja("ipv6"),
        // IPv4 at X: source ^ destination address.
        L("ipv4"), S(LDW_IND, 16), S(ST, 0), S(LDW_IND, 12), S(LDX_MEM, 0), S(XOR_X, 0), Ja("hash"),
        // IPv6 at X: low words of the addresses.
        L("ipv6"), S(LDW_IND, 36), S(ST, 0), S(LDW_IND, 20), S(LDX_MEM, 0), S(XOR_X, 0),
        // Mix (x ^= x >> 16; x *= 0x45d9f3b; x ^= x >> 16), then the socket index.
        L("hash"), S(ST, 1), S(RSH_K, 16), S(LDX_MEM, 1), S(XOR_X, 0), S(MUL_K, 0x045d_9f3b),
        S(ST, 1), S(RSH_K, 16), S(LDX_MEM, 1), S(XOR_X, 0), S(MOD_K, n.max(1)), S(RET_A, 0),
        // Not recognised: an index past the group, so the kernel uses its own hash.
        L("fail"), S(RET_K, u32::MAX),
    ];
    let mut labels = std::collections::HashMap::new();
    let mut pc = 0usize;
    for i in &src {
        match i {
            L(name) => {
                labels.insert(*name, pc);
            }
            _ => pc += 1,
        }
    }
    let mut out = Vec::with_capacity(pc);
    for i in &src {
        let at = out.len();
        // Forward distance from the next instruction; "" is the next instruction itself.
        let rel = |l: &str| if l.is_empty() { 0 } else { labels[l] - (at + 1) };
        match i {
            L(_) => continue,
            S(code, k) => out.push(libc::sock_filter { code: *code, jt: 0, jf: 0, k: *k }),
            J(code, k, t, f) => out.push(libc::sock_filter { code: *code, jt: rel(t) as u8, jf: rel(f) as u8, k: *k }),
            Ja(t) => out.push(libc::sock_filter { code: JA, jt: 0, jf: 0, k: rel(t) as u32 }),
        }
    }
    out
}

/// Attach the steering program to the reuseport group of `sock` (one of `n` bound sockets;
/// socket indexes follow bind order).
pub fn attach(sock: &UdpSocket, n: u32) -> Result<()> {
    if n < 2 {
        return Ok(());
    }
    let mut prog = program(n);
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
    // SAFETY: the kernel copies the program during the call; `prog` outlives it.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!("SO_ATTACH_REUSEPORT_CBPF: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_stay_inside_the_program() {
        let p = program(4);
        for (pc, i) in p.iter().enumerate() {
            if i.code == JEQ_K {
                assert!(pc + 1 + usize::from(i.jt) < p.len() && pc + 1 + usize::from(i.jf) < p.len());
            }
            if i.code == JA {
                assert!(pc + 1 + (i.k as usize) < p.len());
            }
        }
        assert_eq!(p.last().map(|i| (i.code, i.k)), Some((RET_K, u32::MAX)));
    }
}
