/*
 * How fast can threads fill fresh pages of tmpfs files through MAP_SHARED
 * mappings, as CRIU's direct page dump (patch 0004) does? One file written
 * by T threads is one task's pages image; F files written at once would be
 * F tasks dumped at the same time. Also fresh anonymous memory, the same
 * copy without tmpfs. Prints GB/s per case.
 *
 * usage: tmpfs-write-scaling DIR GIB   (each case writes GIB GiB in all)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PIECE (4UL << 20)

static char *src; /* a warm 4 MiB source, as process_vm_readv reads a resident task */

struct job {
	char *dst;
	size_t len;
	int populate;
};

static void *fill(void *arg)
{
	struct job *j = arg;

	for (size_t off = 0; off < j->len; off += PIECE) {
		size_t n = j->len - off < PIECE ? j->len - off : PIECE;

		if (j->populate)
			madvise(j->dst + off, n, MADV_POPULATE_WRITE);
		memcpy(j->dst + off, src, n);
	}
	return NULL;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* files == 0: anonymous memory */
static void run(const char *dir, size_t total, int files, int threads, int populate)
{
	int nmaps = files ? files : 1;
	char *maps[64];
	int fds[64];
	pthread_t t[64];
	struct job jobs[64];
	size_t per_file = total / nmaps, per_thread = total / threads;
	double t0, took;

	for (int f = 0; f < nmaps; f++) {
		if (files) {
			char path[4096];

			snprintf(path, sizeof(path), "%s/scaling-%d", dir, f);
			fds[f] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
			unlink(path);
			if (fds[f] < 0 || ftruncate(fds[f], per_file)) {
				perror(path);
				exit(1);
			}
			maps[f] = mmap(NULL, per_file, PROT_READ | PROT_WRITE, MAP_SHARED, fds[f], 0);
		} else {
			maps[f] = mmap(NULL, per_file, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		}
		if (maps[f] == MAP_FAILED) {
			perror("mmap");
			exit(1);
		}
	}
	/* threads are spread evenly over the files, each file cut among its threads */
	for (int i = 0; i < threads; i++) {
		int f = i % nmaps, k = i / nmaps, per = threads / nmaps;

		jobs[i].dst = maps[f] + (size_t)k * (per_file / per);
		jobs[i].len = per_file / per;
		jobs[i].populate = populate;
	}
	t0 = now();
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, fill, &jobs[i]);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	took = now() - t0;
	printf("%-9s files=%-2d threads=%-2d populate=%d  %6.2f GB/s  (%.2f s for %.1f GiB)\n",
	       files ? "tmpfs" : "anonymous", files, threads, populate, total / 1e9 / took, took,
	       total / (double)(1 << 30));
	fflush(stdout);
	for (int f = 0; f < nmaps; f++) {
		munmap(maps[f], per_file);
		if (files)
			close(fds[f]);
	}
	(void)per_thread;
}

int main(int argc, char **argv)
{
	static const int cases[][3] = {
		/* files, threads, populate */
		{ 0, 1, 0 },  { 0, 16, 0 }, { 1, 1, 0 },  { 1, 4, 0 },	{ 1, 16, 0 }, { 1, 16, 1 },
		{ 4, 4, 0 },  { 4, 16, 0 }, { 4, 16, 1 }, { 16, 16, 0 }, { 2, 16, 0 },
	};
	size_t total;

	if (argc != 3) {
		fprintf(stderr, "usage: %s DIR GIB\n", argv[0]);
		return 2;
	}
	total = strtoul(argv[2], NULL, 0) << 30;
	src = malloc(PIECE);
	memset(src, 0x5a, PIECE);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run(argv[1], total, cases[i][0], cases[i][1], cases[i][2]);
	return 0;
}
