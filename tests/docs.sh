#!/bin/sh
# The help and the manual pages say everything the programs take, read
# from the programs' own tables so that they cannot drift apart again:
#   - every command of gpuq's command table (client/cli/gpuq.c,
#     cli_commands) and every bench kind (client/bench/bench.c,
#     bench_kind_rows) has its line in `gpuq --help` and its own tagged
#     paragraph (.TP) in docs/gpuq.1;
#   - every long option gpuq parses (client/cli/args.c) is in docs/gpuq.1
#     and in the help gpuq prints (gpuq --help or some gpuq COMMAND --help);
#   - docs/gpuq.1 describes the progress bar;
#   - every long option of gpuqd (daemon/options.c, long_options) and
#     every quota key (daemon/quota.c) is in docs/gpuqd.8, and every quota
#     key in the README's quota paragraph.
# One ok/FAIL line per check; ends with "RESULT docs: N passed, N failed,
# 0 skipped" for tests/run.sh.
set -u
BUILD=${1:-build}
passed=0
failed=0
dir=$(mktemp -d /tmp/gpuq-docs.XXXXXX)
trap 'rm -rf "$dir"' EXIT

ok() { passed=$((passed + 1)); echo "ok   docs/$1"; }
fail() { failed=$((failed + 1)); echo "FAIL docs/$1"; echo "    $2"; }

# A man page's source as text: \- is -, font changes and quotes go.
plain() { sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\&//g' "$1"; }
# The tags of a man page's .TP paragraphs, as text, one a line.
tags() {
	plain "$1" | awk '
		tp { sub(/^\.[BIR]+ /, ""); gsub(/"/, ""); gsub(/  +/, " "); print; tp = 0; next }
		/^\.TP/ { tp = 1 }'
}
# The "NAME" of each row of the C table that starts at the line matching
# $2 in file $1 and ends at its "};".
table_names() {
	awk -v start="$2" '
		index($0, start) { on = 1; next }
		on && /^};/ { exit }
		on && /^\t\{ "[a-z-]+",/ { s = $0; sub(/^\t\{ "/, "", s); sub(/".*/, "", s); print s }' "$1"
}

gpuq="$BUILD/gpuq"
if ! "$gpuq" --help > "$dir/help" 2>&1; then
	fail gpuq_help_runs "$gpuq --help failed: $(head -3 "$dir/help")"
fi
plain docs/gpuq.1 > "$dir/gpuq.1"
plain docs/gpuqd.8 > "$dir/gpuqd.8"
tags docs/gpuq.1 > "$dir/gpuq.1.tags"

table_names client/cli/gpuq.c "cli_commands[] = {" > "$dir/commands"
table_names client/bench/bench.c "bench_kind_rows[] = {" > "$dir/kinds"
[ -s "$dir/commands" ] && [ -s "$dir/kinds" ] ||
	fail tables_found "no command table in client/cli/gpuq.c or no bench kinds in client/bench/bench.c"

# Every command (bench: every kind) in gpuq --help and as a tag in gpuq.1.
while read -r cmd; do
	if [ "$cmd" = bench ]; then
		while read -r kind; do
			if grep -q "^  bench $kind\( \|$\)" "$dir/help"; then ok "help_lists_bench_$kind"
			else fail "help_lists_bench_$kind" "gpuq --help has no line for 'bench $kind'"; fi
			if grep -q "^bench $kind\( \|$\)" "$dir/gpuq.1.tags"; then ok "gpuq.1_has_bench_$kind"
			else fail "gpuq.1_has_bench_$kind" "docs/gpuq.1 has no .TP paragraph for 'bench $kind'"; fi
		done < "$dir/kinds"
		continue
	fi
	if grep -q "^  $cmd\( \|$\)" "$dir/help"; then ok "help_lists_$cmd"
	else fail "help_lists_$cmd" "gpuq --help has no line for '$cmd'"; fi
	if grep -q "^$cmd\( \|$\)" "$dir/gpuq.1.tags"; then ok "gpuq.1_has_$cmd"
	else fail "gpuq.1_has_$cmd" "docs/gpuq.1 has no .TP paragraph for '$cmd'"; fi
done < "$dir/commands"

# Every long option of gpuq: the global ones and the commands' table.
{
	awk '/^static const struct option global_options\[\]/, /^};/' client/cli/args.c |
		sed -n 's/^\t{ "\([a-z-]*\)",.*/\1/p'
	sed -n 's/^\t{ { "\([a-z-]*\)",.*/\1/p' client/cli/args.c
	echo version
} | sort -u > "$dir/cli-options"
: > "$dir/all-help"
while read -r cmd; do
	"$gpuq" "$cmd" --help >> "$dir/all-help" 2>&1
	[ "$cmd" != bench ] || while read -r kind; do
		"$gpuq" bench "$kind" --help >> "$dir/all-help" 2>&1
	done < "$dir/kinds"
done < "$dir/commands"
cat "$dir/help" >> "$dir/all-help"
while read -r opt; do
	if grep -q -e "--$opt\b" "$dir/gpuq.1"; then ok "gpuq.1_has_--$opt"
	else fail "gpuq.1_has_--$opt" "docs/gpuq.1 does not mention --$opt"; fi
	if grep -q -e "--$opt\b" "$dir/all-help"; then ok "help_has_--$opt"
	else fail "help_has_--$opt" "neither gpuq --help nor any gpuq COMMAND --help mentions --$opt"; fi
done < "$dir/cli-options"
if grep -qi "progress bar" "$dir/gpuq.1"; then ok gpuq.1_has_the_progress_bar
else fail gpuq.1_has_the_progress_bar "docs/gpuq.1 does not describe put and get's progress bar"; fi

# gpuqd's long options and the quota keys.
awk '/^static const struct option long_options\[\]/, /^};/' daemon/options.c |
	sed -n 's/^\t{ "\([a-z-]*\)",.*/\1/p' > "$dir/gpuqd-options"
[ -s "$dir/gpuqd-options" ] || fail gpuqd_options_found "no long_options table in daemon/options.c"
while read -r opt; do
	if grep -q -e "--$opt\b" "$dir/gpuqd.8"; then ok "gpuqd.8_has_--$opt"
	else fail "gpuqd.8_has_--$opt" "docs/gpuqd.8 does not mention --$opt"; fi
done < "$dir/gpuqd-options"
{
	sed -n 's/.*strcmp(key, "\([a-z-]*\)").*/\1/p' daemon/quota.c
	sed -n 's/^\t\[HOLD_[A-Z_]*\] = { "\([a-z-]*\)",.*/\1/p' daemon/quota.c
} | sort -u > "$dir/quota-keys"
[ -s "$dir/quota-keys" ] || fail quota_keys_found "no quota keys found in daemon/quota.c"
# The README's quota paragraph: from "**Quotas" to the next blank line.
awk '/^\*\*Quotas/ { on = 1 } on && /^$/ { exit } on' README.md > "$dir/readme-quotas"
while read -r key; do
	if grep -q "^\.B[IR]* $key\b" "$dir/gpuqd.8"; then ok "gpuqd.8_has_quota_$key"
	else fail "gpuqd.8_has_quota_$key" "docs/gpuqd.8 does not set quota key '$key' in bold"; fi
	if grep -q "\`$key\`" "$dir/readme-quotas"; then ok "readme_has_quota_$key"
	else fail "readme_has_quota_$key" "README.md's quota paragraph does not name \`$key\`"; fi
done < "$dir/quota-keys"

# gpuqd.8 says what gpuqd does (as README.md and protocol.md do): SIGUSR2
# replays queued jobs, SIGTERM under a descriptor store leaves the buffers
# there, and a fault that needs a new process makes gpuqd re-execute itself.
# Their text as one line: a font macro's words stay, its quotes go.
flat() { sed -e 's/^\.[BIR]* //' -e '/^\./d' -e 's/"//g' | tr -s ' \n' '  '; }
sed -n '/^\.SH SIGNALS/,/^\.SH SYSTEMD/p' "$dir/gpuqd.8" | flat > "$dir/gpuqd.8.signals"
flat < "$dir/gpuqd.8" > "$dir/gpuqd.8.flat"
while IFS='|' read -r name file phrase; do
	if grep -qF "$phrase" "$dir/$file"; then ok "gpuqd.8_$name"
	else fail "gpuqd.8_$name" "docs/gpuqd.8 does not say '$phrase'"; fi
done <<'PHRASES'
sigusr2_replays_queued_jobs|gpuqd.8.signals|queued ones are replayed by the new image
sigterm_keeps_the_store|gpuqd.8.signals|the buffers stay in the store and the next start takes them over
reset_limit_reexecutes|gpuqd.8.flat|gpuqd re-executes itself (as gpuq admin restart does
PHRASES

echo "RESULT docs: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
