/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6 and its extension headers (layer 3 of the shared parser). */
#ifndef CGLOOP_PARSE_IPV6_H
#define CGLOOP_PARSE_IPV6_H

#include "cursor.h"

#define CGL_MAX_IPV6_EXT 6	/* extension headers walked before giving up */
#define CGL_IPPROTO_HOPOPTS 0
#define CGL_IPPROTO_ROUTING 43
#define CGL_IPPROTO_FRAGMENT 44
#define CGL_IPPROTO_AH 51
#define CGL_IPPROTO_DSTOPTS 60
#define CGL_IPPROTO_MH 135

static __always_inline int cgl_ipv6_is_ext(__u8 nh)
{
	return nh == CGL_IPPROTO_HOPOPTS || nh == CGL_IPPROTO_ROUTING ||
	       nh == CGL_IPPROTO_DSTOPTS || nh == CGL_IPPROTO_FRAGMENT || nh == CGL_IPPROTO_AH ||
	       nh == CGL_IPPROTO_MH;
}

/* Same contract as cgl_parse_ipv4; pk->l4_proto is the protocol after the extension headers
 * (RFC 8200 §4: hop-by-hop, routing, fragment, destination options, AH (RFC 4302, length in
 * 4-byte units), mobility). */
static __always_inline int cgl_parse_ipv6(struct cgl_cursor *c, struct cgl_packet *pk)
{
	struct ipv6hdr *ip6 = c->pos;
	__u32 len, avail;
	__u8 nh;

	if ((void *)(ip6 + 1) > c->end)
		return CGLOOP_STAT_ERR_IPV6_TRUNCATED;
	if (ip6->version != 6)
		return CGLOOP_STAT_ERR_IP_VERSION_MISMATCH;
	len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
	if (len > c->avail)
		return CGLOOP_STAT_ERR_IP_BAD_LENGTH;
	__builtin_memcpy(pk->src, &ip6->saddr, 16);
	__builtin_memcpy(pk->dst, &ip6->daddr, 16);
	pk->family = 6;
	pk->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
	pk->l3_len = len;
	nh = ip6->nexthdr;
	c->pos = ip6 + 1;
	avail = len - sizeof(*ip6);
#pragma unroll
	for (int i = 0; i < CGL_MAX_IPV6_EXT; i++) {
		__u8 *ext = c->pos;
		__u32 elen;

		if (!cgl_ipv6_is_ext(nh))
			break;
		if ((void *)(ext + 8) > c->end)
			return CGLOOP_STAT_ERR_IPV6_EXT_TRUNCATED;
		if (nh == CGL_IPPROTO_FRAGMENT) {
			if (((ext[2] << 8) | ext[3]) & 0xfff8) {
				pk->l4_proto = ext[0];
				return CGLOOP_STAT_ERR_FRAGMENT;
			}
			elen = 8;
		} else if (nh == CGL_IPPROTO_AH) {
			elen = (ext[1] + 2) * 4;
		} else {
			elen = (ext[1] + 1) * 8;
		}
		if (elen > avail)
			return CGLOOP_STAT_ERR_IPV6_EXT_TRUNCATED;
		nh = ext[0];
		c->pos += elen;
		avail -= elen;
	}
	if (cgl_ipv6_is_ext(nh))
		return CGLOOP_STAT_ERR_IPV6_EXT_TOO_DEEP;
	pk->l4_proto = nh;
	c->avail = avail;
	return 0;
}

#endif
