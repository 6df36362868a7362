#include "tests/harness.h"

int main(int argc, char **argv)
{
	return harness_main("unit", argc, argv);
}
