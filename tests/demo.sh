#!/bin/sh
# The README's first command (make demo): starts a private gpuqd, runs the
# main jobs through the gpuq CLI, and stops it. Each command is printed once,
# as one would paste it. Uses the GPUs when there are
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

# Each command is printed once, as one would type it (GPUQ_SOCKET names the
# private daemon's socket), then run.
export GPUQ_SOCKET="$sock"
echo "\$ export GPUQ_SOCKET=$sock"
show() {
	line="\$"
	for arg in "$@"; do
		case $arg in
		*[!A-Za-z0-9_./@:=,+-]* | "") arg="'$(printf '%s' "$arg" | sed "s/'/'\\\\''/g")'" ;;
		esac
		line="$line $arg"
	done
	echo "$line"
	"$@"
}
gpuq() { "$BUILD/gpuq" "$@"; }

root=$(pwd)
BUILD=$(cd "$BUILD" && pwd)
cd "$dir"
show gpuq ping
show gpuq devices
# Named buffers stay on their device between jobs.
show gpuq alloc weights --bytes 256M
show gpuq fill weights random 42
show gpuq checksum weights
echo "\$ head -c 100000000 /dev/urandom > data.bin"
head -c 100000000 /dev/urandom > data.bin
show gpuq alloc staged --bytes 100000000
show gpuq put data.bin staged
show gpuq get staged back.bin
show cmp data.bin back.bin
show gpuq copy staged 'weights[0:100000000]' --verify
# Kernels: a chain of elementwise ops, replayed as a CUDA graph; an
# expression over several buffers; a reduction to one number.
show gpuq alloc x --count 1M --dtype f32
show gpuq fill x random 7
show gpuq run x 'sin | add 1 | sqrt | mul 2 | sub 3'
show gpuq run x 'sin | add 1 | sqrt | mul 2 | sub 3' --mode graph --repeat 10
show gpuq alloc y --count 1M --dtype f32
show gpuq fill y value 1
show gpuq alloc a --count 1 --dtype f32
show gpuq fill a value 2
show gpuq run 'y = a * x + y'
show gpuq reduce 'sum(abs(x - y))'
show gpuq stats
# A host region: memory gpuqd pins once, then each put from it is one DMA.
show gpuq region create inbox --bytes 4M
show gpuq alloc small --bytes 4M
show gpuq put 'region:inbox' small
show gpuq region free inbox
# Priorities: a long put queued at low priority, an urgent checksum passes it.
show gpuq put data.bin staged --priority low --detach
show gpuq checksum weights --priority high
# All-reduce across every device (one on a machine with one GPU).
ndev=$(gpuq --json ping | sed -n 's/.*"devices":\([0-9]*\).*/\1/p')
for d in $(seq 1 $((ndev - 1))); do
	show gpuq alloc x --count 1M --dtype f32 --device "$d"
	show gpuq fill "x@$d" value 1
done
show gpuq allreduce x --op sum
show gpuq buffers
show gpuq jobs
show gpuq free weights
show gpuq bench dispatch --clients 1,8 --requests 2000
# The same daemon from Python (client/python; msgpack and numpy from Debian).
py=/usr/bin/python3
if PYTHONPATH="$root/client/python" "$py" -c 'import gpuq, numpy' > /dev/null 2>&1; then
	cat <<'PY' > snippet.py
import gpuq, numpy as np
c = gpuq.Client()
print(c.get_array("y")[:4], c.checksum("y").result)
PY
	echo "\$ PYTHONPATH=client/python python3 <<'PY'"
	cat snippet.py
	echo "PY"
	PYTHONPATH="$root/client/python" "$py" snippet.py
else
	echo "(the Python snippet needs $py with msgpack and numpy: make deps installs them)"
fi
kill -TERM $daemon
wait $daemon
trap 'rm -rf "$dir"' EXIT
echo "== demo done on the $backend backend; gpuqd stopped cleanly"
