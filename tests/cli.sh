#!/bin/sh
# CLI tests: the gpuq command against a private gpuqd on the host backend
# (the CUDA tier of the integration suite covers the devices themselves).
# Checks outputs and the documented exit codes; ends with a RESULT line.
set -u
BUILD=${1:-build}
dir=$(mktemp -d /tmp/gpuq-cli.XXXXXX)
# Compiled chain kernels go to the daemons' default cache: keep it here, not in ~/.cache.
export XDG_CACHE_HOME="$dir/cache"
sock="$dir/gpuqd.sock"
passed=0
failed=0
skipped=0
gpuq() { "$BUILD/gpuq" --socket "$sock" "$@"; }

# verdict NAME GOT WANT: counts a command's exit status GOT against WANT,
# showing its output ($dir/out, $dir/err) when they differ.
verdict() {
	if [ "$2" -eq "$3" ]; then
		passed=$((passed + 1))
		echo "ok   cli/$1"
	else
		failed=$((failed + 1))
		echo "FAIL cli/$1: exit $2, expected $3"
		sed 's/^/    /' "$dir/out" "$dir/err"
	fi
}

# check NAME WANT_EXIT COMMAND...: runs COMMAND, compares its exit status.
check() {
	name=$1 want=$2
	shift 2
	"$@" > "$dir/out" 2> "$dir/err"
	verdict "$name" $? "$want"
}

# expect_not NAME PATTERN FILE: the last command's output does not match PATTERN.
expect_not() {
	if grep -q -- "$2" "$dir/$3"; then
		verdict "$1" 1 0
	else
		verdict "$1" 0 0
	fi
}

# expect NAME PATTERN FILE: the last command's output matches PATTERN.
expect() {
	if grep -q -- "$2" "$dir/$3"; then
		passed=$((passed + 1))
		echo "ok   cli/$1"
	else
		failed=$((failed + 1))
		echo "FAIL cli/$1: no '$2' in its $3:"
		sed 's/^/    /' "$dir/$3"
	fi
}

check unreachable_is_3 3 gpuq ping
expect unreachable_names_socket "$sock" err

# bench sched's second owner (uid 65534) must reach the socket: its group, a directory others enter.
other_group=$(getent group 65534 | cut -d: -f1)
chmod 0711 "$dir"
"$BUILD/gpuqd" --backend host --socket "$sock" --log-level warn \
	${other_group:+--socket-group "$other_group"} > "$dir/gpuqd.log" 2>&1 &
daemon=$!
i=0
until gpuq ping > /dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 200 ] || { echo "gpuqd did not start"; cat "$dir/gpuqd.log"; break; }
	sleep 0.05
done

check help_is_0 0 gpuq --help
check usage_is_2 2 gpuq alloc
check unknown_command_is_2 2 gpuq frobnicate
check ping_is_0 0 gpuq ping
expect ping_says_host "host" out
check devices 0 gpuq devices
expect devices_table "host arena" out
check alloc 0 gpuq alloc w --bytes 1M
check alloc_exists_is_1 1 gpuq alloc w --bytes 1M
expect alloc_exists_error "exists" err
check alloc_dtype 0 gpuq alloc f --count 1000 --dtype f32 --device 1
# Sizes of dtype bytes read as plain English: "N bytes", not "N bytes of bytes"
check alloc_exists_bytes_is_1 1 gpuq alloc w --bytes 1M
expect alloc_exists_says_plain_bytes "(1048576 bytes); free it" err
check alloc_exists_dtype_is_1 1 gpuq alloc f --count 1000 --dtype f32 --device 1
expect alloc_exists_says_dtype "(4000 bytes of f32); free it" err
check alloc_zero_bytes_is_1 1 gpuq alloc z --bytes 0
expect alloc_zero_bytes_plain "field 'bytes': 0 bytes is not a positive size" err
check alloc_zero_count_of_bytes_is_1 1 gpuq alloc z --count 0 --dtype bytes
expect alloc_zero_count_of_bytes_plain "field 'count': 0 bytes is not a positive size" err
# On the host backend a run says that the host evaluated it, not that a GPU kernel ran
check run_on_host 0 gpuq run f 'sin | add 1'
expect run_on_host_says_host_evaluation "host evaluation (the host backend: no GPU kernel ran" out
expect run_on_host_times_the_host "on the host," out
cp "$dir/out" "$dir/run.out"
check run_on_host_claims_no_gpu_kernel 1 grep -E ", (compiled|interpreted) kernel|on the device" "$dir/run.out"
check run_on_host_interpreted 0 gpuq run f 'sin' --kernel interpreted
expect run_on_host_interpreted_says_so "no GPU kernel ran; a GPU would run the interpreted kernel" out
check run_on_host_json 0 gpuq --json run f 'sin'
expect run_on_host_json_evaluated '"evaluated":"host"' out
for mode in graph eager; do
	check "run_${mode}_on_host" 0 gpuq run f 'sin | add 1' --mode $mode
	expect "run_${mode}_on_host_says_host_evaluation" "host evaluation (the host backend: no GPU kernel or graph ran): 2 passes, .* on the host" out
	cp "$dir/out" "$dir/run.out"
	check "run_${mode}_on_host_claims_no_graph" 1 grep -E "graph instantiated|cached graph|on the device" "$dir/run.out"
	check "run_${mode}_on_host_json" 0 gpuq --json run f 'sin' --mode $mode
	expect "run_${mode}_on_host_json_evaluated" '"evaluated":"host"' out
done
check run_graph_on_host_again_cached_plan 0 gpuq run f 'sin | add 1' --mode graph
expect run_graph_on_host_says_cached_plan "graph (cached plan), host evaluation" out
check reduce_on_host 0 gpuq reduce 'sum(f)'
expect reduce_on_host_says_host_evaluation "host evaluation (the host backend: no GPU kernel ran" out
# alloc NAME@GPU is alloc NAME --device GPU, as every other command reads a buffer
check alloc_name_at_device 0 gpuq alloc at@1 --bytes 4K
check alloc_name_at_device_lands_there 0 gpuq free at@1
check alloc_name_at_device_disagrees_is_2 2 gpuq alloc at@1 --bytes 4K --device 0
expect alloc_name_at_device_disagrees_says_so "says device 1 but --device says 0" err
check fill_random 0 gpuq fill w random 7
# an integer beyond 64 bits is refused, not rounded to a float that an integer buffer takes
check fill_value_beyond_64_bits_is_2 2 gpuq fill w value -- -9223372036854775809
expect fill_value_beyond_64_bits_says_so "beyond every integer dtype" err
check fill_value_beyond_u64_is_2 2 gpuq fill w value 18446744073709551616
check checksum_json 0 gpuq --json checksum w
expect checksum_json_key '"checksum"' out
head -c 1048576 /dev/urandom > "$dir/data"
check put_stdin 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" put - w < \"$dir/data\""
check get_stdout 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" get w - > \"$dir/back\""
check round_trip_equal 0 cmp "$dir/data" "$dir/back"
check get_to_file 0 gpuq get w "$dir/back2"
check round_trip_file_equal 0 cmp "$dir/data" "$dir/back2"
# a get that fails before it writes leaves an existing FILE as it was, and
# makes none; one that succeeds over a longer FILE leaves the bytes alone
echo precious > "$dir/keep"
check get_missing_buffer_is_1 1 gpuq get nosuch "$dir/keep"
check get_missing_buffer_keeps_the_file 0 grep -qx precious "$dir/keep"
check get_bad_range_is_1 1 gpuq get 'w[0:99999999]' "$dir/keep"
check get_bad_range_keeps_the_file 0 grep -qx precious "$dir/keep"
check get_missing_buffer_makes_no_file 1 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" get nosuch \"$dir/none\"; test -e \"$dir/none\""
head -c 2000000 /dev/zero > "$dir/longer"
check get_over_a_longer_file 0 gpuq get w "$dir/longer"
check get_over_a_longer_file_is_cut 0 cmp "$dir/data" "$dir/longer"
# --verify, a range, the path in the summary; no progress bar off a terminal
check put_verify 0 gpuq put "$dir/data" w --verify
expect put_verify_summary "staged, verified" out
check put_no_bar_off_a_terminal 0 test ! -s "$dir/err"
check get_range 0 gpuq get 'w[4K:12K]' "$dir/part"
check get_range_bytes 0 sh -c "tail -c +4097 \"$dir/data\" | head -c 8192 | cmp - \"$dir/part\""
check get_range_outside_is_1 1 gpuq get 'w[1M:1048577]' "$dir/part"
expect get_range_outside_says_so "outside buffer" err
check alloc_scratch 0 gpuq alloc s --bytes 1M
check put_scratch 0 gpuq put scratch: s --verify
expect put_scratch_summary "1.00 MiB in .*staged, verified" out
check get_scratch 0 gpuq get s scratch:
check free_scratch 0 gpuq free s
check bench_copy 0 gpuq bench copy --sizes 1M --requests 1
expect bench_copy_has_rows "gpuq memfd (host)" out
# gpuq copy: within a device and between the two, the path said, refusals exit 1
check copy_alloc 0 gpuq alloc w2 --bytes 1M --device 1
check copy_between_devices 0 gpuq copy w w2@1 --verify
expect copy_says_path_and_verified "by host-memcpy, verified" out
check copy_host_staged 0 gpuq copy 'w[4K:12K]' 'w2@1[1:]' --path host-staged
expect copy_host_staged_path "w@0\[4096:12288\] -> w2@1\[1:8193\].*host-staged" out
check copy_back_get 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" get 'w2@1[1:8193]' - > \"$dir/copied\""
check copy_back_bytes 0 sh -c "tail -c +4097 \"$dir/data\" | head -c 8192 | cmp - \"$dir/copied\""
check copy_sm_within 0 gpuq copy 'w2@1[:4K]' 'w2@1[512K:]' --engine sm
expect copy_sm_engine "(engine sm)" out
check copy_overlap_is_1 1 gpuq copy 'w[0:2K]' 'w[1K:]'
expect copy_overlap_says_so "overlap" err
check copy_missing_arg_is_2 2 gpuq copy w
check copy_free_w2 0 gpuq free w2@1
check put_missing_file_is_2 2 gpuq put "$dir/nonexistent" w
# put FILE NEWBUF makes the buffer of FILE's size first, as Python's put_array does
check put_new_buffer 0 gpuq put "$dir/data" fresh@1 --verify
expect put_new_buffer_allocs "^alloc fresh@1: 1.00 MiB" out
expect put_new_buffer_then_puts "^put fresh@1: 1.00 MiB.*verified" out
check put_new_buffer_back 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" get fresh - | cmp - \"$dir/data\""
check put_new_buffer_again_no_alloc 0 gpuq put "$dir/data" fresh
check put_new_buffer_again_says_put_only 1 grep -q "alloc" "$dir/out"
check put_new_buffer_free 0 gpuq free fresh
check put_pipe_into_missing_is_1 1 sh -c "head -c 10 \"$dir/data\" | \"$BUILD/gpuq\" --socket \"$sock\" put - nosuch"
expect put_pipe_into_missing_says_not_found "buffer 'nosuch' not found" err
check free_missing_is_1 1 gpuq free nothere
expect free_missing_names_it "nothere" err
check buffers 0 gpuq buffers
expect buffers_lists_f "f" out
check detach 0 gpuq noop --detach
check jobs 0 gpuq jobs
expect jobs_lists_fill "fill" out
# newest first: the noop just detached is the first row; --last 1 keeps it alone
check jobs_newest_first 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" jobs | sed -n 2p | grep -q noop"
check jobs_last_one 0 gpuq jobs --last 1
cp "$dir/out" "$dir/last"
check jobs_last_one_is_one_row 0 test "$(wc -l < "$dir/last")" -eq 2
check jobs_last_zero_is_2 2 gpuq jobs --last 0
# a job that can never fit fails; --failed shows it and not the done ones
check alloc_too_big_fails 1 gpuq alloc huge --bytes 1T
check jobs_failed 0 gpuq jobs --failed
expect jobs_failed_lists_the_alloc "alloc  *failed" out
cp "$dir/out" "$dir/failed"
check jobs_failed_has_no_done 1 grep -q " done " "$dir/failed"
check jobs_queued_none 0 gpuq jobs --queued
expect jobs_queued_says_none "no jobs" out
check status 0 gpuq status 1
check wait 0 gpuq wait 1
check status_missing_is_1 1 gpuq status 99999
check cancel_finished 0 gpuq cancel 1
check free 0 gpuq free w
# host regions: put and get through one (one DMA, path region), listed, freed; refusals exit 1
check region_create 0 gpuq region create rg --bytes 1M
expect region_create_says_pinned "region rg: 1.00 MiB pinned" out
check region_alloc 0 gpuq alloc rb --bytes 1M
check region_put 0 gpuq put "$dir/data" rb
check region_get 0 gpuq get 'rb[1:4097]' 'region:rg[3:]'
expect region_get_path "4.00 KiB in .*region" out
check region_put_back 0 gpuq put 'region:rg[3:4099]' 'rb[512K:]' --verify
expect region_put_verified "region, verified" out
check region_put_back_bytes 0 sh -c "tail -c +2 \"$dir/data\" | head -c 4096 > \"$dir/part1\" && \"$BUILD/gpuq\" --socket \"$sock\" get 'rb[512K:528384]' - | cmp - \"$dir/part1\""
check regions 0 gpuq regions
expect regions_lists_rg "^rg " out
check region_missing_is_1 1 gpuq put region:nope rb
expect region_missing_names_it "region 'nope' not found" err
check region_usage_is_2 2 gpuq region make rg
check region_free 0 gpuq region free rg
check region_free_rb 0 gpuq free rb
# a shareable buffer attached by new processes, beside get and a plain copy
check bench_attach 0 gpuq bench attach --bytes 4M --requests 2
expect bench_attach_bytes_match "bytes match gpuqd's" out
expect bench_attach_kept_use "a use of a kept attachment (revocable lease)" out
check attach_not_shareable_is_1 1 gpuq attach f@1
expect attach_not_shareable_says_so "not shareable" err
check leases_none 0 gpuq leases
expect leases_none_says_so "no leases" out
# an attach held by another: --timeout gives the second attach up in gpuqd too,
# so no lease is granted to it once the first goes
check alloc_shareable 0 gpuq alloc sh --bytes 64K --shareable
# hold_attach BUF [OPTION...]: gpuq attach BUF in the background (not through
# the gpuq function, so that $holder is gpuq itself), once its lease is held
hold_attach() {
	"$BUILD/gpuq" --socket "$sock" attach "$@" > "$dir/holder.out" 2>&1 &
	holder=$!
	i=0
	until grep -q "held until interrupted" "$dir/holder.out" || [ $i -ge 200 ]; do
		i=$((i + 1))
		sleep 0.05
	done
}
hold_attach sh
check attach_timeout_is_1 1 gpuq --timeout 300 attach sh
expect attach_timeout_says_given_up "is given up" err
kill -TERM "$holder"
wait "$holder"
check attach_timeout_leaves_no_lease 0 gpuq leases
expect attach_timeout_leaves_no_lease_says_so "no leases" out
# a held lease that root breaks: the holder exits 1, not 0 as when interrupted
if [ "$(id -u)" = 0 ]; then
	hold_attach sh
	lease=$(sed -n 's/^lease \([0-9]*\):.*/\1/p' "$dir/holder.out")
	check lease_break 0 gpuq lease break "$lease"
	wait "$holder"
	verdict attach_broken_exits_1 $? 1
fi
check free_shareable 0 gpuq free sh
# quota: limits beside usage, sizes for people, unlimited spelled out; --json as the reply; --uid
check quota 0 gpuq quota
expect quota_has_memory_rows "^device-memory gpu0 " out
expect quota_root_unlimited "^connections  *unlimited  *[0-9]" out
check quota_json 0 gpuq --json quota
expect quota_json_users '"users":\[{"uid":' out
expect quota_json_nil_is_unlimited '"connections":null' out
check quota_uid 0 gpuq quota --uid 65534
expect quota_uid_names_it "^uid 65534" out
expect quota_uid_builtin_default "^connections  *512 " out
check quota_uid_bad_is_2 2 gpuq quota --uid nobody
if command -v setpriv > /dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && [ -n "$other_group" ]; then
	check quota_other_uid_refused_is_1 1 setpriv --reuid 65534 --regid 65534 --clear-groups \
		"$BUILD/gpuq" --socket "$sock" quota --uid 0
	expect quota_other_uid_refused_says_why "its own quota, not uid 0's" err
else
	skipped=$((skipped + 1))
	echo "skip cli/quota_other_uid_refused: skipped: needs root and setpriv"
fi
# Root names another user's buffer with --owner (the request's `owner`); without
# it, not_found says that uid has a buffer of that name and how to name it.
if command -v setpriv > /dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && [ -n "$other_group" ]; then
	check owner_other_alloc 0 setpriv --reuid 65534 --regid 65534 --clear-groups \
		"$BUILD/gpuq" --socket "$sock" alloc leftover --bytes 8K --device 0
	check owner_missing_is_1 1 gpuq free leftover@0
	expect owner_missing_names_the_owner \
		"not found on device 0 (your buffers there: .*); uid 65534 has 'leftover@0': name it with the request's \`owner\` 65534 (gpuq --owner 65534)" err
	check owner_fill_by_uid 0 gpuq fill leftover@0 value 7 --owner 65534
	check owner_checksum_by_name 0 gpuq checksum leftover --owner "$(getent passwd 65534 | cut -d: -f1)"
	check owner_free 0 gpuq free leftover@0 --owner 65534
	check owner_freed 1 gpuq checksum leftover@0 --owner 65534
	check owner_other_user_is_1 1 setpriv --reuid 65534 --regid 65534 --clear-groups \
		"$BUILD/gpuq" --socket "$sock" checksum w --owner 0
	expect owner_other_user_says_why "only root may name another owner's buffers" err
	# and another user's host region: gpuq region free NAME --owner
	check owner_other_region 0 setpriv --reuid 65534 --regid 65534 --clear-groups \
		"$BUILD/gpuq" --socket "$sock" region create theirs --bytes 4K
	check owner_region_missing_is_1 1 gpuq region free theirs
	check owner_region_free 0 gpuq region free theirs --owner 65534
	expect owner_region_free_says_freed "region theirs freed" out
	check owner_region_gone 0 gpuq regions
	expect_not owner_region_not_listed "^theirs " out
	# and attaches another user's shareable buffer (a lease for root)
	check owner_other_shareable 0 setpriv --reuid 65534 --regid 65534 --clear-groups \
		"$BUILD/gpuq" --socket "$sock" alloc theirs_sh --bytes 64K --device 0 --shareable
	check owner_attach_missing_is_1 1 gpuq --timeout 2000 attach theirs_sh@0
	hold_attach theirs_sh@0 --owner 65534
	check owner_attach_leased 0 gpuq leases
	expect owner_attach_lists_the_lease "theirs_sh@0" out
	kill -TERM "$holder"
	wait "$holder"
	verdict owner_attach_interrupted_exits_0 $? 0
	check owner_attach_free 0 gpuq free theirs_sh@0 --owner 65534
else
	skipped=$((skipped + 21))
	echo "skip cli/owner_*: skipped: needs root and setpriv"
fi
check owner_unknown_user_is_2 2 gpuq free w --owner no-such-user-here
check owner_not_on_alloc_is_2 2 gpuq alloc x --bytes 1K --owner 0
check owner_not_on_region_create_is_2 2 gpuq region create x --bytes 4K --owner 0
check bench_dispatch 0 gpuq bench dispatch --clients 1 --requests 200
expect bench_has_echo "echo" out
# gpuq bench sched, small: every part measured (fairness needs root, else says why it is
# skipped), nothing failed, nothing on stderr. check truncates out and err: keep copies.
check bench_sched 0 gpuq bench sched --bytes 4M --requests 10
cp "$dir/out" "$dir/sched.out"
cp "$dir/err" "$dir/sched.err"
expect bench_sched_overlap "together / raw together" out
expect bench_sched_head_of_line "put p99 busy / idle" out
expect bench_sched_head_of_line_get "get p99 busy / idle" out
expect bench_sched_priority "high checksum / idle  " out
if [ "$(id -u)" -eq 0 ]; then
	expect bench_sched_fairness "owner of 80 jobs: % of bytes" out
else
	expect bench_sched_fairness "fairness skipped: a second owner needs a second uid" out
fi
expect bench_sched_summary "^targets (H200): [0-9]* of [0-9]* met" out
check bench_sched_nothing_failed 1 grep -q "FAILED" "$dir/sched.out"
check bench_sched_quiet_stderr 0 test ! -s "$dir/sched.err"
check bench_sched_json 0 gpuq --json bench sched --bytes 4M --requests 5
expect bench_sched_json_parts '"head_of_line":{"state":"ran"' out
check bench_sched_buffers 0 gpuq buffers
cp "$dir/out" "$dir/buffers.out"
check bench_sched_freed_its_buffers 1 grep -q "bsched" "$dir/buffers.out"
check bench_sched_bad_bytes_is_2 2 gpuq bench sched --bytes 1M:4M
# Every bench prints --json, and `python -m gpuq plot` draws each into a PNG.
gpuq --json bench sched --bytes 4M --requests 5 > "$dir/sched.json" 2> /dev/null
# --save-json: the table as usual, and the same run's JSON in the file
check bench_dispatch_save_json 0 gpuq bench dispatch --clients 1 --requests 100 --save-json "$dir/dispatch.json"
expect bench_dispatch_save_json_prints_the_table "P50 / ECHO" out
check bench_dispatch_save_json_wrote_it 0 grep -q '"bench":"dispatch"' "$dir/dispatch.json"
check bench_save_json_unwritable_is_2 2 gpuq bench dispatch --save-json "$dir/no/such/dir.json"
check bench_copy_json 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" --json bench copy --sizes 1M,2M --requests 1 > \"$dir/copy.json\""
check bench_attach_json 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" --json bench attach --bytes 4M --requests 2 > \"$dir/attach.json\""
check bench_attach_json_has_kept_use 0 grep -q '"kept_use_ms":[0-9]' "$dir/attach.json"
check bench_chain_json 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" --json bench chain --bytes 1M > \"$dir/chain.json\""
check bench_allreduce_json 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" --json bench allreduce --bytes 8:4K --factor 8 --devices all > \"$dir/allreduce.json\""
check bench_collective_json 0 sh -c "\"$BUILD/gpuq\" --socket \"$sock\" --json bench collective --op broadcast --bytes 8:4K --factor 8 --devices all > \"$dir/collective.json\""
py=/usr/bin/python3
if PYTHONPATH=client/python "$py" -c 'import matplotlib, msgpack' > /dev/null 2>&1; then
	for kind in dispatch copy attach chain allreduce collective sched; do
		check "plot_$kind" 0 env PYTHONPATH=client/python "$py" -m gpuq plot "$dir/$kind.json" \
			-o "$dir/$kind.png"
		# a PNG file (its signature), not an empty one
		check "plot_${kind}_is_a_png" 0 sh -c "head -c 4 \"$dir/$kind.png\" | grep -q PNG && test -s \"$dir/$kind.png\""
	done
	check plot_not_a_bench_is_2 2 env PYTHONPATH=client/python "$py" -m gpuq plot "$dir/gpuqd.log" -o "$dir/x.png"
else
	skipped=$((skipped + 15))
	echo "skipped 15 cli/plot_*: no $py with matplotlib and msgpack (make deps installs python3-matplotlib)"
fi
# The Grafana dashboard shipped in etc/: valid JSON, and every metric and
# label its queries use is one this gpuqd exports (after the jobs above).
check metrics_for_dashboard 0 gpuq metrics
cp "$dir/out" "$dir/metrics.txt"
check grafana_dashboard_matches_metrics 0 /usr/bin/python3 tests/dashboard_check.py \
	etc/grafana-gpuq.json "$dir/metrics.txt"
# gpuqd raises its soft RLIMIT_MEMLOCK (regions count against it) to the hard limit
hard_kib=$(ulimit -H -l)
if [ "$hard_kib" != unlimited ] && [ "$hard_kib" -gt 64 ]; then
	sh -c "ulimit -S -l 64; exec \"$BUILD/gpuqd\" --backend host --socket \"$dir/lim.sock\" --log-level warn" \
		> "$dir/lim.log" 2>&1 &
	lim=$!
	i=0
	until "$BUILD/gpuq" --socket "$dir/lim.sock" ping > /dev/null 2>&1 || [ $i -ge 200 ]; do
		i=$((i + 1))
		sleep 0.05
	done
	check memlock_raised_metrics 0 "$BUILD/gpuq" --socket "$dir/lim.sock" metrics
	expect memlock_raised_to_the_hard_limit "^gpuq_memlock_limit_bytes $((hard_kib * 1024))\$" out
	kill -TERM "$lim"
	wait "$lim"
else
	skipped=$((skipped + 2))
	echo "skipped 2 cli/memlock_*: the hard RLIMIT_MEMLOCK is $hard_kib KiB (nothing to raise to)"
fi
# reset-device: the device comes back, its buffers are lost; a bad index is refused
check reset_alloc 0 gpuq alloc r --bytes 4K --device 1
check reset_region 0 gpuq region create rr --bytes 4K --device 1
check reset_device 0 gpuq reset-device 1
expect reset_device_says_ok "gpu 1 reset in .* s: ok; 1 host region pinned again" out
check reset_region_freed 0 gpuq region free rr
check reset_lost_buffer_is_1 1 gpuq checksum r@1
expect reset_lost_buffer_says_why "was lost when gpu 1 was reset" err
check reset_lost_buffer_freed 0 gpuq free r@1
check reset_device_unknown_is_1 1 gpuq reset-device 9
check reset_device_usage_is_2 2 gpuq reset-device one
# admin restart: the same daemon serves again with its buffers; a binary that cannot take over is refused
check restart_alloc 0 gpuq alloc keep --bytes 64K --device 0
check restart_fill 0 gpuq fill keep random 7
gpuq checksum keep > "$dir/sum_before" 2>&1
check admin_restart 0 gpuq admin restart
expect admin_restart_says_serving "gpuqd restarted (restart 1, pid $daemon): serving again" out
check restart_checksum 0 gpuq checksum keep
cp "$dir/out" "$dir/sum_after"
check restart_checksum_kept 0 cmp "$dir/sum_before" "$dir/sum_after"
check admin_restart_refuses_false_is_1 1 gpuq admin restart --binary /bin/false
expect admin_restart_refusal_says_why "cannot take over this gpuqd's state record" err
check admin_restart_missing_is_1 1 gpuq admin restart --binary "$dir/no-such-gpuqd"
check admin_unknown_action_is_2 2 gpuq admin frobnicate
check admin_drop_absent_without_uuid_is_2 2 gpuq admin drop-absent
check admin_drop_absent_nothing_kept_is_1 1 gpuq admin drop-absent GPU-gone
expect admin_drop_absent_says_nothing_is_kept "no buffers are kept for GPU GPU-gone (kept for: none)" err
check bench_restart 0 gpuq bench restart --bytes 8M --requests 8
expect bench_restart_serves "to the first job served" out
expect bench_restart_verifies "(0 of 8 differ)" out
expect bench_restart_reloads "reloading them instead, put from the page cache: [0-9.]* s  ([0-9.]* GB/s" out

# gpuqd restarted under running commands, on a daemon of their own: device 0
# runs one job at a time, a put from a FIFO that nothing feeds stalls it, and
# a fill queues behind it. A re-exec keeps the connections (no reconnect); a
# crash and a new gpuqd on the socket makes every command reconnect: reads go
# again, jobs never do, and each says so once.
rsock="$dir/restart.sock"
rgpuq() { "$BUILD/gpuq" --socket "$rsock" "$@"; }
# rstart: a gpuqd on rsock that our group may restart; $rdaemon is its pid.
rstart() {
	"$BUILD/gpuqd" --backend host --socket "$rsock" --log-level warn --max-inflight=1 \
		--restart-drain 100 --admin-group "$(id -gn)" >> "$dir/restart.log" 2>&1 &
	rdaemon=$!
	until_true rgpuq ping
}
# until_true COMMAND...: runs it every 50 ms until it succeeds (at most 10 s).
until_true() {
	i=0
	until "$@" > /dev/null 2>&1 || [ $i -ge 200 ]; do
		i=$((i + 1))
		sleep 0.05
	done
}
# bg NAME COMMAND...: runs a gpuq command in the background, its output in NAME.out and NAME.err.
bg() {
	name=$1
	shift
	rgpuq "$@" > "$dir/$name.out" 2> "$dir/$name.err" &
	eval "pid_$name=\$!"
}
# finished NAME WANT: the background command NAME ended with WANT; its output becomes out and err.
finished() {
	eval "wait \$pid_$1"
	got=$?
	cp "$dir/$1.out" "$dir/out"
	cp "$dir/$1.err" "$dir/err"
	verdict "$1_exit_$2" "$got" "$2"
}
connections() { rgpuq metrics | grep -q "^gpuq_connections $1\$"; }
# stall: the put running, the fill queued, a wait for the put and NAMES... in flight.
stall() {
	bg "$1_put" put "$dir/fifo" w --length 4096
	until_true sh -c "\"$BUILD/gpuq\" --socket \"$rsock\" jobs --running | grep -q ' put '"
	job=$(rgpuq jobs --running | awk '$2 == "put" { print $1 }')
	bg "$1_fill" fill w zero
	until_true sh -c "\"$BUILD/gpuq\" --socket \"$rsock\" jobs --queued | grep -q ' fill '"
	bg "$1_wait" wait "$job"
}
mkfifo "$dir/fifo"
exec 7<> "$dir/fifo" # a writer that never writes: the put waits for bytes
rstart
check restart_stall_alloc 0 rgpuq alloc w --bytes 64K
stall reexec
until_true connections 4 # put, fill, wait, and metrics' own
check reexec_under_jobs 0 rgpuq admin restart
finished reexec_put 1
expect reexec_put_says_restarted "^gpuq: restarted: gpuqd restarted while the job ran" err
expect reexec_put_not_sent_again "^gpuq: the job was not sent again (gpuq never resends a job by itself); it may be submitted again\$" err
check reexec_put_no_reconnect 1 grep -q reconnected "$dir/reexec_put.err"
# the fill queued behind the put is replayed by the new image, on the same connection
finished reexec_fill 0
check reexec_fill_no_reconnect 1 grep -q reconnected "$dir/reexec_fill.err"
check reexec_fill_not_restarted 1 grep -q restarted "$dir/reexec_fill.err"
finished reexec_wait 1
expect reexec_wait_says_restarted "^gpuq: restarted:" err
check reexec_wait_no_reconnect 1 grep -q reconnected "$dir/reexec_wait.err"
check reexec_keeps_the_buffer 0 rgpuq checksum w
# The crash: SIGKILL, then a new gpuqd on the socket, as systemd would start one.
stall crash
bg crash_top top --once --interval 2000
bg crash_hold alloc e@1 --bytes 4K --ephemeral # device 1: not behind the put
until_true connections 6 # put, fill, wait, top, the held alloc, and metrics' own
until_true grep -q "holding ephemeral buffer" "$dir/crash_hold.err"
kill -KILL "$rdaemon"
{ wait "$rdaemon"; } 2> /dev/null # "Killed"
rstart
finished crash_put 3
expect crash_put_says_restarted "^gpuq: gpuqd restarted (pid $rdaemon); reconnected\$" err
expect crash_put_not_sent_again "(put) in flight .*; it is not sent again" err
check crash_put_said_once 0 test "$(grep -c reconnected "$dir/crash_put.err")" -eq 1
finished crash_fill 3
expect crash_fill_not_sent_again "(fill) in flight .*; it is not sent again" err
check crash_fill_said_once 0 test "$(grep -c reconnected "$dir/crash_fill.err")" -eq 1
# The wait is not asked again: the new gpuqd started afresh, and numbers its
# jobs from 1 again, so the id may name one of its own (exit 3, as for a job).
finished crash_wait 3
expect crash_wait_says_restarted "^gpuq: gpuqd restarted (pid $rdaemon); reconnected\$" err
expect crash_wait_not_asked_of_a_fresh_gpuqd "started afresh .* the wait is not asked again" err
check crash_wait_said_once 0 test "$(grep -c reconnected "$dir/crash_wait.err")" -eq 1
finished crash_top 0
expect crash_top_says_restarted "^gpuq: gpuqd restarted (pid $rdaemon); reconnected\$" err
expect crash_top_prints_a_snapshot "^gpuq top: .*rates over" out
check crash_top_said_once 0 test "$(grep -c reconnected "$dir/crash_top.err")" -eq 1
# A held connection does not reconnect: what it held went with it.
finished crash_hold 3
expect crash_hold_says_the_buffer_went "the buffer went with the connection" err
check crash_hold_no_reconnect 1 grep -q reconnected "$dir/crash_hold.err"
exec 7>&-
kill -TERM "$rdaemon"
wait "$rdaemon"

# admin restart succeeds only when the same gpuqd (a re-exec keeps its pid)
# counts one more restart: a new image that dies at start-up fails, after an
# earlier good restart too, and so does one that another gpuqd replaced.
# dying-gpuqd passes the restart's checks and exits when run as the daemon.
printf '#!/bin/sh\ncase "$*" in *--check-record*|*--check-config*) exec "%s" "$@" ;; esac\nexit 1\n' \
	"$(cd "$BUILD" && pwd)/gpuqd" > "$dir/dying-gpuqd"
chmod 0755 "$dir/dying-gpuqd"
rstart
check dying_restart_first_is_0 0 rgpuq admin restart
check dying_restart_is_3 3 rgpuq admin restart --binary "$dir/dying-gpuqd" --timeout 2000
expect dying_restart_says_none_answered "gpuqd .* restart 1 .*: no gpuqd answered at $rsock within 2 s" err
expect_not dying_restart_not_said_restarted "gpuqd restarted" out
{ wait "$rdaemon"; } 2> /dev/null
rstart
old_rdaemon=$rdaemon
bg replaced_restart admin restart --binary "$dir/dying-gpuqd"
{ wait "$old_rdaemon"; } 2> /dev/null # once the new image exited
rstart
finished replaced_restart 1
expect replaced_restart_names_both_pids "a new gpuqd (pid $rdaemon, not $old_rdaemon" err
kill -TERM "$rdaemon"
wait "$rdaemon"

kill -TERM "$daemon"
wait "$daemon"
check daemon_exit_0 0 test $? -eq 0
rm -rf "$dir"
echo "RESULT cli: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
