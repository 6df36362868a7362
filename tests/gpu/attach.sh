#!/bin/sh
# make gpu-check: the two-process attach test (tests/gpu/attach_selftest.c)
# against a private gpuqd on the CUDA backend.
set -u
BUILD=${1:-build}
dir=$(mktemp -d /tmp/gpuq-attach.XXXXXX)
sock="$dir/gpuqd.sock"
"$BUILD/gpuqd" --backend cuda --socket "$sock" --log-level warn > "$dir/gpuqd.log" 2>&1 &
daemon=$!
i=0
until "$BUILD/gpuq" --socket "$sock" ping > /dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 400 ] || { echo "gpuqd did not start"; cat "$dir/gpuqd.log"; exit 1; }
	sleep 0.05
done
"$BUILD/tests/attach_selftest" "$sock" > "$dir/out" 2>&1
rc=$?
kill -TERM "$daemon"
wait "$daemon" || { echo "gpuqd exited $?"; rc=1; }
[ $rc -eq 0 ] || cat "$dir/gpuqd.log"
cat "$dir/out" # its last line: "N passed, N failed"
rm -rf "$dir"
exit $rc
