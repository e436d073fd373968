/*
 * mem-app: a plain (CPU-only) test application for CRIU's page I/O, with the interface of
 * scripts/gpu/gpu-app.cu so the same scripts drive both.
 *
 * Holds GIB gibibytes of pseudo-random data in anonymous memory (a hash of seed, step and
 * index), and on each SIGUSR1 checks every word against the value it must have, then advances
 * the data one step (every word is rewritten) so the next check proves the memory kept changing.
 * On SIGUSR2 it forks a child that checks the data the same way without changing it (after a
 * restore this shows that the memory is inherited by fork as before). With --with-child it
 * first forks a child that only waits (it shares none of the data), so that a restore of this
 * process also forks a child after its memory is in place.
 * Results go to STATUS, one line per event:
 *   ready pid=P words=W addr=0x...
 *   verified step=S mismatches=M first_bad=I sum=X   (X: the sum of the words as they are now)
 *   forked-child step=S mismatches=M
 * Like a CUDA process it also reserves a large range of address space it never touches (64 GiB,
 * PROT_NONE): a restore must not charge it as memory.
 * Build: gcc -O2 -o mem-app mem-app.c;  run: mem-app GIB SEED STATUS [--with-child]
 */
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *status_path;

static inline uint64_t mix(uint64_t x, uint64_t i)
{
	x ^= i * 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* The value of word I at STEP: every step changes every word. */
static inline uint64_t expected(uint64_t seed, uint64_t i, int step)
{
	return mix(seed + (uint64_t)step * 0xd1b54a32d192ed03ULL, i);
}

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

/* Counts the words that do not have their value of STEP. */
static unsigned long long check(const uint64_t *d, uint64_t n, uint64_t seed, int step, long long *first)
{
	unsigned long long bad = 0;

	*first = -1;
	for (uint64_t i = 0; i < n; i++) {
		if (d[i] != expected(seed, i, step) && !bad++)
			*first = (long long)i;
	}
	return bad;
}

/* A child checks the data it inherited; the exit status says whether all of it was right. */
static void check_in_child(const uint64_t *d, uint64_t n, uint64_t seed, int step)
{
	long long first;
	int st;
	pid_t pid = fork();

	if (pid == 0)
		_exit(check(d, n, seed, step, &first) ? 1 : 0);
	if (pid < 0 || waitpid(pid, &st, 0) != pid) {
		status("forked-child step=%d error", step);
		return;
	}
	status("forked-child step=%d mismatches=%s", step,
	       WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "0" : (WIFSIGNALED(st) ? "killed" : "some"));
}

int main(int argc, char **argv)
{
	uint64_t seed, n, *d;
	sigset_t set;
	double gib;

	if (argc != 4 && !(argc == 5 && !strcmp(argv[4], "--with-child"))) {
		fprintf(stderr, "usage: %s GIB SEED STATUS [--with-child]\n", argv[0]);
		return 1;
	}
	gib = atof(argv[1]);
	seed = strtoull(argv[2], NULL, 0);
	status_path = argv[3];
	n = (uint64_t)(gib * (1ULL << 30)) / 8;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGUSR2);
	sigprocmask(SIG_BLOCK, &set, NULL);

	if (argc == 5 && fork() == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (;;)
			pause();
	}

	if (mmap(NULL, 64ULL << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) {
		status("error mmap of a 64 GiB PROT_NONE reservation failed");
		return 2;
	}
	d = mmap(NULL, n * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (d == MAP_FAILED) {
		status("error mmap of %llu bytes failed", (unsigned long long)n * 8);
		return 2;
	}
	for (uint64_t i = 0; i < n; i++)
		d[i] = expected(seed, i, 0);
	status("ready pid=%d words=%llu addr=%p", getpid(), (unsigned long long)n, (void *)d);

	for (int step = 0;;) {
		unsigned long long bad;
		long long first;
		int sig;

		sigwait(&set, &sig);
		if (sig == SIGUSR2) {
			check_in_child(d, n, seed, step);
			continue;
		}
		uint64_t sum = 0;

		bad = 0;
		first = -1;
		for (uint64_t i = 0; i < n; i++) {
			if (d[i] != expected(seed, i, step) && !bad++)
				first = (long long)i;
			d[i] = expected(seed, i, step + 1);
			sum += d[i];
		}
		status("verified step=%d mismatches=%llu first_bad=%lld sum=%llx", step, bad, first,
		       (unsigned long long)sum);
		step++;
	}
}
