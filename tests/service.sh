#!/bin/sh
# Service tests: gpuqd as systemd runs it, without systemd as init.
#  - socket activation under systemd-socket-activate (the first client is
#    served while the daemon starts), and under tests/service/svc_helper.c's
#    stand-in supervisor, which keeps the socket across a restart (a client
#    that connects while gpuqd is down is served by the next one);
#  - the service manager's descriptor store, kept by the same stand-in:
#    buffers with their bytes through SIGKILL, SIGSEGV and a re-exec, a
#    buffer being written comes back suspect, freed ones stay freed, and
#    with --fd-store off a crash loses them; when the configuration's
#    devices change, each buffer follows its GPU (by uuid), and a left-out
#    GPU's are kept until it is served again (through the store, and
#    through re-execs without it), in set sequences and in random ones
#    checked against a model;
#  - readiness, status, watchdog and stopping notifications, received on a
#    test socket (a path, and an @abstract name);
#  - journal priority prefixes; --check-config; the metrics textfile;
#  - make install DESTDIR=... (the tree the README describes), make
#    uninstall, and systemd-analyze verify and security on the units.
# Ends with a RESULT line.
set -u
BUILD=${1:-build}
dir=$(mktemp -d /tmp/gpuq-svc.XXXXXX)
# Compiled chain kernels go to the daemons' default cache: keep it here, not in ~/.cache.
export XDG_CACHE_HOME="$dir/cache"
helper="$BUILD/tests/svc-helper"
gpuqd="$BUILD/gpuqd"
passed=0
failed=0
skipped=0
pids=""

cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null; done
	rm -rf "$dir"
}
trap cleanup EXIT

ok() { passed=$((passed + 1)); echo "ok   service/$1"; }
fail() {
	failed=$((failed + 1))
	echo "FAIL service/$1: $2"
	shift 2
	for f in "$@"; do [ -f "$f" ] && sed 's/^/    /' "$f"; done
}
skip() { skipped=$((skipped + 1)); echo "skip service/$1"; echo "    skipped: $2"; }

# check NAME CONDITION-COMMAND... : passes when the command succeeds.
check() {
	name=$1
	shift
	if "$@" > /dev/null 2>&1; then ok "$name"; else fail "$name" "'$*' failed" $logs; fi
}

# wait_until COMMAND...: polls up to 10 s until COMMAND succeeds.
wait_until() {
	i=0
	until "$@" > /dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 200 ] || return 1
		sleep 0.05
	done
}

# count PATTERN FILE: lines of FILE matching PATTERN.
count() { grep -c -- "$1" "$2" 2>/dev/null || true; }
# count_is TEXT FILE N: FILE has N lines with TEXT.
count_is() { [ "$(count "$1" "$2")" -eq "$3" ]; }

# check_soon NAME COMMAND...: as check, but COMMAND may take up to 10 s to
# succeed. For what the notify listener writes: it is a process of its
# own, and on a loaded machine it may write a notification after gpuqd
# has already answered a client.
check_soon() {
	name=$1
	shift
	if wait_until "$@"; then ok "$name"; else fail "$name" "'$*' failed for 10 s" $logs; fi
}

gpuq() { "$BUILD/gpuq" --socket "$sock" "$@"; }

# --- socket activation by systemd-socket-activate, notifications to a path ---
if command -v systemd-socket-activate > /dev/null 2>&1; then
	sock="$dir/a.sock"
	notify="$dir/a.notify"
	logs="$dir/a.log $notify"
	"$helper" notify-listen "$dir/notify.sock" "$notify" &
	pids="$pids $!"
	wait_until test -S "$dir/notify.sock"
	systemd-socket-activate -l "$sock" -E NOTIFY_SOCKET="$dir/notify.sock" \
		-E WATCHDOG_USEC=400000 -- "$gpuqd" --backend host --log-level info \
		--socket "$dir/unused.sock" > "$dir/a.log" 2>&1 &
	activated=$!
	pids="$pids $activated"
	wait_until test -S "$sock"
	check activation_serves_the_first_client gpuq --timeout 20000 ping
	check activation_uses_the_passed_socket grep -q "passed by the service manager" "$dir/a.log"
	check activation_binds_nothing_itself test ! -e "$dir/unused.sock"
	check_soon ready_after_the_workers grep -q \
		"READY=1 | STATUS=2 host devices (no GPU); 0 jobs running, 0 queued" "$notify"
	check starting_status_before_ready sh -c "head -1 '$notify' | grep -q 'STATUS=starting'"
	sleep 1.3
	n=$(count "WATCHDOG=1" "$notify")
	if [ "$n" -ge 4 ]; then ok watchdog_pings_at_half_the_interval
	else fail watchdog_pings_at_half_the_interval "$n pings in 1.3 s at WATCHDOG_USEC=400000" $logs; fi
	# A put that waits on a FIFO keeps one job running.
	mkfifo "$dir/fifo"
	gpuq alloc w --bytes 64 > /dev/null
	gpuq put - w --detach < "$dir/fifo" > /dev/null &
	exec 3> "$dir/fifo"
	wait_until grep -q '1 jobs running' "$notify"
	check status_counts_running_jobs grep -q "STATUS=2 host devices (no GPU); 1 jobs running, 0 queued" "$notify"
	exec 3>&-
	kill -TERM "$activated"
	wait "$activated"
	rc=$?
	check sigterm_exits_0 test "$rc" -eq 0
	check_soon stopping_notified grep -q "STOPPING=1 | STATUS=stopping" "$notify"
	check activated_socket_is_left_to_the_manager test -S "$sock"
	check plain_log_without_journal grep -q "^gpuqd\[[0-9]*\]: info: gpuqd" "$dir/a.log"
else
	skip socket_activation "systemd-socket-activate is not installed (tests/install-deps.sh installs systemd)"
fi

# --- restart under a supervisor that keeps the socket; abstract NOTIFY_SOCKET ---
sock="$dir/b.sock"
notify="$dir/b.notify"
logs="$dir/b.log $notify"
abstract="@gpuq-svc-test-$$"
"$helper" notify-listen "$abstract" "$notify" &
pids="$pids $!"
sleep 0.1
NOTIFY_SOCKET="$abstract" "$helper" supervise "$sock" 1 1500 -- "$gpuqd" --backend host \
	--log-level info --admin-group "$(id -gn)" > "$dir/b.log" 2>&1 &
supervisor=$!
pids="$pids $supervisor"
wait_until test -S "$sock"
first=$(gpuq --json --timeout 20000 ping | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
check shutdown_by_an_admin gpuq shutdown
wait_until grep -q 'exited with status 0x0' "$dir/b.log"
sleep 0.3 # the supervisor waits 1.5 s before it starts gpuqd again
second=$(gpuq --json --timeout 20000 ping | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
if [ -n "$first" ] && [ -n "$second" ] && [ "$first" != "$second" ]; then
	ok client_waiting_through_a_restart_is_served
else
	fail client_waiting_through_a_restart_is_served "pids '$first' then '$second'" $logs
fi
check_soon abstract_notify_socket count_is 'READY=1' "$notify" 2
check shutdown_logged grep -q "shutdown requested by uid $(id -u)" "$dir/b.log"
kill -TERM "$supervisor"
wait "$supervisor"

# Starts gpuqd on the host backend under the stand-in descriptor store
# (svc-helper supervise-store, as systemd's) as $1 (its socket, store and
# log in $dir), started again after up to $2 ends, the store keeping at
# most $3 descriptors; the rest are gpuqd's own options. Sets sock, store,
# logs and supervisor, and returns once gpuqd listens.
start_under_store() {
	under=$1 restarts=$2 store_max=$3
	shift 3
	sock="$dir/$under.sock"
	store="$dir/$under.store"
	logs="$dir/$under.log $store"
	"$helper" supervise-store "$sock" "$restarts" 300 "$store_max" "$store" -- "$gpuqd" \
		--backend host --log-level info "$@" > "$dir/$under.log" 2>&1 &
	supervisor=$!
	pids="$pids $supervisor"
	wait_until test -S "$sock"
}

# --- a crash under a descriptor store (svc-helper supervise-store, as systemd's) ---
start_under_store f 5 64 --admin-group "$(id -gn)"
# gpuqd's pid, once it serves again after the n-th start of the stand-in's.
pid_after_start() {
	wait_until sh -c "test \$(grep -c 'start: ' '$store') -ge $1" &&
		gpuq --json --timeout 20000 ping | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p'
}
# checksums NAME...: "NAME=SUM" per buffer.
checksums() {
	for b in "$@"; do
		printf '%s=%s\n' "$b" "$(gpuq checksum "$b" | sed -n 's/.*: \(0x[0-9a-f]*\) .*/\1/p')"
	done
}
# came_back NAME OLD NEW: gpuqd is another process now (pid NEW, was OLD), and
# small, mid and large hold the bytes they held before ($dir/sums.before).
came_back() {
	checksums small mid large > "$dir/sums.after"
	if [ -n "$3" ] && [ "$3" != "$2" ] && cmp -s "$dir/sums.before" "$dir/sums.after"; then
		ok "$1"
	else
		fail "$1" "pids '$2' then '$3'" "$dir/sums.before" "$dir/sums.after" $logs
	fi
}
first=$(pid_after_start 1)
head -c 3000 /dev/urandom > "$dir/small"
head -c 1048576 /dev/urandom > "$dir/mid"
head -c 40000000 /dev/urandom > "$dir/large"
# small and mid are carved from one slab, large has a slab of its own, as have gone1 and gone2.
for spec in small:3000 mid:1048576 large:40000000 gone1:20000000 gone2:20000000; do
	gpuq alloc "${spec%%:*}" --bytes "${spec#*:}" > /dev/null
done
for b in small mid large; do gpuq put "$dir/$b" "$b" > /dev/null; done
gpuq free gone1 > /dev/null # kept empty, as the last slab of its own freed: out of the store
gpuq free gone2 > /dev/null # kept in gone1's stead (gone1's slab is given back): out of the store
checksums small mid large > "$dir/sums.before"
# A put that waits on a FIFO is writing w when gpuqd dies.
gpuq alloc w --bytes 64 > /dev/null
mkfifo "$dir/ffifo"
gpuq put - w --detach < "$dir/ffifo" > /dev/null &
exec 4> "$dir/ffifo"
# Its own row, not the store's STATUS: the checksum of large ran long enough
# to send "1 jobs running" before the put reached gpuqd.
put_of_w_running() { gpuq jobs | grep -q ' put  *running .* w@0 '; }
wait_until put_of_w_running
check store_keeps_the_record_and_each_slab sh -c "grep -q 'FDSTORE=1 | FDNAME=gpuq-record \[1 fds\]' '$store' &&
	grep -q 'FDSTORE=1 | FDNAME=gpuq-slab-HOST-0-1 \[1 fds\]' '$store' &&
	grep -q 'FDSTORE=1 | FDNAME=gpuq-slab-HOST-0-2 \[1 fds\]' '$store'"
check store_removes_a_slab_given_back count_is 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-HOST-0-3$' "$store" 1
check store_removes_a_kept_empty_slab count_is 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-HOST-0-4$' "$store" 1
# The id of a new job (a checksum of small).
new_job_id() { gpuq --json checksum small | sed -n 's/.*"job":\([0-9][0-9]*\).*/\1/p'; }
id_before=$(new_job_id)
kill -KILL "$first"
exec 4>&-
second=$(pid_after_start 2)
check store_passes_the_record_and_two_slabs grep -q 'start: 3 stored' "$store"
came_back sigkill_keeps_every_buffer_with_its_bytes "$first" "$second"
id_after=$(new_job_id)
check sigkill_job_ids_go_on_above_the_dead_gpuqds test "${id_after:-0}" -gt "${id_before:-0}" -a "${id_before:-0}" -gt 0
check sigkill_recovery_copies_nothing test "$(count "gpuqd\[$second\].*op=put" "$dir/f.log")" -eq 0
check sigkill_recovery_is_logged grep -q \
	"gpuqd\[$second\]: info: recovered 4 buffers (1 suspect, 0 lost) from the service manager's descriptor store" "$dir/f.log"
gpuq buffers > "$dir/f.buffers"
check sigkill_buffer_being_written_is_suspect grep -q '^w .* suspect' "$dir/f.buffers"
check sigkill_freed_buffers_stay_freed sh -c "! grep -q '^gone' '$dir/f.buffers'"
check sigkill_record_is_not_stored_again count_is 'FDSTORE=1 | FDNAME=gpuq-record' "$store" 1
gpuq ping > "$dir/f.ping"
gpuq metrics > "$dir/f.metrics"
check sigkill_recovery_counted_in_ping grep -q 'descriptor store 1 time (after dying, or a stop under the store), buffers kept' "$dir/f.ping"
check sigkill_recovery_counted_in_metrics grep -q '^gpuq_store_recoveries_total 1$' "$dir/f.metrics"
# What the store holds that no buffer names: a slab name of ours (removed
# from the store) and another name (closed, and said so in the log).
head -c 4096 /dev/zero > "$dir/stray"
"$helper" notify-send "$sock.notify" 'FDSTORE=1\nFDNAME=gpuq-slab-1-99' "$dir/stray"
"$helper" notify-send "$sock.notify" 'FDSTORE=1\nFDNAME=someone-else' "$dir/small"
wait_until grep -q 'FDNAME=someone-else' "$store"
kill -SEGV "$second"
third=$(pid_after_start 3)
check store_slab_no_buffer_names_is_removed count_is 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-1-99$' "$store" 1
check store_descriptor_not_gpuqds_is_closed grep -q \
	"gpuqd\[$third\]: warn: descriptor [0-9]* passed by the service manager ('someone-else') is none of gpuqd's; closed" "$dir/f.log"
came_back sigsegv_keeps_every_buffer_with_its_bytes "$second" "$third"
stored=$(count 'FDSTORE=1' "$store")
gpuq admin restart > /dev/null
wait_until grep -q "gpuqd\[$third\]: info: re-exec 1: " "$dir/f.log"
wait_until gpuq ping
check reexec_under_the_store_stores_nothing_again test "$(count 'FDSTORE=1' "$store")" -eq "$stored"
kill -KILL "$third"
fourth=$(pid_after_start 4)
came_back reexec_then_sigkill_keeps_every_buffer "$third" "$fourth"
gpuq --json devices > "$dir/f.devices"
check recoveries_counted_across_a_reexec grep -q '"recoveries": *3' "$dir/f.devices"
# A clean stop leaves the slabs in the store (as systemd keeps it across a
# restart with FileDescriptorStorePreserve=yes, or an automatic one).
kill -TERM "$fourth"
fifth=$(pid_after_start 5)
came_back clean_stop_leaves_the_buffers_in_the_store "$fourth" "$fifth"
check clean_stop_is_not_called_a_death grep -q "gpuqd\[$fifth\]: info: gpuqd stopped; the service manager's store holds record" "$dir/f.log"
kill -TERM "$supervisor"
wait "$supervisor"

# --- a fault whose driver refuses the process a new context, under the store:
# the re-exec keeps the faulted device's slab named in the store, so that a
# later SIGKILL still brings its buffer back (simulated on host device 1) ---
export GPUQ_HOST_FAULT_DEVICE=1 GPUQ_HOST_FAULT_NEEDS_RESTART=1
start_under_store g 1 64 --host-devices 2 --reset-limit 1
unset GPUQ_HOST_FAULT_DEVICE GPUQ_HOST_FAULT_NEEDS_RESTART
first=$(pid_after_start 1)
gpuq alloc f@1 --bytes 1048576 > /dev/null
gpuq put "$dir/mid" f@1 > /dev/null
gpuq checksum f@1 > /dev/null 2>&1 # the simulated fault: device_error, then the re-exec
wait_until grep -q "gpuqd\[$first\]: info: re-exec 1: " "$dir/g.log"
wait_until gpuq ping
check fault_reexec_leaves_the_faulted_slab_in_the_store count_is 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-HOST-1-' "$store" 0
kill -KILL "$first"
second=$(pid_after_start 2)
gpuq get f@1 "$dir/g.back" > /dev/null 2>&1
check fault_reexec_then_sigkill_keeps_the_faulted_devices_buffer cmp "$dir/mid" "$dir/g.back"
kill -TERM "$supervisor"
wait "$supervisor"

# --- the one carved slab, kept empty (out of the store) and serving again, is
# stored again: a buffer carved from it survives a SIGKILL ---
start_under_store k 1 64
first=$(pid_after_start 1)
gpuq alloc once --bytes 1048576 > /dev/null
gpuq free once > /dev/null # slab 1 is kept empty: out of the store
gpuq alloc again --bytes 1048576 > /dev/null
gpuq put "$dir/mid" again > /dev/null
check kept_carved_slab_serving_again_is_stored_again count_is 'FDSTORE=1 | FDNAME=gpuq-slab-HOST-0-1 \[1 fds\]' "$store" 2
kill -KILL "$first"
second=$(pid_after_start 2)
gpuq get again "$dir/k.back" > /dev/null 2>&1
check sigkill_keeps_a_buffer_carved_from_a_kept_slab cmp "$dir/mid" "$dir/k.back"
kill -TERM "$supervisor"
wait "$supervisor"

# --- GPUs by uuid: the configuration's `devices` changes between starts
# (host devices stand in for GPUs: host device N's uuid is HOST-N). Each
# buffer follows its GPU to its new index; one whose GPU is left out is
# kept, with its bytes, until a gpuqd serves that GPU again ---
# holds BUF FILE [BUF FILE]: each buffer holds the bytes of its file.
holds() {
	gpuq get "$1" "$dir/held" > /dev/null 2>&1 && cmp -s "$2" "$dir/held" &&
		{ [ $# -lt 4 ] || holds "$3" "$4"; }
}
# alloc_put BUF:FILE:BYTES...: each buffer made, holding its file's bytes.
alloc_put() {
	for spec in "$@"; do
		gpuq alloc "${spec%%:*}" --bytes "${spec##*:}" > /dev/null
		file=${spec#*:}
		gpuq put "$dir/${file%:*}" "${spec%%:*}" > /dev/null
	done
}
printf 'devices = 0,1\n' > "$dir/u.conf"
start_under_store u 4 64 --host-devices 2 --config "$dir/u.conf"
first=$(pid_after_start 1)
alloc_put a@0:mid:1048576 b@1:small:3000 c@1:large:40000000
check store_names_slabs_by_uuid sh -c "grep -q 'FDSTORE=1 | FDNAME=gpuq-slab-HOST-0-1 \[1 fds\]' '$store' &&
	grep -q 'FDSTORE=1 | FDNAME=gpuq-slab-HOST-1-2 \[1 fds\]' '$store'"
printf 'devices = 1\n' > "$dir/u.conf"
kill -KILL "$first"
second=$(pid_after_start 2)
check devices_changed_buffers_follow_their_gpu holds b@0 "$dir/small" c@0 "$dir/large"
gpuq devices > "$dir/u.devices" 2>&1
check devices_changed_left_out_gpus_buffers_are_kept grep -q \
	'kept for GPU HOST-0, which this gpuqd does not serve: 1 buffer, 1.0 MiB' "$dir/u.devices"
check devices_changed_table_says_which_gpu_each_index_is grep -q '^  0 .* HOST-1  ok$' "$dir/u.devices"
gpuq get a "$dir/u.a" > "$dir/u.a.err" 2>&1
check devices_changed_kept_buffer_says_where_it_is grep -q \
	"'a' is on GPU HOST-0, which this gpuqd does not serve" "$dir/u.a.err"
gpuq buffers > "$dir/u.buffers" 2>&1
check devices_changed_buffers_lists_the_kept_one grep -q \
	'^a (1.0 MiB) is kept for GPU HOST-0, which gpuqd does not serve now' "$dir/u.buffers"
gpuq metrics > "$dir/u.metrics"
check devices_changed_kept_buffers_in_metrics grep -q '^gpuq_absent_buffers{uuid="HOST-0"} 1$' "$dir/u.metrics"
check devices_changed_kept_slab_stays_in_the_store count_is 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-HOST-0-' "$store" 0
check devices_changed_status_says_buffers_are_kept grep -q \
	'STATUS=1 host devices (no GPU); 0 jobs running, 0 queued; 1 buffers kept for GPUs not served' "$store"
check devices_changed_is_logged grep -q \
	"gpuqd\[$second\]: warn: 1 buffers (1048576 bytes) on GPU HOST-0 are kept for a gpuqd that serves it" "$dir/u.log"
# Swapped: HOST-1 is device 0, HOST-0 device 1; a clean stop (SIGTERM) between.
printf 'devices = 1,0\n' > "$dir/u.conf"
kill -TERM "$second"
third=$(pid_after_start 3)
check devices_swapped_every_buffer_is_on_its_gpu holds a@1 "$dir/mid" b@0 "$dir/small"
gpuq devices > "$dir/u.devices" 2>&1
check devices_served_again_nothing_is_kept_aside sh -c "! grep -q 'kept for GPU' '$dir/u.devices'"
# Freeing c (HOST-1's slab 2, now device 0) removes its name alone: HOST-0's slabs stay.
gpuq free c@0 > /dev/null
check devices_swapped_free_removes_its_own_slab_only sh -c "
	test \$(grep -c 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-HOST-1-2\$' '$store') -eq 1 &&
	test \$(grep -c 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-HOST-0-' '$store') -eq 0"
gpuq alloc d@1 --bytes 40000000 > /dev/null # HOST-0's next slab: numbered above its adopted one
check devices_swapped_new_slab_numbers_go_on grep -q 'FDSTORE=1 | FDNAME=gpuq-slab-HOST-0-2 \[1 fds\]' "$store"
kill -KILL "$third"
fourth=$(pid_after_start 4)
check devices_swapped_then_sigkill_keeps_the_bytes holds a@1 "$dir/mid"
kill -TERM "$supervisor"
wait "$supervisor"

# --- the same through re-execs (`admin restart` reads the configuration
# again), first with no store: the process itself keeps the left-out GPU's
# slab and hands it to the next image; then an image that uses the store
# stores it, so that a crash keeps it too ---
# v_config DEVICES FD_STORE: the configuration the next start or re-exec reads.
v_config() { printf 'devices = %s\nfd-store = %s\n' "$1" "$2" > "$dir/v.conf"; }
# reexec_into DEVICES FD_STORE N: re-exec N serves with that configuration.
reexec_into() {
	v_config "$1" "$2"
	gpuq admin restart > /dev/null
	wait_until grep -q "gpuqd\[$first\]: info: re-exec $3: " "$dir/v.log"
	wait_until gpuq ping
}
v_config 0,1 off
start_under_store v 3 64 --host-devices 2 --config "$dir/v.conf" --admin-group "$(id -gn)"
first=$(pid_after_start 1)
alloc_put a@0:mid:1048576 b@1:small:3000
reexec_into 1 off 1
check reexec_devices_changed_buffer_follows_its_gpu holds b@0 "$dir/small"
gpuq devices > "$dir/v.devices" 2>&1
check reexec_devices_changed_left_out_gpus_buffer_is_kept grep -q 'kept for GPU HOST-0' "$dir/v.devices"
reexec_into 0,1 off 2
check reexec_gpu_served_again_has_its_buffer_back holds a@0 "$dir/mid" b@1 "$dir/small"
reexec_into 1 on 3
check reexec_into_the_store_stores_the_kept_slab grep -q 'FDSTORE=1 | FDNAME=gpuq-slab-HOST-0-1 \[1 fds\]' "$store"
kill -KILL "$first"
second=$(pid_after_start 2)
v_config 0,1 on
kill -KILL "$second"
third=$(pid_after_start 3)
check kept_slab_stored_by_a_reexec_survives_two_crashes holds a@0 "$dir/mid" b@1 "$dir/small"
# A GPU gone for good: an administrator drops what is kept for it.
v_config 1 on
kill -KILL "$third"
fourth=$(pid_after_start 4)
gpuq admin drop-absent HOST-0 > "$dir/v.drop" 2>&1
check drop_absent_says_what_went grep -q \
	'dropped 1 buffer (1.0 MiB) kept for GPU HOST-0: their memory there is freed' "$dir/v.drop"
check drop_absent_takes_the_slab_out_of_the_store grep -q 'FDSTOREREMOVE=1 | FDNAME=gpuq-slab-HOST-0-1$' "$store"
gpuq devices > "$dir/v.devices" 2>&1
check drop_absent_leaves_nothing_kept sh -c "! grep -q 'kept for GPU' '$dir/v.devices'"
kill -TERM "$supervisor"
wait "$supervisor"

# --- the same at random: buffers made, rewritten and freed, the devices
# changed and taken up by SIGKILL, SIGTERM or `admin restart`, gpuqd killed
# while a put runs, kept buffers dropped, every buffer checked against a
# model after each event (tests/service/devices_chaos.py; GPUQ_CHAOS_SEEDS
# for other runs) ---
if command -v python3 > /dev/null 2>&1; then
	for seed in ${GPUQ_CHAOS_SEEDS:-1 2 3}; do
		if python3 tests/service/devices_chaos.py "$BUILD" 200 "$seed" > "$dir/chaos.$seed" 2>&1; then
			ok "devices_changed_at_random_buffers_follow_their_gpu_seed_$seed"
		else
			fail "devices_changed_at_random_buffers_follow_their_gpu_seed_$seed" \
				"the model and gpuqd differ" "$dir/chaos.$seed"
		fi
	done
else
	skip devices_changed_at_random_buffers_follow_their_gpu "no python3 here"
fi

# --- an alloc still waiting for memory when gpuqd dies: listed lost, saying so ---
start_under_store a 1 64 --host-mem 64M --host-devices 1
first=$(pid_after_start 1)
gpuq alloc full --bytes 48M > /dev/null
gpuq --json alloc waiting --bytes 32M --wait-memory 60000 --detach > "$dir/a.job"
waiting_for_memory() { gpuq jobs | grep -q ' alloc  *running .* memory'; }
wait_until waiting_for_memory
kill -KILL "$first"
second=$(pid_after_start 2)
gpuq checksum waiting > "$dir/a.out" 2>&1
check sigkill_alloc_in_flight_is_lost_saying_why grep -q "was lost after gpuqd died (its alloc had not finished: it never held data)" "$dir/a.out"
kill -TERM "$supervisor"
wait "$supervisor"

# --- a store smaller than gpuqd's slabs: one warning, and the stand-in drops the rest ---
start_under_store q 0 2
for b in q1 q2 q3; do gpuq --timeout 20000 alloc "$b" --bytes 20000000 > /dev/null; done
wait_until grep -q 'store full' "$store"
check store_full_warns_once count_is "warn: the service manager's descriptor store keeps 2 descriptors" "$dir/q.log" 1
check store_full_is_what_the_stand_in_saw grep -q 'FDNAME=gpuq-slab-HOST-0-2 \[1 fds\] \[ignored: store full\]' "$store"
gpuq metrics > "$dir/q.metrics"
check store_full_counts_what_is_over_the_limit grep -q '^gpuq_store_over_limit 2$' "$dir/q.metrics"
kill -TERM "$supervisor"
wait "$supervisor"

# --- --fd-store off: nothing is stored, and a crash loses the buffers ---
start_under_store o 1 64 --fd-store off
first=$(pid_after_start 1)
gpuq alloc kept --bytes 3000 > /dev/null
gpuq put "$dir/small" kept > /dev/null
kill -KILL "$first"
second=$(pid_after_start 2)
check fd_store_off_stores_nothing test "$(count 'FDSTORE' "$store")" -eq 0
check fd_store_off_says_a_crash_loses_buffers grep -q \
	"gpuqd\[$first\]: info: the service manager's descriptor store: off (--fd-store off): a crash loses every buffer" "$dir/o.log"
gpuq buffers > "$dir/o.buffers"
check fd_store_off_crash_loses_the_buffers sh -c "test -n '$second' && ! grep -q '^kept' '$dir/o.buffers'"
kill -TERM "$supervisor"
wait "$supervisor"

# --- the journal's priority prefixes ---
log="$dir/j.log"
logs="$log"
: > "$log"
sock="$dir/j.sock"
JOURNAL_STREAM=$(stat -c %d:%i "$log") "$gpuqd" --backend host --socket "$sock" \
	--log-level info 2>> "$log" &
jp=$!
wait_until test -S "$sock"
kill -TERM "$jp"
wait "$jp"
check journal_info_prefix grep -q "^<6>info: gpuqd" "$log"
check journal_lines_carry_no_pid test "$(count 'gpuqd\[' "$log")" -eq 0
JOURNAL_STREAM=$(stat -c %d:%i "$log") "$gpuqd" --backend host \
	--socket "$dir/no/such/dir/x.sock" 2>> "$log"
check journal_error_prefix grep -q "^<3>error: cannot serve $dir/no/such/dir/x.sock" "$log"

# --- --check-config ---
good="$dir/good.conf"
bad="$dir/bad.conf"
logs="$dir/out $dir/err"
printf '[gpuqd]\nqueue-depth = 16\n\n[default]\ndevice-memory = 8G\n[group:0]\ndevices = 0-1\n[user:root]\nmax-priority = low\nweight = 3\n' > "$good"
printf '[gpuqd]\nqueue-depth = many\nshoe-size = 9\n[user:no-such-user-gpuq]\nqueued-jobs = 1\n' > "$bad"
"$gpuqd" --check-config --config "$good" > "$dir/out" 2> "$dir/err"
check check_config_ok_exits_0 test $? -eq 0
check check_config_ok_says_so grep -q "^$good: ok" "$dir/out"
check check_config_lists_rules grep -q "\[group:0\] ($good:6): devices 0-1" "$dir/out"
check check_config_lists_every_key grep -q "\[user:root\] ($good:8): max-priority low weight 3\$" "$dir/out"
"$gpuqd" --check-config --config "$bad" > "$dir/out" 2> "$dir/err"
check check_config_errors_exit_1 test $? -eq 1
check check_config_file_line_message grep -q "^$bad:2: queue-depth takes 1 to 1048576, not 'many'" "$dir/err"
check check_config_every_error grep -q "^$bad:3: unknown option 'shoe-size'" "$dir/err"
check check_config_names_the_section grep -q "^$bad:4: \[user:no-such-user-gpuq\]: no user named" "$dir/err"
"$gpuqd" --check-config --config "$dir/missing.conf" > "$dir/out" 2> "$dir/err"
check check_config_missing_file test $? -eq 1
"$gpuqd" --backend host --socket "$dir/c.sock" --config "$bad" > "$dir/out" 2> "$dir/err"
check bad_config_refuses_to_start_with_ex_config test $? -eq 78
check bad_config_logs_file_line grep -q "error: $bad:3: unknown option 'shoe-size'" "$dir/err"

# --- the metrics textfile ---
sock="$dir/m.sock"
mkdir "$dir/textfile"
prom="$dir/textfile/gpuq.prom"
logs="$dir/m.log"
"$gpuqd" --backend host --socket "$sock" --metrics-textfile "$prom" --metrics-interval 1 \
	> "$dir/m.log" 2>&1 &
mp=$!
wait_until test -S "$sock"
gpuq noop > /dev/null
wait_until grep -q 'gpuq_jobs_total{op="noop",result="ok"} 1' "$prom"
check textfile_is_written grep -q 'gpuq_jobs_total{op="noop",result="ok"} 1' "$prom"
check textfile_leaves_no_temporary test ! -e "$prom.tmp"
gpuq metrics > "$dir/metrics.txt"
check cli_metrics_prints_the_exposition grep -q "^# TYPE gpuq_job_latency_seconds histogram" "$dir/metrics.txt"
kill -TERM "$mp"
wait "$mp"
check textfile_goes_when_gpuqd_stops test ! -e "$prom"

# --- make install / uninstall, and the units ---
dest="$dir/root"
logs="$dir/install.log"
if ! make -q --no-print-directory BUILD="$BUILD" "$BUILD/gpuqd" "$BUILD/gpuq" "$BUILD/libgpuq.a" \
	> /dev/null 2>&1; then
	# A carried build/ (make gpu-check) must not be rebuilt here.
	skip install_tree "the binaries in $BUILD are not up to date with the sources: make install would compile"
elif make -s --no-print-directory install BUILD="$BUILD" DESTDIR="$dest" > "$dir/install.log" 2>&1; then
	(cd "$dest" && find . -type f | sort) > "$dir/tree"
	cat > "$dir/tree.expected" <<-TREE
	./etc/gpuq/gpuqd.conf.example
	./usr/local/bin/gpuq
	./usr/local/include/gpuq/gpuq.h
	./usr/local/include/gpuq/protocol/msg.h
	./usr/local/include/gpuq/protocol/protocol.h
	./usr/local/lib/libgpuq.a
	./usr/local/lib/systemd/system/gpuqd.service
	./usr/local/lib/systemd/system/gpuqd.socket
	./usr/local/lib/sysusers.d/gpuq.conf
	./usr/local/lib/tmpfiles.d/gpuq.conf
	./usr/local/sbin/gpuqd
	./usr/local/share/man/man1/gpuq.1
	./usr/local/share/man/man8/gpuqd.8
	TREE
	if diff "$dir/tree.expected" "$dir/tree" > "$dir/tree.diff"; then ok install_tree
	else fail install_tree "the installed tree differs" "$dir/tree.diff"; fi
	check installed_gpuqd_runs "$dest/usr/local/sbin/gpuqd" --version
	check installed_example_config_checks "$dest/usr/local/sbin/gpuqd" --check-config \
		--config "$dest/etc/gpuq/gpuqd.conf.example"
	check installed_unit_execs_sbin grep -q "^ExecStart=/usr/local/sbin/gpuqd$" \
		"$dest/usr/local/lib/systemd/system/gpuqd.service"
	make -s --no-print-directory uninstall DESTDIR="$dest" > /dev/null 2>&1
	check uninstall_removes_everything test -z "$(find "$dest" -type f)"
else
	fail install_tree "make install failed" "$dir/install.log"
fi
prefix="$dir/prefix"
if ! command -v systemd-analyze > /dev/null 2>&1; then
	skip units_verify "systemd-analyze is not installed"
elif [ ! -f "$dest/../tree" ]; then
	skip units_verify "make install was not run"
elif make -s --no-print-directory install BUILD="$BUILD" PREFIX="$prefix" \
	SYSCONFDIR="$prefix/etc" > "$dir/install.log" 2>&1; then
	# Verified where installed (ExecStart= must exist), with the man pages on MANPATH.
	units="$prefix/lib/systemd/system"
	if MANPATH="$prefix/share/man:" systemd-analyze verify "$units/gpuqd.socket" \
		"$units/gpuqd.service" > "$dir/verify" 2>&1 && [ ! -s "$dir/verify" ]; then
		ok units_verify
	else
		fail units_verify "systemd-analyze verify complained" "$dir/verify"
	fi
	systemd-analyze security --offline=true "$units/gpuqd.service" > "$dir/security" 2>&1
	level=$(sed -n 's/.*Overall exposure level for gpuqd.service: \([0-9.]*\).*/\1/p' "$dir/security")
	echo "    systemd-analyze security: exposure ${level:-?} (lower is safer)"
	if [ -n "$level" ] && awk -v l="$level" 'BEGIN { exit !(l < 2.5) }'; then ok units_security_exposure_below_2.5
	else fail units_security_exposure_below_2.5 "exposure '$level'" "$dir/security"; fi
else
	fail units_verify "make install PREFIX=$prefix failed" "$dir/install.log"
fi

echo "RESULT service: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
