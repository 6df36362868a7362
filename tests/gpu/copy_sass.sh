#!/bin/sh
# The SM copy kernel's machine code for sm_90, as built: it must move data
# in 16-byte accesses (cp.async loads LDGSTS...BYPASS...128, stores STG...128)
# and use no local memory (LDL/STL: registers spilled). Run by gpu-check on
# the GPU machine, whose CUDA toolkit has cuobjdump (this one may not).
set -u
BUILD=${1:-build}
obj="$BUILD/obj/kernels/copy.o"
dump=${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump
command -v "$dump" > /dev/null 2>&1 || dump=$(command -v cuobjdump || true)
if [ -z "$dump" ] || [ ! -x "$dump" ]; then
	echo "cuobjdump not found: SASS not checked"
	exit 0
fi
sass=$("$dump" --dump-sass "$obj" 2>&1) || { echo "$sass"; exit 1; }
sm90=$(printf '%s\n' "$sass" | awk '/arch = sm_90/ { on = 1 } /arch = sm_80/ { on = 0 } on')
ldgsts=$(printf '%s\n' "$sm90" | grep -cE 'LDGSTS\.E\.BYPASS[.A-Z0-9]*\.128')
stg=$(printf '%s\n' "$sm90" | grep -cE 'STG\.E[.A-Z0-9]*\.128')
local_mem=$(printf '%s\n' "$sm90" | grep -cE '\b(LDL|STL)\b')
echo "sm_90 copy kernels: $ldgsts LDGSTS.E.BYPASS.128, $stg STG.E.128, $local_mem LDL/STL"
[ "$ldgsts" -gt 0 ] && [ "$stg" -gt 0 ] && [ "$local_mem" -eq 0 ]
