// SPDX-License-Identifier: GPL-2.0 OR MIT
// What does bpf_xdp_metadata_rx_timestamp give on this interface?
// slot 0: calls, 1: returned 0 with a non-zero stamp, 2: returned 0 with stamp 0,
// 3: -ENODATA, 4: -EOPNOTSUPP, 5: other error, 6: last stamp seen.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

extern int bpf_xdp_metadata_rx_timestamp(const struct xdp_md *ctx, __u64 *timestamp) __ksym;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
} probe_stats SEC(".maps");

static __always_inline void bump(__u32 k, __u64 v, int set)
{
	__u64 *c = bpf_map_lookup_elem(&probe_stats, &k);
	if (c) {
		if (set)
			*c = v;
		else
			__sync_fetch_and_add(c, 1);
	}
}

SEC("xdp")
int probe(struct xdp_md *ctx)
{
	__u64 ts = 0;
	int r = bpf_xdp_metadata_rx_timestamp(ctx, &ts);
	bump(0, 0, 0);
	if (r == 0 && ts)
		bump(1, 0, 0);
	else if (r == 0)
		bump(2, 0, 0);
	else if (r == -61)
		bump(3, 0, 0);
	else if (r == -95)
		bump(4, 0, 0);
	else
		bump(5, 0, 0);
	if (ts)
		bump(6, ts, 1);
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
