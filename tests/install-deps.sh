#!/bin/sh
# Installs gpuq's build dependencies where they are missing (Debian/Ubuntu):
# libuv, msgpack-c and inih (their static libraries are linked in), and
# systemd's tools for the service tests. The CUDA
# toolkit with NCCL is expected under $CUDA_HOME (default /usr/local/cuda).
set -eu
libdir=$(pkg-config --variable=libdir libuv 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)
missing=""
[ -f "$libdir/libuv_a.a" ] || [ -f /usr/lib/x86_64-linux-gnu/libuv_a.a ] || missing="$missing libuv1-dev"
[ -f /usr/lib/x86_64-linux-gnu/libmsgpackc.a ] || missing="$missing libmsgpack-dev"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
# [service] inih for the configuration file (static library); systemd's
# tools for the service tests (systemd-socket-activate, systemd-analyze).
[ -f /usr/lib/x86_64-linux-gnu/libinih.a ] || missing="$missing libinih-dev"
command -v systemd-socket-activate >/dev/null 2>&1 && command -v systemd-analyze >/dev/null 2>&1 ||
	missing="$missing systemd"
if [ -n "$missing" ]; then
	echo "installing:$missing"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda/bin/nvcc" ]; then
	echo "gpuq needs the CUDA toolkit (nvcc) under $cuda; set CUDA_HOME" >&2
	exit 1
fi
