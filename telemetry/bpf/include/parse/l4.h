/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* TCP, UDP and ICMP (layer 4 of the shared parser): ports, flags, lengths. */
#ifndef CGLOOP_PARSE_L4_H
#define CGLOOP_PARSE_L4_H

#include "cursor.h"

#define CGL_IPPROTO_ICMP 1
#define CGL_IPPROTO_TCP 6
#define CGL_IPPROTO_UDP 17
#define CGL_IPPROTO_ICMPV6 58

/* c->pos is the transport header, c->avail the bytes the IP header promises for it. Other
 * protocols are accepted without ports. */
static __always_inline int cgl_parse_l4(struct cgl_cursor *c, struct cgl_packet *pk)
{
	pk->l4 = c->pos;
	if (pk->l4_proto == CGL_IPPROTO_TCP) {
		struct tcphdr *tcp = c->pos;

		if ((void *)(tcp + 1) > c->end || c->avail < sizeof(*tcp))
			return CGLOOP_STAT_ERR_TCP_TRUNCATED;
		if (tcp->doff < 5 || tcp->doff * 4 > c->avail)
			return CGLOOP_STAT_ERR_TCP_BAD_OFFSET;
		pk->sport = bpf_ntohs(tcp->source);
		pk->dport = bpf_ntohs(tcp->dest);
		pk->tcp_flags = ((__u8 *)tcp)[13];
	} else if (pk->l4_proto == CGL_IPPROTO_UDP) {
		struct udphdr *udp = c->pos;
		__u32 ulen;

		if ((void *)(udp + 1) > c->end || c->avail < sizeof(*udp))
			return CGLOOP_STAT_ERR_UDP_TRUNCATED;
		ulen = bpf_ntohs(udp->len);
		if (ulen < sizeof(*udp) || ulen > c->avail)
			return CGLOOP_STAT_ERR_UDP_BAD_LENGTH;
		pk->sport = bpf_ntohs(udp->source);
		pk->dport = bpf_ntohs(udp->dest);
		pk->udp_len = ulen;
	} else if (pk->l4_proto == CGL_IPPROTO_ICMP || pk->l4_proto == CGL_IPPROTO_ICMPV6) {
		if (c->pos + 4 > c->end || c->avail < 4)
			return CGLOOP_STAT_ERR_ICMP_TRUNCATED;
	}
	return 0;
}

#endif
