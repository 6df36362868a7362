#!/bin/sh
# Runs every test tier against the binaries in BUILD (default build/) and
# ends with one line: "N passed, N failed, N skipped".
#
# Tiers: the layering of the includes (tests/layers.sh), unit (C), integration against the host backend, the same suite
# against the CUDA backend (on a machine without a GPU, one line says
# "skipped N tests: no cuda device: ..."; each tier prints one such line per
# distinct reason, and its RESULT line counts every test), the CLI tests,
# the documentation checks (tests/docs.sh: gpuq --help, gpuq.1 and gpuqd.8
# against the programs' own tables), the service tests, and the Python
# client's suite on each backend.
# GPUQ_REQUIRE_GPU=1 turns skipped GPU tests into a failure (make gpu-check).
# GPUQ_TIERS=cuda runs only the tiers against the CUDA backend (integration
# and Python): what a GPU machine adds to the tiers CI runs.
set -u
BUILD=${1:-build}
export GPUQ_BUILD="$BUILD"
LOG=${GPUQ_TEST_LOG:-$(mktemp /tmp/gpuq-tests.XXXXXX)}
: > "$LOG"

tier() {
	echo "== $*" | tee -a "$LOG"
	"$@" 2>&1 | tee -a "$LOG"
}

if [ "${GPUQ_TIERS:-all}" = cuda ]; then
	GPUQ_TEST_BACKEND=cuda tier "$BUILD/tests/itest"
	GPUQ_TEST_BACKEND=cuda tier sh tests/python.sh "$BUILD"
else
	tier sh tests/layers.sh          # which folders each layer may include
	tier "$BUILD/tests/unit"
	GPUQ_TEST_BACKEND=host tier "$BUILD/tests/itest"
	GPUQ_TEST_BACKEND=cuda tier "$BUILD/tests/itest"
	tier sh tests/cli.sh "$BUILD"
	tier sh tests/top.sh "$BUILD"     # gpuq top: --once, and the live view in tmux
	tier sh tests/docs.sh "$BUILD"    # --help and the man pages against the programs' own tables
	tier sh tests/service.sh "$BUILD" # socket activation, notify, config, install
	tier sh tests/python.sh "$BUILD"  # the Python client: pip install, then its suite
	GPUQ_TEST_BACKEND=cuda tier sh tests/python.sh "$BUILD"
fi

awk -v require_gpu="${GPUQ_REQUIRE_GPU:-0}" '
/^RESULT / {
	tier = $2; sub(":", "", tier)
	p += $3; f += $5; s += $7
	if (tier ~ /-cuda$/) { gpu_passed += $3; gpu_skipped += $7 }
}
/^skipped [0-9]+ tests?( \([^)]*\))?: no cuda device/ { no_gpu = 1 }
END {
	if (no_gpu)
		print "GPU tests: " gpu_skipped " skipped (no usable CUDA device here; run make gpu-check on a GPU machine)"
	else if (gpu_skipped > 0)
		print "GPU tests: " gpu_skipped " skipped for what this machine lacks (each says why)"
	if (require_gpu == 1 && (no_gpu || gpu_passed == 0)) {
		print "GPU tests were required (GPUQ_REQUIRE_GPU=1) and did not run"
		f += 1
	}
	printf "%d passed, %d failed, %d skipped\n", p, f, s
	exit (f > 0 || p == 0) ? 1 : 0
}' "$LOG"
