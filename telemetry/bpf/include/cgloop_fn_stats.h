/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Contract between the flow probe (writer, telemetry/bpf) and the node agent's X-MAN power
 * manager (reader, actuators/node-agent): per-network-function packet counters, pinned at
 *   /sys/fs/bpf/cgloop/fn_stats   BPF_MAP_TYPE_PERCPU_ARRAY, key __u32 fn index, value below
 *   /sys/fs/bpf/cgloop/if_fn      BPF_MAP_TYPE_HASH, key __u32 ifindex, value __u32 fn index
 * A "function" is a set of interfaces serving one network function (X-MAN, Xiang thesis ch. 4). Index 0 is
 * "unassigned": traffic of interfaces not in if_fn is counted there. The reader sums the per-CPU
 * values (counters) and takes the maximum of last_ns. Layout changes bump CGLOOP_FN_STATS_ABI.
 */
#ifndef CGLOOP_FN_STATS_H
#define CGLOOP_FN_STATS_H

#define CGLOOP_FN_STATS_ABI 1
#define CGLOOP_MAX_FUNCTIONS 64

struct cgloop_fn_stats {
	__u64 rx_packets; /* ingress (XDP) packets on the function's interfaces */
	__u64 rx_bytes;
	__u64 tx_packets; /* egress (tc) packets on the function's interfaces */
	__u64 tx_bytes;
	__u64 rx_last_ns; /* bpf_ktime_get_ns() of the last ingress packet (CLOCK_MONOTONIC) */
	__u64 tx_last_ns; /* same, egress */
};

#endif
