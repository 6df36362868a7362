"""client/python/bench.py, which gpu-check runs on the GPU, runs here too: its
dispatch and calls tables against the session's gpuqd (the copy table needs
torch and a GPU for most of its rows). Its output's shape is checked, never
its times."""

from __future__ import annotations

import subprocess
import sys

from conftest import BUILD, REPO


def test_the_dispatch_and_calls_tables_come_out(daemon):
    run = subprocess.run([sys.executable, str(REPO / "client" / "python" / "bench.py"),
                          "--socket", daemon.socket, "--gpuq", str(BUILD / "gpuq"),
                          "--skip", "copy", "--requests", "300"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout
    lines = run.stdout.splitlines()
    dispatch = [line.split() for line in lines if line.startswith(("ping ", "noop "))]
    assert [(row[0], row[1]) for row in dispatch] == [
        (op, who) for op in ("ping", "noop") for who in ("Client", "AsyncClient", "Async")]
    assert dispatch[2][2] in ("poll=0", "poll=50")
    calls = [line.split() for line in lines if line.startswith(("put ", "get "))]
    assert [(row[0], " ".join(row[1:-1])) for row in calls] == [
        ("put", "shortcut"), ("put", "whole plan"), ("get", "shortcut"),
        ("get", "whole plan")]
    assert all(float(row[-1]) > 0 for row in calls)
    assert "pybench_calls" not in run.stdout  # no error naming its buffer
