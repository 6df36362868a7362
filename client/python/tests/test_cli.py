"""python -m gpuq: the commands it mirrors, their output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import gpuq


def cli(socket, *args, stdin=None):
    pkg = os.path.dirname(os.path.dirname(gpuq.__file__))
    env = dict(os.environ, PYTHONPATH=pkg)
    return subprocess.run([sys.executable, "-m", "gpuq", "--socket", socket, *args],
                          input=stdin, capture_output=True, env=env, timeout=60)


def test_commands_and_exit_codes(daemon, name, tmp_path):
    s = daemon.socket
    run = cli(s, "ping")
    assert run.returncode == 0 and b"backend:" in run.stdout
    assert cli(s, "alloc", name, "--bytes", "64K").returncode == 0
    run = cli(s, "alloc", name, "--bytes", "64K")
    assert run.returncode == 1 and b"exists" in run.stderr
    assert cli(s, "fill", name, "random", "7").returncode == 0
    run = cli(s, "--json", "checksum", name)
    record = json.loads(run.stdout)
    assert run.returncode == 0 and record["result"]["bytes"] == 65536
    out = tmp_path / "out.bin"
    assert cli(s, "get", name, str(out)).returncode == 0 and out.stat().st_size == 65536
    run = cli(s, "get", name, "-")
    assert run.returncode == 0 and run.stdout == out.read_bytes()
    assert cli(s, "put", "-", name, "--verify", stdin=bytes(65536)).returncode == 0
    assert cli(s, "--json", "checksum", name).stdout != run.stdout
    assert name.encode() in cli(s, "buffers").stdout
    run = cli(s, "noop", "--detach")
    job = run.stdout.split()[1].decode()
    assert run.returncode == 0 and cli(s, "wait", job).returncode == 0
    assert b"done" in cli(s, "status", job).stdout
    assert b"False" in cli(s, "cancel", job).stdout
    assert b"noop" in cli(s, "jobs").stdout
    assert b"gpuq_jobs_total" in cli(s, "metrics").stdout
    assert cli(s, "free", name).returncode == 0
    run = cli(s, "free", name)
    assert run.returncode == 1 and b"not_found" in run.stderr


@pytest.mark.parametrize("args", [["alloc"], ["frobnicate"], ["fill", "x", "value"],
                                  ["alloc", "x", "--bytes", "lots"]])
def test_usage_errors_exit_2(daemon, args):
    assert cli(daemon.socket, *args).returncode == 2


def test_unreachable_exits_3_and_names_the_socket(tmp_path):
    path = str(tmp_path / "none.sock")
    run = cli(path, "ping")
    assert run.returncode == 3 and path.encode() in run.stderr


def test_output_and_errors_read_as_the_clis(private_daemon):
    """As gpuq prints them: an empty list says so ("no buffers", not "[]"), alloc
    says what it made ("alloc NAME@GPU: SIZE (COUNT x DTYPE)", not a Python
    repr; --json the alloc's job record), and a fill value or seed that is not
    a number is a usage error saying so, not int()'s complaint."""
    s = private_daemon().socket
    run = cli(s, "buffers")
    assert run.returncode == 0 and run.stdout == b"no buffers\n"
    assert cli(s, "--json", "buffers").stdout == b"[]\n"
    run = cli(s, "alloc", "q", "--bytes", "64K")
    assert run.returncode == 0 and run.stdout == b"alloc q@0: 64 KiB\n"
    run = cli(s, "alloc", "f@0", "--count", "16", "--dtype", "f32")
    assert run.returncode == 0 and run.stdout == b"alloc f@0: 64 B (16 x f32)\n"
    record = json.loads(cli(s, "--json", "alloc", "j", "--bytes", "4K").stdout)
    assert record["op"] == "alloc" and record["result"]["bytes"] == 4096
    run = cli(s, "fill", "f", "value", "abc")
    assert run.returncode == 2 and b"V 'abc' is not a number (an integer, or a float" \
        in run.stderr and b"int()" not in run.stderr
    run = cli(s, "fill", "f", "random", "x")
    assert run.returncode == 2 and b"SEED 'x' is not a number" in run.stderr
    assert cli(s, "fill", "f", "value", "-2.5e-1").returncode == 0  # a value, not an option
    run = cli(s, "fill", "f", "value", "-inf")  # sent, and refused by gpuqd
    assert run.returncode == 1 and b"finite" in run.stderr
    assert cli(s, "fill", "q", "value", "7").returncode == 0
    assert b"q" in cli(s, "buffers").stdout
