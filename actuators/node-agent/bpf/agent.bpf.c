// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgloop node agent datapath (tc egress, clsact, cls_bpf direct-action).
 *
 *   cgl_classify   flow -> HTB class (skb->priority, which HTB consults before its own filters),
 *                  optional DSCP rewrite, lab impairment (drop a fraction of a flow), then the
 *                  class's service chain through tail calls.
 *   cgl_fn_*       header-only ("basic", CALVIN) chain functions: forward, ACL, DSCP/ECN marker,
 *                  token bucket, mirror. Each runs its step of the chain and tail-calls the next.
 *   cgl_fn_to_user the hand-over of a chain's advanced (payload) functions to user space:
 *                  tags the source MAC with (slot, ifindex) and redirects the frame to the
 *                  egress of the AF_XDP veth port of one instance (src/advanced.rs): a hash of
 *                  the flow's 5-tuple (cgl_classify, cb[2]) picks it, so a flow stays whole.
 *   cgl_qmon_*     tp_btf at qdisc enqueue/dequeue: per-class sojourn (bpf/qmon.bpf.h); the
 *                  classifier's low-latency class rules are in bpf/qprot.bpf.h.
 *   cgl_xsk_rx     XDP on a port's peer: frames into that instance's AF_XDP socket (XSKMAP).
 *   cgl_adv_return tc ingress on the port: frames the user-space worker sent back get their
 *                  source MAC restored and CGL_ADV_MARK, and leave on their interface's egress.
 *
 * The user-space agent (src/datapath.rs) is the only writer of the configuration maps; the
 * programs only read them, except the per-function counters and token-bucket state.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "agent.h"
#include "parse/packet.h"	/* the flow probe's packet parser (telemetry/bpf/include/parse) */

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Flow -> class rule. Written by the agent (SetFlowClass), read by cgl_classify. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_FLOWS);
	__type(key, struct cgl_flow_key);
	__type(value, struct cgl_flow_rule);
} flow_class SEC(".maps");

/* (ifindex, DSCP) -> class for packets no flow rule matched. Agent writes, classifier reads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_DSCP_RULES);
	__type(key, struct cgl_dscp_key);
	__type(value, struct cgl_flow_rule);
} dscp_class SEC(".maps");

/* Flow -> drop threshold (lab impairment, SetImpairment). Agent writes, classifier reads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_FLOWS);
	__type(key, struct cgl_flow_key);
	__type(value, struct cgl_impairment);
} flow_drop SEC(".maps");

/* ifindex -> default HTB class, so unmatched traffic still finds its class's chain.
 * Agent writes on ApplyQueueHierarchy, classifier reads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_IFACES);
	__type(key, __u32);
	__type(value, __u32);
} if_default SEC(".maps");

/* (ifindex, class) -> chain slot. The agent writes a chain into the inactive slot of the pair
 * and then flips this entry (one 4-byte store), so SetChain swaps a chain atomically. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_CHAINS);
	__type(key, struct cgl_class_key);
	__type(value, __u32);
} class_chain SEC(".maps");

/* Chain slot -> ordered functions and their parameters. Agent writes, functions read. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CGL_MAX_CHAIN_SLOTS);
	__type(key, __u32);
	__type(value, struct cgl_chain);
} chains SEC(".maps");

/* Function kind -> program, filled once by the agent at load time; tail-call targets. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, CGL_FN_KINDS);
	__type(key, __u32);
	__type(value, __u32);
} fn_progs SEC(".maps");

/* Per (slot, position) counters. Functions write, the agent reads for GetState. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CGL_MAX_CHAIN_SLOTS * CGL_MAX_CHAIN_FNS);
	__type(key, __u32);
	__type(value, struct cgl_fn_counters);
} fn_counters SEC(".maps");

/* Per (slot, position) token-bucket state. cgl_fn_rate writes; the agent resets it on SetChain. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CGL_MAX_CHAIN_SLOTS * CGL_MAX_CHAIN_FNS);
	__type(key, __u32);
	__type(value, struct cgl_bucket);
} buckets SEC(".maps");

/* Per-class counters seen by the classifier (packets steered by a flow or DSCP rule).
 * Classifier writes, agent reads. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, CGL_MAX_FLOWS);
	__type(key, struct cgl_flow_key);
	__type(value, struct cgl_flow_counters);
} flow_counters SEC(".maps");

/* AF_XDP sockets of the advanced-function worker, by queue. Agent writes. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

/* Instance -> ifindex of its AF_XDP veth port (Natif's scale-out). Agent writes. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CGL_MAX_ADV_INSTANCES);
	__type(key, __u32);
	__type(value, __u32);
} adv_ports SEC(".maps");

/* ifindex of a port's peer -> index of its instance's socket in xsks. Agent writes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_ADV_INSTANCES);
	__type(key, __u32);
	__type(value, __u32);
} xsk_of_if SEC(".maps");

/* ifindex -> its own MAC, restored on frames coming back from user space. Agent writes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CGL_MAX_IFACES);
	__type(key, __u32);
	__type(value, struct cgl_mac);
} adv_if_mac SEC(".maps");

/* A hash of a flow's 5-tuple (the interface left out): which instance of the advanced
 * functions gets the flow. Every packet of a flow has the same, so a flow never splits. */
static __always_inline __u32 flow_hash(const struct cgl_flow_key *k)
{
	const __u32 *w = (const __u32 *)k->src;
	__u32 h = 0x9e3779b9u ^ k->proto ^ ((__u32)k->sport << 16 | k->dport);
	int i;

#pragma unroll
	for (i = 0; i < 8; i++) {
		h = (h ^ w[i]) * 0x01000193u;
		h ^= h >> 15;
	}
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	return h;
}

#include "qmon.bpf.h"	/* queue monitor: tracepoints, qmon_queue_delay_ns() */
#include "qprot.bpf.h"	/* L4S class: ECN rule, RFC 9957 queue protection, CE marking */

struct parsed {
	struct cgl_flow_key key;
	__u32 l3_off;
	__u8 tos; /* IPv4 TOS or IPv6 traffic class */
	__u8 ipv6;
};

/* Flow key of the frame through the shared parser (parse/packet.h: VLAN tags, IPv6 extension
 * headers, the probe's bounds and length checks). Returns 0 on success. A non-first fragment
 * carries no ports: it is classified by addresses and protocol. The agent keys flows by
 * interface, not VLAN: a rule matches its 5-tuple whatever the tag. */
static __always_inline int parse(struct __sk_buff *skb, struct parsed *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct cgl_packet pk;
	int err;

	err = cgl_parse_packet(data, data_end, skb->len, 0, &pk);
	if (err && err != CGLOOP_STAT_ERR_FRAGMENT)
		return -1;
	__builtin_memset(&p->key, 0, sizeof(p->key));
	p->key.ifindex = skb->ifindex;
	p->key.family = pk.family;
	p->key.proto = pk.l4_proto;
	p->key.sport = pk.sport;
	p->key.dport = pk.dport;
	__builtin_memcpy(p->key.src, pk.src, 16);
	__builtin_memcpy(p->key.dst, pk.dst, 16);
	p->l3_off = pk.l3_off;
	p->tos = pk.tos;
	p->ipv6 = pk.family == 6;
	return 0;
}

/* Rewrites DSCP and/or ECN (0xff = keep) of the IP header at p->l3_off (after any VLAN tags).
 * IPv4 fixes the header checksum. Reads and writes go through the skb helpers, which check
 * the variable offset themselves. */
static __always_inline int set_tos(struct __sk_buff *skb, const struct parsed *p, __u32 dscp,
				   __u32 ecn)
{
	__u32 off = p->l3_off;

	if (off > 64) /* at most two VLAN tags after Ethernet; keeps the offset bounded */
		return -1;
	if (!p->ipv6) {
		__u8 old, new;

		if (bpf_skb_load_bytes(skb, off + offsetof(struct iphdr, tos), &old, 1))
			return -1;
		new = old;
		if (dscp != CGL_KEEP)
			new = (new & 0x03) | ((dscp & 0x3f) << 2);
		if (ecn != CGL_KEEP)
			new = (new & 0xfc) | (ecn & 0x03);
		if (new == old)
			return 0;
		/* The checksum covers 16-bit words: TOS is the low byte of the first one. */
		bpf_l3_csum_replace(skb, off + offsetof(struct iphdr, check), bpf_htons(old),
				    bpf_htons(new), 2);
		bpf_skb_store_bytes(skb, off + offsetof(struct iphdr, tos), &new, 1, 0);
		return 0;
	}
	{
		__u8 b[2], tc;

		if (bpf_skb_load_bytes(skb, off, b, 2))
			return -1;
		tc = (b[0] << 4) | (b[1] >> 4);
		if (dscp != CGL_KEEP)
			tc = (tc & 0x03) | ((dscp & 0x3f) << 2);
		if (ecn != CGL_KEEP)
			tc = (tc & 0xfc) | (ecn & 0x03);
		b[0] = (b[0] & 0xf0) | (tc >> 4);
		b[1] = (b[1] & 0x0f) | (tc << 4);
		bpf_skb_store_bytes(skb, off, b, 2, 0);
	}
	return 0;
}

/* Runs the function at position cb[1] of chain slot cb[0], or ends the chain. */
static __always_inline int next_fn(struct __sk_buff *skb)
{
	__u32 slot = skb->cb[0];
	__u32 pos = skb->cb[1];
	struct cgl_chain *chain = bpf_map_lookup_elem(&chains, &slot);

	if (!chain || pos >= chain->len || pos >= CGL_MAX_CHAIN_FNS)
		return TC_ACT_OK;
	bpf_tail_call(skb, &fn_progs, chain->fns[pos].kind);
	/* Missing program (should not happen: the agent fills fn_progs at load): fail open. */
	return TC_ACT_OK;
}

/* Looks up this step's configuration and counts the packet. NULL ends the chain. */
static __always_inline struct cgl_chain_fn *this_fn(struct __sk_buff *skb, __u32 *idx)
{
	__u32 slot = skb->cb[0];
	__u32 pos = skb->cb[1];
	struct cgl_chain *chain;
	struct cgl_fn_counters *c;

	if (slot >= CGL_MAX_CHAIN_SLOTS || pos >= CGL_MAX_CHAIN_FNS)
		return NULL;
	chain = bpf_map_lookup_elem(&chains, &slot);
	if (!chain)
		return NULL;
	*idx = slot * CGL_MAX_CHAIN_FNS + pos;
	c = bpf_map_lookup_elem(&fn_counters, idx);
	if (c) {
		c->packets++;
		c->bytes += skb->len;
	}
	return &chain->fns[pos];
}

static __always_inline int drop_counted(__u32 idx)
{
	struct cgl_fn_counters *c = bpf_map_lookup_elem(&fn_counters, &idx);

	if (c)
		c->dropped++;
	return TC_ACT_SHOT;
}

static __always_inline int advance(struct __sk_buff *skb)
{
	skb->cb[1] = skb->cb[1] + 1;
	return next_fn(skb);
}

SEC("tc")
int cgl_classify(struct __sk_buff *skb)
{
	struct parsed p;
	struct cgl_flow_rule *rule;
	struct cgl_impairment *imp;
	struct cgl_class_key ck = {};
	__u32 *slot, *dflt;
	__u32 classid = 0;

	if (parse(skb, &p))
		return TC_ACT_OK;

	if (skb->mark == CGL_ADV_MARK) {
		/* Back from the advanced functions: its class again, no second pass of the chain. */
		skb->mark = 0;
		rule = bpf_map_lookup_elem(&flow_class, &p.key);
		if (!rule) {
			struct cgl_dscp_key dk = { .ifindex = skb->ifindex, .dscp = p.tos >> 2 };

			rule = bpf_map_lookup_elem(&dscp_class, &dk);
		}
		if (rule)
			skb->priority = rule->classid;
		return TC_ACT_OK;
	}

	imp = bpf_map_lookup_elem(&flow_drop, &p.key);
	if (imp) {
		__sync_fetch_and_add(&imp->seen, 1);
		if (imp->threshold && bpf_get_prandom_u32() < imp->threshold) {
			__sync_fetch_and_add(&imp->dropped, 1);
			return TC_ACT_SHOT;
		}
	}

	rule = bpf_map_lookup_elem(&flow_class, &p.key);
	if (!rule) {
		struct cgl_dscp_key dk = { .ifindex = skb->ifindex, .dscp = p.tos >> 2 };

		rule = bpf_map_lookup_elem(&dscp_class, &dk);
	}
	if (rule) {
		struct cgl_flow_counters *fc;

		classid = rule->classid;
		skb->priority = classid;
		if (rule->rewrite_dscp != CGL_KEEP)
			set_tos(skb, &p, rule->rewrite_dscp, CGL_KEEP);
		fc = bpf_map_lookup_elem(&flow_counters, &p.key);
		if (fc) {
			fc->packets++;
			fc->bytes += skb->len;
		}
	} else if ((classid = qprot_ecn_class(skb->ifindex, p.tos))) {
		skb->priority = classid; /* ECT(1)/CE to the low-latency class */
	} else {
		__u32 ifindex = skb->ifindex;

		dflt = bpf_map_lookup_elem(&if_default, &ifindex);
		if (!dflt)
			return TC_ACT_OK;
		classid = *dflt;
	}
	classid = qprot_apply(skb, &p.key, p.tos, classid);

	ck.ifindex = skb->ifindex;
	ck.classid = classid;
	slot = bpf_map_lookup_elem(&class_chain, &ck);
	if (!slot)
		return TC_ACT_OK;
	skb->cb[0] = *slot;
	skb->cb[1] = 0;
	skb->cb[2] = flow_hash(&p.key);
	return next_fn(skb);
}

SEC("tc")
int cgl_fn_forward(struct __sk_buff *skb)
{
	__u32 idx;

	if (!this_fn(skb, &idx))
		return TC_ACT_OK;
	return advance(skb);
}

SEC("tc")
int cgl_fn_acl(struct __sk_buff *skb)
{
	struct cgl_chain_fn *fn;
	struct parsed p;
	__u32 idx;

	fn = this_fn(skb, &idx);
	if (!fn)
		return TC_ACT_OK;
	if (parse(skb, &p))
		return advance(skb);
	/* a = protocol, b = destination port, c = source port; 0 is a wildcard. Deny on match. */
	if ((!fn->a || fn->a == p.key.proto) && (!fn->b || fn->b == p.key.dport) &&
	    (!fn->c || fn->c == p.key.sport))
		return drop_counted(idx);
	return advance(skb);
}

SEC("tc")
int cgl_fn_mark(struct __sk_buff *skb)
{
	struct cgl_chain_fn *fn;
	struct parsed p;
	__u32 idx;

	fn = this_fn(skb, &idx);
	if (!fn)
		return TC_ACT_OK;
	/* a = DSCP, b = ECN codepoint; CGL_KEEP leaves the field. Not IP: nothing to mark. */
	if (!parse(skb, &p))
		set_tos(skb, &p, fn->a, fn->b);
	return advance(skb);
}

SEC("tc")
int cgl_fn_rate(struct __sk_buff *skb)
{
	struct cgl_chain_fn *fn;
	struct cgl_bucket *b;
	__u64 now, tokens, elapsed;
	__u32 idx;
	int pass;

	fn = this_fn(skb, &idx);
	if (!fn)
		return TC_ACT_OK;
	b = bpf_map_lookup_elem(&buckets, &idx);
	if (!b)
		return advance(skb);
	/* c = rate in bytes/s, d = burst in bytes. Tokens are bytes scaled by 1e9 (ns units). */
	now = bpf_ktime_get_ns();
	bpf_spin_lock(&b->lock);
	if (!b->last_ns) {
		b->tokens = fn->d * 1000000000ULL;
		b->last_ns = now;
	}
	/* Capping the refill interval at 1 s keeps the product in 64 bits (rate is bounded). */
	elapsed = now - b->last_ns;
	if (elapsed > 1000000000ULL)
		elapsed = 1000000000ULL;
	tokens = b->tokens + elapsed * fn->c;
	if (tokens > fn->d * 1000000000ULL)
		tokens = fn->d * 1000000000ULL;
	b->last_ns = now;
	pass = tokens >= (__u64)skb->len * 1000000000ULL;
	if (pass)
		tokens -= (__u64)skb->len * 1000000000ULL;
	b->tokens = tokens;
	bpf_spin_unlock(&b->lock);
	if (!pass)
		return drop_counted(idx);
	return advance(skb);
}

SEC("tc")
int cgl_fn_mirror(struct __sk_buff *skb)
{
	struct cgl_chain_fn *fn;
	__u32 idx;

	fn = this_fn(skb, &idx);
	if (!fn)
		return TC_ACT_OK;
	/* a = ifindex of the monitor interface; the copy leaves on its egress. */
	if (fn->a)
		bpf_clone_redirect(skb, fn->a, 0);
	return advance(skb);
}

#define TC_ACT_REDIRECT_ 7
#define XDP_PASS_ 2

SEC("tc")
int cgl_fn_to_user(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct cgl_chain_fn *fn;
	struct ethhdr *eth;
	__u32 idx, slot = skb->cb[0];
	__u32 n, instance, port, *p;
	__u8 tag[6];

	fn = this_fn(skb, &idx);
	if (!fn || !fn->a)
		return TC_ACT_OK;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	tag[0] = CGL_ADV_MAC0;
	tag[1] = CGL_ADV_MAC1;
	tag[2] = slot >> 8;
	tag[3] = slot & 0xff;
	tag[4] = skb->ifindex >> 8;
	tag[5] = skb->ifindex & 0xff;
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), tag, 6, 0))
		return drop_counted(idx);
	/* a = ifindex of instance 0's AF_XDP port, b = instances (0 or 1: one); the flow's hash
	 * picks the instance, whose peer's XDP program hands the frame to its worker. */
	n = fn->b;
	if (n > CGL_MAX_ADV_INSTANCES)
		n = CGL_MAX_ADV_INSTANCES;
	port = fn->a;
	if (n > 1) {
		instance = skb->cb[2] % n;
		p = bpf_map_lookup_elem(&adv_ports, &instance);
		if (p && *p)
			port = *p;
	}
	return bpf_redirect(port, 0);
}

SEC("xdp")
int cgl_xsk_rx(struct xdp_md *ctx)
{
	/* Copy mode: a socket takes frames of the queue it is bound to only, so each instance
	 * has its own port (one queue); its socket sits at the instance's index. */
	__u32 ifindex = ctx->ingress_ifindex;
	__u32 queue = ctx->rx_queue_index;
	__u32 *q;

	/* a plain value: the compiler may not merge the two loads into one through a pointer
	 * that is either the map value or the context (the verifier refuses the latter) */
	asm volatile("" : "+r"(queue));
	q = bpf_map_lookup_elem(&xsk_of_if, &ifindex);
	if (q)
		queue = *q;
	return bpf_redirect_map(&xsks, queue, XDP_PASS_);
}

SEC("tc")
int cgl_adv_return(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct cgl_mac *mac;
	__u32 ifindex;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_source[0] != CGL_ADV_MAC0 || eth->h_source[1] != CGL_ADV_MAC1)
		return TC_ACT_SHOT; /* nothing else belongs on the port */
	ifindex = ((__u32)eth->h_source[4] << 8) | eth->h_source[5];
	mac = bpf_map_lookup_elem(&adv_if_mac, &ifindex);
	if (!mac)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), mac->addr, 6, 0))
		return TC_ACT_SHOT;
	skb->mark = CGL_ADV_MARK;
	return bpf_redirect(ifindex, 0);
}
