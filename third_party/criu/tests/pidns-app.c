/*
 * pidns-app: the init of a pid namespace for pidns-page-threads.sh: it holds MIB mebibytes of
 * known data (enough that a restore reads its pages with several threads), THREADS threads
 * that only wait, and with --with-child a child forked first (so the child has number 2 and
 * the threads the numbers after it). On SIGUSR1 it checks every word of its data, counts its
 * threads and sees whether its child is there, and appends to STATUS:
 *   ready pid=P
 *   verified mismatches=M threads=T child=C   (T: the threads, the main one included; C: 0/1)
 * Build: gcc -O2 -pthread -o pidns-app pidns-app.c
 * Run:   unshare --pid --fork setsid pidns-app MIB THREADS STATUS [--with-child]
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *status_path;

static void status(const char *fmt, ...)
{
	FILE *f = fopen(status_path, "a");
	va_list ap;

	if (!f)
		return;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

static uint64_t word(uint64_t i)
{
	return (i + 1) * 0x9e3779b97f4a7c15ULL;
}

static void *wait_forever(void *arg)
{
	for (;;)
		pause();
	return arg;
}

static int count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	uint64_t *data, i, nr_words, mismatches;
	pid_t child = 0;
	sigset_t usr1;
	int nr_threads, sig;

	if (argc < 4) {
		fprintf(stderr, "usage: pidns-app MIB THREADS STATUS [--with-child]\n");
		return 2;
	}
	nr_words = (uint64_t)atol(argv[1]) << 20 >> 3;
	nr_threads = atoi(argv[2]);
	status_path = argv[3];

	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, NULL); /* for every thread: main takes it with sigwait() */
	if (argc > 4 && !strcmp(argv[4], "--with-child")) {
		child = fork();
		if (child == 0)
			wait_forever(NULL);
	}
	data = malloc(nr_words * sizeof(*data));
	if (!data)
		return 1;
	for (i = 0; i < nr_words; i++)
		data[i] = word(i);
	for (sig = 0; sig < nr_threads; sig++) {
		pthread_t t;

		if (pthread_create(&t, NULL, wait_forever, NULL))
			return 1;
	}
	status("ready pid=%d", getpid());
	for (;;) {
		if (sigwait(&usr1, &sig))
			continue;
		for (mismatches = 0, i = 0; i < nr_words; i++)
			mismatches += data[i] != word(i);
		status("verified mismatches=%llu threads=%d child=%d", (unsigned long long)mismatches,
		       count_threads(), child > 0 && kill(child, 0) == 0);
	}
}
