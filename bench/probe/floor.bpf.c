// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Baselines for bench.py: what bpf_stats reports for an XDP program doing nothing, and for one
 * that only reads the clock (the probe reads it once per packet). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

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

char LICENSE[] SEC("license") = "Dual BSD/GPL";
