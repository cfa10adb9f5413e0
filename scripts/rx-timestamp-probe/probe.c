// Load probe.bpf.o device-bound to IFNAME, attach in MODE (native|generic),
// wait SECS, print what bpf_xdp_metadata_rx_timestamp returned.
#include <bpf/libbpf.h>
#include <bpf/bpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifndef BPF_F_XDP_DEV_BOUND_ONLY
#define BPF_F_XDP_DEV_BOUND_ONLY (1U << 6)
#endif
int main(int argc, char **argv)
{
	if (argc != 5) { fprintf(stderr, "usage: probe OBJ IFNAME native|generic SECS\n"); return 2; }
	int ifindex = if_nametoindex(argv[2]);
	if (!ifindex) { perror("if_nametoindex"); return 1; }
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) { perror("open"); return 1; }
	struct bpf_program *p = bpf_object__find_program_by_name(obj, "probe");
	bpf_program__set_ifindex(p, ifindex);
	bpf_program__set_flags(p, bpf_program__flags(p) | BPF_F_XDP_DEV_BOUND_ONLY);
	int err = bpf_object__load(obj);
	if (err) { printf("{\"load\":\"failed\",\"err\":%d}\n", err); return 1; }
	__u32 flags = strcmp(argv[3], "native") == 0 ? XDP_FLAGS_DRV_MODE : XDP_FLAGS_SKB_MODE;
	err = bpf_xdp_attach(ifindex, bpf_program__fd(p), flags, NULL);
	if (err) { printf("{\"mode\":\"%s\",\"attach\":\"refused\",\"err\":%d,\"msg\":\"%s\"}\n", argv[3], err, strerror(-err)); return 0; }
	fprintf(stderr, "attached\n");
	sleep(atoi(argv[4]));
	int m = bpf_map__fd(bpf_object__find_map_by_name(obj, "probe_stats"));
	unsigned long long v[8] = {0};
	for (__u32 k = 0; k < 8; k++) bpf_map_lookup_elem(m, &k, &v[k]);
	bpf_xdp_detach(ifindex, flags, NULL);
	printf("{\"mode\":\"%s\",\"calls\":%llu,\"ok_nonzero\":%llu,\"ok_zero\":%llu,\"enodata\":%llu,\"eopnotsupp\":%llu,\"other\":%llu,\"last_stamp\":%llu}\n",
	       argv[3], v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
	return 0;
}
