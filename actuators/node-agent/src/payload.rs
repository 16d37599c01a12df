//! Advanced ("payload") chain functions, run by the user-space worker behind AF_XDP
//! (src/advanced.rs) on whole Ethernet frames (CALVIN §III: advanced functions in user space).
//!
//! The set is extensible: a function is declared in the catalogue (a message in
//! `ChainFunction.function` with kind FUNCTION_KIND_ADVANCED), implements [`PayloadFn`] and
//! gets a line in [`build`]. Implemented: `dpi`, a payload pattern tagger/filter for cloud gaming (find a byte pattern in
//! the first `depth` bytes of the UDP/TCP payload — e.g. a game's input or session-control
//! message marker, or an RTP payload type byte — then set the packet's DSCP so the network
//! prioritises it, or drop it).
use std::sync::atomic::AtomicU64;

use cgloop_proto::v1::chain_function::Function;
use cgloop_proto::v1::dpi::{OnMatch, Pattern};

use crate::error::{AgentError, AgentResult};
use crate::invalid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not matched: on to the next function.
    Pass,
    /// Matched and handled in place: on to the next function.
    Matched,
    /// Matched and dropped.
    Drop,
}

pub trait PayloadFn: Send + Sync {
    /// Runs on one frame in place.
    fn run(&self, frame: &mut [u8]) -> Verdict;
    /// The function with its parameters as given (GetState reads them back).
    fn function(&self) -> Function;
}

/// Per-function counters of the worker.
#[derive(Debug, Default)]
pub struct Counters {
    pub packets: AtomicU64,
    pub matched: AtomicU64,
    pub dropped: AtomicU64,
}

/// Builds an advanced function from its request entry (parameters already checked against
/// the catalogue's declared values), or says why not.
pub fn build(f: &Function, pos: usize) -> AgentResult<Box<dyn PayloadFn>> {
    match f {
        Function::Dpi(d) => Ok(Box::new(Dpi::new(d, pos)?)),
        other => Err(AgentError::Unimplemented(format!(
            "chain function #{pos} {:?}: not a user-space function",
            cgloop_proto::catalogue::spec(other).name
        ))),
    }
}

/// Where the L4 payload of an Ethernet frame starts, and where its IP header is.
struct L4 {
    l3: usize,
    ipv6: bool,
    payload: usize,
}

fn locate(frame: &[u8]) -> Option<L4> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let l3 = 14;
    let (ipv6, proto, l4) = match ethertype {
        0x0800 => {
            let ihl = (*frame.get(l3)? & 0x0f) as usize * 4;
            if ihl < 20 || frame.len() < l3 + ihl {
                return None;
            }
            let frag = u16::from_be_bytes([frame[l3 + 6], frame[l3 + 7]]) & 0x1fff;
            if frag != 0 {
                return None;
            }
            (false, frame[l3 + 9], l3 + ihl)
        }
        0x86dd => (true, *frame.get(l3 + 6)?, l3 + 40),
        _ => return None,
    };
    let payload = match proto {
        17 => l4 + 8,
        6 => l4 + ((*frame.get(l4 + 12)? >> 4) as usize) * 4,
        _ => return None,
    };
    (payload <= frame.len()).then_some(L4 { l3, ipv6, payload })
}

fn sum16(data: &[u8], mut sum: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Computes the UDP/TCP checksum of the frame in full. Needed on every frame the worker sends
/// on: a locally generated packet reaches tc egress with checksum offload pending
/// (CHECKSUM_PARTIAL: the field holds only the pseudo-header sum), and the skb AF_XDP builds
/// on TX has no offload state left, so the kernel would send the partial sum as is.
pub fn finish_l4_checksum(frame: &mut [u8]) {
    let Some(ethertype) = frame.get(12..14).map(|b| u16::from_be_bytes([b[0], b[1]])) else { return };
    let l3 = 14;
    let (proto, l4, l4_len, pseudo) = match ethertype {
        0x0800 if frame.len() >= l3 + 20 => {
            let ihl = (frame[l3] & 0x0f) as usize * 4;
            let total = u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]) as usize;
            if ihl < 20 || total < ihl || frame.len() < l3 + total {
                return;
            }
            if u16::from_be_bytes([frame[l3 + 6], frame[l3 + 7]]) & 0x3fff != 0 {
                return; // fragments: the checksum spans datagrams
            }
            let proto = frame[l3 + 9];
            let len = total - ihl;
            let mut p = sum16(&frame[l3 + 12..l3 + 20], 0);
            p += proto as u32 + len as u32;
            (proto, l3 + ihl, len, p)
        }
        0x86dd if frame.len() >= l3 + 40 => {
            let len = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]) as usize;
            if frame.len() < l3 + 40 + len {
                return;
            }
            let proto = frame[l3 + 6];
            let mut p = sum16(&frame[l3 + 8..l3 + 40], 0);
            p += proto as u32 + len as u32;
            (proto, l3 + 40, len, p)
        }
        _ => return,
    };
    let field = match proto {
        17 if l4_len >= 8 => l4 + 6,
        6 if l4_len >= 20 => l4 + 16,
        _ => return,
    };
    frame[field] = 0;
    frame[field + 1] = 0;
    let mut c = fold(sum16(&frame[l4..l4 + l4_len], pseudo));
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
}

/// Rewrites the DSCP of the frame's IP header (IPv4: incremental checksum, RFC 1624).
fn set_dscp(frame: &mut [u8], at: &L4, dscp: u8) {
    let l3 = at.l3;
    if at.ipv6 {
        let tc = ((frame[l3] & 0x0f) << 4) | (frame[l3 + 1] >> 4);
        let tc = (tc & 0x03) | (dscp << 2);
        frame[l3] = (frame[l3] & 0xf0) | (tc >> 4);
        frame[l3 + 1] = (frame[l3 + 1] & 0x0f) | (tc << 4);
        return;
    }
    let old = frame[l3 + 1];
    let new = (old & 0x03) | (dscp << 2);
    if old == new {
        return;
    }
    let old_word = u16::from_be_bytes([frame[l3], old]);
    let new_word = u16::from_be_bytes([frame[l3], new]);
    let check = u16::from_be_bytes([frame[l3 + 10], frame[l3 + 11]]);
    // HC' = ~(~HC + ~m + m')
    let mut sum = (!check as u32) + (!old_word as u32) + new_word as u32;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = !(sum as u16);
    frame[l3 + 1] = new;
    frame[l3 + 10..l3 + 12].copy_from_slice(&check.to_be_bytes());
}

/// `dpi`: the pattern as text or hex, depth (bytes of payload searched, default 256), then
/// mark_dscp or drop (cgloop.v1.Dpi).
pub struct Dpi {
    finder: memchr::memmem::Finder<'static>,
    depth: usize,
    mark: Option<u8>,
    given: cgloop_proto::v1::Dpi,
}

fn hex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

impl Dpi {
    pub const MAX_PATTERN: usize = 64;

    /// The declared values (pattern lengths, depth, DSCP, a pattern and an action set) are the
    /// catalogue's; what it cannot say is checked here (hex digits, the pattern's bytes).
    fn new(d: &cgloop_proto::v1::Dpi, pos: usize) -> AgentResult<Self> {
        if let Err(v) = cgloop_proto::catalogue::check(&Function::Dpi(d.clone())) {
            invalid!("chain function #{pos} \"dpi\": {v}");
        }
        let pattern = match &d.pattern {
            Some(Pattern::Text(p)) => p.as_bytes().to_vec(),
            Some(Pattern::Hex(h)) => match hex(h) {
                Some(b) => b,
                None => invalid!("chain function #{pos} \"dpi\": hex {h:?} is not hex bytes (two digits each)"),
            },
            None => invalid!("chain function #{pos} \"dpi\": pattern: set one of text, hex"),
        };
        if pattern.is_empty() || pattern.len() > Self::MAX_PATTERN {
            invalid!("chain function #{pos} \"dpi\": the pattern must have 1..{} bytes", Self::MAX_PATTERN);
        }
        let depth = d.depth.unwrap_or(256) as usize;
        let mark = match d.on_match {
            Some(OnMatch::MarkDscp(dscp)) => Some(dscp as u8),
            Some(OnMatch::Drop(_)) => None,
            None => invalid!("chain function #{pos} \"dpi\": on_match: set one of mark_dscp, drop"),
        };
        Ok(Self { finder: memchr::memmem::Finder::new(&pattern).into_owned(), depth, mark, given: d.clone() })
    }

    /// Whether the frame's payload holds the pattern (and where its headers are).
    fn matches(&self, frame: &[u8]) -> Option<L4> {
        let at = locate(frame)?;
        let end = frame.len().min(at.payload + self.depth);
        self.finder.find(&frame[at.payload..end]).map(|_| at)
    }
}

impl PayloadFn for Dpi {
    fn run(&self, frame: &mut [u8]) -> Verdict {
        match (self.matches(frame), self.mark) {
            (None, _) => Verdict::Pass,
            (Some(at), Some(dscp)) => {
                set_dscp(frame, &at, dscp);
                Verdict::Matched
            }
            (Some(_), None) => Verdict::Drop,
        }
    }

    fn function(&self) -> Function {
        Function::Dpi(self.given.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cgloop_proto::v1::{Acl, DpiDrop};

    fn dpi(pattern: Option<Pattern>, depth: Option<u32>, on_match: Option<OnMatch>) -> AgentResult<Box<dyn PayloadFn>> {
        build(&Function::Dpi(cgloop_proto::v1::Dpi { pattern, depth, on_match }), 2)
    }

    fn text(p: &str) -> Option<Pattern> {
        Some(Pattern::Text(p.into()))
    }

    fn hex_of(p: &str) -> Option<Pattern> {
        Some(Pattern::Hex(p.into()))
    }

    /// Ethernet + IPv4 (valid checksum) + UDP + payload.
    fn udp_frame(payload: &[u8], tos: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12] = 0x08;
        let total = (20 + 8 + payload.len()) as u16;
        let mut ip = vec![0x45, tos];
        ip.extend_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        let mut sum: u32 = ip.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]) as u32).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x1f, 0x90, 0x23, 0x28]);
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    fn checksum_ok(frame: &[u8]) -> bool {
        let mut sum: u32 = frame[14..34].chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]) as u32).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    }

    #[test]
    fn marks_matching_payloads_with_a_valid_checksum_and_leaves_others() {
        let f = dpi(text("GAMEINPUT"), None, Some(OnMatch::MarkDscp(46))).unwrap();
        let mut hit = udp_frame(b"xx GAMEINPUT yy", 0x01);
        assert_eq!(f.run(&mut hit), Verdict::Matched);
        assert_eq!(hit[15], (46 << 2) | 0x01, "DSCP set, ECN kept");
        assert!(checksum_ok(&hit));
        let mut miss = udp_frame(b"bulk data", 0);
        let before = miss.clone();
        assert_eq!(f.run(&mut miss), Verdict::Pass);
        assert_eq!(miss, before);
    }

    #[test]
    fn l4_checksum_is_completed() {
        let mut f = udp_frame(b"hello world", 0);
        f[40] = 0x12; // a partial (pseudo-header only) sum, as CHECKSUM_PARTIAL leaves it
        f[41] = 0x34;
        finish_l4_checksum(&mut f);
        // Verify: pseudo header + UDP segment sums to 0xffff.
        let udp = &f[34..];
        let mut sum = sum16(&f[26..34], 0) + 17 + udp.len() as u32;
        sum = sum16(udp, sum);
        assert_eq!(fold(sum), 0, "checksum does not verify");
        let mut short = f[..20].to_vec();
        finish_l4_checksum(&mut short); // truncated: left alone, no panic
    }

    #[test]
    fn drop_action_and_depth() {
        let f = dpi(hex_of("cafe"), Some(4), Some(OnMatch::Drop(DpiDrop {}))).unwrap();
        assert_eq!(f.run(&mut udp_frame(&[0, 0xca, 0xfe, 0], 0)), Verdict::Drop);
        assert_eq!(f.run(&mut udp_frame(&[0, 0, 0, 0, 0xca, 0xfe], 0)), Verdict::Pass, "beyond depth");
        // Truncated or non-IP frames pass untouched, never panic.
        for n in 0..40 {
            let mut short = udp_frame(&[0xca, 0xfe], 0);
            short.truncate(n);
            f.run(&mut short);
        }
    }

    #[test]
    fn bad_parameters_are_named() {
        let mark = Some(OnMatch::MarkDscp(1));
        for (pattern, depth, on_match, needle) in [
            (None, None, mark.clone(), "pattern: set one of text, hex"),
            (text("a"), None, Some(OnMatch::MarkDscp(99)), "mark_dscp 99 is not within 0..63"),
            (text("a"), None, None, "on_match: set one of mark_dscp, drop"),
            (hex_of("zz"), None, mark.clone(), "not hex"),
            (hex_of("abc"), None, mark.clone(), "not hex"),
            (text(&"x".repeat(65)), None, mark.clone(), "is not within length 1..64"),
            (hex_of(&"ab".repeat(65)), None, mark.clone(), "is not within length 2..128"),
            (text(&"é".repeat(33)), None, mark.clone(), "is not within length 1..64"), // bytes
            (text("a"), Some(0), mark.clone(), "depth 0 is not within 1..1500"),
        ] {
            let e = dpi(pattern, depth, on_match).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(needle) && e.contains("#2"), "{needle}: {e}");
        }
        assert!(matches!(build(&Function::Acl(Acl::default()), 0), Err(AgentError::Unimplemented(_))));
        // GetState reads the function back as given.
        let given = cgloop_proto::v1::Dpi { pattern: text("GAME"), depth: Some(64), on_match: mark };
        let f = build(&Function::Dpi(given.clone()), 0).unwrap();
        assert_eq!(f.function(), Function::Dpi(given));
    }
}
