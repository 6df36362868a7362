#!/bin/sh
# The Python client's tier: the install check, then its pytest suite against
# a private gpuqd (client/python/tests). Ends with a RESULT line that
# tests/run.sh sums, whatever happens before it.
#
# GPUQ_TEST_BACKEND=host (default): the README's `pip install
# --no-build-isolation ./client/python` (offline) into a
# fresh venv of Debian's /usr/bin/python3 (with the system's msgpack, numpy
# and pytest, as the README's set-up installs them), then the suite with
# that venv's interpreter, so that the installed package is what is tested.
# GPUQ_TEST_BACKEND=cuda, or where /usr/bin/python3 cannot make that venv
# (the install check then says skipped): the suite from the source tree,
# with $GPUQ_PYTHON or the first of /usr/bin/python3 and python3 that has
# msgpack, numpy and pytest. Without a GPU the cuda run's tests are
# skipped, in one line: "skipped N tests: no cuda device: ...".
set -u
BUILD=${1:-build}
backend=${GPUQ_TEST_BACKEND:-host}
tier=python
[ "$backend" = host ] || tier="python-$backend"
root=$PWD
dir=$(mktemp -d /tmp/gpuq-python.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export GPUQ_BUILD="$BUILD"

# pick: the first interpreter given that has what the suite needs.
pick() {
	for py in "$@"; do
		[ -n "$py" ] && "$py" -c 'import msgpack, numpy, pytest' > /dev/null 2>&1 &&
			{ echo "$py"; return 0; }
	done
	return 1
}

install=""
py=""
# gpu-check: the host-backend run is CI's (the GPU machine's system Python
# has no pytest or venv); the cuda run below is the one that needs the GPU.
if [ "$backend" = host ] && [ "${GPUQ_REQUIRE_GPU:-0}" = 1 ]; then
	echo "skip $tier: the host-backend Python tier runs in CI (make test); gpu-check runs python-cuda"
	echo "RESULT $tier: 0 passed, 0 failed, 1 skipped"
	exit 0
fi
if [ "$backend" = host ] && pick /usr/bin/python3 > /dev/null &&
	/usr/bin/python3 -c 'import ensurepip, setuptools, wheel' > /dev/null 2>&1; then
	# uid 65534 runs one test's child process from this venv.
	chmod 755 "$dir"
	if /usr/bin/python3 -m venv --system-site-packages "$dir/V" > "$dir/install.log" 2>&1 &&
		"$dir/V/bin/pip" install --no-build-isolation ./client/python \
			>> "$dir/install.log" 2>&1 &&
		(cd "$dir" && PYTHONPATH= "$dir/V/bin/python" -c \
			'import gpuq, sys; sys.exit(not gpuq.__file__.startswith(sys.prefix))'); then
		echo "ok   $tier/install: pip install ./client/python into a fresh venv"
		install="1 passed, 0 failed, 0 skipped"
		py="$dir/V/bin/python"
	else
		echo "FAIL $tier/install: pip install ./client/python into a fresh venv:"
		sed 's/^/    /' "$dir/install.log" | tail -n 20
		install="0 passed, 1 failed, 0 skipped"
	fi
	# pip builds in place; what it leaves there is not the source.
	rm -rf client/python/build client/python/gpuq.egg-info
elif [ "$backend" = host ]; then
	echo "skip $tier/install: /usr/bin/python3 lacks msgpack, numpy, pytest, venv," \
		"setuptools or wheel (make deps installs them)"
	install="0 passed, 0 failed, 1 skipped"
fi
# Without the installed copy, the suite imports the source tree.
[ -n "$py" ] || export PYTHONPATH="$root/client/python"
if [ -z "$py" ] && ! py=$(pick "${GPUQ_PYTHON:-}" /usr/bin/python3 "$(command -v python3)"); then
	echo "FAIL $tier: no python3 with msgpack, numpy and pytest (make deps; or set GPUQ_PYTHON)"
	[ -z "$install" ] || echo "RESULT $tier-install: $install"
	echo "RESULT $tier: 0 passed, 1 failed, 0 skipped"
	exit 1
fi
[ -z "$install" ] || echo "RESULT $tier-install: $install"
# -p no:cacheprovider: nothing written into the source tree.
(cd "$dir" && GPUQ_TEST_BACKEND="$backend" "$py" -m pytest -p no:cacheprovider -q \
	--rootdir "$root/client/python" "$root/client/python/tests") > "$dir/pytest.log" 2>&1
rc=$?
cat "$dir/pytest.log"
if ! grep -q "^RESULT $tier:" "$dir/pytest.log"; then
	echo "FAIL $tier: pytest exited $rc before its summary"
	echo "RESULT $tier: 0 passed, 1 failed, 0 skipped"
	exit 1
fi
[ $rc -eq 0 ] && [ "$install" != "0 passed, 1 failed, 0 skipped" ]
