/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Queue monitor: the sojourn every packet actually sees in the agent's HTB classes.
 *
 *   cgl_qmon_enqueue  tp_btf/qdisc_enqueue (root qdisc, after a successful enqueue): stamps the
 *                     skb (LRU hash keyed by its address -> enqueue ns, class slot, length) and
 *                     adds it to its class's backlog.
 *   cgl_qmon_dequeue  tp_btf/qdisc_dequeue: sojourn = now - stamp into the class's log-linear
 *                     histogram and max, backlog down, and the class's drain rate (bytes
 *                     dequeued over >= QMON_RATE_WINDOW_NS while the class stayed backlogged),
 *                     then the INT source's per-packet report decision (bpf/int.bpf.h).
 *
 * The class of a packet is skb->priority when it is a class the agent registered in
 * qmon_index (the classifier sets it), else the interface's default class (if_default).
 * Per-class state lives in an mmapable array: the agent's 1 ms sampler reads it without a
 * syscall and swaps the per-tick max to 0 with an atomic exchange.
 *
 * qmon_queue_delay_ns() is the queue delay a packet enqueued now would see: the class's
 * backlog divided by its measured drain rate (the backlog drains at that rate ahead of it). No
 * rate yet (the class never stayed backlogged for a window): the last dequeued packet's sojourn.
 *
 * Included once, by agent.bpf.c, after its maps (it reads if_default).
 */
#ifndef CGLOOP_QMON_BPF_H
#define CGLOOP_QMON_BPF_H

#include <bpf/bpf_tracing.h>

#define QMON_MAX_CLASSES 256
/* Sojourn histogram: bucket 0 holds < 1024 ns; then 4 buckets per octave (the two bits after
 * the leading one), so a bucket spans at most 25 % of its value: p50/p99 within ~12 % from
 * 1 µs to hours. Bucket i >= 1 starts at (4 + (i - 1) % 4) << ((i - 1) / 4 + 8) ns. */
#define QMON_HIST_BUCKETS 128 /* a power of two: the index is masked for the verifier */
#define QMON_HIST_MIN_LOG2 10
/* Drain-rate window: spans HTB's dequeue bursts and its borrowing swings; with the EWMA (1/8)
 * it follows a rate change within ~10 ms (2 ms gave half the error of 0.5 ms in the bench). */
#define QMON_RATE_WINDOW_NS 2000000ULL
/* Most packets of one bulk dequeue looked at (a list linked by skb->next). */
#define QMON_DEQ_BATCH 8
/* A fresh load of a field other CPUs write. */
#define QMON_READ(x) (*(volatile typeof(x) *)&(x))

struct qmon_key {
	__u32 ifindex;
	__u32 classid;
};

struct qmon_stamp {
	__u64 ns;
	__u32 slot;
	__u32 len;
};

/* One managed class. Counters are cumulative (the sampler takes deltas); backlog_* can drift
 * when the kernel drops a queued packet or resets the qdisc: the sampler resets them when the
 * kernel reports the class empty and nothing was enqueued since. */
struct qmon_class {
	__u64 enq_packets;
	__u64 enq_bytes;
	__u64 deq_packets;
	__u64 deq_bytes;
	__s64 backlog_bytes;
	__s64 backlog_packets;
	__u64 ns_per_kb; /* drain time of 1024 bytes: delay = backlog * ns_per_kb >> 10 */
	__u64 win_start_ns;
	__u64 win_bytes;
	__u64 last_deq_ns;
	__u64 last_sojourn_ns;
	__u64 sojourn_max_ns; /* since the sampler last swapped it to 0 */
	__u64 ce_marked;
	__u64 qprot_sanctioned;
	__u64 hist[QMON_HIST_BUCKETS];
};

/* (ifindex, class) -> slot in qmon_stats. The agent writes it for every leaf it manages. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, QMON_MAX_CLASSES);
	__type(key, struct qmon_key);
	__type(value, __u32);
} qmon_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, QMON_MAX_CLASSES);
	__type(key, __u32);
	__type(value, struct qmon_class);
} qmon_stats SEC(".maps");

/* skb address -> its enqueue stamp. LRU: a packet the qdisc drops never comes back. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct qmon_stamp);
} qmon_stamps SEC(".maps");

static __always_inline struct qmon_class *qmon_class_of(__u32 ifindex, __u32 classid,
							 __u32 *slot_out)
{
	struct qmon_key k = { .ifindex = ifindex, .classid = classid };
	__u32 *slot = bpf_map_lookup_elem(&qmon_index, &k);

	if (!slot)
		return NULL;
	*slot_out = *slot;
	return bpf_map_lookup_elem(&qmon_stats, slot);
}

/* The queue delay a packet entering (ifindex, classid) now would see, in ns (0: class not
 * monitored or empty). See the method above. */
static __always_inline __u64 qmon_queue_delay_ns(__u32 ifindex, __u32 classid, __u64 now)
{
	__u32 slot;
	struct qmon_class *c = qmon_class_of(ifindex, classid, &slot);
	__s64 backlog;
	__u64 rate;

	if (!c)
		return 0;
	backlog = QMON_READ(c->backlog_bytes);
	if (backlog <= 0)
		return 0;
	rate = QMON_READ(c->ns_per_kb);
	if (rate)
		return ((__u64)backlog * rate) >> 10;
	return QMON_READ(c->last_sojourn_ns);
}

/* Log-linear bucket of a sojourn (see QMON_HIST_BUCKETS). */
static __always_inline __u32 qmon_bucket(__u64 v)
{
	__u32 msb = 0, idx;
	__u64 x = v;

	if (v < (1ULL << QMON_HIST_MIN_LOG2))
		return 0;
	if (x >> 32) { msb += 32; x >>= 32; }
	if (x >> 16) { msb += 16; x >>= 16; }
	if (x >> 8) { msb += 8; x >>= 8; }
	if (x >> 4) { msb += 4; x >>= 4; }
	if (x >> 2) { msb += 2; x >>= 2; }
	if (x >> 1) { msb += 1; }
	idx = (msb - QMON_HIST_MIN_LOG2) * 4 + ((v >> (msb - 2)) & 3) + 1;
	return idx < QMON_HIST_BUCKETS ? idx : QMON_HIST_BUCKETS - 1;
}

SEC("tp_btf/qdisc_enqueue")
int BPF_PROG(cgl_qmon_enqueue, struct Qdisc *q, const struct netdev_queue *txq,
	     struct sk_buff *skb)
{
	struct qmon_stamp st = {};
	struct qmon_class *c;
	__u32 ifindex, slot, *dflt;
	__u64 key = (__u64)skb;

	if (!skb || !q || !q->dev_queue || !q->dev_queue->dev)
		return 0;
	ifindex = q->dev_queue->dev->ifindex;
	c = qmon_class_of(ifindex, skb->priority, &slot);
	if (!c) {
		dflt = bpf_map_lookup_elem(&if_default, &ifindex);
		if (!dflt)
			return 0;
		c = qmon_class_of(ifindex, *dflt, &slot);
		if (!c)
			return 0;
	}
	st.ns = bpf_ktime_get_ns();
	st.slot = slot;
	st.len = skb->len;
	bpf_map_update_elem(&qmon_stamps, &key, &st, BPF_ANY);
	__sync_fetch_and_add(&c->enq_packets, 1);
	__sync_fetch_and_add(&c->enq_bytes, st.len);
	__sync_fetch_and_add(&c->backlog_packets, 1);
	__sync_fetch_and_add(&c->backlog_bytes, st.len);
	return 0;
}

#include "int.bpf.h"	/* INT source: int_dequeued() */

static __always_inline void qmon_dequeued(struct sk_buff *skb, __u32 ifindex, __u64 now)
{
	__u64 key = (__u64)skb;
	struct qmon_stamp *st = bpf_map_lookup_elem(&qmon_stamps, &key);
	struct qmon_class *c;
	__u64 sojourn, len, enq_ns;
	__u32 slot, idx;

	if (!st)
		return;
	slot = st->slot;
	len = st->len;
	enq_ns = st->ns;
	sojourn = now > enq_ns ? now - enq_ns : 0;
	bpf_map_delete_elem(&qmon_stamps, &key);
	c = bpf_map_lookup_elem(&qmon_stats, &slot);
	if (!c)
		return;
	__sync_fetch_and_add(&c->deq_packets, 1);
	__sync_fetch_and_add(&c->deq_bytes, len);
	__sync_fetch_and_add(&c->backlog_packets, -1);
	__sync_fetch_and_add(&c->backlog_bytes, -(__s64)len);
	idx = qmon_bucket(sojourn) & (QMON_HIST_BUCKETS - 1);
	__sync_fetch_and_add(&c->hist[idx], 1);
	if (sojourn > c->sojourn_max_ns)
		c->sojourn_max_ns = sojourn; /* benign race: a lost max is re-set by the next one */
	c->last_sojourn_ns = sojourn;
	c->last_deq_ns = now;
	/* Drain rate while backlogged; the window restarts after the class runs empty. Racy
	 * across CPUs by design: a torn window only skews one sample of an EWMA. */
	if (!c->win_start_ns) {
		c->win_start_ns = now;
		c->win_bytes = 0;
	} else {
		c->win_bytes += len;
		if (now - c->win_start_ns >= QMON_RATE_WINDOW_NS && c->win_bytes) {
			__u64 sample = ((now - c->win_start_ns) << 10) / c->win_bytes;
			__u64 old = c->ns_per_kb;

			c->ns_per_kb = old ? old - (old >> 3) + (sample >> 3) : sample;
			c->win_start_ns = now;
			c->win_bytes = 0;
		}
	}
	if (QMON_READ(c->backlog_packets) <= 0)
		c->win_start_ns = 0;
	int_dequeued(skb, ifindex, slot, c, enq_ns, sojourn, now);
}

SEC("tp_btf/qdisc_dequeue")
int BPF_PROG(cgl_qmon_dequeue, struct Qdisc *q, const struct netdev_queue *txq, int packets,
	     struct sk_buff *skb)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 ifindex = 0;
	int i;

	if (q && q->dev_queue && q->dev_queue->dev)
		ifindex = q->dev_queue->dev->ifindex;
	/* A bulk dequeue hands over a list linked by skb->next. */
	for (i = 0; i < QMON_DEQ_BATCH && skb; i++) {
		qmon_dequeued(skb, ifindex, now);
		skb = skb->next;
	}
	return 0;
}

#endif
