// SPDX-License-Identifier: GPL-2.0 OR MIT
// nanowire steering program: redirect claimed IPv4 UDP flows, and the TCP
// ports and connections of the engine's TCP, to AF_XDP.
//
// A flow is claimed by inserting (destination address, destination port),
// both in network byte order, into `claims`. Claimed packets go to the
// AF_XDP socket of the RX queue they arrived on (`xsks`, indexed by queue;
// under the engine service, the claiming process's socket on that queue:
// the claim's value names its slot, see xsk_key).
// Everything else -- ARP, ICMP, unclaimed TCP, IPv6, VLAN-tagged frames, unclaimed
// UDP ports, and every UDP fragment, first or not -- is XDP_PASS: the kernel
// reassembles fragmented datagrams and delivers them to the socket's kernel
// twin, which the engine reads (counted as the kernel path). Fragments of
// the engine's TCP flows go to the engine (see tcp_fragment below).
//
// Malformed packets: whenever the destination address and a destination
// port can be located, a claimed packet is redirected even if it is
// malformed (bad IHL, bad lengths) or carries IP options, and the engine
// classifies it and delivers it or counts it under its reason.
//
// Two entry points share the logic and the maps: `nw_steer_frags`
// (xdp.frags, multi-buffer aware), which the engine attaches in every mode
// so that packets larger than one buffer -- jumbo frames, and the 64 KiB
// TSO/GSO/GRO super-frames a kernel peer hands a veth (or GRO builds) that
// generic XDP sees unsegmented -- reach AF_XDP as one chain of descriptors;
// and `nw_steer`, the fallback for kernels and drivers that refuse it. The
// logic reads only the headers, which are in the first buffer (data ..
// data_end covers just that one in a frags-aware program).
// A claimed UDP datagram longer than the interface MTU did not come off a
// wire whole: it is a kernel sender's UDP GSO super-frame (many datagrams in
// one skb, whose sizes only the skb knows), passed to the kernel, which
// splits it for the socket's kernel twin. A TCP super-frame is one segment
// larger than the MSS, which the engine's TCP takes as it is.
// A frame too short to carry the destination port cannot be attributed to
// anyone and is passed to the kernel, which counts it (IP InHdrErrors).
// When a claimed packet arrives on a queue without a socket it is passed
// (a TCP segment other than a SYN is dropped instead: redirect_tcp)
// and counted in `nw_stats[0]` (per CPU); a unicast frame for another
// host's MAC is passed and counted in `nw_stats[1]` (below).
//
// Structure (session 12; every frame on the interface runs this, claimed or
// not): `steer` is the fast path for the common case -- a frame to our MAC
// (or a group address) carrying IPv4 without options, not a fragment, at
// least 38 bytes: one bounds check, two words tested, one config lookup,
// one claim lookup (UDP) or flow-then-listener lookup (TCP), the redirect.
// Everything else (short frames, IP options, fragments, frames for another
// host, no MAC configured) goes to `steer_slow`, a bpf-to-bpf call, which
// decides every case exactly as before; the decisions themselves live once
// (udp_claimed, tcp_owner, tcp_fragment, other_host) and both paths use
// them. scripts/steer-ab/ counts instructions per path and A/B-times two
// builds with BPF_PROG_TEST_RUN (docs/benchmarks.md, "Session 12").
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

// Indexed by RX queue (an engine of its own), or, for a claim whose value
// has NW_SLOT (the engine service: several processes on one queue, each
// with its own socket on a shared UMEM), by slot * 64 + RX queue.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} nw_xsks SEC(".maps");

#define NW_SLOT 0x40000000u

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} nw_stats SEC(".maps");

// Under the engine service: per XSKMAP key (slot * 64 + queue) the frames
// steered to that socket, counted here and read by the members sharing a
// CPU through a read-only mapping (BPF_F_MMAPABLE): a member that waits by
// spinning sees a sibling's frame arrive and hands it the CPU
// (crates/xdp/src/seats.rs, "passing the CPU by hint"). Counted when the
// key is chosen (xsk_key), so an own engine's path is unchanged; a frame
// then passed or dropped costs its member one spurious wake-up at most.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u32);
} nw_ready SEC(".maps");

// One XSKMAP lookup: the redirect itself answers XDP_PASS (the action in
// the flags) when the queue has no socket (counted in nw_stats[0]).
static __always_inline int redirect_to(struct xdp_md *ctx, __u32 key)
{
	long act = bpf_redirect_map(&nw_xsks, key, XDP_PASS);
	if (act == XDP_REDIRECT)
		return XDP_REDIRECT;
	__u32 k = 0;
	__u64 *c = bpf_map_lookup_elem(&nw_stats, &k);
	if (c)
		*c += 1;
	return XDP_PASS;
}

// A TCP segment the engine owns (an engine flow's, a listener's) whose
// socket is gone: dropped, not passed. The kernel has no socket for it and
// would reset the peer. This is the window between an own engine's death
// and its warden's end (the warden holds the program's link until each
// connection has its kernel socket, crates/stack/src/xdp/service/
// warden.rs): the peer retransmits, as to a process whose frames are lost
// on the wire. A SYN without ACK still goes to the kernel, which answers it
// as it would plainly (no listener: RST). `th`: the TCP header, or NULL (a
// fragment: dropped). Counted as any failed redirect (nw_stats[0]).
static __always_inline int redirect_tcp(struct xdp_md *ctx, __u32 key, __u8 *th, void *end)
{
	if (redirect_to(ctx, key) == XDP_REDIRECT)
		return XDP_REDIRECT;
	if (th && (void *)(th + 14) <= end && (th[13] & 0x12) == 0x02)
		return XDP_PASS;
	return XDP_DROP;
}

// The socket a claim's value names: its slot's on this queue, or the
// queue's own.
static __always_inline __u32 xsk_key(struct xdp_md *ctx, __u32 v)
{
	__u32 q = ctx->rx_queue_index & 63;
	if (v & NW_SLOT) {
		__u32 k = ((v & 63) << 6) | q;
		__u32 *n = bpf_map_lookup_elem(&nw_ready, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
		return k;
	}
	return ctx->rx_queue_index;
}

// ---- Frames for another host (issue 20, finding 12) ----
// The kernel drops a unicast frame whose destination MAC is not the
// interface's (PACKET_OTHERHOST: a switch flooding, a promiscuous port, a
// forged frame); so does the engine: such a frame is passed to the kernel
// (which drops it as usual) and counted in nw_stats[1]. Broadcast and
// multicast frames (group bit set) go on to the checks below. The loader
// writes the interface's MAC into nw_config before claiming anything
// (`on` = 0: no check, e.g. an interface without a MAC). `mtu` is the
// interface's MTU when the program was attached (0: unknown): a UDP
// datagram no longer than it is no super-frame, so only longer ones pay
// for the exact bpf_check_mtu (see steer).
struct nw_config {
	__u8 mac[6];
	__u8 on;
	__u8 pad;
	__u32 mtu;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nw_config);
} nw_config SEC(".maps");

static __always_inline int other_host(struct ethhdr *eth, struct nw_config *c)
{
	if (eth->h_dest[0] & 1)
		return 0;
	if (!c || !c->on)
		return 0;
	if (eth->h_dest[0] == c->mac[0] && eth->h_dest[1] == c->mac[1] &&
	    eth->h_dest[2] == c->mac[2] && eth->h_dest[3] == c->mac[3] &&
	    eth->h_dest[4] == c->mac[4] && eth->h_dest[5] == c->mac[5])
		return 0;
	__u32 s = 1;
	__u64 *n = bpf_map_lookup_elem(&nw_stats, &s);
	if (n)
		*n += 1;
	return 1;
}

// ---- TCP (issue 11) ----
// TCP is steered only for what the engine's TCP owns: a listener's
// (local address, port) in `nw_tcp_listen`, a client connection's 4-tuple
// in `nw_tcp_flows`. Their values name the owner as a claim's do: a pid
// (the queue's socket), or NW_SLOT | slot (the engine service: that
// process's socket on the queue, xsk_key). The kernel holds the same ports with its own sockets
// (so it never hands them out) and never sees these segments (so it never
// answers them with RST).
// A flow entry whose value has this bit is the kernel's: a connection handed
// over to it (TCP_REPAIR) under a listener the engine still claims.
#define NW_FLOW_PASS 0x80000000u

struct tcp_flow_key {
	__u32 raddr; // remote (source of the packet)
	__u32 laddr; // local (destination)
	__u16 rport;
	__u16 lport;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct claim_key);
	__type(value, __u32);
} nw_tcp_listen SEC(".maps");

/* A map keyed by a TCP 4-tuple as the packet carries it (nw_tcp_flows, and
 * nw_tcp_pins below: tcp_owner looks both up with the same key). Not
 * preallocated: 65,536 preallocated entries cost every process ~2 ms and
 * ~4 MB at start, for the few flows most of them claim; flows are written
 * from user space (a claim at connect/accept), pins by the program at a
 * group listener's SYN (an allocation in XDP context, as any update). */
#define TCP_FLOW_MAP(name)                                   \
	struct {                                             \
		__uint(type, BPF_MAP_TYPE_HASH);             \
		__uint(max_entries, 65536);                  \
		__uint(map_flags, BPF_F_NO_PREALLOC);        \
		__type(key, struct tcp_flow_key);            \
		__type(value, __u32);                        \
	} name SEC(".maps")

TCP_FLOW_MAP(nw_tcp_flows);

// ---- Listeners shared across fork (issue 24) ----
// Under the engine service a listener's claim is a group: the processes
// that hold the same listening socket (a master and its forked workers,
// each attached with its own slot) and accept from it. Its nw_tcp_listen
// value is NW_SLOT | NW_GROUP | group index. A new connection's SYN goes
// to one of the group's accepting slots by a hash of its 4-tuple (as
// SO_REUSEPORT spreads them), and that choice is pinned in nw_tcp_pins so
// that the connection's later segments reach the same process even after
// the group changes (a worker joins or dies). A SYN whose pin names a slot
// no longer accepting is spread anew. No accepting slot (n == 0: the
// master forked, no worker has come yet): the kernel's listening socket,
// which every holder of the fd accepts from, takes it, and the SYN is
// pinned to the kernel (NW_PIN_KERNEL), so that the connection's later
// segments stay there once a member accepts again (by the hash they would
// reach an engine that never saw the handshake, which resets them). The
// service writes the groups, removes the pins of a slot that leaves and
// the kernel pins of connections the kernel no longer has.
#define NW_GROUP 0x20000000u
#define NW_PIN_KERNEL 0x10000000u

struct nw_group {
	__u64 active; // slots accepting, a bit each
	__u32 n;      // accepting slots (0: none)
	__u32 pad;
	__u8 bucket[64]; // slot per hash bucket
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct nw_group);
} nw_tcp_groups SEC(".maps");

TCP_FLOW_MAP(nw_tcp_pins);

// The owner of a segment for group listener `v` (1), or the kernel's (0).
static __always_inline int group_owner(struct tcp_flow_key *f, __u8 *th, void *end, __u32 v,
				       __u32 *owner)
{
	__u32 gi = v & 1023;
	struct nw_group *g = bpf_map_lookup_elem(&nw_tcp_groups, &gi);
	if (!g)
		return 0;
	// SYN without ACK: a new connection.
	int syn = (void *)(th + 14) <= end && (th[13] & 0x12) == 0x02;
	__u32 *p = bpf_map_lookup_elem(&nw_tcp_pins, f);
	if (p && *p == NW_PIN_KERNEL)
		return 0;
	if (p && (!syn || ((g->active >> (*p & 63)) & 1))) {
		*owner = *p;
		return 1;
	}
	if (!g->n) {
		if (syn) {
			__u32 k = NW_PIN_KERNEL;
			bpf_map_update_elem(&nw_tcp_pins, f, &k, BPF_ANY);
		}
		return 0;
	}
	// Every bit of the 4-tuple moves the bucket (murmur3's finaliser): a
	// client's ports step by 2, which a plain multiply leaves in one bucket.
	__u32 h = f->raddr ^ ((__u32)f->rport << 16) ^ f->lport;
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	__u32 o = NW_SLOT | (g->bucket[h & 63] & 63);
	if (syn)
		bpf_map_update_elem(&nw_tcp_pins, f, &o, BPF_ANY);
	*owner = o;
	return 1;
}

// The one place TCP ownership is decided (both paths): `flow` is the
// segment's struct tcp_flow_key (on the stack, or the packet's own bytes
// 26..37 when the IPv4 header has no options), (laddr, lport) its
// destination, `th` the TCP header (the SYN flag for a listener group,
// read only if within `end`). TCP_MINE | the owner's value (a pid, or
// NW_SLOT | slot under the engine service: see xsk_key; a group
// listener's: group_owner) when the 4-tuple is an engine flow or the
// destination a listener; 0 when the kernel's. (A value, not an out
// parameter: nothing goes through the stack but a group's owner.)
#define TCP_MINE (1ULL << 32)

static __always_inline __u64 tcp_owner(void *flow, __u32 laddr, __u16 lport, __u8 *th, void *end)
{
	__u32 *v = bpf_map_lookup_elem(&nw_tcp_flows, flow);
	if (v)
		return (*v & NW_FLOW_PASS) ? 0 : TCP_MINE | *v;
	struct claim_key k = { .addr = laddr, .port = lport, .pad = 0 };
	v = bpf_map_lookup_elem(&nw_tcp_listen, &k);
	if (!v)
		return 0;
	if (*v & NW_GROUP) {
		__u32 owner = 0;
		return group_owner(flow, th, end, *v, &owner) ? TCP_MINE | owner : 0;
	}
	return TCP_MINE | *v;
}

// tcp_owner for any IPv4 header (options, bad IHL): 0 when the ports are
// beyond the frame.
static __always_inline __u64 tcp_ports_owner(struct iphdr *ip, void *end)
{
	__u32 hl = ip->ihl * 4;
	if (hl < sizeof(*ip))
		hl = sizeof(*ip);
	__u16 *ports = (void *)ip + hl;
	if ((void *)(ports + 2) > end)
		return 0;
	struct tcp_flow_key f = {
		.raddr = ip->saddr, .laddr = ip->daddr, .rport = ports[0], .lport = ports[1],
	};
	return tcp_owner(&f, ip->daddr, ports[1], (__u8 *)ports, end);
}

// ---- Fragments of the engine's TCP flows (issue 20, finding 8) ----
// The kernel has no socket for an engine connection: a fragmented segment
// reassembled there would be answered with RST. So a first fragment (it
// carries the ports) of a flow the engine owns is redirected, and its
// (source, destination, IP id, protocol) remembered here so that the later
// fragments of the datagram follow it (the entry's value is the flow's
// owner value, so they reach the same process's socket under the engine
// service); the engine reassembles (bounded,
// crates/stack/src/xdp/reasm.rs). The last fragment forgets the entry.
// A non-first fragment that arrives before its first fragment is passed to
// the kernel (it cannot be attributed): the kernel never completes that
// datagram, so it is lost, never answered, and TCP retransmits it. A first
// fragment too short to carry the ports goes to the kernel likewise.
struct frag_key {
	__u32 saddr;
	__u32 daddr;
	__u16 id;
	__u8 proto;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct frag_key);
	__type(value, __u32);
} nw_tcp_frags SEC(".maps");

static __always_inline int tcp_fragment(struct xdp_md *ctx, struct iphdr *ip, void *end)
{
	struct frag_key k = {
		.saddr = ip->saddr, .daddr = ip->daddr, .id = ip->id, .proto = ip->protocol, .pad = 0,
	};
	if (ip->frag_off & bpf_htons(0x1fff)) {
		// Not the first: only if its first fragment was ours.
		__u32 *v = bpf_map_lookup_elem(&nw_tcp_frags, &k);
		if (!v)
			return XDP_PASS;
		__u32 key = xsk_key(ctx, *v);
		if (!(ip->frag_off & bpf_htons(0x2000)))
			bpf_map_delete_elem(&nw_tcp_frags, &k); // the last one (no MF)
		return redirect_tcp(ctx, key, NULL, end);
	}
	__u64 mine = tcp_ports_owner(ip, end);
	if (!mine)
		return XDP_PASS;
	__u32 owner = mine;
	bpf_map_update_elem(&nw_tcp_frags, &k, &owner, BPF_ANY);
	return redirect_tcp(ctx, xsk_key(ctx, owner), NULL, end);
}

// A claimed UDP datagram: to the owner's socket, unless it is a UDP GSO
// super-frame (longer than the MTU), which the kernel splits.
static __always_inline int udp_claimed(struct xdp_md *ctx, struct nw_config *cfg,
				       struct iphdr *ip, __u32 owner)
{
	__u32 xkey = xsk_key(ctx, owner);
	__u32 len = bpf_ntohs(ip->tot_len);
	if (!cfg || len > cfg->mtu) {
		// The exact check (the helper takes the length by address: the
		// stack copy only here).
		__u32 mtu_len = len;
		if (bpf_check_mtu(ctx, 0, &mtu_len, 0, 0) != BPF_MTU_CHK_RET_SUCCESS)
			return XDP_PASS;
	}
	return redirect_to(ctx, xkey);
}

// ---- Every case (the slow path) ----
// The whole logic, for every frame the fast path below does not take:
// frames shorter than Ethernet + 20-byte IPv4 header + ports, other
// EtherTypes (ARP, IPv6, VLAN), IPv4 with options or a bad IHL, fragments,
// broadcast and multicast frames, frames for another host, and the
// interface without a MAC (nw_config `on` = 0). A call of its own (not
// inlined): its instructions stay out of the fast path's way.
static __noinline int steer_slow(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > end)
		return XDP_PASS;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	__u32 ck = 0;
	struct nw_config *cfg = bpf_map_lookup_elem(&nw_config, &ck);
	if (other_host(eth, cfg))
		return XDP_PASS;
	if (ip->protocol == IPPROTO_TCP) {
		if (ip->frag_off & bpf_htons(0x3fff))
			return tcp_fragment(ctx, ip, end);
		__u64 mine = tcp_ports_owner(ip, end);
		if (!mine)
			return XDP_PASS;
		__u32 thl = ip->ihl * 4;
		if (thl < sizeof(*ip))
			thl = sizeof(*ip);
		return redirect_tcp(ctx, xsk_key(ctx, mine), (__u8 *)ip + thl, end);
	}
	if (ip->protocol != IPPROTO_UDP)
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
	__u32 *owner = bpf_map_lookup_elem(&nw_claims, &key);
	if (!owner)
		return XDP_PASS;
	return udp_claimed(ctx, cfg, ip, *owner);
}

// ---- The common case first (the fast path) ----
// A unicast frame to our MAC carrying IPv4 without options, not a
// fragment, long enough for the ports: one bounds check, the EtherType,
// version, IHL and fragment bits tested as two words, one config lookup (an
// array: the verifier inlines it), one lookup of the claim or flow (the
// TCP flow's key is the packet's own 12 bytes of addresses and ports, no
// copy), the redirect. Anything else goes to steer_slow, which decides as
// before. Counters only where something is passed that was claimed.
#define FAST_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + 4)

static __always_inline int steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;

	if (data + FAST_LEN > end)
		return steer_slow(ctx);
	// Bytes 12..15: EtherType 0x0800, version 4 with IHL 5 (tos ignored);
	// bytes 20..23: fragment offset and MF (DF ignored), TTL, protocol.
	__u32 w12 = *(__u32 *)(data + 12);
	__u32 w20 = *(__u32 *)(data + 20);
	if ((w12 & 0x00ffffff) != 0x00450008) {
		if ((__u16)w12 != bpf_htons(ETH_P_IP))
			return XDP_PASS; // ARP, IPv6, VLAN: the kernel's
		return steer_slow(ctx);
	}
	if (w20 & 0x0000ff3f)
		return steer_slow(ctx);
	__u32 ck = 0;
	struct nw_config *cfg = bpf_map_lookup_elem(&nw_config, &ck);
	if (!cfg)
		return steer_slow(ctx);
	// Our MAC, or a group address (broadcast, multicast: go on, as in
	// other_host); any other (another host's; none configured) is the
	// slow path's to decide.
	__u32 mac_lo = *(__u32 *)data;
	if ((mac_lo != *(__u32 *)cfg->mac || *(__u16 *)(data + 4) != *(__u16 *)(cfg->mac + 4)) &&
	    !(mac_lo & 1))
		return steer_slow(ctx);
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u8 proto = w20 >> 24;
	if (proto == IPPROTO_UDP) {
		__u16 *ports = (void *)(ip + 1);
		struct claim_key key = { .addr = ip->daddr, .port = ports[1], .pad = 0 };
		__u32 *owner = bpf_map_lookup_elem(&nw_claims, &key);
		if (!owner)
			return XDP_PASS;
		return udp_claimed(ctx, cfg, ip, *owner);
	}
	if (proto != IPPROTO_TCP)
		return XDP_PASS;
	// saddr, daddr, sport, dport: struct tcp_flow_key as the packet has it
	// (a map key may point into the packet).
	__u16 *ports = (void *)(ip + 1);
	__u64 mine = tcp_owner(&ip->saddr, ip->daddr, ports[1], (__u8 *)ports, end);
	if (!mine)
		return XDP_PASS;
	return redirect_tcp(ctx, xsk_key(ctx, mine), (__u8 *)ports, end);
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
