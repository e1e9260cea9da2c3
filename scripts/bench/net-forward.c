/* scripts/bench/net-forward's program: 1 GiB over loopback directly, through a splice relay
 * (what net/tunnel.c does) and through a BPF sockmap redirect, in rounds. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { DIRECT, SPLICE, SOCKMAP, SOCKMAP_BIG, NMODES };
static const char *names[NMODES] = {"direct", "splice", "sockmap", "sockmap-16M"};
static int server_port, relay_port, server_fd, relay_fd, mode;
static int sockmap_fd, count_fd;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_seconds(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec +
	       r.ru_stime.tv_usec / 1e6;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static int listen_on(int *port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || bind(fd, (void *)&a, sizeof a) < 0 || listen(fd, 16) < 0 ||
	    getsockname(fd, (void *)&a, &l) < 0)
		die("listen");
	*port = ntohs(a.sin_port);
	return fd;
}

static int connect_to(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (fd < 0 || connect(fd, (void *)&a, sizeof a) < 0)
		die("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

static int readn(int fd, void *b, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, (char *)b + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

static int writen(int fd, const void *b, size_t n)
{
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, (const char *)b + off, n - off);
		if (w <= 0)
			return -1;
		off += (size_t)w;
	}
	return 0;
}

/* The server: an 8-byte count -> that many bytes, then its end of the stream. */
static void *serve(void *arg)
{
	static char buf[1 << 20];
	(void)arg;
	for (;;) {
		int c = accept(server_fd, NULL, NULL);
		uint64_t left;
		char b;
		if (c < 0)
			die("accept");
		if (readn(c, &left, 8) == 0)
			while (left) {
				size_t k = left < sizeof buf ? left : sizeof buf;
				if (writen(c, buf, k) < 0)
					break;
				left -= k;
			}
		shutdown(c, SHUT_WR);
		while (read(c, &b, 1) > 0)
			;
		close(c);
	}
	return NULL;
}

static long bpf(int cmd, union bpf_attr *a)
{
	return syscall(__NR_bpf, cmd, a, sizeof *a);
}

#define INSN(c, d, s, o, i)                                                                        \
	((struct bpf_insn){.code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i)})

/* A sockmap of two slots (0 the server's side, 1 the client's) and a stream verdict that sends
 * each skb out of the other slot's socket, adding its length to a per-slot count (the bytes a
 * network log would need). */
static void sockmap_setup(void)
{
	union bpf_attr a;
	static char log[65536];
	int prog;

	memset(&a, 0, sizeof a);
	a.map_type = BPF_MAP_TYPE_SOCKMAP, a.key_size = 4, a.value_size = 4, a.max_entries = 2;
	if ((sockmap_fd = (int)bpf(BPF_MAP_CREATE, &a)) < 0)
		die("sockmap");
	memset(&a, 0, sizeof a);
	a.map_type = BPF_MAP_TYPE_ARRAY, a.key_size = 4, a.value_size = 8, a.max_entries = 2;
	if ((count_fd = (int)bpf(BPF_MAP_CREATE, &a)) < 0)
		die("count map");
	struct bpf_insn p[] = {
	    INSN(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0),
	    INSN(BPF_LDX | BPF_W | BPF_MEM, 2, 6, offsetof(struct __sk_buff, local_port), 0),
	    INSN(BPF_ALU64 | BPF_MOV | BPF_K, 7, 0, 0, 1), /* from the server: to slot 1 */
	    INSN(BPF_JMP | BPF_JNE | BPF_K, 2, 0, 1, relay_port),
	    INSN(BPF_ALU64 | BPF_MOV | BPF_K, 7, 0, 0, 0), /* from the client: to slot 0 */
	    INSN(BPF_STX | BPF_W | BPF_MEM, 10, 7, -4, 0),
	    INSN(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
	    INSN(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -4),
	    INSN(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, count_fd),
	    INSN(0, 0, 0, 0, 0),
	    INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem),
	    INSN(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2, 0),
	    INSN(BPF_LDX | BPF_W | BPF_MEM, 1, 6, offsetof(struct __sk_buff, len), 0),
	    INSN(BPF_STX | BPF_DW | BPF_ATOMIC, 0, 1, 0, BPF_ADD),
	    INSN(BPF_ALU64 | BPF_MOV | BPF_X, 1, 6, 0, 0),
	    INSN(BPF_LD | BPF_DW | BPF_IMM, 2, BPF_PSEUDO_MAP_FD, 0, sockmap_fd),
	    INSN(0, 0, 0, 0, 0),
	    INSN(BPF_ALU64 | BPF_MOV | BPF_X, 3, 7, 0, 0),
	    INSN(BPF_ALU64 | BPF_MOV | BPF_K, 4, 0, 0, 0), /* egress of that socket */
	    INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_sk_redirect_map),
	    INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
	};
	memset(&a, 0, sizeof a);
	a.prog_type = BPF_PROG_TYPE_SK_SKB;
	a.insns = (uintptr_t)p;
	a.insn_cnt = sizeof p / sizeof p[0];
	a.license = (uintptr_t) "GPL";
	a.log_buf = (uintptr_t)log, a.log_size = sizeof log, a.log_level = 1;
	if ((prog = (int)bpf(BPF_PROG_LOAD, &a)) < 0) {
		fprintf(stderr, "%s\n", log);
		die("BPF_PROG_LOAD");
	}
	memset(&a, 0, sizeof a);
	a.target_fd = (unsigned)sockmap_fd;
	a.attach_bpf_fd = (unsigned)prog;
	a.attach_type = BPF_SK_SKB_STREAM_VERDICT;
	if (bpf(BPF_PROG_ATTACH, &a) < 0)
		die("BPF_PROG_ATTACH");
}

static int slot(int cmd, uint32_t key, int *fd)
{
	union bpf_attr a;
	memset(&a, 0, sizeof a);
	a.map_fd = (unsigned)sockmap_fd, a.key = (uintptr_t)&key, a.value = (uintptr_t)fd;
	return (int)bpf(cmd, &a);
}

static uint64_t counted(uint32_t key)
{
	union bpf_attr a;
	uint64_t v = 0;
	memset(&a, 0, sizeof a);
	a.map_fd = (unsigned)count_fd, a.key = (uintptr_t)&key, a.value = (uintptr_t)&v;
	bpf(BPF_MAP_LOOKUP_ELEM, &a);
	return v;
}

/* Splice one direction until its end, through a 1 MiB pipe as net/tunnel.c does. */
static void relay_splice(int from, int to)
{
	int pp[2];
	if (pipe2(pp, O_CLOEXEC) < 0)
		die("pipe");
	fcntl(pp[1], F_SETPIPE_SZ, 1 << 20);
	for (;;) {
		ssize_t n = splice(from, NULL, pp[1], NULL, 1 << 20, SPLICE_F_MOVE);
		if (n <= 0)
			break;
		while (n > 0) {
			ssize_t w = splice(pp[0], NULL, to, NULL, (size_t)n, SPLICE_F_MOVE);
			if (w <= 0)
				die("splice out");
			n -= w;
		}
	}
	close(pp[0]);
	close(pp[1]);
}

/* Hand both sockets to the verdict, wait for the server's end, and close the client's side only
 * when every byte the verdict sent on has been acknowledged: closing earlier loses the bytes
 * still queued in the kernel while the client sees a clean end. */
static uint64_t count_before;

static void sockmap_add(int up, int cli)
{
	if (mode == SOCKMAP_BIG) {
		int sz = 16 << 20;
		setsockopt(cli, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
		setsockopt(up, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	}
	count_before = counted(1);
	if (slot(BPF_MAP_UPDATE_ELEM, 0, &up) < 0 || slot(BPF_MAP_UPDATE_ELEM, 1, &cli) < 0)
		die("sockmap update");
}

static void relay_sockmap(int up, int cli)
{
	uint64_t want;
	struct pollfd p = {up, POLLRDHUP, 0};
	poll(&p, 1, -1);
	want = counted(1) - count_before;
	for (;;) {
		struct tcp_info ti;
		socklen_t l = sizeof ti;
		if (getsockopt(cli, IPPROTO_TCP, TCP_INFO, &ti, &l) < 0 ||
		    ti.tcpi_bytes_acked >= want)
			break;
		usleep(100);
	}
	slot(BPF_MAP_DELETE_ELEM, 0, NULL);
	slot(BPF_MAP_DELETE_ELEM, 1, NULL);
}

static void *relay(void *arg)
{
	(void)arg;
	for (;;) {
		int cli = accept(relay_fd, NULL, NULL), one = 1, up;
		uint64_t count;
		if (cli < 0)
			die("accept");
		setsockopt(cli, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		up = connect_to(server_port);
		/* the request goes through user space, as a CONNECT's first bytes would, and only
		 * after both sockets are in the map: bytes that reach a socket before it enters the
		 * map stay in its queue, unseen by the verdict (the relay then hangs) */
		if (readn(cli, &count, 8) < 0)
			die("relay request");
		if (mode != SPLICE)
			sockmap_add(up, cli);
		if (writen(up, &count, 8) < 0)
			die("relay request");
		if (mode == SPLICE)
			relay_splice(up, cli);
		else
			relay_sockmap(up, cli);
		close(up);
		close(cli);
	}
	return NULL;
}

/* One download of n bytes from port: MB/s, or 0 when it came short; CPU of the process. */
static double download(int port, uint64_t n, double *cpu)
{
	static char buf[1 << 20];
	uint64_t got = 0;
	double c0 = cpu_seconds(), t = now();
	int fd = connect_to(port);
	if (writen(fd, &n, 8) < 0)
		die("request");
	for (ssize_t r; got < n && (r = read(fd, buf, sizeof buf)) > 0;)
		got += (uint64_t)r;
	close(fd);
	t = now() - t;
	*cpu = cpu_seconds() - c0;
	return got == n ? (double)n / t / 1e6 : 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 5;
	uint64_t bytes = argc > 2 ? strtoull(argv[2], NULL, 0) : 1ULL << 30;
	double ratio[NMODES][64], mbs[NMODES][64];
	pthread_t t;

	if (rounds < 1 || rounds > 64)
		rounds = 5;
	setvbuf(stdout, NULL, _IONBF, 0);
	server_fd = listen_on(&server_port);
	relay_fd = listen_on(&relay_port);
	sockmap_setup();
	if (pthread_create(&t, NULL, serve, NULL) || pthread_create(&t, NULL, relay, NULL))
		die("pthread_create");
	for (int r = 0; r < rounds; r++) {
		printf("round %d:", r + 1);
		for (mode = 0; mode < NMODES; mode++) {
			double cpu;
			mbs[mode][r] =
			    download(mode == DIRECT ? server_port : relay_port, bytes, &cpu);
			ratio[mode][r] = mbs[mode][r] / mbs[DIRECT][r];
			printf("  %s %.0f MB/s (%.2fx, %.2f CPU-s)", names[mode], mbs[mode][r],
			       ratio[mode][r], cpu);
			if (mbs[mode][r] == 0)
				printf(" SHORT");
		}
		printf("\n");
	}
	printf("\n| path | download, median [lowest..highest] | x direct |\n|---|---|---|\n");
	for (int m = 0; m < NMODES; m++) {
		qsort(mbs[m], (size_t)rounds, sizeof(double), cmp);
		qsort(ratio[m], (size_t)rounds, sizeof(double), cmp);
		printf("| %s | %.0f MB/s [%.0f..%.0f] | %.2f [%.2f..%.2f] |\n", names[m],
		       mbs[m][rounds / 2], mbs[m][0], mbs[m][rounds - 1], ratio[m][rounds / 2],
		       ratio[m][0], ratio[m][rounds - 1]);
	}
	return 0;
}
