/* scripts/bench/net --shaped's program: a delay line joining two tun devices (this kernel has no
 * netem), the download server on the far side and the client that downloads directly or via a
 * proxy. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* a GSO packet of up to 64 KiB and its virtio header: the devices take TCP segmentation
 * offload, so a 10 Gbit/s stream is some 20k packets a second each way, not 800k */
#define PKT_MAX (65536 + 64)
#define RING	16384

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int tun_open(const char *name)
{
	struct ifreq ifr = {.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR};
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
	unsigned off = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;

	snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
	if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) < 0 || ioctl(fd, TUNSETOFFLOAD, off) < 0) {
		perror(name);
		exit(1);
	}
	return fd;
}

struct line {
	int in, out;
	double delay;
	struct {
		double due;
		size_t len;
		char *p;
	} q[RING];
	size_t head, n;
	unsigned long long dropped;
};

/* One direction: each packet read from in is written to out delay seconds later, in order. */
static void *carry(void *arg)
{
	struct line *l = arg;
	static __thread char buf[PKT_MAX];

	for (;;) {
		struct pollfd pf = {.fd = l->in, .events = POLLIN};
		struct timespec ts, *tp = NULL;

		if (l->n) {
			double wait = l->q[l->head].due - now();
			if (wait < 0)
				wait = 0;
			ts.tv_sec = (time_t)wait;
			ts.tv_nsec = (long)((wait - (double)ts.tv_sec) * 1e9);
			tp = &ts;
		}
		ppoll(&pf, 1, tp, NULL);
		for (;;) {
			ssize_t r = read(l->in, buf, sizeof buf);
			if (r <= 0)
				break;
			if (l->n == RING) {
				l->dropped++;
				continue;
			}
			size_t at = (l->head + l->n) % RING;
			l->q[at].p = malloc((size_t)r);
			memcpy(l->q[at].p, buf, (size_t)r);
			l->q[at].len = (size_t)r;
			l->q[at].due = now() + l->delay;
			l->n++;
		}
		double t = now();
		while (l->n && l->q[l->head].due <= t) {
			/* a full device queue drops the packet, as a link would */
			if (write(l->out, l->q[l->head].p, l->q[l->head].len) < 0)
				l->dropped++;
			free(l->q[l->head].p);
			l->head = (l->head + 1) % RING;
			l->n--;
		}
	}
	return NULL;
}

/* delay NETNS DEV_HERE DEV_THERE DELAY_US: DEV_HERE in this netns, DEV_THERE in NETNS */
static int delay(char **argv)
{
	int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	int ns = open(argv[0], O_RDONLY | O_CLOEXEC);
	int a = tun_open(argv[1]), b;
	static struct line ab, ba;
	pthread_t t;

	if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
		perror(argv[0]);
		return 1;
	}
	b = tun_open(argv[2]);
	setns(self, CLONE_NEWNET);
	/* the wire is not what is measured: a real-time thread, so that the machine's other load
	 * does not stretch its delay (it sleeps between packets; the scheduler's real-time
	 * throttling bounds it anyway); its threads inherit this */
	struct sched_param sp = {.sched_priority = 10};
	if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
		perror("delay: SCHED_FIFO (the delay may stretch under load)");
	ab.in = ba.out = a;
	ab.out = ba.in = b;
	ab.delay = ba.delay = atof(argv[3]) / 1e6;
	pthread_create(&t, NULL, carry, &ab);
	printf("ready\n");
	fflush(stdout);
	carry(&ba);
	return 0;
}

static int readn(int fd, void *buf, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

static int writen(int fd, const void *buf, size_t n)
{
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, (const char *)buf + off, n - off);
		if (w <= 0)
			return -1;
		off += (size_t)w;
	}
	return 0;
}

/* 8-byte count -> that many bytes; once the client has closed (so it has every byte), a line
 * on stdout with what limited the sender: the kernel's time busy sending, and how much of it
 * the receiver's window (a reader that does not drain, or a small buffer) or the send buffer
 * held it back; the rest is the congestion window, i.e. the link */
static void *serve_one(void *arg)
{
	int c = (int)(intptr_t)arg;
	static char buf[1 << 20];
	static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	uint64_t left;
	char b;

	if (readn(c, &left, 8) == 0)
		while (left) {
			size_t k = left < sizeof buf ? left : sizeof buf;
			if (writen(c, buf, k) < 0)
				break;
			left -= k;
		}
	while (read(c, &b, 1) > 0)
		;
	memset(&ti, 0, sizeof ti);
	if (getsockopt(c, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0) {
		pthread_mutex_lock(&out);
		printf(
		    "{\"busy_ms\": %.1f, \"rwnd_limited_ms\": %.1f, \"sndbuf_limited_ms\": %.1f, "
		    "\"retrans\": %u, \"srtt_ms\": %.2f, \"min_rtt_ms\": %.2f, "
		    "\"cwnd_kb\": %.0f}\n",
		    ti.tcpi_busy_time / 1e3, ti.tcpi_rwnd_limited / 1e3,
		    ti.tcpi_sndbuf_limited / 1e3, ti.tcpi_total_retrans, ti.tcpi_rtt / 1e3,
		    ti.tcpi_min_rtt / 1e3, ti.tcpi_snd_cwnd * (double)ti.tcpi_snd_mss / 1e3);
		fflush(stdout);
		pthread_mutex_unlock(&out);
	}
	close(c);
	return NULL;
}

/* serve PORT: on every address of this netns */
static int serve(char **argv)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[0]))};
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	pthread_attr_t a;

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(l, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(l, 128) < 0) {
		perror("serve");
		return 1;
	}
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		pthread_t t;
		if (c >= 0 && pthread_create(&t, &a, serve_one, (void *)(intptr_t)c))
			close(c);
	}
}

static int tcp(const char *host, int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	inet_pton(AF_INET, host, &sa.sin_addr);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		perror("connect");
		return -1;
	}
	return fd;
}

/* get HOST PORT BYTES [PROXY_PORT [NETNS]]: one download, directly or through the CONNECT proxy
 * on 127.0.0.1:PROXY_PORT (of NETNS when given, as a sandboxed command connects) */
static int get(int argc, char **argv)
{
	uint64_t want = strtoull(argv[2], NULL, 10), got = 0;
	static char buf[1 << 20];
	struct rusage ru;
	int fd;
	double t;

	if (argc > 4) {
		int ns = open(argv[4], O_RDONLY | O_CLOEXEC);
		if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
			perror(argv[4]);
			return 1;
		}
	}
	t = now();
	if (argc > 3) {
		char req[160];
		size_t n = 0;
		if ((fd = tcp("127.0.0.1", atoi(argv[3]))) < 0)
			return 1;
		snprintf(req, sizeof req, "CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n", argv[0],
			 argv[1], argv[0], argv[1]);
		writen(fd, req, strlen(req));
		/* the answer's head, byte by byte: nothing of the stream is read with it */
		while (n < 4 || memcmp(buf + n - 4, "\r\n\r\n", 4)) {
			if (n == 4096 || read(fd, buf + n, 1) != 1) {
				fprintf(stderr, "get: no answer to CONNECT\n");
				return 1;
			}
			n++;
		}
		if (memcmp(buf, "HTTP/1.1 200", 12) && memcmp(buf, "HTTP/1.0 200", 12)) {
			fprintf(stderr, "get: %.*s\n", (int)n, buf);
			return 1;
		}
	} else if ((fd = tcp(argv[0], atoi(argv[1]))) < 0) {
		return 1;
	}
	if (writen(fd, &want, 8) < 0)
		return 1;
	while (got < want) {
		ssize_t r = read(fd, buf, sizeof buf);
		if (r <= 0)
			break;
		got += (uint64_t)r;
	}
	t = now() - t;
	close(fd);
	getrusage(RUSAGE_SELF, &ru);
	printf("{\"bytes\": %llu, \"secs\": %.6f, \"cpu\": %.3f}\n", (unsigned long long)got, t,
	       ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
		   (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
	return got == want ? 0 : 1;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc == 6 && !strcmp(argv[1], "delay"))
		return delay(argv + 2);
	if (argc == 3 && !strcmp(argv[1], "serve"))
		return serve(argv + 2);
	if (argc >= 5 && argc <= 7 && !strcmp(argv[1], "get"))
		return get(argc - 2, argv + 2);
	fprintf(stderr, "usage: net-shaped delay NETNS DEV_HERE DEV_THERE DELAY_US | serve PORT | "
			"get HOST PORT BYTES [PROXY_PORT [NETNS]]\n");
	return 2;
}
