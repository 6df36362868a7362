#!/bin/sh
# Benchmarks against a private gpuqd on the CUDA backend (host if
# GPUQ_BENCH_BACKEND=host), each beside its raw baseline measured in the
# same run. Writes $OUT/bench-table.txt (the short table) and full output.
set -eu
BUILD=${1:-build}
OUT=${OUT:-$BUILD/gpu-check}
mkdir -p "$OUT"
backend=${GPUQ_BENCH_BACKEND:-cuda}
dir=$(mktemp -d /tmp/gpuq-bench.XXXXXX)
sock="$dir/gpuqd.sock"
table="$OUT/bench-table.txt"
: > "$table"

start_daemon() {
	"$BUILD/gpuqd" --backend "$backend" --socket "$sock" --log-level warn "$@" \
		>> "$OUT/bench-gpuqd.log" 2>&1 &
	daemon=$!
	i=0
	until "$BUILD/gpuq" --socket "$sock" ping > /dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 400 ] || { echo "gpuqd did not start"; exit 1; }
		sleep 0.05
	done
}

stop_daemon() {
	kill -TERM "$daemon"
	wait "$daemon"
}

for spin in 50 0; do
	start_daemon --spin "$spin"
	echo "-- dispatch ($backend backend, --spin $spin)" | tee -a "$table"
	"$BUILD/gpuq" --socket "$sock" bench dispatch --clients 1,8 --requests 20000 | tee -a "$table"
	stop_daemon
done
# [copy]
# [chain]
# [collective]
rm -rf "$dir"
