// SPDX-License-Identifier: GPL-2.0 OR MIT
// A/B of two builds of the steering program (bpf/steer.c) on the same
// packets, with BPF_PROG_TEST_RUN: a relative measure that a loaded machine
// spoils less than a wall-clock benchmark (both programs run interleaved,
// round after round, on the same CPU; the kernel times `repeat` runs and
// gives the mean per run). Also a differential check: both programs must
// give the same verdict on every packet (same maps, same packets).
//
//   cc -O2 -o steer_ab steer_ab.c -lbpf
//   scripts/steer-ab/paths.py --emit | ./steer_ab A.o B.o [prog] [rounds] [repeat]
//
// prog: nw_steer (default) or nw_steer_frags. The maps of each object are
// filled alike (whichever of them the object has): our MAC 02:00:00:00:00:01,
// MTU 1500, UDP claims 198.18.0.1:5000 (a pid) and :5002 (NW_SLOT | 3),
// 239.1.1.1:5000, a TCP listener 198.18.0.1:80, a TCP flow .2:40000 ->
// .1:5001, a flow passed to the kernel .2:40001 -> .1:80, a listener group
// 198.18.0.1:8080 (group 1, slot 3). The XSKMAP gets an
// (unbound) AF_XDP socket at keys 0 and 3 * 64, so a claimed packet's
// bpf_redirect_map answers XDP_REDIRECT as on a live engine (test_run does
// not perform the redirect; its bpf_check_mtu sees the loopback's MTU, so
// a UDP super-frame is redirected there). Prints, per packet: both verdicts, the median
// and the mean ns per run of each over the rounds (the kernel's count
// per round is a whole number), and the median of the per-round ratios B/A.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <linux/if_xdp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef AF_XDP
#define AF_XDP 44
#endif

struct pkt {
	const char *name;
	unsigned char buf[4096];
	unsigned len;
};

static const unsigned char our_mac[6] = { 2, 0, 0, 0, 0, 1 };

struct claim_key {
	uint32_t addr;
	uint16_t port, pad;
};
struct flow_key {
	uint32_t raddr, laddr;
	uint16_t rport, lport;
};

static uint32_t a4(const char *s)
{
	uint32_t a;
	inet_pton(AF_INET, s, &a);
	return a;
}

static int map_fd(struct bpf_object *o, const char *name)
{
	struct bpf_map *m = bpf_object__find_map_by_name(o, name);
	return m ? bpf_map__fd(m) : -1;
}

static void fill(struct bpf_object *o, int xsk)
{
	int fd = map_fd(o, "nw_config");
	if (fd >= 0) {
		unsigned char v[12] = { 0 };
		memcpy(v, our_mac, 6);
		v[6] = 1;
		uint32_t mtu = 1500;
		memcpy(v + 8, &mtu, 4);
		uint32_t k = 0;
		if (bpf_map_update_elem(fd, &k, v, 0))
			perror("nw_config");
	}
	fd = map_fd(o, "nw_claims");
	struct claim_key ck = { a4("198.18.0.1"), htons(5000), 0 };
	uint32_t pid = 4242, slot = 0x40000000u | 3;
	bpf_map_update_elem(fd, &ck, &pid, 0);
	ck.port = htons(5002);
	bpf_map_update_elem(fd, &ck, &slot, 0);
	ck.addr = a4("239.1.1.1");
	ck.port = htons(5000);
	bpf_map_update_elem(fd, &ck, &pid, 0);
	fd = map_fd(o, "nw_tcp_listen");
	if (fd >= 0) {
		struct claim_key lk = { a4("198.18.0.1"), htons(80), 0 };
		bpf_map_update_elem(fd, &lk, &pid, 0);
	}
	fd = map_fd(o, "nw_tcp_groups");
	if (fd >= 0) {
		// A listener group (issue 24): group 1, slot 3 accepting.
		struct claim_key lk = { a4("198.18.0.1"), htons(8080), 0 };
		uint32_t gv = 0x40000000u | 0x20000000u | 1, gi = 1;
		unsigned char g[80] = { 0 };
		uint64_t active = 1 << 3;
		uint32_t one = 1;
		memcpy(g, &active, 8);
		memcpy(g + 8, &one, 4);
		memset(g + 16, 3, 64);
		bpf_map_update_elem(fd, &gi, g, 0);
		bpf_map_update_elem(map_fd(o, "nw_tcp_listen"), &lk, &gv, 0);
	}
	fd = map_fd(o, "nw_tcp_flows");
	if (fd >= 0) {
		struct flow_key f = { a4("198.18.0.2"), a4("198.18.0.1"), htons(40000), htons(5001) };
		bpf_map_update_elem(fd, &f, &pid, 0);
		uint32_t pass = 0x80000000u;
		struct flow_key g = { a4("198.18.0.2"), a4("198.18.0.1"), htons(40001), htons(80) };
		bpf_map_update_elem(fd, &g, &pass, 0);
	}
	fd = map_fd(o, "nw_xsks");
	uint32_t k0 = 0, k3 = 3 * 64;
	if (bpf_map_update_elem(fd, &k0, &xsk, 0))
		perror("nw_xsks[0]");
	bpf_map_update_elem(fd, &k3, &xsk, 0);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One BPF_PROG_TEST_RUN of `repeat` runs: the verdict, and the kernel's
// mean ns per run (a whole number: the mean over the rounds gives the
// fraction). The kernel's timer stops while the loop yields the CPU
// (cond_resched), so other processes' time is not counted, which a
// wall-clock measure around the call would (on a loaded machine, ten times
// the program's own time).
static int run(int prog, struct pkt *p, int repeat, uint32_t *ret, double *ns)
{
	LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = p->buf, .data_size_in = p->len,
		    .repeat = repeat);
	int e = bpf_prog_test_run_opts(prog, &o);
	*ret = o.retval;
	*ns = o.duration;
	return e;
}

static double mean(const double *v, int n)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += v[i];
	return s / n;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s A.o B.o [prog] [rounds] [repeat]\n", argv[0]);
		return 2;
	}
	const char *prog_name = argc > 3 ? argv[3] : "nw_steer";
	int rounds = argc > 4 ? atoi(argv[4]) : 21;
	int repeat = argc > 5 ? atoi(argv[5]) : 200000;
	int xsk = socket(AF_XDP, SOCK_RAW, 0);
	if (xsk < 0) {
		perror("AF_XDP socket");
		return 1;
	}
	struct bpf_object *obj[2];
	int prog[2];
	for (int i = 0; i < 2; i++) {
		obj[i] = bpf_object__open_file(argv[1 + i], NULL);
		if (!obj[i] || bpf_object__load(obj[i])) {
			fprintf(stderr, "cannot load %s\n", argv[1 + i]);
			return 1;
		}
		struct bpf_program *p = bpf_object__find_program_by_name(obj[i], prog_name);
		if (!p) {
			fprintf(stderr, "%s has no %s\n", argv[1 + i], prog_name);
			return 1;
		}
		prog[i] = bpf_program__fd(p);
		fill(obj[i], xsk);
	}
	// The packets, one a line on stdin: a name and the frame in hex
	// (scripts/steer-ab/paths.py --emit writes every path's).
	static struct pkt ps[64];
	int n = 0;
	char *line = NULL;
	size_t cap = 0;
	while (n < 64 && getline(&line, &cap, stdin) > 0) {
		char *name = strtok(line, " \n"), *hex = strtok(NULL, " \n");
		if (!name || !hex)
			continue;
		struct pkt *p = &ps[n++];
		p->name = strdup(name);
		for (p->len = 0; hex[2 * p->len] && hex[2 * p->len + 1] && p->len < sizeof(p->buf); p->len++)
			sscanf(hex + 2 * p->len, "%2hhx", &p->buf[p->len]);
	}
	free(line);
	if (!n) {
		fprintf(stderr, "no packets on stdin (scripts/steer-ab/paths.py --emit)\n");
		return 2;
	}
	// The loop's own cost: a program that only answers XDP_PASS.
	struct bpf_insn pass[] = {
		{ .code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = XDP_PASS },
		{ .code = BPF_JMP | BPF_EXIT },
	};
	int empty = bpf_prog_load(BPF_PROG_TYPE_XDP, "nw_empty", "GPL", pass, 2, NULL);
	if (empty >= 0) {
		double e[rounds];
		for (int r = 0; r < rounds; r++) {
			uint32_t ret;
			double ns;
			run(empty, &ps[0], repeat, &ret, &ns);
			e[r] = ns;
		}
		printf("empty program (the test-run loop's own cost): %.2f ns per run (mean %.2f)\n",
		       median(e, rounds), mean(e, rounds));
	}
	double *t[2], *ratio;
	t[0] = calloc(rounds, sizeof(double));
	t[1] = calloc(rounds, sizeof(double));
	ratio = calloc(rounds, sizeof(double));
	int diff = 0;
	printf("%-20s %8s %8s %13s %13s %7s\n", "packet", "ret A", "ret B", "A ns med/mean",
	       "B ns med/mean", "B/A med");
	for (int i = 0; i < n; i++) {
		uint32_t ret[2] = { 0, 0 };
		for (int r = 0; r < rounds; r++) {
			for (int k = 0; k < 2; k++) {
				int j = (r & 1) ? 1 - k : k; // alternate which goes first
				double ns;
				if (run(prog[j], &ps[i], repeat, &ret[j], &ns)) {
					perror("BPF_PROG_TEST_RUN");
					return 1;
				}
				t[j][r] = ns;
			}
			ratio[r] = t[0][r] > 0 ? t[1][r] / t[0][r] : 0;
		}
		static const char *act[] = { "ABORTED", "DROP", "PASS", "TX", "REDIRECT" };
		double aa = mean(t[0], rounds), ab = mean(t[1], rounds);
		double ma = median(t[0], rounds), mb = median(t[1], rounds), mr = median(ratio, rounds);
		printf("%-20s %8s %8s %6.0f %6.2f %6.0f %6.2f %7.3f\n", ps[i].name,
		       ret[0] < 5 ? act[ret[0]] : "?", ret[1] < 5 ? act[ret[1]] : "?", ma, aa, mb, ab, mr);
		diff |= ret[0] != ret[1];
	}
	if (diff)
		printf("VERDICTS DIFFER\n");
	return diff;
}
