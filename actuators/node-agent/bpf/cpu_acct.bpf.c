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
 *                   adds the slice still running).
 *
 * A slice is charged to the task that was current, interrupts and softirqs it served included
 * (the kernel's own tick accounting does the same without CONFIG_IRQ_TIME_ACCOUNTING).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The node's cgroup v2 id (the kernfs inode of its directory), set by the agent before load. */
const volatile __u64 node_cgroup_id = 0;

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

extern struct cgroup *bpf_cgroup_from_id(u64 cgid) __ksym;
extern void bpf_cgroup_release(struct cgroup *cgrp) __ksym;
extern bool bpf_task_under_cgroup(struct task_struct *task, struct cgroup *ancestor) __ksym;

SEC("tp_btf/sched_switch")
int BPF_PROG(cgl_cpu_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct cgroup *node;
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
	a->in_node = 0;
	if (!next || !next->pid)	/* the idle task belongs to no node */
		return 0;
	node = bpf_cgroup_from_id(node_cgroup_id);
	if (!node)			/* the cgroup is gone: nothing of the node runs */
		return 0;
	a->in_node = bpf_task_under_cgroup(next, node) ? 1 : 0;
	bpf_cgroup_release(node);
	return 0;
}
