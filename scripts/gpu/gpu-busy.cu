// gpu-busy: a CUDA process whose GPU is always busy, for lock-timeout tests.
//
// Holds MIB mebibytes of patterned device memory and launches, one after another, kernels that
// each spin for KERNEL_MS milliseconds (measured on the GPU's global timer). Appends a line to
// STATUS after each kernel; on SIGUSR1 (between kernels) it checks every word of its memory.
//   ready pid=P
//   kernel n=N
//   verified mismatches=M
// Build: nvcc -O2 -o gpu-busy gpu-busy.cu
#include <cuda_runtime.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__global__ void spin(uint64_t ns)
{
	uint64_t start, now;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
	} while (now - start < ns);
}

__global__ void fill(uint32_t *d, uint64_t n)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		d[i] = (uint32_t)(i * 2654435761u);
}

__global__ void check(const uint32_t *d, uint64_t n, unsigned long long *bad)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		if (d[i] != (uint32_t)(i * 2654435761u))
			atomicAdd(bad, 1ULL);
}

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

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { status("error %s", cudaGetErrorString(e)); exit(2); } } while (0)

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s MIB KERNEL_MS STATUS\n", argv[0]);
		return 1;
	}
	uint64_t n = strtoull(argv[1], NULL, 0) * (1ULL << 20) / 4;
	uint64_t ns = strtoull(argv[2], NULL, 0) * 1000000ULL;
	status_path = argv[3];
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);
	uint32_t *d;
	unsigned long long *bad;
	CK(cudaMalloc(&d, n * 4));
	CK(cudaMalloc(&bad, 8));
	fill<<<1024, 256>>>(d, n);
	CK(cudaDeviceSynchronize());
	status("ready pid=%d", getpid());
	struct timespec zero = { 0, 0 };
	for (unsigned long k = 1;; k++) {
		spin<<<1, 1>>>(ns);
		CK(cudaDeviceSynchronize());
		status("kernel n=%lu", k);
		if (sigtimedwait(&set, NULL, &zero) == SIGUSR1) {
			unsigned long long h = 0;
			CK(cudaMemcpy(bad, &h, 8, cudaMemcpyHostToDevice));
			check<<<1024, 256>>>(d, n, bad);
			CK(cudaMemcpy(&h, bad, 8, cudaMemcpyDeviceToHost));
			status("verified mismatches=%llu", h);
		}
	}
}
