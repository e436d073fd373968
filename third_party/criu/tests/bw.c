/*
 * bw: the memory ceilings that bound CRIU's page I/O, measured with THREADS threads:
 *   copy-warm  memcpy into memory that is already mapped (pure copy)
 *   copy-fresh memcpy into freshly mapped anonymous memory (page faults and clearing included:
 *              what a restore into new memory costs at best)
 * Prints one line per measure: "NAME threads=T GB/s=X".
 * Build: gcc -O2 -pthread -o bw bw.c;  run: bw MIB THREADS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static size_t total;
static unsigned int nr_threads;
static char *src, *dst;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *copy_part(void *arg)
{
	size_t i = (size_t)arg, part = total / nr_threads;

	memcpy(dst + i * part, src + i * part, part);
	return NULL;
}

static double copy_all(void)
{
	pthread_t t[256];
	double start = now();

	for (size_t i = 0; i < nr_threads; i++)
		pthread_create(&t[i], NULL, copy_part, (void *)i);
	for (size_t i = 0; i < nr_threads; i++)
		pthread_join(t[i], NULL);
	return total / 1e9 / (now() - start);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s MIB THREADS\n", argv[0]);
		return 1;
	}
	total = strtoull(argv[1], NULL, 0) << 20;
	nr_threads = atoi(argv[2]);
	if (nr_threads < 1 || nr_threads > 256)
		return 1;
	total -= total % (nr_threads * 4096UL);
	src = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	dst = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED || dst == MAP_FAILED)
		return 2;
	memset(src, 0x5a, total);
	printf("copy-fresh threads=%u GB/s=%.2f\n", nr_threads, copy_all());
	printf("copy-warm threads=%u GB/s=%.2f\n", nr_threads, copy_all());
	return 0;
}
