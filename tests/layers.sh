#!/bin/sh
# Layering: which top-level folders each layer's sources may include
# (docs/ARCHITECTURE.md, Layout). Reads every #include "..." in the tracked
# C, CUDA and header files, resolves it as the compiler does (the including
# file's folder first, then the repository root, which the build passes as
# -I.), and fails a rule for each include that crosses the layers the wrong
# way, naming its file and line. Ends with a RESULT line.
#
#   client/   may not include daemon/, workers/ or kernels/
#   daemon/   may not include kernels/
#   protocol/ may include only protocol/
#   kernels/  may not include daemon/, workers/ or client/
#   workers/  may not include daemon/ or client/
#   and no layer includes tests/.
set -u
cd "$(dirname "$0")/.." || exit 1
dir=$(mktemp -d /tmp/gpuq-layers.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# The tracked sources; outside a git checkout, every source below here.
if ! git ls-files -- '*.c' '*.h' '*.cu' '*.cuh' > "$dir/files" 2> /dev/null; then
	find . -path ./build -prune -o -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
		-o -name '*.cuh' \) -print | sed 's|^\./||' > "$dir/files"
fi
# FILE:LINE:TEXT of every quoted include.
tr '\n' '\0' < "$dir/files" | xargs -0 grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' \
	/dev/null > "$dir/includes"

awk -v files="$dir/files" '
BEGIN {
	while ((getline f < files) > 0)
		tracked[f] = 1
	# rule name, the layers it constrains, the folders they may not include
	# ("*": every folder but their own)
	n = 0
	rule[++n] = "client_includes_no_daemon_workers_kernels"; layer[n] = "client"; bad[n] = "daemon workers kernels"
	rule[++n] = "daemon_includes_no_kernels"; layer[n] = "daemon"; bad[n] = "kernels"
	rule[++n] = "protocol_includes_only_protocol"; layer[n] = "protocol"; bad[n] = "*"
	rule[++n] = "kernels_include_no_daemon_workers_client"; layer[n] = "kernels"; bad[n] = "daemon workers client"
	rule[++n] = "workers_include_no_daemon_client"; layer[n] = "workers"; bad[n] = "daemon client"
	rule[++n] = "no_layer_includes_tests"; layer[n] = "client daemon kernels workers"; bad[n] = "tests"
	nrules = n
	read = 0
}

# a/b/../c -> a/c, ./a -> a
function normalise(p,    parts, k, m, out, depth, st) {
	m = split(p, parts, "/")
	depth = 0
	for (k = 1; k <= m; k++) {
		if (parts[k] == "." || parts[k] == "")
			continue
		if (parts[k] == ".." && depth > 0) {
			depth--
			continue
		}
		st[++depth] = parts[k]
	}
	out = ""
	for (k = 1; k <= depth; k++)
		out = out (k > 1 ? "/" : "") st[k]
	return out
}

{
	# FILE:LINE:TEXT
	file = $0; sub(/:.*/, "", file)
	rest = substr($0, length(file) + 2)
	line = rest; sub(/:.*/, "", line)
	text = substr(rest, length(line) + 2)
	if (!match(text, /"[^"]*"/))
		next
	inc = substr(text, RSTART + 1, RLENGTH - 2)
	here = file; if (!sub(/\/[^\/]*$/, "", here)) here = "."
	target = normalise(here "/" inc)
	if (!(target in tracked))
		target = normalise(inc)
	read++
	from = file; sub(/\/.*/, "", from)
	to = target; if (!sub(/\/.*/, "", to)) to = "."
	for (r = 1; r <= nrules; r++) {
		if (!index(" " layer[r] " ", " " from " "))
			continue
		if (bad[r] == "*" ? to != from : index(" " bad[r] " ", " " to " "))
			why[r] = why[r] "    " file ":" line ": includes \"" inc "\"\n"
	}
}

END {
	passed = failed = 0
	if (read > 0) {
		passed++
		printf "ok   layers/read_includes (%d)\n", read
	} else {
		failed++
		print "FAIL layers/read_includes: no #include \"...\" found"
	}
	for (r = 1; r <= nrules; r++) {
		if (why[r] == "") {
			passed++
			print "ok   layers/" rule[r]
		} else {
			failed++
			print "FAIL layers/" rule[r] ":"
			printf "%s", why[r]
		}
	}
	printf "RESULT layers: %d passed, %d failed, 0 skipped\n", passed, failed
	exit (failed > 0)
}' "$dir/includes"
