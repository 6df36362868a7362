#include <stdio.h>

#include "tests/integration/fixture.h"

int main(int argc, char **argv)
{
	char tier[64];
	snprintf(tier, sizeof tier, "integration-%s", test_backend());
	harness_set_timeout(120);
	fixture_probe();
	return harness_main(tier, argc, argv);
}
