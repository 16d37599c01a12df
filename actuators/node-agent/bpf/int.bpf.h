/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * INT source (postcards): per sampled packet leaving a monitored class, one event to user
 * space with what a Telemetry Report v2.0 needs (src/int_export encodes and sends it).
 *
 *   int_dequeued  called by the queue monitor's dequeue tracepoint (bpf/qmon.bpf.h) for every
 *                 packet it stamped at enqueue: the hop latency is the qdisc sojourn (enqueue to
 *                 dequeue), the queue is the packet's HTB class, its occupancy the class backlog
 *                 left behind the packet.
 *
 * A packet is a candidate when its class's 1-in-`sample_every` counter comes round, or when
 * its sojourn reaches `report_over_ns`. Candidates pass a global rate cap (GCRA: at most one
 * per `interval_ns`, bursts of `burst_ns`), then get their IP and transport headers copied
 * out of the skb, checked by the shared parser (telemetry/bpf/include/parse), and are
 * submitted to the ring buffer. Every outcome is counted in int_counters.
 *
 * Included by qmon.bpf.h (it needs struct qmon_class and the monitor's slots).
 */
#ifndef CGLOOP_INT_BPF_H
#define CGLOOP_INT_BPF_H

/* Bytes of the packet (from its IP header) an event carries at most: IPv6 with a few
 * extension headers plus a TCP header with options. */
#define INT_HDR_BYTES 128
/* The parser's cursor may run this far past the start of the copy before its bounds checks
 * stop it (IPv6: 40 + 6 extension headers of at most 2048 bytes, then a 20-byte TCP header):
 * the scratch buffer is that large so the verifier can prove every read in bounds. */
#define INT_SCRATCH_BYTES 16384

/* Why a packet was reported (int_event.reason bits). */
#define INT_R_SAMPLED 1
#define INT_R_LATENCY 2

/* int_counters indices (src/int_export/mod.rs reads them as the same names). */
enum int_counter {
	INT_C_CANDIDATES = 0,	/* sampled or over the latency threshold */
	INT_C_CAPPED = 1,	/* refused by the rate cap */
	INT_C_RINGBUF_FULL = 2,	/* ring buffer full: user space fell behind */
	INT_C_UNPARSED = 3,	/* not IPv4/IPv6, a fragment, or headers not in the linear part */
	INT_C_EMITTED = 4,	/* events submitted */
	INT_C_COUNT = 5,
};

struct int_cfg {
	__u64 report_over_ns;	/* 0: only sampling */
	__u64 interval_ns;	/* rate cap: 1e9 / max_reports_per_s */
	__u64 burst_ns;		/* rate cap: how far ahead of now the schedule may run */
	__u32 sample_every;	/* 1 in N packets per class; 0: no sampling */
	__u32 enabled;
};

struct int_rate {
	__u64 tat;		/* GCRA theoretical arrival time (ns) */
};

struct int_scratch {
	__u8 buf[INT_SCRATCH_BYTES];
};

/* One report's worth of a packet. Layout mirrored by src/int_export/event.rs (explicit
 * padding, little-endian host). */
struct int_event {
	__u64 enq_ns;		/* qdisc enqueue, CLOCK_MONOTONIC */
	__u64 deq_ns;		/* qdisc dequeue, CLOCK_MONOTONIC */
	__s64 backlog_bytes;	/* the class's backlog after this packet left */
	__u32 egress_ifindex;
	__u32 ingress_ifindex;	/* skb->skb_iif: 0 for a packet this node sent itself */
	__u32 slot;		/* qmon_stats slot: (ifindex, class) through qmon_index */
	__u32 len;		/* skb->len */
	__u8 family;		/* 4 or 6 */
	__u8 reason;		/* INT_R_* */
	__u16 hdr_len;		/* bytes of hdr[] that are the IP + transport headers */
	__u32 pad;
	__u8 hdr[INT_HDR_BYTES];
};

/* The exporter's settings. Written by the agent at start (src/int_export), read here. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct int_cfg);
} int_cfg SEC(".maps");

/* ifindex -> 1 for the [int_export] interfaces that have a queue hierarchy. Written by the
 * agent (added and removed as hierarchies come and go), read here. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_IFACES);
	__type(key, __u32);
	__type(value, __u32);
} int_ifaces SEC(".maps");

/* Per-class packet counter of the 1-in-N sampler, by qmon slot. Written here only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, QMON_MAX_CLASSES);
	__type(key, __u32);
	__type(value, __u64);
} int_seen SEC(".maps");

/* The rate cap's schedule. Written here only (compare-and-swap across CPUs). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct int_rate);
} int_rate SEC(".maps");

/* Outcome counters (enum int_counter). Written here, summed by the agent for /metrics. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, INT_C_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} int_counters SEC(".maps");

/* Per-CPU copy of a packet's headers for the parser. Here only. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct int_scratch);
} int_scratch SEC(".maps");

/* Events to the exporter. Written here, read (consumed) by the agent's int-export thread. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} int_events SEC(".maps");

static __always_inline void int_count(__u32 idx)
{
	__u64 *n = bpf_map_lookup_elem(&int_counters, &idx);

	/* Atomic even per CPU: a tracepoint program can interrupt another on the same CPU. */
	if (n)
		__sync_fetch_and_add(n, 1);
}

/* GCRA: admit when the schedule is at most burst_ns ahead of now, then push it one interval. */
static __always_inline int int_admit(const struct int_cfg *cfg, __u64 now)
{
	__u32 zero = 0;
	struct int_rate *r = bpf_map_lookup_elem(&int_rate, &zero);
	int i;

	if (!r)
		return 0;
	for (i = 0; i < 2; i++) {
		__u64 tat = QMON_READ(r->tat);
		__u64 base = tat > now ? tat : now;

		if (base - now > cfg->burst_ns)
			return 0;
		if (__sync_val_compare_and_swap(&r->tat, tat, base + cfg->interval_ns) == tat)
			return 1;
	}
	return 0; /* lost the race twice: another CPU took the slot */
}

/* Copies the packet's headers from its IP header on into the scratch buffer, parses them
 * with the shared parser and returns the bytes of IP + transport header (0: not reportable). */
static __always_inline __u32 int_headers(struct sk_buff *skb, struct int_scratch *s,
					 __u8 *family)
{
	struct cgl_cursor cur = {};
	struct cgl_packet pk;
	__u16 proto = skb->protocol;
	__u32 data_off = (__u32)(skb->data - skb->head);
	__u32 nh = skb->network_header;
	__u32 linear = skb->len - skb->data_len;
	__u32 avail, n, l4_off, l4_len = 0;
	int err;

	if (proto != bpf_htons(CGL_ETH_P_IP) && proto != bpf_htons(CGL_ETH_P_IPV6))
		return 0;
	if (nh < data_off || nh - data_off >= linear)
		return 0;
	avail = skb->len - (nh - data_off);
	n = linear - (nh - data_off);
	if (n > INT_HDR_BYTES)
		n = INT_HDR_BYTES;
	if (n < 20)
		return 0;
	/* Masked in the register that is passed: the verifier wants the size bounded. */
	asm volatile("%0 &= 0xff" : "+r"(n));
	if (bpf_probe_read_kernel(s->buf, n, skb->head + nh))
		return 0;
	__builtin_memset(&pk, 0, sizeof(pk));
	cur.pos = s->buf;
	cur.end = s->buf + n;
	cur.avail = avail;
	if (proto == bpf_htons(CGL_ETH_P_IP))
		err = cgl_parse_ipv4(&cur, &pk);
	else
		err = cgl_parse_ipv6(&cur, &pk);
	if (!err)
		err = cgl_parse_l4(&cur, &pk);
	if (err)
		return 0;
	l4_off = (__u32)((__u8 *)cur.pos - s->buf);
	if (pk.l4_proto == CGL_IPPROTO_TCP)
		l4_len = ((struct tcphdr *)cur.pos)->doff * 4;
	else if (pk.l4_proto == CGL_IPPROTO_UDP || pk.l4_proto == CGL_IPPROTO_ICMP ||
		 pk.l4_proto == CGL_IPPROTO_ICMPV6)
		l4_len = 8;
	*family = pk.family;
	n = l4_off + l4_len < n ? l4_off + l4_len : n;
	return n;
}

/* A packet of the monitored class at `slot` of `ifindex` left the qdisc after `sojourn` ns. */
static __always_inline void int_dequeued(struct sk_buff *skb, __u32 ifindex, __u32 slot,
					 struct qmon_class *c, __u64 enq_ns, __u64 sojourn,
					 __u64 now)
{
	__u32 zero = 0, idx = slot & (QMON_MAX_CLASSES - 1);
	struct int_cfg *cfg = bpf_map_lookup_elem(&int_cfg, &zero);
	struct int_scratch *s;
	struct int_event *e;
	__u64 *seen, k;
	__u8 reason = 0, family = 0;
	__u32 hdr_len;

	if (!cfg || !cfg->enabled || !skb)
		return;
	if (!bpf_map_lookup_elem(&int_ifaces, &ifindex))
		return;
	seen = bpf_map_lookup_elem(&int_seen, &idx);
	if (seen && cfg->sample_every) {
		k = __sync_fetch_and_add(seen, 1);
		if (k % cfg->sample_every == 0)
			reason |= INT_R_SAMPLED;
	}
	if (cfg->report_over_ns && sojourn >= cfg->report_over_ns)
		reason |= INT_R_LATENCY;
	if (!reason)
		return;
	int_count(INT_C_CANDIDATES);
	if (!int_admit(cfg, now)) {
		int_count(INT_C_CAPPED);
		return;
	}
	s = bpf_map_lookup_elem(&int_scratch, &zero);
	if (!s)
		return;
	hdr_len = int_headers(skb, s, &family);
	if (!hdr_len || hdr_len > INT_HDR_BYTES) {
		int_count(INT_C_UNPARSED);
		return;
	}
	e = bpf_ringbuf_reserve(&int_events, sizeof(*e), 0);
	if (!e) {
		int_count(INT_C_RINGBUF_FULL);
		return;
	}
	e->enq_ns = enq_ns;
	e->deq_ns = now;
	e->backlog_bytes = QMON_READ(c->backlog_bytes);
	e->egress_ifindex = ifindex;
	e->ingress_ifindex = skb->skb_iif;
	e->slot = slot;
	e->len = skb->len;
	e->family = family;
	e->reason = reason;
	e->hdr_len = hdr_len;
	e->pad = 0;
	__builtin_memcpy(e->hdr, s->buf, INT_HDR_BYTES);
	bpf_ringbuf_submit(e, 0);
	int_count(INT_C_EMITTED);
}

#endif
