#!/bin/sh
# The README's first command (make demo): starts a private gpuqd, runs the
# main jobs through the gpuq CLI, and stops it. Uses the GPUs when there are
# any and says so; otherwise the host backend, and says that.
set -eu
BUILD=${1:-build}
dir=$(mktemp -d /tmp/gpuq-demo.XXXXXX)
# Compiled chain kernels go to the daemons' default cache: keep it here, not in ~/.cache.
export XDG_CACHE_HOME="$dir/cache"
sock="$dir/gpuqd.sock"
log="$dir/gpuqd.log"
gpuq() { "$BUILD/gpuq" --socket "$sock" "$@"; }

if "$BUILD/gpuqd" --probe --backend cuda >"$dir/probe" 2>&1; then
	backend=cuda
	echo "== GPUs found: running the demo on the CUDA backend"
else
	backend=host
	echo "== no usable GPU ($(tail -n 1 "$dir/probe" | sed 's/^gpuqd\[[0-9]*\]: error: //'))"
	echo "== running the demo on the HOST backend (memory arenas standing in for GPUs)"
fi

"$BUILD/gpuqd" --backend "$backend" --socket "$sock" >"$log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
i=0
until gpuq ping >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 200 ] || { echo "gpuqd did not start:"; cat "$log"; exit 1; }
	sleep 0.05
done

set -x
gpuq ping
gpuq devices
gpuq alloc weights --bytes 256M
gpuq fill weights random 42
gpuq checksum weights
head -c 100000000 /dev/urandom > "$dir/data.bin"
gpuq alloc staged --bytes 100000000
gpuq put "$dir/data.bin" staged
gpuq get staged "$dir/back.bin"
cmp "$dir/data.bin" "$dir/back.bin"
gpuq copy staged weights[0:100000000] --verify
gpuq alloc x --count 1M --dtype f32
gpuq fill x random 7
gpuq run x 'sin | add 1 | sqrt | mul 2 | sub 3'
gpuq run x 'sin | add 1 | sqrt | mul 2 | sub 3' --mode graph --repeat 10
gpuq stats
ndev=$(gpuq --json ping | sed -n 's/.*"devices":\([0-9]*\).*/\1/p')
for d in $(seq 1 $((ndev - 1))); do gpuq alloc x --count 1M --dtype f32 --device "$d"; gpuq fill "x@$d" value 1; done
gpuq allreduce x --op sum
gpuq buffers
gpuq jobs
gpuq free weights
gpuq free staged
gpuq bench dispatch --clients 1,8 --requests 2000
set +x
kill -TERM $daemon
wait $daemon
trap 'rm -rf "$dir"' EXIT
echo "== demo done on the $backend backend; gpuqd stopped cleanly"
