#!/bin/sh
# make gpu-check: on a GPU machine, from an existing build/ (nothing is
# compiled here). Runs the kernel self-test, the whole test suite with the
# CUDA tier required, and the benchmarks; full logs go to $OUT (or
# build/gpu-check), and a short table is printed last.
#
# Extended mode: GPUQ_EXTENDED=1 adds the soak test (tests/integration/
# test_soak.c) against the CUDA backend for GPUQ_SOAK_SECONDS (default 300)
# after everything else; GPUQ_EXTENDED=soak runs that soak alone (about six
# minutes: fits one device command).
#
# GPUQ_CHECK_PARTS=tests runs the self-tests and the suite only, =bench the
# benchmarks only; the default runs both. The whole suite ran into a
# ten-minute limit on one command on the H200 machine, most of it the tiers CI already runs on
# the host backend: =cuda runs the self-tests and only the suite's CUDA tiers
# (integration and Python): a shorter command, meant to fit one device
# command beside =bench (not yet timed on the H200 machine).
set -u
# Regions count against gpuqd's RLIMIT_MEMLOCK: lift it where this shell may.
ulimit -l unlimited 2> /dev/null || true
PARTS=${GPUQ_CHECK_PARTS:-all}
BUILD=${1:-build}
OUT=${OUT:-$BUILD/gpu-check}
mkdir -p "$OUT"
export GPUQ_BUILD="$BUILD" NCCL_NVLS_ENABLE=0
# The Python client's suite and bench want msgpack, numpy and pytest: the
# GPU machine's torch venv has them (GPUQ_PYTHON names another).
[ -n "${GPUQ_PYTHON:-}" ] || [ ! -x /opt/torch/.venv/bin/python3 ] ||
	export GPUQ_PYTHON=/opt/torch/.venv/bin/python3
LOG="$OUT/gpu-check.log"
: > "$LOG"
status=0

step() {
	name=$1
	shift
	echo "== $name: $*" | tee -a "$LOG"
	"$@" > "$OUT/$name.log" 2>&1
	rc=$?
	tail -n 25 "$OUT/$name.log" | tee -a "$LOG" > /dev/null
	echo "   -> exit $rc" | tee -a "$LOG"
	[ $rc -eq 0 ] || status=1
	return $rc
}

nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >> "$OUT/nvidia-smi.txt"
"$BUILD/gpuqd" --probe --backend cuda > "$OUT/probe.txt" 2>&1

# 64 clients killed and restarted at random for minutes, on the GPU (see the test's header).
soak() {
	GPUQ_SOAK_SECONDS=${GPUQ_SOAK_SECONDS:-300} GPUQ_TEST_BACKEND=cuda \
		step soak "$BUILD/tests/itest" soak_killed
	grep -q 'RESULT integration-cuda: 1 passed' "$OUT/soak.log" ||
		{ echo "   the soak did not pass on the GPU (skipped?)" | tee -a "$LOG"; status=1; }
	echo
	echo "== soak summary"
	grep -E 'soak:|FAIL|failures|grew|descriptors after' "$OUT/soak.log"
	tail -n 1 "$OUT/soak.log"
}
if [ "${GPUQ_EXTENDED:-0}" = soak ]; then
	soak
	exit $status
fi

if [ "$PARTS" != bench ]; then
	step kernels "$BUILD/tests/kernels_selftest"
	step copy-kernel "$BUILD/tests/copy_selftest" --bench # SM copy: alignments, lengths, 4 GiB rate
	step copy-sass sh tests/gpu/copy_sass.sh "$BUILD"     # its 16-byte accesses, no spills
	# The chain kernels' machine code, kept for reading against the bench (no GPU time).
	step chain-sass cuobjdump --dump-sass "$BUILD/obj/kernels/chain.o"
	step chain-expr-sass cuobjdump --dump-sass "$BUILD/obj/kernels/chain_expr.o"
	# Client processes attaching a 1 GiB buffer, their own kernel on it, read leases side by side.
	step attach sh tests/gpu/attach.sh "$BUILD"
	tiers=all
	[ "$PARTS" = cuda ] && tiers=cuda
	GPUQ_TIERS=$tiers GPUQ_REQUIRE_GPU=1 GPUQ_TEST_LOG="$OUT/tests-detail.log" \
		step tests sh tests/run.sh "$BUILD"
fi
[ "$PARTS" = tests ] || [ "$PARTS" = cuda ] || step bench sh tests/bench.sh "$BUILD"

[ "${GPUQ_EXTENDED:-0}" = 1 ] && soak

echo
echo "== gpu-check summary"
cat "$OUT/nvidia-smi.txt"
cut -f1-5 "$OUT/probe.txt"
if [ "$PARTS" != bench ]; then
	printf '%-10s %s\n' "kernels" "$(tail -n 1 "$OUT/kernels.log")"
	grep -E '^FAIL chain|^FAIL fast|^FAIL (sum|mean|norm2|dot|min|max|argmax|count_nonzero)' "$OUT/kernels.log" | head -10
	# --math fast's measured errors: the table docs/gpuq.1 quotes.
	sed -n '/^--math fast/,/^$/p' "$OUT/kernels.log"
	printf '%-10s %s\n' "copy-kernel" "$(tail -n 1 "$OUT/copy-kernel.log")"
	grep '^bench 4 GiB' "$OUT/copy-kernel.log"
	printf '%-10s %s\n' "copy-sass" "$(tail -n 1 "$OUT/copy-sass.log")"
	printf '%-10s %s\n' "attach" "$(tail -n 1 "$OUT/attach.log")"
	grep -E '^(FAIL|attach \()' "$OUT/attach.log" | head -10
	printf '%-10s %s\n' "tests" "$(grep -E '^[0-9]+ passed' "$OUT/tests.log" | tail -n 1)"
	grep -E '^(FAIL|GPU tests)' "$OUT/tests.log" | head -20
	grep -E '^RESULT' "$OUT/tests.log"
fi
echo "-- benchmarks"
cat "$OUT/bench-table.txt" 2>/dev/null
# Everything but the summary and the table in one archive: the device tool
# brings back at most eight files.
(cd "$OUT" && tar czf logs.tar.gz --exclude=logs.tar.gz --exclude=gpu-check.log \
	--exclude=bench-table.txt -- * && find . -type f ! -name logs.tar.gz \
	! -name gpu-check.log ! -name bench-table.txt -delete)
exit $status
