/*
 * A libuv-like event loop on io_uring, for tests/io-uring.sh: an epoll set whose
 * changes go through an epoll-control ring (IORING_OP_EPOLL_CTL, 256 entries,
 * no SQ array, as libuv 1.50+ makes it), and a file ring (64 entries; SQPOLL with
 * --sqpoll, as libuv 1.45-1.48 made it) that reads a file and a pipe and runs
 * no-ops, with an eventfd registered (--eventfd) that must count its completions.
 * It serves one-line requests on a unix socket, each connection added to and
 * removed from the epoll set through the control ring:
 *   read      the data file's first 64 bytes, read through the file ring
 *   pipe      a word written into a pipe and read back through the file ring
 *   nop       a no-op through the file ring
 *   state     both rings' SQ head, CQ tail and whether the eventfd counted
 * Each answer is one line; "ERR ..." on any failure.
 *
 *   uring-app serve SOCKET DATAFILE [--sqpoll] [--eventfd] [--nosqarray 0|1]
 *             [--skip N] [--msg N] [--nops N] [--pending]
 *   uring-app ask SOCKET REQUEST
 * --skip N / --msg N / --nops N: before serving, move the file ring's counters:
 * N no-ops without a CQE (SQ head only), N messages from a helper ring (CQ tail
 * only), N no-ops with CQEs (both). --pending: leave a read of an empty pipe in
 * flight on the file ring (the dump must refuse it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef IORING_SETUP_NO_SQARRAY
#define IORING_SETUP_NO_SQARRAY (1U << 16)
#endif

struct ring {
	int fd;
	size_t sqlen;
	unsigned entries, cq_entries, flags;
	char *sq;
	struct io_uring_sqe *sqes;
	unsigned *sqhead, *sqtail, *sqflags, *cqhead, *cqtail;
	struct io_uring_cqe *cqes;
};

static void die(const char *what)
{
	fprintf(stderr, "uring-app: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int ring_init(struct ring *r, unsigned entries, unsigned flags)
{
	struct io_uring_params p;
	size_t sqlen, cqlen;

	memset(&p, 0, sizeof(p));
	memset(r, 0, sizeof(*r));
	p.flags = flags;
	if (flags & IORING_SETUP_SQPOLL)
		p.sq_thread_idle = 10;
	r->fd = syscall(__NR_io_uring_setup, entries, &p);
	if (r->fd < 0)
		return -1;
	r->entries = p.sq_entries;
	r->cq_entries = p.cq_entries;
	r->flags = flags;
	sqlen = p.sq_off.array + p.sq_entries * 4;
	cqlen = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	r->sqlen = sqlen > cqlen ? sqlen : cqlen;
	r->sq = mmap(0, r->sqlen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
		     IORING_OFF_SQ_RING);
	r->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
	if (r->sq == MAP_FAILED || r->sqes == MAP_FAILED)
		return -1;
	r->sqhead = (unsigned *)(r->sq + p.sq_off.head);
	r->sqtail = (unsigned *)(r->sq + p.sq_off.tail);
	r->sqflags = (unsigned *)(r->sq + p.sq_off.flags);
	r->cqhead = (unsigned *)(r->sq + p.cq_off.head);
	r->cqtail = (unsigned *)(r->sq + p.cq_off.tail);
	r->cqes = (struct io_uring_cqe *)(r->sq + p.cq_off.cqes);
	if (!(flags & IORING_SETUP_NO_SQARRAY)) {
		unsigned *array = (unsigned *)(r->sq + p.sq_off.array);

		for (unsigned i = 0; i < p.sq_entries; i++)
			array[i] = i;
	}
	return 0;
}

static struct io_uring_sqe *sqe_get(struct ring *r)
{
	struct io_uring_sqe *s = &r->sqes[*r->sqtail & (r->entries - 1)];

	memset(s, 0, sizeof(*s));
	return s;
}

/* Submits n SQEs and waits for `wait` CQEs. */
static int submit(struct ring *r, unsigned n, unsigned wait)
{
	unsigned flags = wait ? IORING_ENTER_GETEVENTS : 0;

	__atomic_store_n(r->sqtail, *r->sqtail + n, __ATOMIC_RELEASE);
	if (r->flags & IORING_SETUP_SQPOLL) {
		if (__atomic_load_n(r->sqflags, __ATOMIC_ACQUIRE) & IORING_SQ_NEED_WAKEUP)
			flags |= IORING_ENTER_SQ_WAKEUP;
		if (!flags)
			return 0;
		n = 0;
	}
	return syscall(__NR_io_uring_enter, r->fd, n, wait, flags, NULL, 0);
}

/* One request, waits for its CQE; returns its result. */
static int run1(struct ring *r, struct io_uring_sqe *s)
{
	(void)s;
	unsigned head;
	int res;

	if (submit(r, 1, 1) < 0)
		return -errno;
	while (__atomic_load_n(r->cqtail, __ATOMIC_ACQUIRE) == *r->cqhead)
		syscall(__NR_io_uring_enter, r->fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0);
	head = *r->cqhead;
	res = r->cqes[head & (r->cq_entries - 1)].res;
	__atomic_store_n(r->cqhead, head + 1, __ATOMIC_RELEASE);
	return res;
}

static struct ring ctl, file;
static int epfd, efd = -1, datafd, pipefd[2];
static uint64_t efd_seen;

static int epoll_ctl_ring(int op, int fd, unsigned events)
{
	struct epoll_event ev = { .events = events, .data.fd = fd };
	struct io_uring_sqe *s = sqe_get(&ctl);

	s->opcode = IORING_OP_EPOLL_CTL;
	s->fd = epfd;
	s->len = op;
	s->off = fd;
	s->addr = (unsigned long)&ev;
	return run1(&ctl, s);
}

/* Whether the registered eventfd counted the file ring's completions since last asked. */
static int efd_counted(void)
{
	uint64_t v = 0;

	if (efd < 0)
		return 1;
	if (read(efd, &v, sizeof(v)) != sizeof(v))
		return 0;
	efd_seen += v;
	return v > 0;
}

static void answer(int c, char *req)
{
	char out[256], buf[65];
	struct io_uring_sqe *s;
	int res;

	memset(buf, 0, sizeof(buf));
	if (!strcmp(req, "read")) {
		s = sqe_get(&file);
		s->opcode = IORING_OP_READ;
		s->fd = datafd;
		s->addr = (unsigned long)buf;
		s->len = 64;
		s->off = 0;
		res = run1(&file, s);
		if (res < 0)
			snprintf(out, sizeof(out), "ERR read %s\n", strerror(-res));
		else if (!efd_counted())
			snprintf(out, sizeof(out), "ERR the eventfd did not count the read\n");
		else
			snprintf(out, sizeof(out), "read %d %.*s\n", res, (int)strcspn(buf, "\n"), buf);
	} else if (!strcmp(req, "pipe")) {
		static unsigned n;
		char word[32];

		snprintf(word, sizeof(word), "word%u", ++n);
		if (write(pipefd[1], word, strlen(word)) != (ssize_t)strlen(word)) {
			snprintf(out, sizeof(out), "ERR pipe write\n");
		} else {
			s = sqe_get(&file);
			s->opcode = IORING_OP_READ;
			s->fd = pipefd[0];
			s->addr = (unsigned long)buf;
			s->len = 64;
			s->off = -1;
			res = run1(&file, s);
			if (res < 0 || strcmp(buf, word))
				snprintf(out, sizeof(out), "ERR pipe read %d '%s' for '%s'\n", res, buf, word);
			else if (!efd_counted())
				snprintf(out, sizeof(out), "ERR the eventfd did not count the pipe read\n");
			else
				snprintf(out, sizeof(out), "pipe %s\n", buf);
		}
	} else if (!strcmp(req, "nop")) {
		s = sqe_get(&file);
		s->opcode = IORING_OP_NOP;
		s->user_data = 42;
		res = run1(&file, s);
		snprintf(out, sizeof(out), res ? "ERR nop %d\n" : "nop 0\n", res);
	} else if (!strcmp(req, "state")) {
		snprintf(out, sizeof(out), "state ctl %u %u file %u %u eventfd %llu\n", *ctl.sqhead, *ctl.cqtail,
			 *file.sqhead, *file.cqtail, (unsigned long long)efd_seen);
	} else {
		snprintf(out, sizeof(out), "ERR unknown request '%s'\n", req);
	}
	if (write(c, out, strlen(out)) < 0)
		return;
}

static void advance(unsigned skip, unsigned msg, unsigned nops)
{
	struct ring helper;
	unsigned n;

	while (nops) {
		n = nops < file.entries ? nops : file.entries;
		for (unsigned i = 0; i < n; i++) {
			struct io_uring_sqe *s = &file.sqes[(*file.sqtail + i) & (file.entries - 1)];

			memset(s, 0, sizeof(*s));
			s->opcode = IORING_OP_NOP;
		}
		if (submit(&file, n, n) < 0)
			die("nops");
		while (__atomic_load_n(file.cqtail, __ATOMIC_ACQUIRE) - *file.cqhead < n)
			;
		__atomic_store_n(file.cqhead, *file.cqtail, __ATOMIC_RELEASE);
		efd_counted();
		nops -= n;
	}
	while (skip) {
		n = skip < file.entries ? skip : file.entries;
		for (unsigned i = 0; i < n; i++) {
			struct io_uring_sqe *s = &file.sqes[(*file.sqtail + i) & (file.entries - 1)];

			memset(s, 0, sizeof(*s));
			s->opcode = IORING_OP_NOP;
			s->flags = IOSQE_CQE_SKIP_SUCCESS;
		}
		if (submit(&file, n, 0) < 0)
			die("skipped nops");
		while (__atomic_load_n(file.sqhead, __ATOMIC_ACQUIRE) != *file.sqtail)
			;
		skip -= n;
	}
	if (msg) {
		if (ring_init(&helper, 64, 0))
			die("helper ring");
		while (msg) {
			n = msg < 64 ? msg : 64;
			for (unsigned i = 0; i < n; i++) {
				struct io_uring_sqe *s = &helper.sqes[(*helper.sqtail + i) & 63];

				memset(s, 0, sizeof(*s));
				s->opcode = IORING_OP_MSG_RING;
				s->fd = file.fd;
				s->flags = IOSQE_CQE_SKIP_SUCCESS;
			}
			if (submit(&helper, n, 0) != (int)n)
				die("messages");
			while (__atomic_load_n(file.cqtail, __ATOMIC_ACQUIRE) - *file.cqhead < n)
				;
			__atomic_store_n(file.cqhead, *file.cqtail, __ATOMIC_RELEASE);
			msg -= n;
		}
		efd_counted();
		munmap(helper.sq, helper.sqlen);
		munmap(helper.sqes, helper.entries * sizeof(struct io_uring_sqe));
		close(helper.fd);
	}
}

static int serve(int argc, char **argv)
{
	unsigned file_flags = 0, ctl_flags = IORING_SETUP_NO_SQARRAY, skip = 0, msg = 0, nops = 0;
	int want_efd = 0, pending = 0, ls, i;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	static char pbuf[8];

	for (i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--sqpoll"))
			file_flags |= IORING_SETUP_SQPOLL;
		else if (!strcmp(argv[i], "--eventfd"))
			want_efd = 1;
		else if (!strcmp(argv[i], "--pending"))
			pending = 1;
		else if (!strcmp(argv[i], "--nosqarray") && i + 1 < argc)
			ctl_flags = atoi(argv[++i]) ? IORING_SETUP_NO_SQARRAY : 0;
		else if (!strcmp(argv[i], "--skip") && i + 1 < argc)
			skip = strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--msg") && i + 1 < argc)
			msg = strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--nops") && i + 1 < argc)
			nops = strtoul(argv[++i], NULL, 0);
		else {
			fprintf(stderr, "uring-app: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	datafd = open(argv[3], O_RDONLY);
	if (datafd < 0)
		die(argv[3]);
	if (pipe(pipefd))
		die("pipe");
	epfd = epoll_create1(0);
	if (epfd < 0)
		die("epoll_create1");
	if (ring_init(&ctl, 256, ctl_flags) || ring_init(&file, 64, file_flags))
		die("io_uring_setup");
	if (want_efd) {
		efd = eventfd(0, EFD_NONBLOCK);
		if (efd < 0 || syscall(__NR_io_uring_register, file.fd, IORING_REGISTER_EVENTFD, &efd, 1))
			die("IORING_REGISTER_EVENTFD");
	}
	advance(skip, msg, nops);
	if (pending) {
		int p2[2];
		struct io_uring_sqe *s;

		if (pipe(p2))
			die("pipe");
		s = sqe_get(&file);
		s->opcode = IORING_OP_READ;
		s->fd = p2[0];
		s->addr = (unsigned long)pbuf;
		s->len = sizeof(pbuf);
		s->off = -1;
		if (submit(&file, 1, 0) < 0)
			die("pending read");
	}
	ls = socket(AF_UNIX, SOCK_STREAM, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", argv[2]);
	unlink(argv[2]);
	if (ls < 0 || bind(ls, (void *)&sa, sizeof(sa)) || listen(ls, 8))
		die("listen");
	if (epoll_ctl_ring(EPOLL_CTL_ADD, ls, EPOLLIN))
		die("EPOLL_CTL_ADD listener");
	printf("ready pid=%d ctl=%d file=%d eventfd=%d\n", getpid(), ctl.fd, file.fd, efd);
	fflush(stdout);
	for (;;) {
		struct epoll_event ev[8];
		int n = epoll_wait(epfd, ev, 8, -1);

		for (i = 0; i < n; i++) {
			int fd = ev[i].data.fd;

			if (fd == ls) {
				int c = accept(ls, NULL, NULL);

				if (c >= 0 && epoll_ctl_ring(EPOLL_CTL_ADD, c, EPOLLIN) < 0)
					close(c);
			} else {
				char req[64];
				ssize_t len = read(fd, req, sizeof(req) - 1);

				if (len <= 0) {
					int res = epoll_ctl_ring(EPOLL_CTL_DEL, fd, 0);

					if (res)
						fprintf(stderr, "uring-app: EPOLL_CTL_DEL %d: %d\n", fd, res);
					close(fd);
					continue;
				}
				req[len] = '\0';
				req[strcspn(req, "\n")] = '\0';
				answer(fd, req);
			}
		}
	}
}

static int ask(const char *path, const char *req)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char out[256];
	ssize_t n, got = 0;
	int s = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (s < 0 || connect(s, (void *)&sa, sizeof(sa)))
		die(path);
	if (write(s, req, strlen(req)) != (ssize_t)strlen(req))
		die("write");
	while (got < (ssize_t)sizeof(out) - 1 && (n = read(s, out + got, sizeof(out) - 1 - got)) > 0) {
		got += n;
		if (memchr(out, '\n', got))
			break;
	}
	out[got] = '\0';
	fputs(out, stdout);
	return strncmp(out, "ERR", 3) && got > 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "serve"))
		return serve(argc, argv);
	if (argc == 4 && !strcmp(argv[1], "ask"))
		return ask(argv[2], argv[3]);
	fprintf(stderr, "usage: uring-app serve SOCKET DATAFILE [options] | ask SOCKET REQUEST\n");
	return 2;
}
