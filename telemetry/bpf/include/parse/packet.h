/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The shared parser, composed: Ethernet/VLAN -> IPv4 | IPv6 (+ extension headers) -> L4. */
#ifndef CGLOOP_PARSE_PACKET_H
#define CGLOOP_PARSE_PACKET_H

#include "cursor.h"
#include "eth.h"
#include "ipv4.h"
#include "ipv6.h"
#include "l4.h"

/* Parses one frame [data, data_end) of wire_len bytes (the frame as the interface saw it: a
 * non-linear skb holds more than data_end shows). hw_vlan is a tag the driver already took out
 * of the frame (tc: skb->vlan_tci), 0 if none. Returns 0, CGLOOP_STAT_NON_IP, or a failure
 * reason (CGLOOP_STAT_ERR_*); pk is zeroed first and holds whatever was parsed before a
 * failure (after CGLOOP_STAT_ERR_FRAGMENT: the addresses and the protocol). */
static __always_inline int cgl_parse_packet(void *data, void *data_end, __u32 wire_len,
					    __u16 hw_vlan, struct cgl_packet *pk)
{
	struct cgl_cursor c = { .pos = data, .end = data_end };
	__u16 proto = 0;
	int err;

	__builtin_memset(pk, 0, sizeof(*pk));
	pk->vlan_id = hw_vlan;
	err = cgl_parse_eth(&c, pk, &proto);
	if (err)
		return err;
	pk->l3_off = c.pos - data;
	c.avail = wire_len - (__u32)(c.pos - data);
	if (proto == CGL_ETH_P_IP)
		err = cgl_parse_ipv4(&c, pk);
	else if (proto == CGL_ETH_P_IPV6)
		err = cgl_parse_ipv6(&c, pk);
	else
		return CGLOOP_STAT_NON_IP;
	if (err)
		return err;
	return cgl_parse_l4(&c, pk);
}

#endif
