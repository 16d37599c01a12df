/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Flow table layout shared by the BPF programs (writers) and the exporter (reader,
 * telemetry/probe, through the skeleton's generated types). The pcap twin
 * (telemetry/probe/src/parse.rs and account.rs) implements the same rules in Rust; keep them in
 * step (the agreement test, telemetry/probe/src/agreement.rs, catches a drift).
 */
#ifndef CGLOOP_FLOW_H
#define CGLOOP_FLOW_H

#include "cgloop_stat.h"	/* enum cgloop_stat: the probe_stats indexes */

#define CGLOOP_SIZE_BUCKETS 16	/* log2 buckets of layer-3 size: 2^15..65535 is the last */
#define CGLOOP_IAT_BUCKETS 32	/* log2 buckets of inter-arrival ns: >= 2^31 ns lands in the last */
#define CGLOOP_RTP_MIN_SEQUENTIAL 4	/* in-order packets before a stream counts as RTP */
#define CGLOOP_RTP_MAX_DROPOUT 3000	/* RFC 3550 A.1 */
#define CGLOOP_RTP_MAX_MISORDER 100	/* RFC 3550 A.1 */

enum cgloop_direction {
	CGLOOP_DIR_INGRESS = 1,
	CGLOOP_DIR_EGRESS = 2,
};

/* Flow key: one direction of one flow on one interface. IPv4 addresses use bytes 0..3. */
struct flow_key {
	__u8 src_addr[16];
	__u8 dst_addr[16];
	__u16 src_port;		/* host order; 0 for protocols without ports */
	__u16 dst_port;
	__u32 ifindex;
	__u16 vlan_id;		/* outermost 802.1Q/802.1ad VID, 0 when untagged */
	__u8 ip_proto;
	__u8 family;		/* 4 or 6 */
	__u8 direction;		/* enum cgloop_direction */
	__u8 pad[3];
};

enum rtp_state {
	RTP_NONE = 0,
	RTP_PROBATION = 1,
	RTP_CONFIRMED = 2,
};

/* RFC 3550 A.1/A.8 receiver state of the flow's (first) RTP source. Counters are cumulative.
 * Fields every RTP packet writes come first (one cache line); event counters after them. */
struct rtp_stats {
	__u64 received;		/* packets of the confirmed SSRC, duplicates excluded */
	__u64 window;		/* bit i: (max_seq - i) was received */
	__u64 last_arrival_ns;
	__u64 jitter_ns_x16;	/* J of RFC 3550 6.4.1 in ns, scaled by 16 like the RFC's sample code */
	__u32 ssrc;
	__u32 last_rtp_ts;
	__u32 cycles;		/* wraps of the 16-bit sequence, << 16 */
	__u32 clock_rate_hz;
	__u16 max_seq;
	__u8 state;		/* enum rtp_state */
	__u8 probation;		/* in-order packets still needed to confirm */
	__u8 payload_type;
	__u8 pad[3];
	/* Written on events only (loss, reordering, marker, resync). */
	__u32 base_seq;		/* first extended sequence of the current run */
	__u64 expected_prior;	/* expected packets of sequence runs before a resync */
	__u64 reordered;
	__u64 gaps;
	__u64 duplicates;
	__u64 markers;
};

/* Cumulative per-flow state. Laid out hot to cold: the fields every packet writes share the
 * first 80 bytes, then the RTP state, then the histograms (one bucket line each per packet).
 * At 10 k+ flows every touched cache line is a miss, so the line count is the per-packet cost.
 * The size sum equals `bytes` (layer-3 lengths) and is not stored twice. */
struct flow_value {
	__u64 packets;
	__u64 bytes;		/* layer 3; also the size sum of the moments */
	__u64 last_ns;		/* bpf_ktime_get_ns() */
	__u64 size_sum_sq;
	__u64 burst_count;	/* runs of >= 2 packets within burst_gap_ns */
	__u32 ecn[4];		/* Not-ECT, ECT(1), ECT(0), CE by codepoint value 0..3 (wrap: deltas) */
	__u32 cur_burst;	/* packets in the current run */
	/* Interval-scoped fields: reset by the first packet after the exporter bumps sweep_epoch. */
	__u32 epoch;
	__u32 size_min;
	__u32 size_max;
	__u32 max_burst;
	__u8 tcp_flags;
	__u8 tcp_flags_life;	/* OR over the flow's life: FIN/RST end a flow early */
	__u8 last_dscp;
	__u8 pad;
	__u64 first_ns;		/* written once, when the flow is created */
	struct rtp_stats rtp;
	__u32 size_hist[CGLOOP_SIZE_BUCKETS];
	__u32 iat_hist[CGLOOP_IAT_BUCKETS];
};

#endif
