/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Map layouts shared by agent.bpf.c and the agent (src/datapath.rs mirrors them with #[repr(C)]
 * structs; a size check at load time catches drift).
 */
#ifndef CGLOOP_AGENT_H
#define CGLOOP_AGENT_H

#define CGL_MAX_FLOWS 65536
#define CGL_MAX_DSCP_RULES 1024
#define CGL_MAX_IFACES 64
#define CGL_MAX_CHAINS 256
/* Two slots per chain (active + staging) so a swap is one store. */
#define CGL_MAX_CHAIN_SLOTS 512
#define CGL_MAX_CHAIN_FNS 8
#define CGL_KEEP 0xff
/* Instances of the advanced functions (Natif's scale-out): AF_XDP ports/workers. */
#define CGL_MAX_ADV_INSTANCES 16

/* Basic chain functions; index into fn_progs. */
enum cgl_fn_kind {
	CGL_FN_FORWARD = 0,
	CGL_FN_ACL = 1,
	CGL_FN_MARK = 2,
	CGL_FN_RATE = 3,
	CGL_FN_MIRROR = 4,
	/* Last BPF step of a chain with advanced (payload) functions: to the AF_XDP port. */
	CGL_FN_TO_USER = 5,
	CGL_FN_KINDS = 6,
};

/* skb->mark of a packet coming back from the user-space advanced functions: the classifier
 * sets its class again but does not run its chain a second time. */
#define CGL_ADV_MARK 0xc6100adu
/* Source MAC of a packet on its way to user space: 0xc6, 0x1a, slot (u16 BE), ifindex (u16 BE).
 * The return path restores the interface's own address from adv_if_mac. */
#define CGL_ADV_MAC0 0xc6
#define CGL_ADV_MAC1 0x1a

struct cgl_mac {
	__u8 addr[6];
	__u16 pad;
};

struct cgl_flow_key {
	__u32 ifindex;
	__u8 family; /* 4 or 6 */
	__u8 proto;
	__u16 sport; /* host order */
	__u16 dport;
	__u16 pad;
	__u8 src[16]; /* IPv4 uses the first 4 bytes */
	__u8 dst[16];
};

struct cgl_dscp_key {
	__u32 ifindex;
	__u32 dscp;
};

struct cgl_flow_rule {
	__u32 classid;
	__u32 rewrite_dscp; /* CGL_KEEP = leave */
};

struct cgl_impairment {
	__u32 threshold; /* drop when bpf_get_prandom_u32() < threshold */
	__u32 pad;
	__u64 seen;
	__u64 dropped;
};

struct cgl_class_key {
	__u32 ifindex;
	__u32 classid;
};

struct cgl_chain_fn {
	__u32 kind;
	__u32 a;
	__u32 b;
	__u32 c;
	__u64 d;
};

struct cgl_chain {
	__u32 len;
	__u32 pad;
	struct cgl_chain_fn fns[CGL_MAX_CHAIN_FNS];
};

struct cgl_fn_counters {
	__u64 packets;
	__u64 bytes;
	__u64 dropped;
};

struct cgl_flow_counters {
	__u64 packets;
	__u64 bytes;
};

struct cgl_bucket {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 tokens;
	__u64 last_ns;
};

#endif
