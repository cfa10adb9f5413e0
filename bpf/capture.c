// SPDX-License-Identifier: GPL-2.0 OR MIT
// nanowire dedicated capture program (`nanowire capture --xdp`): take the
// interface's frames into AF_XDP sockets for capture.
//
// With no filter every frame is taken. With a filter (nw_cap_cfg) only IPv4
// frames to or from the address and/or UDP/TCP first fragments to or from
// the port are taken -- the same rule as crates/capture/src/filter.rs;
// everything else is XDP_PASS. A taken frame does not reach the kernel
// stack. Counters (per CPU) in nw_cap_stats: 0 taken, 1 passed (filtered
// out), 2 passed because the RX queue had no capture socket.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define CAP_ADDR 1
#define CAP_PORT 2

struct cap_cfg {
	__u32 addr;  // network order
	__u16 port;  // network order
	__u16 flags; // CAP_ADDR | CAP_PORT
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cap_cfg);
} nw_cap_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} nw_cap_xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} nw_cap_stats SEC(".maps");

static __always_inline void count(__u32 k)
{
	__u64 *c = bpf_map_lookup_elem(&nw_cap_stats, &k);
	if (c)
		*c += 1;
}

static __always_inline int selected(struct xdp_md *ctx, const struct cap_cfg *cfg)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if (!(cfg->flags & (CAP_ADDR | CAP_PORT)))
		return 1;
	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	if ((cfg->flags & CAP_ADDR) && ip->saddr != cfg->addr && ip->daddr != cfg->addr)
		return 0;
	if (!(cfg->flags & CAP_PORT))
		return 1;
	if (ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_TCP)
		return 0;
	if (ip->frag_off & bpf_htons(0x1fff))
		return 0;
	__u32 hl = ip->ihl * 4;
	if (hl < sizeof(*ip))
		return 0;
	__u16 *ports = (void *)ip + hl;
	if ((void *)(ports + 2) > end)
		return 0;
	return ports[0] == cfg->port || ports[1] == cfg->port;
}

SEC("xdp")
int nw_capture(struct xdp_md *ctx)
{
	__u32 k = 0;
	struct cap_cfg *cfg = bpf_map_lookup_elem(&nw_cap_cfg, &k);
	if (!cfg)
		return XDP_PASS;
	if (!selected(ctx, cfg)) {
		count(1);
		return XDP_PASS;
	}
	long act = bpf_redirect_map(&nw_cap_xsks, ctx->rx_queue_index, XDP_PASS);
	count(act == XDP_REDIRECT ? 0 : 2);
	return act;
}

char _license[] SEC("license") = "GPL";
