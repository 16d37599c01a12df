// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgloop flow probe: XDP on ingress and tc (clsact) on egress feed one LRU flow table with
 * per-flow gaming telemetry (sizes, inter-arrival times, bursts, ECN, DSCP, TCP flags, RTP
 * loss/reorder/jitter), and per-interface / per-function packet counters for the node agent's
 * X-MAN power manager (cgloop_fn_stats.h). The programs only observe: every packet passes.
 *
 * Parsing is the shared parser of include/parse/ (also the node agent's). The pcap twin
 * (telemetry/probe/src/parse.rs and account.rs) applies the same rules in user space; a change
 * here or there needs the same change in the other (telemetry/probe/src/agreement.rs catches a
 * drift).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "cgloop_fn_stats.h"
#include "cgloop_flow.h"
#include "parse/packet.h"	/* the packet parser shared with the node agent's datapath */

#define TC_ACT_OK 0
#define NSEC_PER_SEC 1000000000ULL
#define CGLOOP_PULL_BYTES 128

/* Settings written by the exporter before load (rodata) or while running (bss). */
const volatile __u64 burst_gap_ns = 1000000;	/* packets closer than this form a burst */
const volatile __u32 rtp_default_clock_hz = 90000;	/* dynamic payload types (96-127) */
const volatile __u8 rtp_enabled = 1;
/* Exporter bumps it at each sweep; flows reset their interval-scoped fields on a change. */
__u32 sweep_epoch = 0;

/* Zeroed initial value of a new flow (never written). */
struct flow_value flow_template = {};

/* Flow table. Writers: both programs (create, update). Reader: the exporter's sweep, which also
 * deletes expired flows. LRU: under pressure the least recently used flow is evicted; the
 * exporter derives evictions from flows created minus flows it deleted minus live flows. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);	/* set by the exporter (--max-flows) */
	__type(key, struct flow_key);
	__type(value, struct flow_value);
} flows SEC(".maps");

/* Packet fates and parse failures by reason (enum cgloop_stat). Writers: both programs.
 * Reader: the exporter (Prometheus metrics, sweep log). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CGLOOP_STAT__MAX);
	__type(key, __u32);
	__type(value, __u64);
} probe_stats SEC(".maps");

/* Per-function counters (contract: cgloop_fn_stats.h). Writers: both programs. Reader: the
 * node agent's power manager through the pin /sys/fs/bpf/cgloop/fn_stats. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CGLOOP_MAX_FUNCTIONS);
	__type(key, __u32);
	__type(value, struct cgloop_fn_stats);
} fn_stats SEC(".maps");

/* ifindex -> function index. Writer: the exporter (--function NAME=if1,if2). Readers: both
 * programs, and the power manager (pin /sys/fs/bpf/cgloop/if_fn). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
} if_fn SEC(".maps");

/* Per-interface counters (fn_stats layout) and the interface's function index, so a packet
 * costs one hash lookup here instead of two (if_fn, then counters). Writers: the exporter
 * creates an entry per observed interface with its function; both programs count into it (and
 * create entries for other interfaces from if_fn). Readers: the exporter's metrics, anyone
 * through the pin if_stats. */
struct if_state {
	struct cgloop_fn_stats stats;
	__u32 fn;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct if_state);
} if_stats SEC(".maps");

struct pkt {
	void *data;
	void *data_end;
	__u64 now;
	__u32 ifindex;
	__u32 wire_len;		/* frame length as the interface saw it */
	__u16 hw_vlan;		/* tag the driver moved out of the frame (tc only), 0 if none */
	__u8 direction;
};

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&probe_stats, &idx);

	if (v)
		*v += 1;	/* per-CPU slot: no atomics needed */
}

static __always_inline void count(struct cgloop_fn_stats *s, const struct pkt *p)
{
	if (p->direction == CGLOOP_DIR_INGRESS) {
		s->rx_packets++;
		s->rx_bytes += p->wire_len;
		s->rx_last_ns = p->now;
	} else {
		s->tx_packets++;
		s->tx_bytes += p->wire_len;
		s->tx_last_ns = p->now;
	}
}

static __always_inline void count_interface(const struct pkt *p)
{
	struct cgloop_fn_stats *fs;
	struct if_state *is;
	__u32 fn = 0;

	is = bpf_map_lookup_elem(&if_stats, &p->ifindex);
	if (!is) {
		/* An interface the exporter did not set up: look its function up once. */
		struct if_state init = {};
		__u32 *fnp = bpf_map_lookup_elem(&if_fn, &p->ifindex);

		if (fnp && *fnp < CGLOOP_MAX_FUNCTIONS)
			init.fn = *fnp;
		bpf_map_update_elem(&if_stats, &p->ifindex, &init, BPF_NOEXIST);
		is = bpf_map_lookup_elem(&if_stats, &p->ifindex);
	}
	if (is) {
		count(&is->stats, p);
		fn = is->fn < CGLOOP_MAX_FUNCTIONS ? is->fn : 0;
	}
	fs = bpf_map_lookup_elem(&fn_stats, &fn);
	if (fs)
		count(fs, p);
}

/* Index of the highest set bit (0 for 0 and 1), without loops. */
static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

static __always_inline __u32 rtp_clock_hz(__u8 pt)
{
	/* RFC 3551 static payload types; audio at 8 kHz unless listed. */
	switch (pt) {
	case 10: case 11: return 44100;
	case 6: return 16000;
	case 16: return 11025;
	case 17: return 22050;
	case 14: case 25: case 26: case 28: case 31: case 32: case 33: case 34: return 90000;
	default:
		return pt < 24 ? 8000 : rtp_default_clock_hz;
	}
}

/* Facts of one parsed packet, handed from the parser to the (separately verified) accounting. */
struct pkt_info {
	struct flow_key key;
	__u64 now;
	__u32 l3_len;
	__u8 tos;
	__u8 tcp_flags;
	__u8 has_rtp;		/* rtp[] holds the first 12 bytes of the UDP payload */
	__u8 rtp[12];
};

/* RFC 3550 A.1 (sequence) and A.8 (jitter) for one RTP packet of the flow. A global function:
 * the verifier checks it once instead of once per parser path. */
__noinline int cgloop_rtp_update(struct rtp_stats *r, const struct pkt_info *pi)
{
	const __u8 *h;
	__u64 now;
	__u32 ssrc, ts;
	__u16 seq;
	__u8 pt;

	if (!r || !pi)
		return 0;
	h = pi->rtp;
	now = pi->now;
	ssrc = ((__u32)h[8] << 24) | ((__u32)h[9] << 16) | ((__u32)h[10] << 8) | h[11];
	ts = ((__u32)h[4] << 24) | ((__u32)h[5] << 16) | ((__u32)h[6] << 8) | h[7];
	seq = ((__u16)h[2] << 8) | h[3];
	pt = h[1] & 0x7f;
	if ((h[0] >> 6) != 2 || (pt >= 72 && pt <= 76))	/* not v2, or RTCP */
		return 0;
	if (r->state != RTP_CONFIRMED) {
		if (r->state == RTP_PROBATION && ssrc == r->ssrc && seq == (__u16)(r->max_seq + 1)) {
			r->max_seq = seq;
			if (--r->probation == 0) {
				/* Statistics start at the confirming packet (RFC 3550 A.1 init_seq). */
				r->state = RTP_CONFIRMED;
				r->base_seq = seq;
				r->cycles = 0;
				r->received = 1;
				r->window = 1;
				r->payload_type = pt;
				r->clock_rate_hz = rtp_clock_hz(pt);
				r->jitter_ns_x16 = 0;
				r->last_arrival_ns = now;
				r->last_rtp_ts = ts;
				stat_inc(CGLOOP_STAT_RTP_CONFIRMED);
			}
			return 0;
		}
		r->state = RTP_PROBATION;
		r->ssrc = ssrc;
		r->max_seq = seq;
		r->probation = CGLOOP_RTP_MIN_SEQUENTIAL - 1;
		return 0;
	}
	if (ssrc != r->ssrc)	/* a second source in the same 5-tuple: not followed */
		return 0;
	if (h[1] & 0x80)
		r->markers++;

	/* Jitter: D = (Rj - Ri) - (Sj - Si), with S converted from RTP clock ticks to ns. */
	{
		__s32 dts = (__s32)(ts - r->last_rtp_ts);
		__u64 mag = dts < 0 ? (__u64)(-(__s64)dts) : (__u64)dts;
		__u64 clock = r->clock_rate_hz ? r->clock_rate_hz : 90000;
		__s64 d;

		mag = mag * NSEC_PER_SEC / clock;
		d = (__s64)(now - r->last_arrival_ns) - (dts < 0 ? -(__s64)mag : (__s64)mag);
		if (d < 0)
			d = -d;
		r->jitter_ns_x16 += d - ((r->jitter_ns_x16 + 8) >> 4);
		r->last_arrival_ns = now;
		r->last_rtp_ts = ts;
	}

	{
		__u16 udelta = seq - r->max_seq;

		if (udelta == 0) {
			r->duplicates++;
		} else if (udelta < CGLOOP_RTP_MAX_DROPOUT) {
			if (seq < r->max_seq)
				r->cycles += 1U << 16;
			if (udelta > 1)
				r->gaps++;
			r->window = udelta >= 64 ? 1 : (r->window << udelta) | 1;
			r->max_seq = seq;
			r->received++;
		} else if (udelta <= 65536 - CGLOOP_RTP_MAX_MISORDER) {
			/* Very large jump: the sender restarted; start a new run, keep what was expected. */
			r->expected_prior += r->cycles + r->max_seq - r->base_seq + 1;
			r->cycles = 0;
			r->base_seq = seq;
			r->max_seq = seq;
			r->window = 1;
			r->received++;
		} else {
			__u16 back = r->max_seq - seq;

			if (back < 64 && (r->window >> back) & 1) {
				r->duplicates++;
			} else {
				if (back < 64)
					r->window |= 1ULL << back;
				r->reordered++;
				r->received++;
			}
		}
	}
	return 0;
}

/* Add one parsed packet to its flow (creating it). Global, verified once. */
__noinline int cgloop_account(const struct pkt_info *pi)
{
	struct flow_value *v;
	__u32 epoch = sweep_epoch, b, l3_len;
	__u64 now;
	__u8 tos;

	if (!pi)
		return 0;
	l3_len = pi->l3_len;
	tos = pi->tos;
	now = pi->now;

	v = bpf_map_lookup_elem(&flows, &pi->key);
	if (!v) {
		/* The value is too big for the 512-byte stack: insert the zeroed template. */
		if (bpf_map_update_elem(&flows, &pi->key, &flow_template, BPF_NOEXIST) == 0)
			stat_inc(CGLOOP_STAT_FLOWS_CREATED);
		v = bpf_map_lookup_elem(&flows, &pi->key);
		if (!v) {
			stat_inc(CGLOOP_STAT_MAP_UPDATE_FAILED);
			return 0;
		}
		if (v->packets == 0) {
			v->first_ns = now;
			v->last_ns = now;
			v->epoch = epoch;
			v->size_min = l3_len;
		}
	}
	/* No atomics (they cost more than the rest of the update here): a flow's packets on one
	 * receive queue are serialised by NAPI; two CPUs sending one flow at once may lose counts. */
	v->packets++;
	v->bytes += l3_len;
	v->size_sum_sq += (__u64)l3_len * l3_len;
	v->ecn[tos & 3]++;
	v->last_dscp = tos >> 2;
	b = log2_u64(l3_len);
	v->size_hist[b < CGLOOP_SIZE_BUCKETS ? b : CGLOOP_SIZE_BUCKETS - 1]++;

	if (v->epoch != epoch) {
		v->epoch = epoch;
		v->size_min = l3_len;
		v->size_max = 0;
		v->max_burst = 0;
		v->tcp_flags = 0;
	}
	if (l3_len < v->size_min)
		v->size_min = l3_len;
	if (l3_len > v->size_max)
		v->size_max = l3_len;
	v->tcp_flags |= pi->tcp_flags;
	v->tcp_flags_life |= pi->tcp_flags;

	if (v->packets > 1) {
		__u64 iat = now > v->last_ns ? now - v->last_ns : 0;

		b = log2_u64(iat);
		v->iat_hist[b < CGLOOP_IAT_BUCKETS ? b : CGLOOP_IAT_BUCKETS - 1]++;
		if (iat <= burst_gap_ns) {
			if (++v->cur_burst == 2)
				v->burst_count++;
		} else {
			v->cur_burst = 1;
		}
	} else {
		v->cur_burst = 1;
	}
	if (v->cur_burst > v->max_burst)
		v->max_burst = v->cur_burst;
	v->last_ns = now;

	if (pi->has_rtp)
		cgloop_rtp_update(&v->rtp, pi);
	return 0;
}

/* Parse one frame and account it; returns nothing: the caller always lets the packet pass. */
static __always_inline void handle(struct pkt *p)
{
	struct pkt_info pi = {};
	struct cgl_packet pk;
	int err;

	/* Packets seen and accounted are derived by the exporter (if_stats minus failures). */
	count_interface(p);

	err = cgl_parse_packet(p->data, p->data_end, p->wire_len, p->hw_vlan, &pk);
	if (err) {
		stat_inc(err);
		return;
	}
	__builtin_memcpy(pi.key.src_addr, pk.src, 16);
	__builtin_memcpy(pi.key.dst_addr, pk.dst, 16);
	pi.key.src_port = pk.sport;
	pi.key.dst_port = pk.dport;
	pi.key.ifindex = p->ifindex;
	pi.key.vlan_id = pk.vlan_id;
	pi.key.ip_proto = pk.l4_proto;
	pi.key.family = pk.family;
	pi.key.direction = p->direction;
	/* RTP candidates: a 12-byte fixed header inside the UDP payload, captured. */
	if (rtp_enabled && pk.l4_proto == CGL_IPPROTO_UDP && pk.udp_len >= 8 + 12) {
		void *payload = pk.l4 + 8;

		if (payload + 12 <= p->data_end) {
			__builtin_memcpy(pi.rtp, payload, 12);
			pi.has_rtp = 1;
		}
	}
	pi.now = p->now;
	pi.l3_len = pk.l3_len;
	pi.tos = pk.tos;
	pi.tcp_flags = pk.tcp_flags;
	cgloop_account(&pi);
}

SEC("xdp")
int cgloop_xdp_ingress(struct xdp_md *ctx)
{
	struct pkt p = {
		.data = (void *)(long)ctx->data,
		.data_end = (void *)(long)ctx->data_end,
		.now = bpf_ktime_get_ns(),
		.ifindex = ctx->ingress_ifindex,
		.direction = CGLOOP_DIR_INGRESS,
	};

	p.wire_len = p.data_end - p.data;
	handle(&p);
	return XDP_PASS;
}

SEC("tc")
int cgloop_tc_egress(struct __sk_buff *skb)
{
	__u32 len = skb->len, linear = skb->data_end - skb->data;
	__u32 vlan_present = skb->vlan_present, vlan_tci = skb->vlan_tci;
	struct pkt p = {};

	/* Headers of a non-linear skb may sit in fragments: pull what the parser reads. */
	if (linear < CGLOOP_PULL_BYTES && len > linear)
		bpf_skb_pull_data(skb, len < CGLOOP_PULL_BYTES ? len : CGLOOP_PULL_BYTES);
	/* Keep clang from folding the ctx loads below into a computed ctx offset. */
	asm volatile("" : "+r"(skb));
	p.data = (void *)(long)skb->data;
	p.data_end = (void *)(long)skb->data_end;
	p.now = bpf_ktime_get_ns();
	p.ifindex = skb->ifindex;
	p.wire_len = len;
	p.hw_vlan = vlan_present ? (vlan_tci & 0x0fff) : 0;
	p.direction = CGLOOP_DIR_EGRESS;
	handle(&p);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
