#!/usr/bin/env python3
"""The Python client beside the C client and torch, all measured in this run against one gpuqd.

1. Dispatch: ping and noop round trips (p50, p99) from ``gpuq.Client`` and
   ``gpuq.AsyncClient``, one request at a time, beside the same from C
   (``gpuq bench dispatch --clients 1``), in three rounds that each measure C
   first, so that the machine's drift falls on both sides; the table gives
   the rounds' medians. Aim: Python's p50 within 2x of C's. The
   AsyncClient as it comes, and beside it with ``poll_us`` the other way
   (0 where it polls for replies, else the default).
2. Calls: the client's own CPU time per ``put_array``/``get_array`` of a
   device array through its kept lease, the copy itself left out (a
   stand-in array, a copy that does nothing), by the shortcut of a repeated
   copy and by the whole plan: what Python adds to each CUDA tensor call.
3. Copies, at each size (default 256 MiB and 1 GiB of float32), each timed
   around the whole call, median of ``--repeats`` after one unmeasured (of
   at least 25 for the device-to-device rows, which take under 1 ms):
   ``put_array``/``get_array`` of a plain numpy array, of a torch CPU tensor
   and of a torch CUDA tensor, beside torch's own ``.cuda()``/``.cpu()``
   from pageable and from pinned memory, the pinned and pageable
   ``cudaMemcpy`` rows of the daemon's ``bench_copy`` job, its D2D
   ``cudaMemcpy`` row (``bench_d2d``), and the host's own speed at making a
   new array and writing it with the client's copy threads (the ceiling of
   ``get_array()`` into a new array: fresh pages cost), that of ``np.empty``
   and that of an array on a huge page boundary, as ``get_array()`` makes
   them (gpuq/host_arrays.py). Aims: put of a
   numpy array and get into an existing one >= 0.7 of pinned; get into a
   new array >= 0.9 of the new-array ceiling; CUDA tensors >= 0.9 of D2D.

    python3 client/python/bench.py --socket S --gpuq build/gpuq [--bytes 256M,1G]

Needs numpy and msgpack; torch (with CUDA) for its rows. Run by
tests/bench.sh (make gpu-check).
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
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import gpuq  # noqa: E402
from gpuq.aio import DEFAULT_POLL_US, default_poll_s  # noqa: E402
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


async def timed_async(socket: str, op: str, n: int,
                      poll_us: Optional[float] = None) -> Dict[str, float]:
    async with gpuq.AsyncClient(socket, poll_us=poll_us) as c:
        call: Any = c.ping if op == "ping" else c.noop
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


#: Rounds of the dispatch table: C, then each Python client, in turn, so that
#: drift in the machine (clocks, other load) falls on both sides of a ratio.
DISPATCH_ROUNDS = 3


def bench_dispatch(args: argparse.Namespace, client: gpuq.Client) -> None:
    n = max(1, args.requests // DISPATCH_ROUNDS)
    calls = (("ping", client.ping), ("noop", lambda: client.noop(args.device)))
    # The AsyncClient as it comes (polling for replies, or not on few CPUs), and
    # beside it the other way, so that each run shows what polling gives.
    default_us = default_poll_s() * 1e6
    other_us = 0.0 if default_us else DEFAULT_POLL_US
    rounds: List[List[Tuple[str, str, Dict[str, float], Dict[str, float]]]] = []
    for _ in range(DISPATCH_ROUNDS):
        c_side = dispatch_c(args.gpuq, args.socket, n)
        rounds.append([row for op, call in calls for row in (
            (op, "Client", timed(call, n), c_side[op]),
            (op, "AsyncClient", asyncio.run(timed_async(args.socket, op, n)), c_side[op]),
            (op, f"Async poll={other_us:.0f}",
             asyncio.run(timed_async(args.socket, op, n, other_us)), c_side[op]))])
    print(f"python dispatch: {DISPATCH_ROUNDS} rounds of {n} round trips per client, one at "
          f"a time, after {WARMUP} unmeasured; C: gpuq bench dispatch --clients 1, in each "
          "round before the Python clients; medians of the rounds (aim: Python p50 <= 2x C); "
          f"the AsyncClient polls {default_us:.0f} us for a reply here (poll_us)")
    print(f"{'KIND':5} {'CLIENT':14} {'C P50 µs':>9} {'PY P50 µs':>10} {'PY P99 µs':>10} "
          f"{'P50 PY/C':>9}")
    for i, (op, who, _, _) in enumerate(rounds[0]):
        same = [r[i] for r in rounds]
        c50 = statistics.median(c["p50"] for _, _, _, c in same)
        py50 = statistics.median(py["p50"] for _, _, py, _ in same)
        py99 = statistics.median(py["p99"] for _, _, py, _ in same)
        ratio = statistics.median(py["p50"] / c["p50"] for _, _, py, c in same)
        print(f"{op:5} {who:14} {c50:9.1f} {py50:10.1f} {py99:10.1f} {ratio:9.2f}")


def daemon_rows(client: gpuq.Client, nbytes: int, repeats: int,
                device: int) -> Dict[str, float]:
    """bench_copy's and bench_d2d's rows at ``nbytes``: ``pinned H2D``/``D2H`` (the
    ceilings), ``pageable H2D``/``D2H`` (the baselines, CUDA only), ``D2D``."""
    table = client.bench_copy(device=device, sizes=[nbytes], repeats=repeats, timeout=1800)
    rows: Dict[str, float] = {}
    for r in table["rows"]:
        if r["role"] == "ceiling":
            rows[f"pinned {r['group']}"] = r["gbps"]
        elif r["role"] == "baseline":
            rows[f"pageable {r['group']}"] = r["gbps"]
    if "pinned H2D" not in rows or "pinned D2H" not in rows:
        raise SystemExit(f"bench_copy gave no ceiling rows at {nbytes} bytes: "
                         f"{table.get('notes')}")
    d2d = client.bench_d2d(device=device, sizes=[nbytes], repeats=repeats, peers=False,
                           timeout=1800)
    for r in d2d["rows"]:
        if r["group"] == "D2D" and r["role"] == "ceiling":
            rows["D2D"] = r["gbps"]
    return rows


#: Repeats of the device-to-device rows: each call takes 0.1-1 ms, where one
#: stall among three samples moved the 256 MiB put_array row from 0.6 to 0.2.
D2D_REPEATS = 25


def median_gbps(nbytes: int, repeats: int, call: Callable[[], Any],
                sync: Callable[[], Any] = lambda: None) -> float:
    call()  # unmeasured, as bench_copy's first run
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def new_array_ceiling(nbytes: int, repeats: int, threads: int = 0, slot: int = 0,
                      aligned: bool = False) -> float:
    """Making a new float32 array of ``nbytes`` and writing every byte of it as the
    ring's copies out do: one task per slot-sized chunk, from a resident
    source of one staging slot, on copy threads like the client's. What
    ``get_array()`` into a new array does besides waiting for the DMA.
    ``aligned``: the array made as ``get_array()`` makes it, its data on a
    huge page boundary (gpuq/host_arrays.py); else plain ``np.empty``."""
    from gpuq.copier import Copier
    from gpuq.host_arrays import empty_aligned
    from gpuq.staging import DEFAULT_SLOT_BYTES, copy_threads
    copier = Copier(threads or copy_threads())
    src = np.ones(min(nbytes, slot or DEFAULT_SLOT_BYTES), np.uint8)
    empty = empty_aligned if aligned else np.empty

    def make() -> Any:
        out = empty(nbytes // 4, np.float32).view(np.uint8)
        tasks = [copier.submit(np.copyto, out[base:base + len(src)],
                               src[:min(len(src), nbytes - base)])
                 for base in range(0, nbytes, len(src))]
        for t in tasks:
            t.wait()
        return out
    try:
        return median_gbps(nbytes, repeats, make)
    finally:
        copier.close()


def ring_timing(what: str, client: gpuq.Client) -> None:
    """Where the last ring transfer's time went, as the calling thread saw it."""
    ring, t = client.staging, client.staging.timing
    if t:
        print(f"   {what} through the ring, last call: " + ", ".join(
            f"{k} {v}" if k == "jobs" else f"{k} {v * 1e3:.2f} ms" for k, v in t.items())
            + f" ({ring!r})")


def torch_cuda() -> Any:
    """torch, when it is installed with a GPU; else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


Row = Tuple[str, str, float, str, float]  # group, method, GB/s, reference name, its GB/s


def copy_rows(args: argparse.Namespace, client: gpuq.Client, nbytes: int,
              ref: Dict[str, float]) -> List[Row]:
    name, r = f"pybench@{args.device}", args.repeats
    for stale in (name, f"pybench_cuda@{args.device}"):
        try:
            client.free(stale)
        except gpuq.NotFound:
            pass
    src = np.random.default_rng(1).random(nbytes // 4, dtype=np.float32)
    rows: List[Row] = []
    pinned_h2d, pinned_d2h = ref["pinned H2D"], ref["pinned D2H"]
    rows.append(("H2D", "put_array (numpy array)",
                 median_gbps(nbytes, r, lambda: client.put_array(name, src)),
                 "pinned", pinned_h2d))
    ring_timing("put_array", client)
    out = np.empty_like(src)
    rows.append(("D2H", "get_array (out=numpy array)",
                 median_gbps(nbytes, r, lambda: client.get_array(name, out=out)),
                 "pinned", pinned_d2h))
    ring_timing("get_array(out=)", client)
    ring = (client.staging.threads, client.staging.slot_bytes)
    ceiling = new_array_ceiling(nbytes, r, *ring)
    rows.append(("D2H", "new array, written by threads", ceiling, "pinned", pinned_d2h))
    aligned = new_array_ceiling(nbytes, r, *ring, aligned=True)
    rows.append(("D2H", "the same, on huge page bounds", aligned, "new array", ceiling))
    new = median_gbps(nbytes, r, lambda: client.get_array(name))
    rows.append(("D2H", "get_array (new array)", new, "new array", ceiling))
    rows.append(("D2H", "the same, of the bounds row", new, "bounds", aligned))
    if not np.array_equal(out, src):
        raise SystemExit("get_array did not give back the bytes put_array stored")
    torch = torch_cuda()
    if torch is None:
        print("torch with CUDA is not installed here: its rows are skipped")
        client.free(name)
        return rows
    dev = f"cuda:{args.device}"
    sync = torch.cuda.synchronize
    t_cpu = torch.from_numpy(src.copy())
    t_pin = t_cpu.pin_memory()
    rows.append(("H2D", "put_array (torch CPU tensor)",
                 median_gbps(nbytes, r, lambda: client.put_array(name, t_cpu)),
                 "pinned", pinned_h2d))
    rows.append(("H2D", "torch .cuda() pageable",
                 median_gbps(nbytes, r, lambda: t_cpu.cuda(dev), sync), "pinned", pinned_h2d))
    rows.append(("H2D", "torch .cuda() pinned",
                 median_gbps(nbytes, r, lambda: t_pin.cuda(dev), sync), "pinned", pinned_h2d))
    t_out = torch.empty_like(t_cpu)
    rows.append(("D2H", "get_array (out=torch CPU tensor)",
                 median_gbps(nbytes, r, lambda: client.get_array(name, out=t_out)),
                 "pinned", pinned_d2h))
    t_gpu = t_cpu.cuda(dev)
    rows.append(("D2H", "torch .cpu() pageable (new)",
                 median_gbps(nbytes, r, lambda: t_gpu.cpu(), sync), "new array", ceiling))
    pin_out = torch.empty_like(t_cpu).pin_memory()
    rows.append(("D2H", "torch .copy_() into pinned",
                 median_gbps(nbytes, r, lambda: pin_out.copy_(t_gpu), sync),
                 "pinned", pinned_d2h))
    client.free(name)
    cname = f"pybench_cuda@{args.device}"
    d2d = ref.get("D2D", 0.0)
    rd = max(r, D2D_REPEATS)
    rows.append(("D2D", "put_array (torch CUDA tensor)",
                 median_gbps(nbytes, rd, lambda: client.put_array(cname, t_gpu)), "D2D", d2d))
    g_out = torch.empty_like(t_gpu)
    rows.append(("D2D", "get_array (out=torch CUDA tensor)",
                 median_gbps(nbytes, rd, lambda: client.get_array(cname, out=g_out)),
                 "D2D", d2d))
    g2 = torch.empty_like(t_gpu)
    rows.append(("D2D", "torch .copy_() device to device",
                 median_gbps(nbytes, rd, lambda: g2.copy_(t_gpu), sync), "D2D", d2d))
    # Holding the attachment (a lease) instead: copies into the buffer's own memory,
    # with no lease check at all (put_array's kept revocable lease checks its lock
    # per call, and attaches again, importing nothing, once gpuqd has ended it).
    start = time.perf_counter()
    with client.buffer(cname).attach() as att:
        attach_s = time.perf_counter() - start
        print(f"attach of {nbytes >> 20} MiB: {attach_s * 1e3:.3f} ms, of which importing "
              f"and mapping it here {att.import_s * 1e3:.3f} ms (what a CUDA put_array/"
              "get_array pays when its kept lease has ended)")
        held = torch.from_dlpack(att).view(torch.float32).reshape(t_gpu.shape)
        rows.append(("D2D", ".copy_() into a held attachment",
                     median_gbps(nbytes, rd, lambda: held.copy_(t_gpu), sync), "D2D", d2d))
        # put_array/get_array while the caller holds that lease go through it.
        rows.append(("D2D", "put_array (CUDA tensor, lease held)",
                     median_gbps(nbytes, rd, lambda: client.put_array(cname, t_gpu)),
                     "D2D", d2d))
        rows.append(("D2D", "get_array (out=CUDA, lease held)",
                     median_gbps(nbytes, rd, lambda: client.get_array(cname, out=g_out)),
                     "D2D", d2d))
        sync()
    if not torch.equal(g_out, t_gpu):
        raise SystemExit("get_array(out=cuda tensor) did not give back what put_array stored")
    client.free(cname)
    return rows


def bench_copy(args: argparse.Namespace, client: gpuq.Client) -> None:
    print(f"python copies: float32, median of {args.repeats} (D2D rows: "
          f"{max(args.repeats, D2D_REPEATS)}) after one unmeasured, beside "
          "the same run's ceilings (aims: put/get numpy >= 0.7 of pinned, new array "
          ">= 0.9 of the new-array row, CUDA tensors >= 0.9 of D2D)")
    for nbytes in args.bytes:
        ref = daemon_rows(client, nbytes, args.repeats, args.device)
        rows = copy_rows(args, client, nbytes, ref)
        print(f"-- {nbytes >> 20} MiB: pinned cudaMemcpy H2D {ref['pinned H2D']:.2f}, "
              f"D2H {ref['pinned D2H']:.2f} GB/s; pageable H2D "
              f"{ref.get('pageable H2D', 0):.2f}, D2H {ref.get('pageable D2H', 0):.2f}; "
              f"D2D {ref.get('D2D', 0):.2f}  ({client.staging})")
        print(f"{'GROUP':5} {'METHOD':36} {'GB/S':>8} {'OF':>10} {'RATIO':>6}")
        for group, method, gbps, ref_name, ref_gbps in rows:
            ratio = gbps / ref_gbps if ref_gbps else 0.0
            print(f"{group:5} {method:36} {gbps:8.2f} {ref_name:>10} {ratio:6.2f}")


class _StandIn:
    """A device array in form only (a CUDA array interface, no host one), for
    bench_calls, whose copies do nothing."""

    def __init__(self, count: int) -> None:
        self.dtype = np.dtype(np.float32)
        self.shape = (count,)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": "<f4",
                                         "data": (0, False), "version": 3}


def bench_calls(args: argparse.Namespace, client: gpuq.Client) -> None:
    """The client's own time per put_array/get_array of a device array through its
    kept lease, the copy left out (a stand-in array; the copy does nothing):
    what Python adds to each CUDA tensor call, by the shortcut of a repeated
    copy and by the whole plan (the shortcut forgotten before each call). CPU
    time of this process, so that it holds on a loaded machine too."""
    from gpuq import device_arrays
    name, n = f"pybench_calls@{args.device}", max(1000, args.requests // 4)
    real = device_arrays._device_copy
    client.alloc(name, count=1024, dtype="f32", shareable=True)
    try:
        device_arrays._device_copy = lambda att, arr, into_attachment: None
        arr = _StandIn(1024)
        calls = (("put", lambda: client.put_array(name, arr)),
                 ("get", lambda: client.get_array(name, out=arr)))

        def whole(call: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                client._kept.shortcuts.clear()
                return call()
            return run
        print(f"python calls: the client's CPU time per call of a device array through "
              f"its kept lease, the copy itself left out; {n} calls after {WARMUP}")
        print(f"{'CALL':5} {'PATH':12} {'CPU µs':>8}")
        for op, call in calls:
            for path, run in (("shortcut", call), ("whole plan", whole(call))):
                for _ in range(WARMUP):
                    run()
                start = time.process_time()
                for _ in range(n):
                    run()
                print(f"{op:5} {path:12} {(time.process_time() - start) / n * 1e6:8.2f}")
    finally:
        device_arrays._device_copy = real
        client.free(name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", default=None, help="gpuqd's socket (default as gpuq)")
    p.add_argument("--gpuq", default="build/gpuq", help="the C client, for its bench dispatch")
    p.add_argument("--bytes", type=lambda t: [_size(x) for x in t.split(",")],
                   default=[256 << 20, 1 << 30], help="copy sizes (default 256M,1G)")
    p.add_argument("--requests", type=int, default=20000, help="round trips per kind")
    p.add_argument("--repeats", type=int, default=3, help="measured copies per method")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--copy-threads", type=int, default=None,
                   help="the client's staging copy threads (default: CPUs, at most 12)")
    p.add_argument("--slot-bytes", type=_size, default=None,
                   help="the staging ring's slot size, one copy task (default 2M)")
    p.add_argument("--slots", type=int, default=None,
                   help="the staging ring's slots (default 64)")
    p.add_argument("--group", type=int, default=None,
                   help="the staging ring's slots per job (default 4)")
    p.add_argument("--groups", action="store_true",
                   help="a job per group of slots, not one ring job per transfer (to compare)")
    p.add_argument("--skip", choices=["dispatch", "calls", "copy"], action="append",
                   default=[])
    args = p.parse_args()
    args.socket = args.socket or gpuq.default_socket()
    ring: Dict[str, Any] = {"copy_threads": args.copy_threads}
    if args.slot_bytes:
        ring["staging_slot_bytes"] = args.slot_bytes
    if args.slots is not None:
        ring["staging_slots"] = args.slots
    with gpuq.Client(args.socket, timeout=600, **ring) as client:
        if args.group is not None:
            client.staging.group = args.group
        client.staging.use_rings = not args.groups
        backend = client.ping()["backend"]
        print(f"-- python client ({backend} backend, gpuq {gpuq.__version__}, "
              f"Python {sys.version.split()[0]})")
        if "dispatch" not in args.skip:
            bench_dispatch(args, client)
        if "calls" not in args.skip:
            bench_calls(args, client)
        if "copy" not in args.skip:
            bench_copy(args, client)


if __name__ == "__main__":
    main()
