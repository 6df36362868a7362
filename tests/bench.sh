#!/bin/sh
# Benchmarks against a private gpuqd on the CUDA backend (host if
# GPUQ_BENCH_BACKEND=host), each beside its raw baseline measured in the
# same run. Writes $OUT/bench-table.txt (the short table) and full output.
set -u
# Regions count against gpuqd's RLIMIT_MEMLOCK: lift it where this shell may.
ulimit -l unlimited 2> /dev/null || true
BUILD=${1:-build}
OUT=${OUT:-$BUILD/gpu-check}
mkdir -p "$OUT"
backend=${GPUQ_BENCH_BACKEND:-cuda}
dir=$(mktemp -d /tmp/gpuq-bench.XXXXXX)
# Compiled chain kernels go to the daemons' default cache: keep it here, not in ~/.cache.
export XDG_CACHE_HOME="$dir/cache"
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
	"$BUILD/gpuq" --socket "$sock" bench dispatch --clients 1,8 --requests 20000 \
		--save-json "$OUT/bench-dispatch-spin$spin.json" | tee -a "$table"
	stop_daemon
done
# Host<->device copies (and device<->device, where the daemon has bench_d2d):
# pageable and pinned cudaMemcpy beside gpuq from a memfd, a file and
# registered, and, D2H, the host half of a get alone (the `host` rows; each
# get's GET ratio is to the slower of pinned and the best of its kind), fresh
# and write-only files, /dev/null and a pipe; 256 MiB to 4 GiB on a GPU; the
# host backend's 1G arena gets smaller sizes.
copy_sizes=256M,1G,4G
[ "$backend" = cuda ] || copy_sizes=64M,256M
start_daemon
echo "-- copy ($backend backend)" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" bench copy --sizes "$copy_sizes" --save-json "$OUT/bench-copy.json" | tee -a "$table"
stop_daemon
# GPUQ_BENCH_COPY_SWEEP=1: the same at 1 GiB under other ring and thread
# settings, for tuning the defaults (about 10 s each on the H200).
if [ "${GPUQ_BENCH_COPY_SWEEP:-0}" = 1 ]; then
	for cfg in "--staging-slot 1M --staging-slots 64" "--staging-slot 4M --staging-slots 16" \
		"--copy-threads 16" "--copy-threads 8"; do
		# shellcheck disable=SC2086 # cfg is a list of options
		start_daemon $cfg
		echo "-- copy ($backend backend, $cfg)" | tee -a "$table"
		"$BUILD/gpuq" --socket "$sock" bench copy --sizes 1G | grep -v '^D2D\|^peer' | tee -a "$table"
		stop_daemon
	done
fi
# Attaching a resident buffer from new processes (10 GiB on a GPU, 64 MiB in
# the host arena), beside get to scratch: and a copy into pinned memory; the
# region rows (H2D and D2H through a region, and pinning's one-time cost)
# are in the copy table above.
start_daemon
echo "-- attach ($backend backend)" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" bench attach --save-json "$OUT/bench-attach.json" | tee -a "$table"
stop_daemon
# Alloc and free latency, the memory pool against exportable slabs in the
# same run (4K, 1M, 64M, 1G), and the device memory a buffer of each takes.
start_daemon
echo "-- alloc ($backend backend)" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" bench alloc --save-json "$OUT/bench-alloc.json" | tee -a "$table"
stop_daemon
# Re-executing gpuqd with many buffers resident (1000 buffers, 100 GiB in
# all, on a GPU; 64 and 256 MiB in the host arena): to the first job
# served again (aim < 1.5 s) and to every checksum verified, no byte copied.
start_daemon
echo "-- restart ($backend backend)" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" bench restart --save-json "$OUT/bench-restart.json" | tee -a "$table"
stop_daemon
# Kernel chains: launch-bound eager vs graph, bandwidth-bound eager/graph/fused
# beside cudaMemcpy D2D, and graph instantiate/update/hit (1 GiB on a GPU;
# the host backend's 1G arena holds two 64M buffers).
chain_bytes=1G
[ "$backend" = cuda ] || chain_bytes=64M
start_daemon
echo "-- chain ($backend backend)" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" bench chain --bytes "$chain_bytes" --save-json "$OUT/bench-chain.json" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" stats | tee -a "$table"
stop_daemon
# A compiled chain's kernel as daemons get it: the first compiles it (NVRTC),
# a new daemon on the same kernel cache reads it from disk, its plan holds it
# (graph), another constant finds it in memory. Each line says which and how long.
echo "-- chain kernels across daemons ($backend backend; a fresh kernel cache)" | tee -a "$table"
chain5='sin | add 1 | sqrt | mul 2 | sub 3'
for round in first new; do
	start_daemon --kernel-cache "$dir/kernels"
	"$BUILD/gpuq" --socket "$sock" alloc kc --count 1048576 --dtype f32 > /dev/null
	"$BUILD/gpuq" --socket "$sock" fill kc random 5 > /dev/null
	echo "$round daemon:" | tee -a "$table"
	"$BUILD/gpuq" --socket "$sock" run kc "$chain5" | tee -a "$table"
	"$BUILD/gpuq" --socket "$sock" run kc "$chain5" | tee -a "$table"
	"$BUILD/gpuq" --socket "$sock" run kc 'sin | add 2 | sqrt | mul 2 | sub 3' | tee -a "$table"
	stop_daemon
done
# All-reduce over every device: the daemon's path (allreduce jobs, 8 in
# flight) beside a raw ncclAllReduce loop on the same communicator, 8 B to
# 512 MiB by 4, every element checked (the host backend's arenas: to 1M).
allreduce_bytes=8:1G
[ "$backend" = cuda ] || allreduce_bytes=8:1M
start_daemon
echo "-- allreduce ($backend backend, all devices)" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" bench allreduce --bytes "$allreduce_bytes" --factor 4 \
	--devices all --save-json "$OUT/bench-allreduce.json" | tee -a "$table"
stop_daemon
# The Python client (client/python/bench.py): ping/noop round trips beside
# the C client's, put_array/get_array of numpy arrays and torch tensors beside
# torch's own copies and bench_copy's pinned cudaMemcpy, in the
# same run; with $GPUQ_PYTHON, else the first of /usr/bin/python3 and python3
# that has msgpack and numpy.
py=""
for candidate in "${GPUQ_PYTHON:-}" /usr/bin/python3 python3; do
	[ -n "$candidate" ] && "$candidate" -c 'import msgpack, numpy' > /dev/null 2>&1 &&
		{ py=$candidate; break; }
done
py_bytes=256M,1G
[ "$backend" = cuda ] || py_bytes=256M
start_daemon
echo "-- python client ($backend backend)" | tee -a "$table"
if [ -n "$py" ]; then
	"$py" client/python/bench.py --socket "$sock" --gpuq "$BUILD/gpuq" --bytes "$py_bytes" \
		2>&1 | tee -a "$table"
else
	echo "skipped: no python3 with msgpack and numpy (set GPUQ_PYTHON)" | tee -a "$table"
fi
stop_daemon
# NCCL's other primitives over every device, each beside the same NCCL calls
# in a raw loop on the same communicator, with nccl-tests' size and bus
# factor, every element checked (8 B to 128 MiB by 8; the host backend's
# arenas: to 256K). On one GPU busbw is 0 where the factor is (n-1)/n.
coll_bytes=8:128M
[ "$backend" = cuda ] || coll_bytes=8:256K
start_daemon
for op in all-gather reduce-scatter broadcast reduce all-to-all sendrecv; do
	echo "-- $op ($backend backend, all devices)" | tee -a "$table"
	"$BUILD/gpuq" --socket "$sock" bench collective --op "$op" --bytes "$coll_bytes" \
		--factor 8 --devices all --save-json "$OUT/bench-$op.json" | tee -a "$table"
done
stop_daemon
# The scheduler: a put, a get and a chain (4 GiB each on a GPU) alone and at
# once beside bench_sched's raw ceiling; a small job's latency behind a long
# put (a small get's behind a long get) and behind 1000 low-priority puts;
# two owners' shares. The second owner is a child of gpuq (root) as uid
# 65534: the socket's group must be its group and the directory enterable.
# No configuration: equal weights.
other_group=$(getent group 65534 | cut -d: -f1)
chmod 0711 "$dir"
start_daemon --config /dev/null ${other_group:+--socket-group "$other_group"}
echo "-- sched ($backend backend)" | tee -a "$table"
"$BUILD/gpuq" --socket "$sock" bench sched --save-json "$OUT/bench-sched.json" | tee -a "$table"
stop_daemon
rm -rf "$dir"
# Each benchmark's result drawn beside its log (python -m gpuq plot; matplotlib).
if [ -n "$py" ] && "$py" -c 'import matplotlib' > /dev/null 2>&1; then
	for json in "$OUT"/bench-*.json; do
		[ -s "$json" ] && PYTHONPATH=client/python "$py" -m gpuq plot "$json" -o "${json%.json}.png" \
			> /dev/null
	done
	echo "-- plots: $(ls "$OUT"/bench-*.png 2> /dev/null | wc -l) PNGs beside the logs" | tee -a "$table"
else
	echo "-- plots: skipped (no python3 with matplotlib)" | tee -a "$table"
fi
