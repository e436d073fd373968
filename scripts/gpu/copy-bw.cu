// copy-bw: host<->device copy bandwidth, the ceiling for the driver's checkpoint and restore.
// Prints one line per case: "<pinned|pageable> <d2h|h2d> GiB=<n> GB/s=<x>".
// Build: nvcc -O2 -o copy-bw copy-bw.cu ; run: ./copy-bw GIB
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <chrono>

static double gbps(size_t bytes, double sec) { return bytes / sec / 1e9; }

static double timed_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
	auto t0 = std::chrono::steady_clock::now();
	cudaError_t e = cudaMemcpy(dst, src, n, kind);
	auto t1 = std::chrono::steady_clock::now();
	if (e != cudaSuccess) {
		fprintf(stderr, "cudaMemcpy: %s\n", cudaGetErrorString(e));
		exit(2);
	}
	return std::chrono::duration<double>(t1 - t0).count();
}

int main(int argc, char **argv)
{
	double gib = argc > 1 ? atof(argv[1]) : 4;
	size_t n = (size_t)(gib * (1ULL << 30));
	void *d, *pinned, *pageable = malloc(n);
	if (cudaMalloc(&d, n) != cudaSuccess || cudaMallocHost(&pinned, n) != cudaSuccess || !pageable) {
		fprintf(stderr, "allocation failed\n");
		return 2;
	}
	memset(pageable, 1, n);  // fault the pages in: the first touch is not part of a copy
	memset(pinned, 1, n);
	cudaMemset(d, 1, n);
	for (int round = 0; round < 2; round++) {  // first round warms up; report the second
		double a = timed_copy(pinned, d, n, cudaMemcpyDeviceToHost);
		double b = timed_copy(d, pinned, n, cudaMemcpyHostToDevice);
		double c = timed_copy(pageable, d, n, cudaMemcpyDeviceToHost);
		double e = timed_copy(d, pageable, n, cudaMemcpyHostToDevice);
		if (round == 1) {
			printf("pinned d2h GiB=%g GB/s=%.2f\n", gib, gbps(n, a));
			printf("pinned h2d GiB=%g GB/s=%.2f\n", gib, gbps(n, b));
			printf("pageable d2h GiB=%g GB/s=%.2f\n", gib, gbps(n, c));
			printf("pageable h2d GiB=%g GB/s=%.2f\n", gib, gbps(n, e));
		}
	}
	return 0;
}
