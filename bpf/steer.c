// SPDX-License-Identifier: GPL-2.0 OR MIT
// nanowire steering program: redirect claimed IPv4 UDP flows to AF_XDP.
//
// A flow is claimed by inserting (destination address, destination port),
// both in network byte order, into `claims`. Claimed packets go to the
// AF_XDP socket of the RX queue they arrived on (`xsks`, indexed by queue).
// Everything else -- ARP, ICMP, TCP, IPv6, VLAN-tagged frames, unclaimed
// UDP ports, and every IP fragment, first or not -- is XDP_PASS: the kernel
// reassembles fragmented datagrams and delivers them to the socket's kernel
// twin, which the engine reads (counted as the kernel path).
//
// Malformed packets: whenever the destination address and a destination
// port can be located, a claimed packet is redirected even if it is
// malformed (bad IHL, bad lengths) or carries IP options, and the engine
// classifies it and delivers it or counts it under its reason.
//
// Two entry points share the logic and the maps: `nw_steer` for ordinary
// MTUs and `nw_steer_frags` (xdp.frags, multi-buffer aware: it only reads
// the headers in the first buffer) for jumbo MTUs, where packets may span
// several buffers.
// A frame too short to carry the destination port cannot be attributed to
// anyone and is passed to the kernel, which counts it (IP InHdrErrors).
// When a claimed packet arrives on a queue without a socket it is passed
// and counted in `nw_stats[0]` (per CPU).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct claim_key {
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct claim_key);
	__type(value, __u32);
} nw_claims SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} nw_xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} nw_stats SEC(".maps");

static __always_inline int steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > end)
		return XDP_PASS;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	// Any fragment (MF set or a non-zero offset): the kernel reassembles.
	if (ip->frag_off & bpf_htons(0x3fff))
		return XDP_PASS;
	__u32 hl = ip->ihl * 4;
	if (hl < sizeof(*ip))
		hl = sizeof(*ip); // bad IHL: attribute by the port after 20 bytes
	__u16 *ports = (void *)ip + hl;
	if ((void *)(ports + 2) > end) {
		ports = (void *)(ip + 1);
		if ((void *)(ports + 2) > end)
			return XDP_PASS;
	}
	struct claim_key key = { .addr = ip->daddr, .port = ports[1], .pad = 0 };
	if (!bpf_map_lookup_elem(&nw_claims, &key))
		return XDP_PASS;
	// One XSKMAP lookup: the redirect itself answers XDP_PASS (the action
	// in the flags) when the queue has no socket.
	long act = bpf_redirect_map(&nw_xsks, ctx->rx_queue_index, XDP_PASS);
	if (act == XDP_REDIRECT)
		return XDP_REDIRECT;
	__u32 k = 0;
	__u64 *c = bpf_map_lookup_elem(&nw_stats, &k);
	if (c)
		*c += 1;
	return XDP_PASS;
}

SEC("xdp")
int nw_steer(struct xdp_md *ctx)
{
	return steer(ctx);
}

SEC("xdp.frags")
int nw_steer_frags(struct xdp_md *ctx)
{
	return steer(ctx);
}

char _license[] SEC("license") = "GPL";
