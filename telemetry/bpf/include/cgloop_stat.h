/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packet fates and parse failures by reason. The flow probe counts them in its per-CPU
 * probe_stats array (the exporter mirrors the order in telemetry/probe/src/bpf_types.rs, the
 * pcap twin in telemetry/probe/src/parse.rs); the shared parser (include/parse/) returns the
 * failure reasons, so the node agent's datapath fails on the same frames for the same reasons.
 * Append only: the indexes are an ABI with the exporter.
 */
#ifndef CGLOOP_STAT_H
#define CGLOOP_STAT_H

enum cgloop_stat {
	CGLOOP_STAT_PACKETS = 0,	/* every packet seen: filled by the exporter from if_stats */
	CGLOOP_STAT_ACCOUNTED,		/* packets added to a flow: derived by the exporter */
	CGLOOP_STAT_NON_IP,		/* not IPv4/IPv6 (ARP, LLDP ...): not a failure */
	CGLOOP_STAT_FLOWS_CREATED,	/* new flow-table entries */
	CGLOOP_STAT_MAP_UPDATE_FAILED,	/* bpf_map_update_elem refused a new flow */
	CGLOOP_STAT_RTP_CONFIRMED,	/* flows confirmed as RTP */
	CGLOOP_STAT_ERR_ETH_TRUNCATED,
	CGLOOP_STAT_ERR_VLAN_TRUNCATED,
	CGLOOP_STAT_ERR_VLAN_TOO_DEEP,
	CGLOOP_STAT_ERR_IPV4_TRUNCATED,
	CGLOOP_STAT_ERR_IPV4_BAD_IHL,
	CGLOOP_STAT_ERR_IP_BAD_LENGTH,	/* IPv4 total / IPv6 payload length beyond the frame */
	CGLOOP_STAT_ERR_IPV6_TRUNCATED,
	CGLOOP_STAT_ERR_IPV6_EXT_TRUNCATED,
	CGLOOP_STAT_ERR_IPV6_EXT_TOO_DEEP,
	CGLOOP_STAT_ERR_IP_VERSION_MISMATCH,
	CGLOOP_STAT_ERR_FRAGMENT,	/* non-first fragment: no transport header to key on */
	CGLOOP_STAT_ERR_TCP_TRUNCATED,
	CGLOOP_STAT_ERR_TCP_BAD_OFFSET,
	CGLOOP_STAT_ERR_UDP_TRUNCATED,
	CGLOOP_STAT_ERR_UDP_BAD_LENGTH,	/* UDP length < 8 (incl. 0) or beyond the IP payload */
	CGLOOP_STAT_ERR_ICMP_TRUNCATED,
	CGLOOP_STAT__MAX,
};

#endif
