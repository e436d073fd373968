/*
 * A CRIU test plugin for UPDATE_INETSK (patch 0012): at restore it moves every IPv4 socket end at
 * $REMAP_OLD to $REMAP_NEW and counts the ends it moved into $REMAP_LOG ("moved N"). It declares
 * the hooks of the header it is built against, so only a CRIU with the hook loads it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "criu-plugin.h"

static uint32_t old_ip, new_ip;
static int moved;

static int remap_init(int stage)
{
	const char *o = getenv("REMAP_OLD"), *n = getenv("REMAP_NEW");

	if (stage != CR_PLUGIN_STAGE__RESTORE || !o || !n)
		return 0;
	if (inet_pton(AF_INET, o, &old_ip) != 1 || inet_pton(AF_INET, n, &new_ip) != 1)
		return -1;
	return 0;
}

static void remap_exit(int stage, int ret)
{
	const char *path = getenv("REMAP_LOG");
	FILE *f;

	if (stage != CR_PLUGIN_STAGE__RESTORE || !path)
		return;
	f = fopen(path, "w");
	if (!f)
		return;
	fprintf(f, "moved %d\n", moved);
	fclose(f);
}

static int remap_update_inetsk(uint32_t family, uint32_t state, uint32_t *src_ip, uint32_t *dst_ip)
{
	int n = 0;

	if (family != AF_INET || !old_ip)
		return -ENOTSUP;
	if (src_ip[0] == old_ip) {
		src_ip[0] = new_ip;
		n++;
	}
	if (dst_ip[0] == old_ip) {
		dst_ip[0] = new_ip;
		n++;
	}
	moved += n;
	return n ? 0 : -ENOTSUP;
}

CR_PLUGIN_REGISTER("remap", remap_init, remap_exit)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__UPDATE_INETSK, remap_update_inetsk)
