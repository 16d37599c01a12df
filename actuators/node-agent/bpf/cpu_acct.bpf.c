// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Per-node CPU accounting (src/cpu_acct.rs): the time each CPU spends running tasks of one
 * cgroup v2 subtree (the node's), for an agent that shares its machine with other emulated
 * nodes (the lab: every namespace on the same cores), where /proc/stat would charge every
 * node with the whole machine's load.
 *
 *   cgl_cpu_switch  tp_btf at sched_switch: the slice that ends on this CPU is added to its
 *                   busy time when the task that ran it was under the node's cgroup; whether
 *                   the next task is, is kept for the next switch (and for the reader, which
 *                   adds the slice still running). "Under" is the kernel's own descendant test
 *                   (cgroup_is_descendant): the task's cgroup v2 ancestor at the node's level
 *                   is the node's cgroup. A few loads per switch, no lookup or reference.
 *
 * A slice is charged to the task that was current, interrupts and softirqs it served included
 * (the kernel's own tick accounting does the same without CONFIG_IRQ_TIME_ACCOUNTING).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The node's cgroup v2 id (the kernfs inode of its directory) and its level (0: the root),
 * set by the agent before load. */
const volatile __u64 node_cgroup_id = 0;
const volatile __u32 node_cgroup_level = 0;

struct cpu_acct {
	__u64 busy_ns;	/* time this CPU ran the node's tasks, slices ended so far */
	__u64 since_ns;	/* bpf_ktime_get_ns() of the last switch on this CPU (0: none yet) */
	__u32 in_node;	/* the task switched in at since_ns is under the node's cgroup */
	__u32 pad;
};

/* One entry per CPU. Written by cgl_cpu_switch on its own CPU; read by the agent's node
 * sampler (src/cpu_acct.rs), which never writes it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_acct);
} cpu_acct SEC(".maps");

/* Whether `t` runs under the node's cgroup: its default-hierarchy cgroup's ancestor at the
 * node's level is the node's (the kernel's cgroup_is_descendant). */
static __always_inline int under_node(struct task_struct *t)
{
	struct cgroup *cg, *at;
	int level;

	cg = BPF_CORE_READ(t, cgroups, dfl_cgrp);
	if (!cg)
		return 0;
	level = BPF_CORE_READ(cg, level);
	if (level < (int)node_cgroup_level || node_cgroup_level > 255)
		return 0;
	at = NULL;
	bpf_core_read(&at, sizeof(at), &cg->ancestors[node_cgroup_level]);
	return at && BPF_CORE_READ(at, kn, id) == node_cgroup_id;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(cgl_cpu_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct cpu_acct *a;
	__u32 zero = 0;
	__u64 now;

	a = bpf_map_lookup_elem(&cpu_acct, &zero);
	if (!a)
		return 0;
	now = bpf_ktime_get_ns();
	if (a->in_node && a->since_ns && now > a->since_ns)
		a->busy_ns += now - a->since_ns;
	a->since_ns = now;
	/* the idle task belongs to no node */
	a->in_node = next && next->pid && under_node(next) ? 1 : 0;
	return 0;
}
