/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * L4S low-latency class: the ECN rule, RFC 9957 queue protection and step CE marking, run by
 * cgl_classify for every packet headed for an interface's low-latency (LL) class.
 *
 * ECN rule: an ECT(1) or CE packet that no flow or DSCP rule matched goes to the LL class of its
 * interface (when qprot_cfg has one).
 *
 * Queue protection (RFC 9957 §4, the DOCSIS algorithm): every flow hashes to one of NBUCKETS
 * buckets (ATTEMPTS tries, BI_SIZE bits of the hash each; else the shared last bucket, the
 * "dregs"). A bucket's queuing score is t_exp - now in ns (T_RES = 1 ns): each packet adds
 * probNative * size / AGING, AGING = 2^LG_AGING bytes/s, and the score drains as time passes.
 * probNative is the native L4S AQM's marking probability at the LL queue delay: the DOCSIS ramp
 * from MINTH (0.475 x the critical delay, the DOCSIS default ratio 475/1000 µs) to the critical
 * delay. A packet is sanctioned when the LL queue delay exceeds the critical delay and its
 * bucket's score exceeds the critical score: it is sent to the classic class instead and
 * counted per flow (qprot_flows).
 *
 * CE marking: a packet that stays in the LL class and is ECT gets CE when the LL queue delay is
 * at or above ce_step_ns (a step, as Linux DualPI2's L queue).
 *
 * The LL queue delay is the queue monitor's estimate (qmon_queue_delay_ns). Included once, by
 * agent.bpf.c, after qmon.bpf.h.
 */
#ifndef CGLOOP_QPROT_BPF_H
#define CGLOOP_QPROT_BPF_H

#define QPROT_MAX_BUCKETS 256
/* Bucket array size: NBUCKETS + the dregs, rounded up to a power of two so that a masked
 * index is provably in range for the verifier. */
#define QPROT_SLOTS 512
#define QPROT_MAX_ATTEMPTS 4
#define QPROT_ECT1 1
#define QPROT_ECT0 2
#define QPROT_CE 3

/* Per interface, written by the agent (src/qprot.rs). Times in ns. */
struct qprot_cfg {
	__u32 ll_class;
	__u32 classic_class;
	__u64 critical_qdelay_ns;
	__u64 minth_ns;
	__u64 critical_score_ns;
	__u64 max_score_ns; /* a bucket's score never grows past this (keeps t_exp bounded) */
	__u64 ce_step_ns;   /* 0: no CE marking */
	__u32 lg_aging;
	__u32 attempts;
	__u32 bi_size; /* NBUCKETS = 1 << bi_size */
	__u32 salt;    /* perturbs the flow hash */
	__u32 protect; /* 0: the ECN rule and CE marking only */
	__u32 pad;
};

struct qprot_bucket {
	__u32 id; /* hash of the flow that owns it */
	__u32 pad;
	__s64 t_exp;
};

struct qprot_state {
	struct bpf_spin_lock lock;
	__u32 pad;
	struct qprot_bucket b[QPROT_SLOTS];
};

/* Sanctions of one flow, cumulative; the agent takes deltas. */
struct qprot_flow {
	__u64 packets;
	__u64 bytes;
	__u64 max_score_ns;
	__u64 max_qdelay_ns;
	__u32 from_class;
	__u32 to_class;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_IFACES);
	__type(key, __u32);
	__type(value, struct qprot_cfg);
} qprot_cfg SEC(".maps");

/* ifindex -> the buckets of its LL queue. The agent creates the entry with the config. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_IFACES);
	__type(key, __u32);
	__type(value, struct qprot_state);
} qprot_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cgl_flow_key);
	__type(value, struct qprot_flow);
} qprot_flows SEC(".maps");

/* 32-bit hash of the flow's 5-tuple (murmur3's mixing), salted. */
static __always_inline __u32 qprot_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 qprot_hash(const struct cgl_flow_key *k, __u32 salt)
{
	__u32 h = salt, w[4];
	int i;

	for (i = 0; i < 16; i += 4) {
		__builtin_memcpy(w, k->src + i, 4);
		h = qprot_mix(h, w[0]);
		__builtin_memcpy(w, k->dst + i, 4);
		h = qprot_mix(h, w[0]);
	}
	h = qprot_mix(h, ((__u32)k->sport << 16) | k->dport);
	h = qprot_mix(h, k->proto);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	return h ^ (h >> 16);
}

/* probNative in 1/65536 units: the ramp from minth to the critical delay. */
static __always_inline __u64 qprot_prob_native(const struct qprot_cfg *cfg, __u64 qdelay)
{
	if (qdelay >= cfg->critical_qdelay_ns)
		return 65536;
	if (qdelay <= cfg->minth_ns || cfg->critical_qdelay_ns <= cfg->minth_ns)
		return 0;
	return ((qdelay - cfg->minth_ns) << 16) / (cfg->critical_qdelay_ns - cfg->minth_ns);
}

/* A bucket index the verifier can bound (the barrier keeps clang from dropping the mask). */
static __always_inline __u32 qprot_idx(__u32 i)
{
	asm volatile("" : "+r"(i));
	return i & (QPROT_SLOTS - 1);
}

/* pick_bucket + fill_bucket under the state's lock; returns the flow's queuing score (ns). */
static __always_inline __s64 qprot_score(struct qprot_state *st, const struct qprot_cfg *cfg,
					 __u32 id, __u64 add, __s64 now)
{
	__u32 bits = cfg->bi_size > 8 ? 8 : cfg->bi_size;
	__u32 nb = 1U << bits, mask = nb - 1, h32 = id, h, hsav = nb, j;
	__s64 score;

	bpf_spin_lock(&st->lock);
	for (j = 0; j < QPROT_MAX_ATTEMPTS; j++) {
		if (j >= cfg->attempts)
			break;
		h = qprot_idx(h32 & mask);
		if (st->b[h].id == id) { /* the flow's own bucket: reset it if it has drained */
			if (st->b[h].t_exp <= now)
				st->b[h].t_exp = now;
			hsav = h;
			goto fill;
		}
		if (hsav == nb && st->b[h].t_exp <= now)
			hsav = h; /* first expired bucket: recycled if the flow owns none */
		h32 >>= bits;
	}
	hsav = qprot_idx(hsav);
	if (st->b[hsav].t_exp <= now)
		st->b[hsav].t_exp = now; /* a recycled bucket, or the dregs when expired */
	st->b[hsav].id = id;
fill:
	hsav = qprot_idx(hsav);
	st->b[hsav].t_exp += add;
	if (st->b[hsav].t_exp - now > (__s64)cfg->max_score_ns)
		st->b[hsav].t_exp = now + cfg->max_score_ns;
	score = st->b[hsav].t_exp - now;
	bpf_spin_unlock(&st->lock);
	return score;
}

/* The LL class of an ECT(1)/CE packet no rule matched, or 0. */
static __always_inline __u32 qprot_ecn_class(__u32 ifindex, __u8 tos)
{
	struct qprot_cfg *cfg;
	__u8 ecn = tos & 3;

	if (ecn != QPROT_ECT1 && ecn != QPROT_CE)
		return 0;
	cfg = bpf_map_lookup_elem(&qprot_cfg, &ifindex);
	return cfg ? cfg->ll_class : 0;
}

static __always_inline void qprot_count(const struct cgl_flow_key *key, __u32 len, __u64 score,
					__u64 qdelay, const struct qprot_cfg *cfg)
{
	struct qprot_flow *f = bpf_map_lookup_elem(&qprot_flows, key);

	if (!f) {
		struct qprot_flow zero = { .from_class = cfg->ll_class,
					   .to_class = cfg->classic_class };

		bpf_map_update_elem(&qprot_flows, key, &zero, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&qprot_flows, key);
		if (!f)
			return;
	}
	__sync_fetch_and_add(&f->packets, 1);
	__sync_fetch_and_add(&f->bytes, len);
	if (score > f->max_score_ns)
		f->max_score_ns = score;
	if (qdelay > f->max_qdelay_ns)
		f->max_qdelay_ns = qdelay;
}

/* Runs protection and marking for a packet headed for `classid`; returns the class it goes to
 * (the classic class when sanctioned; skb->priority is set to it). */
static __always_inline __u32 qprot_apply(struct __sk_buff *skb, const struct cgl_flow_key *key,
					 __u8 tos, __u32 classid)
{
	__u32 ifindex = skb->ifindex, slot;
	struct qprot_cfg *cfg = bpf_map_lookup_elem(&qprot_cfg, &ifindex);
	struct qprot_state *st;
	struct qmon_class *c;
	__u64 now, qdelay;

	if (!cfg || classid != cfg->ll_class)
		return classid;
	now = bpf_ktime_get_ns();
	qdelay = qmon_queue_delay_ns(ifindex, classid, now);
	c = qmon_class_of(ifindex, classid, &slot);
	if (cfg->protect) {
		st = bpf_map_lookup_elem(&qprot_state, &ifindex);
		if (st) {
			__u64 add = (qprot_prob_native(cfg, qdelay) * skb->len) <<
				    (30 - (cfg->lg_aging & 31));
			__s64 score = qprot_score(st, cfg, qprot_hash(key, cfg->salt), add >> 16,
						  (__s64)now);

			if (qdelay > cfg->critical_qdelay_ns &&
			    score > (__s64)cfg->critical_score_ns) {
				qprot_count(key, skb->len, score, qdelay, cfg);
				if (c)
					__sync_fetch_and_add(&c->qprot_sanctioned, 1);
				skb->priority = cfg->classic_class;
				return cfg->classic_class;
			}
		}
	}
	if (cfg->ce_step_ns && qdelay >= cfg->ce_step_ns && (tos & 3) &&
	    (tos & 3) != QPROT_CE && bpf_skb_ecn_set_ce(skb) && c)
		__sync_fetch_and_add(&c->ce_marked, 1);
	return classid;
}

#endif
