#!/bin/sh
# gpuq top against a private gpuqd on the host backend: --once and --json
# for scripts, then the live view in a real terminal (a detached tmux session
# of fixed size, read with capture-pane and driven with send-keys). Every
# wait on the screen is a bounded poll, not a fixed sleep, so that a loaded
# machine only makes it slower. Ends with a RESULT line.
set -u
BUILD=${1:-build}
dir=$(mktemp -d /tmp/gpuq-top.XXXXXX)
sock="$dir/gpuqd.sock"
passed=0
failed=0
skipped=0
gpuq() { "$BUILD/gpuq" --socket "$sock" "$@"; }

pass() { passed=$((passed + 1)); echo "ok   top/$1"; }
fail() {
	failed=$((failed + 1))
	echo "FAIL top/$1: $2"
	[ -z "${3:-}" ] || sed 's/^/    /' "$3"
}

# check NAME WANT_EXIT COMMAND...: runs COMMAND, compares its exit status.
check() {
	name=$1 want=$2
	shift 2
	"$@" > "$dir/out" 2> "$dir/err"
	got=$?
	if [ "$got" -eq "$want" ]; then
		pass "$name"
	else
		cat "$dir/err" >> "$dir/out"
		fail "$name" "exit $got, expected $want" "$dir/out"
	fi
}

# expect NAME PATTERN FILE: FILE (out, err, or a path) matches PATTERN.
expect() {
	f=$3
	[ -f "$f" ] || f="$dir/$3"
	if grep -q -- "$2" "$f"; then pass "$1"; else fail "$1" "no '$2' in:" "$f"; fi
}

check unreachable_is_3 3 gpuq top --once --interval 50
expect unreachable_names_socket "$sock" err

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

check help 0 gpuq top --help
expect help_names_once "--once" out
check json_needs_once_is_2 2 gpuq top --json
check needs_a_terminal_is_2 2 gpuq top
expect needs_a_terminal_says_once "--once" err
check interval_too_short_is_2 2 gpuq top --once --interval 10

# What to show: buffers of two users where a second uid can connect; a put
# that runs until the fifo's writer goes (its reader never sees the end), and
# two fills queued behind it on its buffer, one urgent, one not.
check alloc_w 0 gpuq alloc w --bytes 1M
check alloc_v 0 gpuq alloc v --bytes 3M --device 1
other=""
if [ "$(id -u)" -eq 0 ] && command -v setpriv > /dev/null 2>&1 &&
	setpriv --reuid 65534 --regid 65534 --clear-groups "$BUILD/gpuq" --socket "$sock" \
		alloc o --bytes 2M --device 1 > /dev/null 2>&1; then
	other=65534
fi
mkfifo "$dir/fifo"
sleep 120 > "$dir/fifo" &
holder=$!
check put_running 0 gpuq put "$dir/fifo" w --length 1M --detach
check fill_high 0 gpuq fill w zero --detach --priority high
fill_high_job=$(cat "$dir/out")
check fill_low 0 gpuq fill w zero --detach --priority low

check once 0 gpuq top --once --interval 200
cp "$dir/out" "$dir/once"
expect once_header "^gpuq top: gpuqd .*host backend" once
expect once_device_0 "^ *0  host arena" once
expect once_device_1 "^ *1  host arena" once
expect once_engines "H2D  D2H  KERNEL  COPY  COLL" once
expect once_memory_of_root "^ *0  *0  *1  *1.0 MiB" once
expect once_memory_on_1 "^ *1  *0  *1  *3.0 MiB" once
if [ -n "$other" ]; then
	expect once_memory_of_other_user "^ *1  *65534  *1  *2.0 MiB" once
else
	skipped=$((skipped + 1))
	echo "skip top/once_memory_of_other_user: skipped: a second user needs root and setpriv"
fi
expect once_put_running "put  *running  *normal" once
expect once_fill_high_queued "fill  *queued  *high .*buffer: behind job" once
expect once_summary "1 running, 2 queued.*high 0/1, normal 1/0, low 0/1; waiting: buffer 2" once
expect once_users_share "^ *0  *1  *2 .*100%" once
check once_plain_text 1 grep -q "$(printf '\033')" "$dir/once"
check once_device_filter 0 gpuq top --once --interval 50 --device 1
cp "$dir/out" "$dir/once1"
check once_device_filter_hides_0 1 grep -q "^ *0  host arena" "$dir/once1"
check once_device_filter_hides_put 1 grep -q "put  *running" "$dir/once1"
check once_device_missing_is_1 1 gpuq top --once --interval 50 --device 7
expect once_device_missing_says_so "device 7 does not exist (gpuqd has 2" err

check json 0 gpuq top --once --json --interval 200
cp "$dir/out" "$dir/json"
check json_parses 0 python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["interval_s"] > 0, s["interval_s"]
assert [d["index"] for d in s["devices"]] == [0, 1], s["devices"]
d0 = s["devices"][0]
assert d0["busy_share"]["h2d"] > 0.5, d0["busy_share"]  # the put waits on its fifo
assert {(m["device"], m["owner"], m["bytes"]) for m in s["memory"]} >= {(0, 0, 1 << 20), (1, 0, 3 << 20)}
jobs = {(j["op"], j["state"], j["priority"]) for j in s["jobs"]}
assert ("put", "running", "normal") in jobs and ("fill", "queued", "high") in jobs, jobs
assert any(j.get("waiting_reason") == "buffer" for j in s["jobs"]), s["jobs"]
assert s["users"][0]["running"] == 1 and s["users"][0]["queued"] == 2, s["users"]
' "$dir/json"

# The live view in tmux: a private server, a pane of 120 x 40 running sh.
if ! command -v tmux > /dev/null 2>&1; then
	# Each terminal test below counts as one skipped.
	skipped=$((skipped + $(grep -c '^	*\(wait_pane\|check\|expect\) tty_' "$0")))
	echo "skip top/tty_*: skipped: no tmux (tests/install-deps.sh installs it)"
else
	tm() { tmux -S "$dir/tmux.sock" "$@"; }
	# wait_pane NAME PATTERN [ROW]: the pane shows PATTERN (on row ROW) within 10 s.
	wait_pane() {
		i=0
		while [ $i -lt 100 ]; do
			tm capture-pane -p -t top > "$dir/pane"
			if sed -n "${3:-1,\$}p" "$dir/pane" | grep -q -- "$2"; then pass "$1"; return 0; fi
			sleep 0.1
			i=$((i + 1))
		done
		fail "$1" "the pane never showed '$2':" "$dir/pane"
	}
	tm new-session -d -s top -x 120 -y 40 sh
	tm send-keys -t top "stty -g > $dir/stty.before; \"$BUILD/gpuq\" --socket \"$sock\" top --interval 200; echo EXITED \$?" Enter
	wait_pane tty_header "^gpuq top: gpuqd .*device all; user all"
	wait_pane tty_devices "^ *1  host arena"
	wait_pane tty_rates "over [0-9.]* ms"
	wait_pane tty_keys_line "q quit  s sort  d device"
	tm send-keys -t top d
	wait_pane tty_d_filters_device "; device 0; user all"
	check tty_d_hides_device_1 1 grep -q "^ *1  host arena" "$dir/pane"
	tm send-keys -t top s
	wait_pane tty_s_sorts_by_age "sort age; device 0"
	tm send-keys -t top u
	wait_pane tty_u_filters_user "sort age; device 0; user 0"
	tm send-keys -t top p
	wait_pane tty_p_pauses "PAUSED (p resumes)"
	tm send-keys -t top p h
	wait_pane tty_h_explains "s sort jobs: priority, age, device, owner"
	tm resize-window -t top -x 60 -y 12
	# Lines longer than the width would wrap and scroll the header away.
	wait_pane tty_resize_keys_on_last_row "^q quit" 12
	wait_pane tty_resize_header_on_first_row "^gpuq top: gpuqd" 1
	wait_pane tty_resize_says_more_lines "^\.\.\. [0-9]* more lines" 11
	tm resize-window -t top -x 120 -y 40
	tm send-keys -t top q
	wait_pane tty_q_exits_0 "^EXITED 0"
	expect tty_q_says_quit "gpuq top: quit$" "$dir/pane"
	tm send-keys -t top "stty -g > $dir/stty.after; echo STTY" Enter
	wait_pane tty_stty_read "^STTY"
	check tty_terminal_restored 0 cmp "$dir/stty.before" "$dir/stty.after"

	# A job the CLI waits for shows its progress line on a terminal: the fill
	# queued behind the put says so, then the wait times out and the line goes.
	tm send-keys -t top clear Enter "\"$BUILD/gpuq\" --socket \"$sock\" wait $fill_high_job --timeout 4000; echo EXITED \$?" Enter
	wait_pane tty_wait_says_queued "^wait $fill_high_job  queued [0-9.]* s"
	wait_pane tty_wait_times_out_1 "^EXITED 1"
	check tty_wait_line_cleared 1 grep -q "queued [0-9.]* s.*timeout" "$dir/pane"

	tm send-keys -t top clear Enter "\"$BUILD/gpuq\" --socket \"$sock\" top; echo EXITED \$?" Enter
	wait_pane tty_again "^gpuq top: gpuqd"
	tm send-keys -t top C-c
	wait_pane tty_ctrl_c_exits_0 "^EXITED 0"
	expect tty_ctrl_c_says_so "gpuq top: stopped by Interrupt$" "$dir/pane"

	tm send-keys -t top clear Enter "sh -c 'echo \$\$ > $dir/top.pid; exec \"$BUILD/gpuq\" --socket \"$sock\" top'; echo EXITED \$?" Enter
	wait_pane tty_before_sigterm "^gpuq top: gpuqd"
	kill -TERM "$(cat "$dir/top.pid")"
	wait_pane tty_sigterm_exits_0 "^EXITED 0"
	expect tty_sigterm_says_so "gpuq top: stopped by Terminated$" "$dir/pane"

	# Last: the daemon goes away under a paused live view, which polls nothing but
	# still watches the socket (the put ends first, so that gpuqd stops at once).
	tm send-keys -t top clear Enter "\"$BUILD/gpuq\" --socket \"$sock\" top --interval 100; echo EXITED \$?" Enter
	wait_pane tty_before_daemon_stops "^gpuq top: gpuqd"
	tm send-keys -t top p
	wait_pane tty_paused_before_daemon_stops "PAUSED"
	kill "$holder"
	wait "$holder" 2> /dev/null
	holder=""
	kill -TERM "$daemon"
	wait_pane tty_daemon_gone_exits_3 "^EXITED 3"
	expect tty_daemon_gone_says_so "gpuq top: gpuqd went away: " "$dir/pane"
	tm kill-server
fi

[ -z "$holder" ] || { kill "$holder"; wait "$holder" 2> /dev/null; }
kill -TERM "$daemon" 2> /dev/null
wait "$daemon"
rm -rf "$dir"
echo "RESULT top: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
