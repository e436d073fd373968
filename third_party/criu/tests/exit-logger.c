/*
 * A CRIU test plugin that only records what its exit hook receives: one line
 * "exit stage=S ret=R" appended to $EXIT_LOGGER_LOG. It claims no device and
 * registers no other hook, so CRIU dumps the tree exactly as without it.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "criu-plugin.h"

static int logger_init(int stage)
{
	return 0;
}

static void logger_exit(int stage, int ret)
{
	const char *path = getenv("EXIT_LOGGER_LOG");
	char line[64];
	int fd, n;

	if (!path)
		return;
	n = snprintf(line, sizeof(line), "exit stage=%d ret=%d\n", stage, ret);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, line, n) != n)
		perror("exit-logger: write");
	close(fd);
}

/*
 * No hook: max_hooks 0 rather than CR_PLUGIN_REGISTER's CR_PLUGIN_HOOK__MAX, which the
 * project's header raises (patch 0012) past what stock 4.2.1 accepts from a plugin.
 */
cr_plugin_desc_t CR_PLUGIN_DESC = {
	.name = "exit_logger",
	.init = logger_init,
	.exit = logger_exit,
	.version = CRIU_PLUGIN_VERSION,
	.max_hooks = 0,
};
