// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Floors for bench.py, measured with bpf_stats on the same replays as the probe:
 * - floor_empty: an XDP program doing nothing;
 * - floor_clock: one that only reads the clock (the probe reads it once per packet);
 * - floor_lookup: the least a flow table costs: build the probe's key (IPv4/UDP only, no
 *   checks beyond the verifier's) and look it up in an LRU hash of the probe's key and value
 *   types (inserting on a miss, so the warm-up replay fills it and the measured one only finds);
 * - floor_touch: the same plus one write into the found value (the packet counter), i.e. the
 *   element's key line and its first value line: what any per-flow counter costs.
 */
#include "vmlinux.h"
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include "cgloop_flow.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);	/* the bench's --max-flows */
	__type(key, struct flow_key);
	__type(value, struct flow_value);
} floor_flows SEC(".maps");

const struct flow_value floor_zero = {};

static __always_inline struct flow_value *find(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct udphdr *udp = (void *)(ip + 1);
	struct flow_key key = {};
	struct flow_value *v;

	if ((void *)(udp + 1) > end || eth->h_proto != bpf_htons(0x0800) || ip->protocol != 17)
		return 0;
	__builtin_memcpy(key.src_addr, &ip->saddr, 4);
	__builtin_memcpy(key.dst_addr, &ip->daddr, 4);
	key.src_port = bpf_ntohs(udp->source);
	key.dst_port = bpf_ntohs(udp->dest);
	key.ifindex = ctx->ingress_ifindex;
	key.ip_proto = 17;
	key.family = 4;
	key.direction = CGLOOP_DIR_INGRESS;
	v = bpf_map_lookup_elem(&floor_flows, &key);
	if (!v) {
		bpf_map_update_elem(&floor_flows, &key, &floor_zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&floor_flows, &key);
	}
	return v;
}

SEC("xdp")
int floor_empty(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("xdp")
int floor_clock(struct xdp_md *ctx)
{
	volatile __u64 t = bpf_ktime_get_ns();

	(void)t;
	return XDP_PASS;
}

SEC("xdp")
int floor_lookup(struct xdp_md *ctx)
{
	volatile struct flow_value *v = find(ctx);

	(void)v;
	return XDP_PASS;
}

SEC("xdp")
int floor_touch(struct xdp_md *ctx)
{
	struct flow_value *v = find(ctx);

	if (v)
		v->packets++;
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
