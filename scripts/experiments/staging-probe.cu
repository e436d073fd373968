// staging-probe: where the driver keeps a checkpointed process's device memory, what its restore
// does with it, and whether that restore can start while the memory is still arriving.
//
//   staging-probe GIB MODE...      MODE: plain | seq | uffd | demand (each is one round)
//
// A child process (this program re-executed) holds GIB GiB of patterned device memory; the
// parent drives the driver's checkpoint API on it (it never calls cuInit) and prints, per round:
// - the address ranges that became private anonymous memory during the checkpoint (the
//   "staging" the driver fills), their RSS and huge pages, and whether they are still mapped
//   after the restore;
// - plain:  the driver's restore of the memory as its checkpoint left it;
// - seq:    the staging copied to a tmpfs file and dropped, put back with UFFDIO_COPY by 8
//           threads (4 KiB pages, as CRIU leaves restored memory), then the driver's restore:
//           CRIU's order today, both phases timed;
// - uffd:   the staging dropped and registered with userfaultfd; the driver's restore starts at
//           once while 8 threads put the pages back from the tmpfs file and a handler thread
//           serves the driver's faults first: the overlapped restore;
// - demand: as uffd without the fill threads: every page arrives through a fault (the order and
//           the threads the driver reads with);
// after every round the child checks every word on the GPU.
// Build: nvcc -O2 -o staging-probe staging-probe.cu -lcuda -lpthread
#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

#define MAXR 64
struct range { uint64_t start, end; };

// ---------------------------------------------------------------- child: the CUDA process

__global__ void fill(uint64_t *d, uint64_t n)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		d[i] = i * 0x9e3779b97f4a7c15ULL ^ (i >> 7);
}

__global__ void check(const uint64_t *d, uint64_t n, unsigned long long *bad)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		if (d[i] != (i * 0x9e3779b97f4a7c15ULL ^ (i >> 7)))
			atomicAdd(bad, 1ULL);
}

static int cmd_in, cmd_out;
static void reply(const char *fmt, ...)
{
	char b[4096];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(b, sizeof(b) - 1, fmt, ap);
	va_end(ap);
	b[n++] = '\n';
	if (write(cmd_out, b, n) != n)
		exit(3);
}
static int readline(int fd, char *b, int max)
{
	int n = 0;
	while (n < max - 1) {
		if (read(fd, b + n, 1) != 1)
			return -1;
		if (b[n] == '\n')
			break;
		n++;
	}
	b[n] = 0;
	return n;
}

// The userfaultfd side (inside the child, whose memory it is).
static int uffd = -1;
static struct range ur[MAXR];
static int nur;
static char *src;          // the tmpfs copy, mapped read-only
static uint64_t src_off[MAXR];
static volatile int go;
static uint64_t next_chunk, total_bytes;
static const uint64_t CHUNK = 4 << 20;
static double fill_end, first_fault = 0, last_fault = 0;
static long faults, fault_writes, eexist;
static int fault_tids[8], nfault_tids;
static uint64_t fault_addr[16];

static int locate(uint64_t addr, uint64_t *off)
{
	for (int i = 0; i < nur; i++)
		if (addr >= ur[i].start && addr < ur[i].end) {
			*off = src_off[i] + (addr - ur[i].start);
			return i;
		}
	return -1;
}

// copies [addr, addr+len) from the tmpfs copy; pages already there are skipped.
static void put(uint64_t addr, uint64_t len)
{
	uint64_t done = 0, off;
	while (done < len) {
		int r = locate(addr + done, &off);
		if (r < 0)
			return;
		uint64_t n = len - done;
		if (addr + done + n > ur[r].end)
			n = ur[r].end - (addr + done);
		struct uffdio_copy c = { addr + done, (uint64_t)(src + off), n, 0, 0 };
		if (ioctl(uffd, UFFDIO_COPY, &c) == 0) {
			done += n;
			continue;
		}
		if (errno == EEXIST) {
			__sync_fetch_and_add(&eexist, 1);
			done += c.copy > 0 ? c.copy : 4096;
			continue;
		}
		if (errno == EAGAIN) {
			if (c.copy > 0)
				done += c.copy;
			continue;
		}
		if (errno == ENOENT) /* gone: the driver's restore unmaps its staging when done */
			return;
		fprintf(stderr, "UFFDIO_COPY %lx: %s\n", addr + done, strerror(errno));
		exit(4);
	}
}

static void *filler(void *)
{
	while (!go)
		usleep(50);
	for (;;) {
		uint64_t c = __sync_fetch_and_add(&next_chunk, CHUNK);
		if (c >= total_bytes)
			break;
		// the c-th byte of the concatenated ranges
		uint64_t left = c;
		for (int i = 0; i < nur; i++) {
			uint64_t sz = ur[i].end - ur[i].start;
			if (left < sz) {
				uint64_t n = sz - left < CHUNK ? sz - left : CHUNK;
				put(ur[i].start + left, n);
				break;
			}
			left -= sz;
		}
	}
	double t = now();
	if (t > fill_end)
		fill_end = t;
	return NULL;
}

static volatile int stop_handler;
static void *handler(void *)
{
	while (!stop_handler) {
		struct pollfd p = { uffd, POLLIN, 0 };
		if (poll(&p, 1, 100) <= 0)
			continue;
		struct uffd_msg m;
		if (read(uffd, &m, sizeof(m)) != sizeof(m))
			continue;
		if (m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		uint64_t a = m.arg.pagefault.address & ~4095ULL;
		double t = now();
		if (!faults)
			first_fault = t;
		last_fault = t;
		if (faults < 16)
			fault_addr[faults] = a;
		faults++;
		if (m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE)
			fault_writes++;
		int tid = m.arg.pagefault.feat.ptid, k;
		for (k = 0; k < nfault_tids && fault_tids[k] != tid; k++)
			;
		if (k == nfault_tids && k < 8)
			fault_tids[nfault_tids++] = tid;
		// serve the 2 MiB around the fault (bounded by its range), then wake the faulter
		uint64_t off;
		int r = locate(a, &off);
		if (r < 0)
			continue;
		uint64_t s = a & ~((2ULL << 20) - 1), e = s + (2ULL << 20);
		if (s < ur[r].start)
			s = ur[r].start;
		if (e > ur[r].end)
			e = ur[r].end;
		put(s, e - s);
		struct uffdio_range w = { a, 4096 };
		ioctl(uffd, UFFDIO_WAKE, &w);
	}
	return NULL;
}

static pthread_t fillers[8], hthread;
static int nfill;

static void prep(char *args)
{
	// args: "THREADS start-end start-end ..."
	nfill = strtol(args, &args, 10);
	nur = 0;
	total_bytes = 0;
	for (char *t = strtok(args, " "); t && nur < MAXR; t = strtok(NULL, " ")) {
		ur[nur].start = strtoull(t, &t, 16);
		ur[nur].end = strtoull(t + 1, NULL, 16);
		src_off[nur] = total_bytes;
		total_bytes += ur[nur].end - ur[nur].start;
		nur++;
	}
	double t0 = now();
	int fd = open("/dev/shm/staging-probe.copy", O_RDWR | O_CREAT | O_TRUNC, 0600);
	for (int i = 0; i < nur; i++) {
		uint64_t sz = ur[i].end - ur[i].start, done = 0;
		while (done < sz) {
			ssize_t w = pwrite(fd, (char *)ur[i].start + done, sz - done > (1 << 30) ? (1 << 30) : sz - done,
					   src_off[i] + done);
			if (w <= 0) {
				reply("error pwrite %s", strerror(errno));
				return;
			}
			done += w;
		}
		madvise((void *)ur[i].start, sz, MADV_DONTNEED);
	}
	src = (char *)mmap(NULL, total_bytes, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	double t1 = now();
	struct uffdio_api api = { UFFD_API, UFFD_FEATURE_THREAD_ID, 0 };
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		reply("error userfaultfd %s", strerror(errno));
		return;
	}
	for (int i = 0; i < nur; i++) {
		struct uffdio_register r = { { ur[i].start, ur[i].end - ur[i].start }, UFFDIO_REGISTER_MODE_MISSING, 0 };
		if (ioctl(uffd, UFFDIO_REGISTER, &r)) {
			reply("error register %s", strerror(errno));
			return;
		}
	}
	go = 0;
	next_chunk = 0;
	faults = fault_writes = eexist = nfault_tids = 0;
	fill_end = 0;
	stop_handler = 0;
	pthread_create(&hthread, NULL, handler, NULL);
	for (int i = 0; i < nfill; i++)
		pthread_create(&fillers[i], NULL, filler, NULL);
	reply("prepared %d range(s) %.2f GiB copied to tmpfs in %.2f s", nur, total_bytes / 1073741824.0, t1 - t0);
}

static void finish(double t_go)
{
	for (int i = 0; i < nfill; i++)
		pthread_join(fillers[i], NULL);
	double filled = fill_end ? fill_end - t_go : 0;
	int had_fillers = nfill;
	nfill = 0;
	stop_handler = 1;
	pthread_join(hthread, NULL);
	char addrs[1024] = "";
	for (int i = 0; i < faults && i < 16; i++)
		snprintf(addrs + strlen(addrs), sizeof(addrs) - strlen(addrs), " %lx", fault_addr[i]);
	char tids[256] = "";
	for (int i = 0; i < nfault_tids; i++)
		snprintf(tids + strlen(tids), sizeof(tids) - strlen(tids), " %d", fault_tids[i]);
	// demand: the pages the driver never touched arrive now, so that the process is whole
	double t0 = now();
	if (!had_fillers) {
		go = 1;
		next_chunk = 0;
		pthread_t t;
		pthread_create(&t, NULL, filler, NULL);
		pthread_join(t, NULL);
	}
	double rest = now() - t0;
	close(uffd);
	uffd = -1;
	munmap(src, total_bytes);
	unlink("/dev/shm/staging-probe.copy");
	reply("uffd fill_s=%.3f faults=%ld write_faults=%ld eexist=%ld first_fault_s=%.3f last_fault_s=%.3f "
	      "leftover_fill_s=%.3f tids=%s first_addrs=%s",
	      filled, faults, fault_writes, eexist, faults ? first_fault - t_go : -1, faults ? last_fault - t_go : -1, rest,
	      tids, addrs);
}

static int child(double gib)
{
	uint64_t n = (uint64_t)(gib * (1ULL << 30)) / 8;
	uint64_t *d;
	unsigned long long *bad;
	if (cudaMalloc(&d, n * 8) || cudaMalloc(&bad, 8)) {
		reply("error cudaMalloc");
		return 2;
	}
	fill<<<1024, 256>>>(d, n);
	cudaDeviceSynchronize();
	reply("ready %d", getpid());
	char b[8192];
	double t_go = 0;
	while (readline(cmd_in, b, sizeof(b)) >= 0) {
		if (!strcmp(b, "verify")) {
			unsigned long long h = 0;
			cudaMemcpy(bad, &h, 8, cudaMemcpyHostToDevice);
			check<<<1024, 256>>>(d, n, bad);
			cudaError_t e = cudaMemcpy(&h, bad, 8, cudaMemcpyDeviceToHost);
			reply("verified mismatches=%llu err=%d", h, (int)e);
		} else if (!strncmp(b, "prep ", 5)) {
			prep(b + 5);
		} else if (!strcmp(b, "go")) {
			t_go = now();
			go = 1;
			reply("going");
		} else if (!strcmp(b, "finish")) {
			finish(t_go);
		} else if (!strcmp(b, "quit")) {
			return 0;
		}
	}
	return 0;
}

// ---------------------------------------------------------------- parent: the controller

static int to_child, from_child;
static void send(const char *s)
{
	if (write(to_child, s, strlen(s)) < 0 || write(to_child, "\n", 1) != 1)
		exit(3);
}
static char *recv_line(void)
{
	static char b[8192];
	if (readline(from_child, b, sizeof(b)) < 0) {
		printf("child gone\n");
		exit(3);
	}
	return b;
}

struct vma { uint64_t s, e; char perm[5]; int anon; };
static int read_maps(int pid, struct vma *v, int max)
{
	char p[64], l[512];
	snprintf(p, sizeof(p), "/proc/%d/maps", pid);
	FILE *f = fopen(p, "r");
	int n = 0;
	while (f && fgets(l, sizeof(l), f) && n < max) {
		unsigned long s, e, off, ino;
		char perm[5], dev[16], path[256] = "";
		if (sscanf(l, "%lx-%lx %4s %lx %15s %lu %255s", &s, &e, perm, &off, dev, &ino, path) < 6)
			continue;
		v[n].s = s;
		v[n].e = e;
		memcpy(v[n].perm, perm, 5);
		v[n].anon = ino == 0 && path[0] == 0 && perm[3] == 'p';
		n++;
	}
	if (f)
		fclose(f);
	return n;
}
static int covered(struct vma *v, int n, uint64_t a)
{
	for (int i = 0; i < n; i++)
		if (a >= v[i].s && a < v[i].e)
			return v[i].anon && v[i].perm[1] == 'w';
	return 0;
}
// ranges anonymous-private-writable now that were not before (page granularity, merged)
static int new_ranges(struct vma *b, int nb, struct vma *a, int na, struct range *r)
{
	int n = 0;
	for (int i = 0; i < na; i++) {
		if (!a[i].anon || a[i].perm[1] != 'w')
			continue;
		for (uint64_t p = a[i].s; p < a[i].e; p += 4096) {
			if (covered(b, nb, p))
				continue;
			if (n && r[n - 1].end == p)
				r[n - 1].end += 4096;
			else if (n < MAXR)
				r[n++] = (struct range){ p, p + 4096 };
		}
	}
	return n;
}
static void smaps_of(int pid, struct range *r, int n)
{
	char p[64], l[512];
	snprintf(p, sizeof(p), "/proc/%d/smaps", pid);
	FILE *f = fopen(p, "r");
	unsigned long rss = 0, thp = 0;
	int in = 0;
	while (f && fgets(l, sizeof(l), f)) {
		unsigned long a, b, kb;
		if (sscanf(l, "%lx-%lx ", &a, &b) == 2 && strchr(l, ' ') && l[strlen(l) - 1] == '\n' && strchr(l, '-') < strchr(l, ' ')) {
			in = 0;
			for (int i = 0; i < n; i++)
				if (a < r[i].end && b > r[i].start)
					in = 1;
			continue;
		}
		if (in && sscanf(l, "Rss: %lu kB", &kb) == 1)
			rss += kb;
		if (in && sscanf(l, "AnonHugePages: %lu kB", &kb) == 1)
			thp += kb;
	}
	if (f)
		fclose(f);
	printf("  staging VMAs: rss %.2f GiB, anon huge pages %.2f GiB\n", rss / 1048576.0, thp / 1048576.0);
}

static int ck(const char *what, CUresult r)
{
	if (r != CUDA_SUCCESS) {
		const char *s = "?";
		cuGetErrorName(r, &s);
		printf("  %s: %s (%d)\n", what, s, (int)r);
		return 1;
	}
	return 0;
}

static struct vma before[4096], after[4096], later[4096];

static int round_(int pid, const char *mode)
{
	printf("== round %s\n", mode);
	int nb = read_maps(pid, before, 4096);
	CUcheckpointLockArgs la;
	memset(&la, 0, sizeof(la));
	la.timeoutMs = 10000;
	double t0 = now();
	if (ck("lock", cuCheckpointProcessLock(pid, &la)))
		return 1;
	double t1 = now();
	if (ck("checkpoint", cuCheckpointProcessCheckpoint(pid, NULL)))
		return 1;
	double t2 = now();
	printf("  lock %.3f s, checkpoint %.3f s\n", t1 - t0, t2 - t1);
	int na = read_maps(pid, after, 4096);
	struct range r[MAXR];
	int nr = new_ranges(before, nb, after, na, r);
	uint64_t tot = 0;
	char list[4096] = "";
	for (int i = 0; i < nr; i++) {
		tot += r[i].end - r[i].start;
		printf("  new anonymous range %lx-%lx (%.3f GiB)\n", r[i].start, r[i].end, (r[i].end - r[i].start) / 1073741824.0);
		snprintf(list + strlen(list), sizeof(list) - strlen(list), " %lx-%lx", r[i].start, r[i].end);
	}
	printf("  %d new range(s), %.3f GiB; VMAs %d before, %d after the checkpoint\n", nr, tot / 1073741824.0, nb, na);
	smaps_of(pid, r, nr);
	double fill_s = 0;
	int uf = strcmp(mode, "plain") != 0;
	if (uf) {
		char cmd[8192];
		snprintf(cmd, sizeof(cmd), "prep %d%s", strcmp(mode, "demand") ? 8 : 0, list);
		send(cmd);
		printf("  %s\n", recv_line());
		if (!strcmp(mode, "seq")) {
			double f0 = now();
			send("go");
			recv_line();
			send("finish");
			printf("  fill first: %.3f s; %s\n", (fill_s = now() - f0), recv_line());
		}
	}
	double t3 = now();
	if (uf && strcmp(mode, "seq")) {
		send("go");
		recv_line();
	}
	if (ck("restore", cuCheckpointProcessRestore(pid, NULL)))
		return 1;
	double t4 = now();
	printf("  restore %.3f s%s\n", t4 - t3, !strcmp(mode, "seq") ? "" : "");
	if (uf && strcmp(mode, "seq")) {
		send("finish");
		printf("  %s\n", recv_line());
	}
	if (!strcmp(mode, "seq"))
		printf("  seq total (fill + restore) %.3f s\n", fill_s + (t4 - t3));
	int nl = read_maps(pid, later, 4096);
	int still = 0;
	for (int i = 0; i < nr; i++)
		for (uint64_t p = r[i].start; p < r[i].end; p += 4096)
			if (covered(later, nl, p)) {
				still++;
				break;
			}
	printf("  after restore: %d VMAs; %d of %d staging range(s) still mapped\n", nl, still, nr);
	if (ck("unlock", cuCheckpointProcessUnlock(pid, NULL)))
		return 1;
	send("verify");
	printf("  %s\n", recv_line());
	printf("RESULT mode=%s gib=%.2f checkpoint_s=%.3f restore_s=%.3f fill_first_s=%.3f\n", mode, tot / 1073741824.0,
	       t2 - t1, t4 - t3, fill_s);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "--child")) {
		cmd_in = 0;
		cmd_out = 1;
		return child(atof(argv[2]));
	}
	if (argc < 3) {
		fprintf(stderr, "usage: %s GIB MODE...\n", argv[0]);
		return 1;
	}
	int a[2], b[2];
	if (pipe(a) || pipe(b))
		return 1;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(a[0], 0);
		dup2(b[1], 1);
		execl("/proc/self/exe", argv[0], "--child", argv[1], (char *)NULL);
		_exit(127);
	}
	to_child = a[1];
	from_child = b[0];
	char *l = recv_line();
	printf("child: %s\n", l);
	if (strncmp(l, "ready", 5))
		return 1;
	int rc = 0;
	for (int i = 2; i < argc && !rc; i++)
		rc = round_(pid, argv[i]);
	send("quit");
	waitpid(pid, NULL, 0);
	return rc;
}
