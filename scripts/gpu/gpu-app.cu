// gpu-app: a CUDA test application for the GPU machine.
//
// Holds GIB gibibytes of pseudo-random data on the GPU (a hash of seed and index), and on each
// SIGUSR1 checks every word on the GPU against the value it must have, then advances the data
// one step (every word is rehashed) so the next check proves the device kept changing state.
// Results go to STATUS, one line per event:
//   ready pid=P words=W dptr=0x...
//   verified step=S mismatches=M first_bad=I
// Build: nvcc -O2 -o gpu-app gpu-app.cu
#include <cuda_runtime.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>

__host__ __device__ static inline uint64_t mix(uint64_t x, uint64_t i)
{
	x ^= i * 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

__device__ static inline uint64_t expected(uint64_t seed, uint64_t i, int step)
{
	uint64_t x = mix(seed, i);
	for (int s = 1; s <= step; s++)
		x = mix(x ^ (uint64_t)s, i);
	return x;
}

__global__ void fill(uint64_t *d, uint64_t n, uint64_t seed)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		d[i] = mix(seed, i);
}

__global__ void check_and_advance(uint64_t *d, uint64_t n, uint64_t seed, int step,
				  unsigned long long *bad, unsigned long long *first)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
		if (d[i] != expected(seed, i, step)) {
			atomicAdd(bad, 1ULL);
			atomicMin(first, (unsigned long long)i);
		}
		d[i] = mix(d[i] ^ (uint64_t)(step + 1), i);
	}
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
	fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); status("error %s", cudaGetErrorString(e)); exit(2); } } while (0)

static const char *status_path;

static void status(const char *fmt, ...)
{
	FILE *f = fopen(status_path, "a");
	if (!f)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s GIB SEED STATUS\n", argv[0]);
		return 1;
	}
	double gib = atof(argv[1]);
	uint64_t seed = strtoull(argv[2], NULL, 0);
	status_path = argv[3];
	uint64_t n = (uint64_t)(gib * (1ULL << 30)) / 8;

	// Block SIGUSR1 before the driver starts its threads, then wait for it synchronously.
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);

	uint64_t *d;
	unsigned long long *bad, *first;
	CK(cudaMalloc(&d, n * 8));
	CK(cudaMalloc(&bad, 16));
	first = bad + 1;
	fill<<<1024, 256>>>(d, n, seed);
	CK(cudaDeviceSynchronize());
	status("ready pid=%d words=%llu dptr=%p", getpid(), (unsigned long long)n, (void *)d);

	for (int step = 0;; step++) {
		int sig;
		sigwait(&set, &sig);
		unsigned long long h[2] = { 0, ~0ULL };
		CK(cudaMemcpy(bad, h, 16, cudaMemcpyHostToDevice));
		check_and_advance<<<1024, 256>>>(d, n, seed, step, bad, first);
		CK(cudaMemcpy(h, bad, 16, cudaMemcpyDeviceToHost));
		status("verified step=%d mismatches=%llu first_bad=%lld", step, h[0], h[0] ? (long long)h[1] : -1LL);
	}
}
