//! HTB qdiscs and classes over rtnetlink (netlink-packet-route for framing and parsing).
//!
//! netlink-packet-route has no HTB option types, so the two HTB structs (`tc_htb_glob`,
//! `tc_htb_opt`, include/uapi/linux/pkt_sched.h) are encoded here and carried as raw nested
//! attributes; everything else (messages, attributes, stats) is the library's.

use std::io;

use netlink_packet_core::{
    DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, NlaBuffer, NlasIterator,
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption, TcStats2};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

const TCA_HTB_PARMS: u16 = 1;
const TCA_HTB_INIT: u16 = 2;
const TCA_HTB_RATE64: u16 = 6;
const TCA_HTB_CEIL64: u16 = 7;
const TC_LINKLAYER_ETHERNET: u8 = 1;
/// psched ticks are 64 ns (PSCHED_SHIFT = 6 in the kernel).
const PSCHED_SHIFT: u32 = 6;
const HTB_VERSION: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum TcError {
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("kernel refused {what}: {source}")]
    Kernel {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot decode the kernel's answer to {what}: {detail}")]
    Decode { what: String, detail: String },
}

/// One HTB class as the kernel reports it (rates in bytes per second, as the kernel keeps them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelClass {
    pub handle: u32,
    pub parent: u32,
    pub rate_bytes: u64,
    pub ceil_bytes: u64,
    pub burst_bytes: u32,
    pub cburst_bytes: u32,
    pub prio: u32,
    pub packets: u64,
    pub bytes: u64,
    pub drops: u32,
    /// Times the class was over its rate (HTB's overlimits).
    pub overlimits: u32,
    /// Bytes and packets waiting in the class's queue now.
    pub backlog_bytes: u32,
    pub backlog_packets: u32,
}

/// The class parameters to program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassSpec {
    pub handle: u32,
    pub parent: u32,
    pub rate_bytes: u64,
    pub ceil_bytes: u64,
    pub burst_bytes: u32,
    pub cburst_bytes: u32,
    pub prio: u32,
}

/// The root HTB qdisc of an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelHtbRoot {
    pub handle: u32,
    pub default_minor: u32,
}

/// A blocking rtnetlink socket. One request at a time; calls take microseconds.
pub struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> Result<Self, TcError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(TcError::Socket)?;
        socket.bind_auto().map_err(TcError::Socket)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(TcError::Socket)?;
        // Extended acks carry the kernel's reason (e.g. "HTB: quantum too big").
        let _ = socket.set_ext_ack(true);
        Ok(Self { socket, seq: 0 })
    }

    /// Sends one request and collects every answer until the ACK or DONE.
    fn request(
        &mut self,
        what: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, TcError> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        self.socket.send(&buf, 0).map_err(TcError::Socket)?;

        let mut answers = Vec::new();
        let mut rx = Vec::with_capacity(64 * 1024);
        loop {
            rx.clear();
            self.socket.recv(&mut rx, 0).map_err(TcError::Socket)?;
            let mut offset = 0;
            while offset < rx.len() {
                let bytes = &rx[offset..];
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| {
                    TcError::Decode { what: what.to_string(), detail: e.to_string() }
                })?;
                let len = msg.header.length as usize;
                if len == 0 {
                    break;
                }
                offset += (len + 3) & !3;
                if msg.header.sequence_number != self.seq {
                    continue; // a late answer to an earlier request
                }
                match msg.payload {
                    NetlinkPayload::Error(err) => {
                        return match err.code {
                            None => Ok(answers),
                            Some(code) => Err(TcError::Kernel {
                                what: what.to_string(),
                                source: io::Error::from_raw_os_error(-code.get()),
                            }),
                        };
                    }
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::InnerMessage(inner) => answers.push(inner),
                    _ => {}
                }
            }
        }
    }

    /// Creates a veth pair `name` <-> `peer` in the agent's namespace.
    pub fn create_veth(&mut self, name: &str, peer: &str) -> Result<(), TcError> {
        use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo, LinkMessage};
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes.push(LinkAttribute::IfName(peer.to_string()));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        self.request(
            &format!("creating veth {name}/{peer}"),
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Deletes a link (and a veth's peer with it).
    pub fn delete_link(&mut self, ifindex: u32) -> Result<(), TcError> {
        use netlink_packet_route::link::LinkMessage;
        let mut msg = LinkMessage::default();
        msg.header.index = ifindex;
        self.request(&format!("deleting link {ifindex}"), RouteNetlinkMessage::DelLink(msg), NLM_F_REQUEST | NLM_F_ACK)?;
        Ok(())
    }

    /// Sets a link up.
    pub fn set_up(&mut self, ifindex: u32) -> Result<(), TcError> {
        use netlink_packet_route::link::{LinkFlags, LinkMessage};
        let mut msg = LinkMessage::default();
        msg.header.index = ifindex;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(&format!("setting link {ifindex} up"), RouteNetlinkMessage::SetLink(msg), NLM_F_REQUEST | NLM_F_ACK)?;
        Ok(())
    }

    /// The link's hardware address.
    pub fn mac(&mut self, ifindex: u32) -> Result<[u8; 6], TcError> {
        use netlink_packet_route::link::{LinkAttribute, LinkMessage};
        let mut msg = LinkMessage::default();
        msg.header.index = ifindex;
        let what = format!("reading the address of link {ifindex}");
        for answer in self.request(&what, RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST | NLM_F_ACK)? {
            if let RouteNetlinkMessage::NewLink(link) = answer {
                for a in link.attributes {
                    if let LinkAttribute::Address(b) = a {
                        if let Ok(mac) = <[u8; 6]>::try_from(b.as_slice()) {
                            return Ok(mac);
                        }
                    }
                }
            }
        }
        Err(TcError::Decode { what, detail: "no 6-byte IFLA_ADDRESS in the answer".into() })
    }

    /// Creates the root HTB qdisc, or changes the default class of the one in place (same
    /// handle: the kernel keeps the classes and their queues).
    pub fn replace_htb_root(&mut self, ifindex: u32, root: KernelHtbRoot) -> Result<(), TcError> {
        let mut msg = TcMessage::with_index(ifindex as i32);
        msg.header.handle = TcHandle::from(root.handle);
        msg.header.parent = TcHandle::ROOT;
        let mut glob = Vec::with_capacity(20);
        for v in [HTB_VERSION, 10, root.default_minor, 0, 0] {
            glob.extend_from_slice(&v.to_ne_bytes()); // version, rate2quantum, defcls, debug, direct_pkts
        }
        msg.attributes.push(TcAttribute::Kind("htb".into()));
        msg.attributes
            .push(TcAttribute::Options(vec![TcOption::Other(DefaultNla::new(TCA_HTB_INIT, glob))]));
        self.request(
            &format!("htb root {:x}: on ifindex {ifindex}", root.handle >> 16),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        Ok(())
    }

    /// Deletes the root qdisc (and with it every class).
    pub fn delete_root(&mut self, ifindex: u32) -> Result<(), TcError> {
        let mut msg = TcMessage::with_index(ifindex as i32);
        msg.header.parent = TcHandle::ROOT;
        self.request(
            &format!("delete root qdisc of ifindex {ifindex}"),
            RouteNetlinkMessage::DelQueueDiscipline(msg),
            NLM_F_REQUEST | NLM_F_ACK,
        )?;
        Ok(())
    }

    /// The interface's root HTB qdisc, if its root qdisc is HTB.
    pub fn htb_root(&mut self, ifindex: u32) -> Result<Option<KernelHtbRoot>, TcError> {
        let what = format!("dump qdiscs of ifindex {ifindex}");
        let answers = self.request(
            &what,
            RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(ifindex as i32)),
            NLM_F_REQUEST | NLM_F_DUMP,
        )?;
        for answer in answers {
            let RouteNetlinkMessage::NewQueueDiscipline(msg) = answer else { continue };
            if msg.header.index as u32 != ifindex || u32::from(msg.header.parent) != u32::MAX {
                continue;
            }
            if !msg.attributes.iter().any(|a| matches!(a, TcAttribute::Kind(k) if k == "htb")) {
                return Ok(None);
            }
            let mut default_minor = 0;
            for raw in htb_options(&msg) {
                if raw.kind == TCA_HTB_INIT && raw.value.len() >= 12 {
                    default_minor = u32_at(&raw.value, 8);
                }
            }
            return Ok(Some(KernelHtbRoot { handle: u32::from(msg.header.handle), default_minor }));
        }
        Ok(None)
    }

    /// Creates (`create`) or changes one class.
    pub fn set_class(&mut self, ifindex: u32, spec: &ClassSpec, create: bool) -> Result<(), TcError> {
        let mut msg = TcMessage::with_index(ifindex as i32);
        msg.header.handle = TcHandle::from(spec.handle);
        msg.header.parent = TcHandle::from(spec.parent);
        msg.attributes.push(TcAttribute::Kind("htb".into()));
        let mut opts = vec![TcOption::Other(DefaultNla::new(TCA_HTB_PARMS, htb_opt(spec)))];
        if spec.rate_bytes > u32::MAX as u64 {
            opts.push(TcOption::Other(DefaultNla::new(
                TCA_HTB_RATE64,
                spec.rate_bytes.to_ne_bytes().to_vec(),
            )));
        }
        if spec.ceil_bytes > u32::MAX as u64 {
            opts.push(TcOption::Other(DefaultNla::new(
                TCA_HTB_CEIL64,
                spec.ceil_bytes.to_ne_bytes().to_vec(),
            )));
        }
        msg.attributes.push(TcAttribute::Options(opts));
        let flags = if create {
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        } else {
            NLM_F_REQUEST | NLM_F_ACK
        };
        self.request(
            &format!("{} htb class {} on ifindex {ifindex}", if create { "add" } else { "change" }, handle_str(spec.handle)),
            RouteNetlinkMessage::NewTrafficClass(msg),
            flags,
        )?;
        Ok(())
    }

    pub fn delete_class(&mut self, ifindex: u32, handle: u32) -> Result<(), TcError> {
        let mut msg = TcMessage::with_index(ifindex as i32);
        msg.header.handle = TcHandle::from(handle);
        self.request(
            &format!("delete htb class {} on ifindex {ifindex}", handle_str(handle)),
            RouteNetlinkMessage::DelTrafficClass(msg),
            NLM_F_REQUEST | NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Every HTB class of the interface with its parameters and counters, read from the kernel.
    pub fn classes(&mut self, ifindex: u32) -> Result<Vec<KernelClass>, TcError> {
        let what = format!("dump classes of ifindex {ifindex}");
        let answers = self.request(
            &what,
            RouteNetlinkMessage::GetTrafficClass(TcMessage::with_index(ifindex as i32)),
            NLM_F_REQUEST | NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for answer in answers {
            let RouteNetlinkMessage::NewTrafficClass(msg) = answer else { continue };
            if !msg.attributes.iter().any(|a| matches!(a, TcAttribute::Kind(k) if k == "htb")) {
                continue;
            }
            out.push(decode_class(&msg).map_err(|detail| TcError::Decode {
                what: what.clone(),
                detail,
            })?);
        }
        out.sort_by_key(|c| c.handle);
        Ok(out)
    }
}

/// The nested attributes inside TCA_OPTIONS of an HTB message. The library hands unknown
/// kinds' options over as one raw attribute holding the nested list.
struct RawNla {
    kind: u16,
    value: Vec<u8>,
}

fn htb_options(msg: &TcMessage) -> Vec<RawNla> {
    let mut out = Vec::new();
    for attr in &msg.attributes {
        let TcAttribute::Options(opts) = attr else { continue };
        for opt in opts {
            let TcOption::Other(nla) = opt else { continue };
            let mut value = vec![0u8; netlink_packet_core::Nla::value_len(nla)];
            netlink_packet_core::Nla::emit_value(nla, &mut value);
            for inner in NlasIterator::new(&value[..]).flatten() {
                let inner: NlaBuffer<&[u8]> = inner;
                out.push(RawNla { kind: inner.kind(), value: inner.value().to_vec() });
            }
        }
    }
    out
}

fn decode_class(msg: &TcMessage) -> Result<KernelClass, String> {
    let mut class = KernelClass {
        handle: u32::from(msg.header.handle),
        parent: u32::from(msg.header.parent),
        rate_bytes: 0,
        ceil_bytes: 0,
        burst_bytes: 0,
        cburst_bytes: 0,
        prio: 0,
        packets: 0,
        bytes: 0,
        drops: 0,
        overlimits: 0,
        backlog_bytes: 0,
        backlog_packets: 0,
    };
    let mut buffer_ticks = 0;
    let mut cbuffer_ticks = 0;
    let mut parms = false;
    for raw in htb_options(msg) {
        match raw.kind {
            TCA_HTB_PARMS if raw.value.len() >= 44 => {
                let v = &raw.value;
                class.rate_bytes = u32_at(v, 8) as u64;
                class.ceil_bytes = u32_at(v, 20) as u64;
                buffer_ticks = u32_at(v, 24);
                cbuffer_ticks = u32_at(v, 28);
                class.prio = u32_at(v, 40);
                parms = true;
            }
            TCA_HTB_RATE64 if raw.value.len() >= 8 => class.rate_bytes = u64_at(&raw.value, 0),
            TCA_HTB_CEIL64 if raw.value.len() >= 8 => class.ceil_bytes = u64_at(&raw.value, 0),
            _ => {}
        }
    }
    if !parms {
        return Err(format!("class {} has no TCA_HTB_PARMS", handle_str(class.handle)));
    }
    class.burst_bytes = ticks_to_bytes(buffer_ticks, class.rate_bytes);
    class.cburst_bytes = ticks_to_bytes(cbuffer_ticks, class.ceil_bytes);
    for attr in &msg.attributes {
        match attr {
            TcAttribute::Stats2(stats) => {
                for s in stats {
                    match s {
                        TcStats2::Basic(b) => {
                            class.bytes = b.bytes;
                            class.packets = b.packets as u64;
                        }
                        TcStats2::Queue(q) => {
                            class.drops = q.drops;
                            class.overlimits = q.overlimits;
                            class.backlog_bytes = q.backlog;
                            class.backlog_packets = q.qlen;
                        }
                        _ => {}
                    }
                }
            }
            TcAttribute::Stats(s) if class.packets == 0 => {
                class.bytes = s.bytes;
                class.packets = s.packets as u64;
                class.drops = s.drops;
            }
            _ => {}
        }
    }
    Ok(class)
}

/// `struct tc_htb_opt`: two `tc_ratespec` (12 bytes each), buffer, cbuffer, quantum, level, prio.
fn htb_opt(spec: &ClassSpec) -> Vec<u8> {
    let mut v = Vec::with_capacity(44);
    for rate in [spec.rate_bytes, spec.ceil_bytes] {
        v.push(0); // cell_log
        v.push(TC_LINKLAYER_ETHERNET); // so the kernel needs no rate table
        v.extend_from_slice(&0u16.to_ne_bytes()); // overhead
        v.extend_from_slice(&0i16.to_ne_bytes()); // cell_align
        v.extend_from_slice(&0u16.to_ne_bytes()); // mpu
        v.extend_from_slice(&(rate.min(u32::MAX as u64) as u32).to_ne_bytes());
    }
    let buffer = bytes_to_ticks(spec.burst_bytes, spec.rate_bytes);
    let cbuffer = bytes_to_ticks(spec.cburst_bytes, spec.ceil_bytes);
    for x in [buffer, cbuffer, 0 /* quantum: from rate2quantum */, 0 /* level */, spec.prio] {
        v.extend_from_slice(&x.to_ne_bytes());
    }
    v
}

/// Burst in bytes -> time to send it at `rate` bytes/s, in psched ticks (what HTB stores).
pub fn bytes_to_ticks(bytes: u32, rate: u64) -> u32 {
    if rate == 0 {
        return 0;
    }
    let ns = bytes as u128 * 1_000_000_000 / rate as u128;
    (ns >> PSCHED_SHIFT).min(u32::MAX as u128) as u32
}

pub fn ticks_to_bytes(ticks: u32, rate: u64) -> u32 {
    let ns = (ticks as u128) << PSCHED_SHIFT;
    // Round to nearest: the tick conversion truncated on the way in.
    ((ns * rate as u128 + 500_000_000) / 1_000_000_000).min(u32::MAX as u128) as u32
}

pub fn handle_str(handle: u32) -> String {
    format!("{:x}:{:x}", handle >> 16, handle & 0xffff)
}

fn u32_at(v: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]])
}

fn u64_at(v: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&v[at..at + 8]);
    u64::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_round_trips_through_ticks() {
        for (burst, rate) in [(15_000u32, 1_250_000u64), (1_600, 125_000), (64_000, 125_000_000)] {
            let back = ticks_to_bytes(bytes_to_ticks(burst, rate), rate);
            let err = (back as i64 - burst as i64).abs();
            // One tick (64 ns) of the rate is the resolution.
            assert!(err as u64 <= rate * 64 / 1_000_000_000 + 1, "{burst} B at {rate} B/s -> {back}");
        }
    }

    #[test]
    fn htb_opt_layout_matches_the_kernel_struct() {
        let spec = ClassSpec {
            handle: 0x10010,
            parent: 0x10000,
            rate_bytes: 1_000_000,
            ceil_bytes: 2_000_000,
            burst_bytes: 10_000,
            cburst_bytes: 10_000,
            prio: 3,
        };
        let v = htb_opt(&spec);
        assert_eq!(v.len(), 44);
        assert_eq!(u32_at(&v, 8), 1_000_000);
        assert_eq!(u32_at(&v, 20), 2_000_000);
        assert_eq!(v[1], TC_LINKLAYER_ETHERNET);
        assert_eq!(u32_at(&v, 40), 3);
    }
}
