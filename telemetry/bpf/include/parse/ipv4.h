/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv4 (layer 3 of the shared parser). */
#ifndef CGLOOP_PARSE_IPV4_H
#define CGLOOP_PARSE_IPV4_H

#include "cursor.h"

/* On entry c->avail is what the frame holds from the IP header on; on success c->pos is the
 * transport header and c->avail the transport bytes the IP header promises. A non-first
 * fragment returns CGLOOP_STAT_ERR_FRAGMENT with the addresses and protocol filled in (no
 * ports: a caller may still classify it by addresses). */
static __always_inline int cgl_parse_ipv4(struct cgl_cursor *c, struct cgl_packet *pk)
{
	struct iphdr *ip = c->pos;
	__u32 ihl, len;

	if ((void *)(ip + 1) > c->end)
		return CGLOOP_STAT_ERR_IPV4_TRUNCATED;
	if (ip->version != 4)
		return CGLOOP_STAT_ERR_IP_VERSION_MISMATCH;
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return CGLOOP_STAT_ERR_IPV4_BAD_IHL;
	len = bpf_ntohs(ip->tot_len);
	if (len < ihl || len > c->avail)
		return CGLOOP_STAT_ERR_IP_BAD_LENGTH;
	if (c->pos + ihl > c->end)
		return CGLOOP_STAT_ERR_IPV4_TRUNCATED;
	__builtin_memcpy(pk->src, &ip->saddr, 4);
	__builtin_memcpy(pk->dst, &ip->daddr, 4);
	pk->family = 4;
	pk->tos = ip->tos;
	pk->l4_proto = ip->protocol;
	pk->l3_len = len;
	if (bpf_ntohs(ip->frag_off) & 0x1fff)
		return CGLOOP_STAT_ERR_FRAGMENT;
	c->pos += ihl;
	c->avail = len - ihl;
	return 0;
}

#endif
