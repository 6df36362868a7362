#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/integration/fixture.h"

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

int main(int argc, char **argv)
{
	char tier[64], cache[] = "/tmp/gpuq-itest-cache.XXXXXX";
	snprintf(tier, sizeof tier, "integration-%s", test_backend());
	harness_set_timeout(120);
	/* The daemons' compiled kernels (their default cache) stay in this run's directory. */
	if (mkdtemp(cache))
		setenv("XDG_CACHE_HOME", cache, 1);
	fixture_probe();
	int rc = harness_main(tier, argc, argv);
	nftw(cache, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	return rc;
}
