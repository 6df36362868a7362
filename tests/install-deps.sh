#!/bin/sh
# Installs gpuq's build dependencies where they are missing (Debian/Ubuntu):
# libuv, msgpack-c and inih (their static libraries are linked in), what
# the Python client's tests need, and, if it can, systemd's tools for the
# service tests. The CUDA toolkit with NCCL is expected under $CUDA_HOME
# (default /usr/local/cuda).
set -eu
libdir=$(pkg-config --variable=libdir libuv 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)
missing=""
[ -f "$libdir/libuv_a.a" ] || [ -f /usr/lib/x86_64-linux-gnu/libuv_a.a ] || missing="$missing libuv1-dev"
[ -f /usr/lib/x86_64-linux-gnu/libmsgpackc.a ] || missing="$missing libmsgpack-dev"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
# inih for the configuration file (static library).
[ -f /usr/lib/x86_64-linux-gnu/libinih.a ] || missing="$missing libinih-dev"
# tmux: a real terminal for gpuq top's tests (tests/top.sh).
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
# The Python client's tier runs on Debian's /usr/bin/python3 (the python3
# first on PATH may be another interpreter): msgpack, numpy and pytest for
# its suite, matplotlib for its plots, mypy to check its type hints, venv,
# setuptools and wheel for its
# pip-install check.
py=/usr/bin/python3
for mod in msgpack:python3-msgpack numpy:python3-numpy pytest:python3-pytest matplotlib:python3-matplotlib mypy:python3-mypy \
	ensurepip:python3-venv setuptools:python3-setuptools wheel:python3-wheel; do
	"$py" -c "import ${mod%%:*}" > /dev/null 2>&1 || missing="$missing ${mod#*:}"
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ -n "$missing" ]; then
	echo "installing:$missing"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
# systemd's tools for the service tests (systemd-socket-activate,
# systemd-analyze): wanted, not needed; without them those tests say skipped.
if ! command -v systemd-socket-activate >/dev/null 2>&1 || ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "installing: systemd (its tools, for the service tests)"
	{ $sudo apt-get update -qq &&
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq systemd >/dev/null; } ||
		echo "could not install systemd; the service tests that need its tools will be skipped" >&2
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ]; then
	echo "gpuq needs the CUDA toolkit (nvcc) under $cuda; set CUDA_HOME" >&2
	exit 1
fi
