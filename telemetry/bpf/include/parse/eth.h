/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Ethernet and up to CGL_MAX_VLAN_TAGS 802.1Q / 802.1ad tags (layer 2 of the shared parser). */
#ifndef CGLOOP_PARSE_ETH_H
#define CGLOOP_PARSE_ETH_H

#include "cursor.h"

#define CGL_ETH_P_IP 0x0800
#define CGL_ETH_P_IPV6 0x86DD
#define CGL_ETH_P_8021Q 0x8100
#define CGL_ETH_P_8021AD 0x88A8
#define CGL_MAX_VLAN_TAGS 2	/* 802.1ad + 802.1Q */

struct cgl_vlan_hdr {
	__be16 tci;
	__be16 proto;
};

/* Walks the Ethernet header and its VLAN tags. On success *proto is the layer-3 EtherType
 * (host order), c->pos the layer-3 header, and pk->vlan_id the outermost VID unless the
 * driver already moved a tag out of the frame (pk->vlan_id set by the caller). */
static __always_inline int cgl_parse_eth(struct cgl_cursor *c, struct cgl_packet *pk,
					 __u16 *proto)
{
	struct ethhdr *eth = c->pos;
	__u16 p;

	if ((void *)(eth + 1) > c->end)
		return CGLOOP_STAT_ERR_ETH_TRUNCATED;
	p = bpf_ntohs(eth->h_proto);
	c->pos = eth + 1;
#pragma unroll
	for (int i = 0; i < CGL_MAX_VLAN_TAGS; i++) {
		struct cgl_vlan_hdr *vh = c->pos;

		if (p != CGL_ETH_P_8021Q && p != CGL_ETH_P_8021AD)
			break;
		if ((void *)(vh + 1) > c->end)
			return CGLOOP_STAT_ERR_VLAN_TRUNCATED;
		if (!pk->vlan_id)
			pk->vlan_id = bpf_ntohs(vh->tci) & 0x0fff;
		p = bpf_ntohs(vh->proto);
		c->pos = vh + 1;
	}
	if (p == CGL_ETH_P_8021Q || p == CGL_ETH_P_8021AD)
		return CGLOOP_STAT_ERR_VLAN_TOO_DEEP;
	*proto = p;
	return 0;
}

#endif
