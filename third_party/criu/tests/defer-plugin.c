/*
 * A CRIU test plugin for patch 0007 (deferred pages), standing in for a GPU plugin:
 * - init (restore): for each "PID:START-END" of $DEFER_PAGES (comma-separated, hex addresses),
 *   asks criu to let those pages arrive while the restore goes on (criu_defer_pages, found with
 *   dlsym as a real plugin must: stock CRIU lacks it);
 * - RESUME_DEVICES_LATE: reads every page of the task's ranges from criu's process, as a GPU
 *   driver's restore reads its checkpoint data, and appends "late pid=P bytes=B sum=S" to
 *   $DEFER_LOG (S: a sum of every 64-bit word; the test compares it with the application's).
 * It claims no device, so CRIU dumps and restores exactly as without it otherwise.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "criu-plugin.h"

struct range {
	int pid;
	unsigned long start, end;
};
static struct range ranges[16];
static int nr_ranges;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	const char *path = getenv("DEFER_LOG");
	char line[256];
	va_list ap;
	int fd, n;

	if (!path)
		return;
	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, line, n) != n)
		perror("defer-plugin: write");
	close(fd);
}

static int defer_init(int stage)
{
	int (*defer)(int, unsigned long, unsigned long);
	const char *spec = getenv("DEFER_PAGES");
	char *copy, *tok, *save;

	if (stage != CR_PLUGIN_STAGE__RESTORE || !spec)
		return 0;
	defer = (int (*)(int, unsigned long, unsigned long))dlsym(RTLD_DEFAULT, "criu_defer_pages");
	if (!defer) {
		say("no criu_defer_pages\n");
		return 0;
	}
	copy = strdup(spec);
	for (tok = strtok_r(copy, ",", &save); tok && nr_ranges < 16; tok = strtok_r(NULL, ",", &save)) {
		struct range *r = &ranges[nr_ranges];

		if (sscanf(tok, "%d:%lx-%lx", &r->pid, &r->start, &r->end) != 3)
			continue;
		if (defer(r->pid, r->start, r->end))
			say("criu_defer_pages failed for %d\n", r->pid);
		nr_ranges++;
	}
	free(copy);
	return 0;
}

static void defer_exit(int stage, int ret)
{
}

static int defer_resume_late(int pid)
{
	static char buf[1 << 20];
	int i;

	for (i = 0; i < nr_ranges; i++) {
		unsigned long a, bytes = 0;
		uint64_t sum = 0;

		if (ranges[i].pid != pid)
			continue;
		for (a = ranges[i].start; a < ranges[i].end; a += sizeof(buf)) {
			size_t len = ranges[i].end - a < sizeof(buf) ? ranges[i].end - a : sizeof(buf);
			struct iovec local = { buf, len }, remote = { (void *)a, len };
			ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
			size_t k;

			if (n != (ssize_t)len) {
				say("late pid=%d read error at %lx: %s\n", pid, a, strerror(errno));
				return -1;
			}
			for (k = 0; k < len / 8; k++)
				sum += ((uint64_t *)buf)[k];
			bytes += len;
		}
		say("late pid=%d bytes=%lu sum=%llx\n", pid, bytes, (unsigned long long)sum);
	}
	return -ENOTSUP;
}

CR_PLUGIN_REGISTER("defer_test", defer_init, defer_exit)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESUME_DEVICES_LATE, defer_resume_late)
