/*
 * A TCP connection inside one process tree, for inet-remap.sh: the parent listens on ADDR:PORT
 * and accepts, the child connects from ADDR to it, and they pass a counter back and forth every
 * 10 ms. Each checks that what it receives is what it sent plus one; the parent writes
 * "ready" then the counter to STATUS, or "broken: WHY" when the connection fails.
 *
 *   tcp-pair ADDR PORT STATUS
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *status;

/* STATUS holds one line, replaced whole. */
static void say(const char *line)
{
	char tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", status);
	f = fopen(tmp, "w");
	if (!f)
		exit(2);
	fprintf(f, "%s\n", line);
	fclose(f);
	rename(tmp, status);
}

/* Sends v, then reads what the other side answers, which must be v + 1. */
static int pass(int fd, uint64_t v, uint64_t *got, const char **why)
{
	if (send(fd, &v, sizeof(v), 0) != sizeof(v)) {
		*why = strerror(errno);
		return -1;
	}
	if (recv(fd, got, sizeof(*got), MSG_WAITALL) != sizeof(*got)) {
		*why = errno ? strerror(errno) : "closed";
		return -1;
	}
	if (*got != v + 1) {
		*why = "a counter was lost";
		return -1;
	}
	return 0;
}

static void serve(int fd)
{
	uint64_t v = 0, got;
	const char *why;
	char line[256];

	for (;;) {
		if (pass(fd, v, &got, &why)) {
			snprintf(line, sizeof(line), "broken: %s at %lu", why, (unsigned long)v);
			say(line);
			exit(1);
		}
		v = got + 1;
		snprintf(line, sizeof(line), "%lu", (unsigned long)v);
		say(line);
		usleep(10000);
	}
}

static void answer(int fd)
{
	uint64_t v;

	while (recv(fd, &v, sizeof(v), MSG_WAITALL) == sizeof(v)) {
		v++;
		if (send(fd, &v, sizeof(v), 0) != sizeof(v))
			break;
	}
	exit(1);
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int l, c, s, one = 1;
	pid_t child;

	if (argc != 4) {
		fprintf(stderr, "usage: tcp-pair ADDR PORT STATUS\n");
		return 2;
	}
	status = argv[3];
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1)
		return 2;
	a.sin_port = htons(atoi(argv[2]));
	l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1)) {
		perror("listen");
		return 2;
	}
	child = fork();
	if (child == 0) {
		c = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(c, (struct sockaddr *)&a, sizeof(a))) {
			perror("connect");
			return 2;
		}
		answer(c);
	}
	s = accept(l, NULL, NULL);
	if (s < 0) {
		perror("accept");
		kill(child, SIGKILL);
		return 2;
	}
	say("ready");
	serve(s);
	return 0;
}
