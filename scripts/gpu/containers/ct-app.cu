// ct-app: the CUDA application of the container tests (scripts/gpu/containers/run.sh).
//
// Holds GIB gibibytes of pseudo-random data on the GPU (a hash of seed, step and index). Every
// INTERVAL_MS it checks every word on the GPU against the value it must have after the steps so
// far, then advances the data one step (every word changes), and appends one line to LOG, in
// the format of the simulated GPU's cuda-sim-app so that the runner reads both alike:
//   start pid=P device=D words=W uuid=GPU-...
//   step=S pid=P words=W uuid=GPU-... ok                 (every word as it must be)
//   MISMATCH step=S pid=P mismatches=M first_bad=I      (then exits 3)
//   ERROR <call>: <CUDA error>                          (then exits 2)
// The step counter lives in host memory and the data on the GPU: a restored process whose
// device memory came back wrong, or from another step, fails its next check. The log is
// opened for each line (no file stays open across a checkpoint). uuid= is the GPU the CUDA
// runtime reports for the device in use, read at every step (after a restore onto another
// GPU, what the process itself sees).
// Optional: BUSY_MS, a kernel spinning that long on the GPU before each check (a process whose
// GPU is busy, for lock tests); UNIX_SOCKET, a connection to it held open for the whole run (a
// resource CRIU cannot dump, so that a dump fails after the GPU checkpoint). The Rust scenarios
// (tests/tests/scenarios) run it as the NVIDIA machine's application.
// Build: nvcc -O2 -o ct-app ct-app.cu
#include <cuda_runtime.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__host__ __device__ static inline uint64_t mix(uint64_t x, uint64_t i)
{
	x ^= i * 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

// The value word i must hold after `step` steps: every word changes at every step, and a
// word from another step (or another seed) never matches.
__host__ __device__ static inline uint64_t value(uint64_t seed, uint64_t i, uint64_t step)
{
	return mix(seed + step * 0xd1b54a32d192ed03ULL, i);
}

// Spins for `ns` nanoseconds of the GPU's global timer.
__global__ void spin(uint64_t ns)
{
	uint64_t start, now;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
	} while (now - start < ns);
}

__global__ void fill(uint64_t *d, uint64_t n, uint64_t seed)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		d[i] = value(seed, i, 0);
}

// Checks that every word holds its value of `step`, then moves it to step + 1.
__global__ void check_and_advance(uint64_t *d, uint64_t n, uint64_t seed, uint64_t step,
				  unsigned long long *bad, unsigned long long *first)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
		if (d[i] != value(seed, i, step)) {
			atomicAdd(bad, 1ULL);
			atomicMin(first, (unsigned long long)i);
		}
		d[i] = value(seed, i, step + 1);
	}
}

static const char *log_path;
static uint64_t step;

static void say(const char *fmt, ...)
{
	FILE *f = fopen(log_path, "a");
	if (!f)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

#define CK(x)                                                                   \
	do {                                                                    \
		cudaError_t e = (x);                                            \
		if (e != cudaSuccess) {                                         \
			say("ERROR %s: %s (step=%llu)", #x, cudaGetErrorString(e), \
			    (unsigned long long)step);                          \
			exit(2);                                                \
		}                                                               \
	} while (0)

static void uuid_text(char *out, size_t len)
{
	cudaDeviceProp p;
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
		snprintf(out, len, "?");
		return;
	}
	const unsigned char *u = (const unsigned char *)p.uuid.bytes;
	snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
		 u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

int main(int argc, char **argv)
{
	if (argc < 5 || argc > 7) {
		fprintf(stderr, "usage: %s GIB SEED LOG INTERVAL_MS [BUSY_MS [UNIX_SOCKET]]\n", argv[0]);
		return 1;
	}
	uint64_t busy_ns = argc > 5 ? strtoull(argv[5], NULL, 0) * 1000000ULL : 0;
	if (argc > 6) {
		struct sockaddr_un a;
		memset(&a, 0, sizeof(a));
		a.sun_family = AF_UNIX;
		int s = socket(AF_UNIX, SOCK_STREAM, 0);
		strncpy(a.sun_path, argv[6], sizeof(a.sun_path) - 1);
		if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
			fprintf(stderr, "connect %s failed\n", argv[6]);
			return 1;
		}
	}
	double gib = atof(argv[1]);
	uint64_t seed = strtoull(argv[2], NULL, 0);
	log_path = argv[3];
	long interval_ms = atol(argv[4]);
	uint64_t n = (uint64_t)(gib * (1ULL << 30)) / 8;
	uint64_t *d;
	unsigned long long *bad;
	char uuid[64];
	int dev = 0;

	CK(cudaMalloc(&d, n * 8));
	CK(cudaMalloc(&bad, 16));
	fill<<<1024, 256>>>(d, n, seed);
	CK(cudaDeviceSynchronize());
	CK(cudaGetDevice(&dev));
	uuid_text(uuid, sizeof(uuid));
	say("start pid=%d device=%d words=%llu uuid=%s", getpid(), dev, (unsigned long long)n, uuid);
	for (step = 0;; step++) {
		unsigned long long h[2] = { 0, ~0ULL };
		if (busy_ns)
			spin<<<1, 1>>>(busy_ns);
		CK(cudaMemcpy(bad, h, 16, cudaMemcpyHostToDevice));
		check_and_advance<<<1024, 256>>>(d, n, seed, step, bad, bad + 1);
		CK(cudaMemcpy(h, bad, 16, cudaMemcpyDeviceToHost));
		if (h[0]) {
			say("MISMATCH step=%llu pid=%d mismatches=%llu first_bad=%llu", (unsigned long long)step + 1,
			    getpid(), h[0], h[1]);
			exit(3);
		}
		uuid_text(uuid, sizeof(uuid));
		say("step=%llu pid=%d words=%llu uuid=%s ok", (unsigned long long)step + 1, getpid(),
		    (unsigned long long)n, uuid);
		struct timespec ts = { interval_ms / 1000, (interval_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}
