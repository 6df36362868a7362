#!/usr/bin/env python3
"""The Python client beside the C client, both measured in this run against one gpuqd.

1. Dispatch: ping and noop round trips (p50, p99) from ``gpuq.Client`` and
   ``gpuq.AsyncClient``, one request at a time, beside the same from C
   (``gpuq bench dispatch --clients 1``). Aim: Python's p50 within 2x of C's.
2. Copies: ``put_array`` and ``get_array`` of one size (default 1 GiB), each
   timed around the whole call, beside the ``gpuq memfd`` rows of the daemon's
   ``bench_copy`` job (what ``gpuq bench copy`` prints) at that size. Aim:
   >= 0.9 of those rows. A plain numpy array is first copied into a memfd
   by the client; a ``gpuq.memfd_array`` (or ``get_array``'s result) is
   passed as it is, so both are shown.

    python3 client/python/bench.py --socket S --gpuq build/gpuq [--bytes 1G]

Needs numpy and msgpack; run by tests/bench.sh (make gpu-check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import gpuq  # noqa: E402
from gpuq.__main__ import _size  # noqa: E402

WARMUP = 200


def percentiles(samples: List[float]) -> Dict[str, float]:
    s = sorted(samples)
    return {"p50": s[len(s) // 2] * 1e6, "p99": s[min(len(s) - 1, len(s) * 99 // 100)] * 1e6}


def timed(call: Callable[[], Any], n: int) -> Dict[str, float]:
    for _ in range(WARMUP):
        call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return percentiles(samples)


async def timed_async(socket: str, op: str, n: int) -> Dict[str, float]:
    async with gpuq.AsyncClient(socket) as c:
        call = c.ping if op == "ping" else c.noop
        for _ in range(WARMUP):
            await call()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            await call()
            samples.append(time.perf_counter() - t0)
    return percentiles(samples)


def dispatch_c(gpuq_bin: str, socket: str, n: int) -> Dict[str, Dict[str, float]]:
    run = subprocess.run([gpuq_bin, "--socket", socket, "--json", "bench", "dispatch",
                          "--clients", "1", "--requests", str(n)],
                         capture_output=True, text=True, timeout=600, check=True)
    results = json.loads(run.stdout)["results"]
    return {r["kind"]: {"p50": r["p50_us"], "p99": r["p99_us"]} for r in results}


def bench_dispatch(args: argparse.Namespace, client: gpuq.Client) -> None:
    c_side = dispatch_c(args.gpuq, args.socket, args.requests)
    rows = []
    for op, call in (("ping", client.ping), ("noop", lambda: client.noop(args.device))):
        rows.append((op, "Client", timed(call, args.requests), c_side[op]))
        rows.append((op, "AsyncClient", asyncio.run(timed_async(args.socket, op,
                                                                args.requests)), c_side[op]))
    print(f"python dispatch: {args.requests} round trips, one at a time, after {WARMUP} "
          "unmeasured; C: gpuq bench dispatch --clients 1 (aim: Python p50 <= 2x C)")
    print(f"{'KIND':5} {'CLIENT':12} {'C P50 µs':>9} {'PY P50 µs':>10} {'PY P99 µs':>10} "
          f"{'P50 PY/C':>9}")
    for op, who, py, c in rows:
        print(f"{op:5} {who:12} {c['p50']:9.1f} {py['p50']:10.1f} {py['p99']:10.1f} "
              f"{py['p50'] / c['p50']:9.2f}")


def memfd_rows(client: gpuq.Client, nbytes: int, repeats: int, device: int) -> Dict[str, float]:
    """The ``gpuq memfd`` rows (GB/s by group) of a bench_copy job at ``nbytes``."""
    job = client.job("bench_copy", device=device, sizes=[nbytes], repeats=repeats,
                     timeout=600)
    rows = {r["group"]: r["gbps"] for r in job.result["rows"]
            if r["method"].startswith("gpuq memfd") and "registered" not in r["method"]}
    if set(rows) != {"H2D", "D2H"}:
        raise SystemExit(f"bench_copy gave no memfd rows at {nbytes} bytes: "
                         f"{job.result.get('notes')}")
    return rows


def median_gbps(nbytes: int, repeats: int, call: Callable[[], Any]) -> float:
    call()  # unmeasured, as bench_copy's first run
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def bench_copy(args: argparse.Namespace, client: gpuq.Client) -> None:
    n, name = args.bytes, f"pybench@{args.device}"
    try:
        client.free(name)
    except gpuq.NotFound:
        pass
    base = memfd_rows(client, n, args.repeats, args.device)
    src = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    shared = gpuq.memfd_array(n, np.uint8)
    shared[:] = src
    out = gpuq.memfd_array(n, np.uint8)
    rows = [
        ("H2D", "put_array (numpy array)", median_gbps(n, args.repeats,
                                                       lambda: client.put_array(src, name))),
        ("H2D", "put_array (memfd_array)", median_gbps(n, args.repeats,
                                                       lambda: client.put_array(shared, name))),
        ("D2H", "get_array (new array)", median_gbps(n, args.repeats,
                                                     lambda: client.get_array(name))),
        ("D2H", "get_array (out=memfd_array)", median_gbps(
            n, args.repeats, lambda: client.get_array(name, out=out))),
    ]
    verified = bool(np.array_equal(out, src))
    client.free(name)
    print(f"python copies: {n} bytes, median of {args.repeats} after one unmeasured, "
          "beside bench_copy's gpuq memfd rows in this run (aim: >= 0.9)")
    print(f"{'GROUP':5} {'METHOD':28} {'GB/S':>7} {'MEMFD ROW':>10} {'RATIO':>6}")
    for group, method, gbps in rows:
        print(f"{group:5} {method:28} {gbps:7.2f} {base[group]:10.2f} "
              f"{gbps / base[group]:6.2f}")
    print(f"round trip verified: {'yes' if verified else 'NO'}")
    if not verified:
        raise SystemExit("get_array did not give back the bytes put_array stored")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", default=None, help="gpuqd's socket (default as gpuq)")
    p.add_argument("--gpuq", default="build/gpuq", help="the C client, for its bench dispatch")
    p.add_argument("--bytes", type=_size, default=1 << 30, help="copy size (default 1G)")
    p.add_argument("--requests", type=int, default=20000, help="round trips per kind")
    p.add_argument("--repeats", type=int, default=5, help="measured copies per method")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--skip", choices=["dispatch", "copy"], action="append", default=[])
    args = p.parse_args()
    args.socket = args.socket or gpuq.default_socket()
    with gpuq.Client(args.socket, timeout=120) as client:
        backend = client.ping()["backend"]
        print(f"-- python client ({backend} backend, gpuq {gpuq.__version__}, "
              f"Python {sys.version.split()[0]})")
        if "dispatch" not in args.skip:
            bench_dispatch(args, client)
        if "copy" not in args.skip:
            bench_copy(args, client)


if __name__ == "__main__":
    main()
