/* An MPI job with its data on the GPU, one rank per node (tests/tests/criu_cluster_mpi.rs and
 * scripts/gpu/multinode.sh): each rank holds a buffer on its GPU, and every step copies it to the
 * host, checks it holds what the last step left there, sums it over all ranks with
 * MPI_Allreduce (host-staged, over Open MPI's TCP transport between the nodes) and writes the
 * mean plus one back to the GPU. So every rank's GPU data follows the same sequence, and a
 * rank restored with its GPU memory, a message or a step lost says so.
 *
 *   mpirun ... cuda-mpi-app LOG STEPS [INTERVAL_MS]   (LOG.rankN: "step S pid=P ok" or BAD)
 *
 * The CUDA driver is loaded with dlopen (libcuda.so.1: the real driver or the simulated one),
 * its few calls declared here, so that no CUDA toolkit is needed to build it. The rank's GPU is
 * the first one it sees (each node shows its own: CUDA_VISIBLE_DEVICES, or --device below).
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*cuCtxSetCurrent)(void *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);

#define N (1 << 17) /* 1 MiB of doubles */

static void must(CUresult r, const char *what) {
	if (r != 0) {
		fprintf(stderr, "cuda-mpi-app: %s failed: %d\n", what, r);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
}

static void *sym(void *lib, const char *name) {
	void *f = dlsym(lib, name);
	if (!f) {
		fprintf(stderr, "cuda-mpi-app: libcuda.so.1 has no %s\n", name);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	return f;
}

static CUdeviceptr gpu_buffer(int ordinal) {
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "cuda-mpi-app: %s\n", dlerror());
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	*(void **)&cuInit = sym(lib, "cuInit");
	*(void **)&cuDeviceGet = sym(lib, "cuDeviceGet");
	*(void **)&cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
	*(void **)&cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent");
	*(void **)&cuMemAlloc = sym(lib, "cuMemAlloc_v2");
	*(void **)&cuMemcpyHtoD = sym(lib, "cuMemcpyHtoD_v2");
	*(void **)&cuMemcpyDtoH = sym(lib, "cuMemcpyDtoH_v2");
	int dev;
	void *ctx;
	CUdeviceptr buf;
	must(cuInit(0), "cuInit");
	must(cuDeviceGet(&dev, ordinal), "cuDeviceGet");
	must(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	must(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	must(cuMemAlloc(&buf, N * sizeof(double)), "cuMemAlloc");
	return buf;
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc < 3) {
		fprintf(stderr, "usage: cuda-mpi-app LOG STEPS [INTERVAL_MS] [DEVICE]\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	long steps = atol(argv[2]);
	int interval = argc > 3 ? atoi(argv[3]) : 50;
	int ordinal = argc > 4 ? atoi(argv[4]) : 0;
	char path[4096];
	snprintf(path, sizeof path, "%s.rank%d", argv[1], rank);
	FILE *log = fopen(path, "w");
	if (!log) {
		perror(path);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	static double host[N], sum[N];
	CUdeviceptr buf = gpu_buffer(ordinal);
	double expect = rank + 1;
	for (long i = 0; i < N; i++)
		host[i] = expect + i;
	must(cuMemcpyHtoD(buf, host, sizeof host), "cuMemcpyHtoD");
	fprintf(log, "ready pid=%d\n", getpid());
	fflush(log);
	for (long step = 0; step < steps; step++) {
		must(cuMemcpyDtoH(host, buf, sizeof host), "cuMemcpyDtoH");
		long bad = 0;
		for (long i = 0; i < N; i++)
			bad += host[i] != expect + i;
		MPI_Allreduce(host, sum, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		/* Every rank's next value: the mean over the ranks, plus one (the same on all). */
		double mean = 0;
		for (int r = 0; r < size; r++)
			mean += step == 0 ? r + 1 : expect;
		expect = mean / size + 1;
		for (long i = 0; i < N; i++)
			host[i] = sum[i] / size + 1;
		bad += host[0] != expect;
		must(cuMemcpyHtoD(buf, host, sizeof host), "cuMemcpyHtoD");
		fprintf(log, "step %ld pid=%d %s\n", step, getpid(), bad ? "BAD" : "ok");
		fflush(log);
		usleep(interval * 1000);
	}
	fprintf(log, "done\n");
	fclose(log);
	MPI_Finalize();
	return 0;
}
