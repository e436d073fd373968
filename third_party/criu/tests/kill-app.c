/*
 * kill-app: a plain (CPU-only) process tree for tests/tracer-death.sh, with the default action
 * for every signal (SIGTRAP, SIGPIPE and SIGSEGV end it): NPROC processes (the root and its
 * children), each with NTHR threads that rewrite and check their own data every 5 ms; the root
 * and its first child also pass a counter back and forth over a TCP connection, each waiting
 * in recv() (a socket left in repair mode fails it). Each process appends to DIR/PID.log:
 *   ready                        once its threads run
 *   ok N                         every 20 steps of its first thread
 *   MISMATCH ... / ERROR ...     and it exits
 * Build: gcc -O2 -pthread -o kill-app kill-app.c;  run: kill-app DIR NPROC NTHR
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define WORDS 4096

static const char *dir;
static uint64_t *data;

static void say(const char *fmt, ...)
{
	char path[512];
	FILE *f;
	va_list ap;

	snprintf(path, sizeof(path), "%s/%d.log", dir, getpid());
	f = fopen(path, "a");
	if (!f)
		return;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

static void *work(void *arg)
{
	long t = (long)arg;
	uint64_t *d = data + t * WORDS;
	struct timespec pause = { 0, 5 * 1000 * 1000 };

	for (uint64_t step = 1;; step++) {
		for (int i = 0; i < WORDS; i++) {
			if (step > 1 && d[i] != (step - 1) * 7919 + i + t) {
				say("MISMATCH thread %ld word %d step %lu", t, i, (unsigned long)step);
				_exit(3);
			}
			d[i] = step * 7919 + i + t;
		}
		if (t == 0 && step % 20 == 0)
			say("ok %lu", (unsigned long)step);
		nanosleep(&pause, NULL);
	}
	return NULL;
}

/* Passes a counter over `sk`: sends first if `first`; each side checks what it receives. */
static void *ping(void *arg)
{
	int sk = (int)(long)arg & 0xffff, first = (int)(long)arg >> 16;
	uint64_t n = 0, got;

	for (;; n += 2) {
		if (first && send(sk, &n, sizeof(n), 0) != sizeof(n)) {
			say("ERROR tcp send: %m");
			_exit(4);
		}
		if (recv(sk, &got, sizeof(got), MSG_WAITALL) != sizeof(got)) {
			say("ERROR tcp recv: %m");
			_exit(4);
		}
		if (got != (first ? n + 1 : n)) {
			say("ERROR tcp got %lu", (unsigned long)got);
			_exit(4);
		}
		if (!first && (got++, send(sk, &got, sizeof(got), 0) != sizeof(got))) {
			say("ERROR tcp send: %m");
			_exit(4);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	int nproc, nthr, lsk, sk = -1, i, me = 0;
	pthread_t th;

	if (argc != 4)
		return 2;
	dir = argv[1];
	nproc = atoi(argv[2]);
	nthr = atoi(argv[3]);
	syscall(SYS_close_range, 3, ~0U, 0);
	lsk = socket(AF_INET, SOCK_STREAM, 0);
	if (lsk < 0 || bind(lsk, (void *)&a, sizeof(a)) || listen(lsk, 1) ||
	    getsockname(lsk, (void *)&a, &alen))
		return 1;
	for (i = 1; i < nproc; i++)
		if (fork() == 0) {
			me = i;
			break;
		}
	if (me == 1) {
		sk = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(sk, (void *)&a, sizeof(a)))
			return 1;
	} else if (me == 0 && nproc > 1) {
		sk = accept(lsk, NULL, NULL);
	}
	close(lsk);
	data = calloc(nthr, WORDS * sizeof(uint64_t));
	for (long t = 1; t < nthr; t++)
		pthread_create(&th, NULL, work, (void *)t);
	if (sk >= 0)
		pthread_create(&th, NULL, ping, (void *)((long)sk | (me == 0 ? 1L << 16 : 0)));
	say("ready");
	work(0);
	return 0;
}
