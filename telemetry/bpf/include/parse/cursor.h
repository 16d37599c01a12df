/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The packet parser shared by the flow probe (telemetry/bpf/flow_probe.bpf.c) and the node
 * agent's datapath (actuators/node-agent/bpf/agent.bpf.c): one header per protocol layer
 * (eth.h, ipv4.h, ipv6.h, l4.h), composed by packet.h. Each layer reads through a cursor,
 * checks its bounds against data_end before every read (the verifier's rule) and against the
 * length the outer header promises (the wire's rule), and returns 0 or the failure reason
 * (enum cgloop_stat), never counting it: the caller decides what a failure costs.
 * Needs vmlinux.h (CO-RE types) and bpf_endian.h included first.
 */
#ifndef CGLOOP_PARSE_CURSOR_H
#define CGLOOP_PARSE_CURSOR_H

#include "../cgloop_stat.h"

/* Where the parser stands in the frame. */
struct cgl_cursor {
	void *pos;
	void *end;		/* data_end: the last readable byte + 1 */
	__u32 avail;		/* bytes the enclosing header promises from pos on */
};

/* What the layers found; the flow key fields of both users come from here. */
struct cgl_packet {
	__u8 src[16];		/* IPv4 uses bytes 0..3 */
	__u8 dst[16];
	__u16 sport;		/* host order; 0 for protocols without ports */
	__u16 dport;
	__u16 vlan_id;		/* outermost 802.1Q/802.1ad VID (or the offloaded tag), 0 if none */
	__u16 l3_off;		/* IP header offset from the frame start */
	__u32 l3_len;		/* IPv4 total length / IPv6 header + payload length */
	__u8 family;		/* 4 or 6 */
	__u8 l4_proto;		/* after IPv6 extension headers */
	__u8 tos;		/* IPv4 TOS / IPv6 traffic class: DSCP << 2 | ECN */
	__u8 tcp_flags;
	__u16 udp_len;		/* UDP length field, 0 for other protocols */
	void *l4;		/* transport header (bounds-checked for its fixed part only) */
};

#endif
