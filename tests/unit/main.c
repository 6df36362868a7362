#include "tests/harness.h"

int main(int argc, char **argv)
{
	/*
	 * The timeout catches a hang, not a slow machine: compiling every chain
	 * op with NVRTC takes 6 s here when idle and over 30 s beside two
	 * CPU-bound processes on two cores.
	 */
	harness_set_timeout(120);
	return harness_main("unit", argc, argv);
}
