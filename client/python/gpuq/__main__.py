"""``python -m gpuq``: a few of the ``gpuq`` CLI's commands, for quick checks.

Exit status as the CLI's: 0 ok, 1 refused or job failed, 2 usage, 3 daemon
unreachable (or gone).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Callable, Dict, List, Optional

from . import Client, GpuqError, Job, __version__
from .buffer import Buffer, human_bytes

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def _size(text: str) -> int:
    """``4096``, ``64K``, ``1.5G``, ``64KiB`` (powers of 1024), ``100MB`` (of 1000), as the CLI reads sizes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(?:([KMGT])(I?)(B?))?\s*", text, re.IGNORECASE)
    if m and m[3] and not m[4]:
        m = None  # "Ki" without the B
    base = 1000 if m and m[4] and not m[3] else 1024
    value = float(m[1]) * base ** "_KMGT".index((m[2] or "_").upper()) if m else 0.0
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (4096, 64K, 1.5G)")
    return int(value)


def _show_job(job: Job) -> str:
    r = job.result or {}
    if job.op == "alloc" and job.state == "done":  # as gpuq prints it
        dtype = r.get("dtype") or "bytes"
        return (f"alloc {r.get('name')}@{r.get('device', job.record.get('device', 0))}: "
                f"{human_bytes(int(r.get('bytes') or 0))}"
                + (f" ({r.get('count')} x {dtype})" if dtype != "bytes" else ""))
    detail = ", ".join(f"{k} {v}" for k, v in r.items() if not isinstance(v, (dict, list)))
    return f"job {job.id} {job.op} {job.state}" + (f": {detail}" if detail else "")


def _duration(seconds: float) -> str:
    """``0.25s``, ``42s``, ``1m49s``, ``3h05m``: an age as people read it."""
    if seconds < 10:
        return f"{seconds:.2g}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _cell(key: str, value: Any) -> str:
    """A table cell: sizes in KiB/MiB/GiB, ages and times as durations, shapes as AxB,
    other floats to a few digits (never a 17-digit repr)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in ("bytes", "mem_total", "mem_free", "mem_used", "region_bytes") and \
            isinstance(value, int):
        return human_bytes(value)
    if key.endswith("_s") and isinstance(value, (int, float)):
        return _duration(float(value))
    if key == "shape" and isinstance(value, list):
        return "x".join(str(n) for n in value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _heading(key: str) -> str:
    """``age_s`` is AGE: its cells say their unit."""
    return (key[:-2] if key.endswith("_s") else key).upper()


def _table(rows: List[Dict[str, Any]], keys: List[str]) -> str:
    cells = [[_cell(k, row.get(k)) for k in keys] for row in rows]
    widths = [max([len(k)] + [len(c[i]) for c in cells]) for i, k in enumerate(keys)]
    lines = ["  ".join(_heading(k).ljust(w) for k, w in zip(keys, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--detach", action="store_true", help="print the job id at once")
    p.add_argument("--timeout", type=float, help="seconds to wait for the job")
    p.add_argument("--priority", choices=["high", "normal", "low"])


def _job_kw(a: argparse.Namespace) -> Dict[str, Any]:
    return {"detach": a.detach, "timeout": a.timeout, "priority": a.priority}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuq", description=__doc__.splitlines()[0])
    p.add_argument("--socket", help="gpuqd's socket (default: $GPUQ_SOCKET, as gpuq)")
    p.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    p.add_argument("--version", action="version", version=f"gpuq (Python) {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in [("ping", "version, backend, devices"), ("devices", "per device"),
                       ("buffers", "your buffers"), ("jobs", "your jobs"),
                       ("metrics", "Prometheus text"), ("stats", "per-device counters")]:
        sub.add_parser(name, help=text)
    for name in ("status", "wait", "cancel"):
        s = sub.add_parser(name, help=f"{name} a job")
        s.add_argument("job", type=int)
        if name == "wait":
            s.add_argument("--timeout", type=float, help="seconds")
    s = sub.add_parser("alloc", help="allocate a buffer")
    s.add_argument("name")
    s.add_argument("--bytes", type=_size, dest="nbytes")
    s.add_argument("--count", type=int)
    s.add_argument("--dtype")
    s.add_argument("--device", type=int)
    _job_options(s)
    for name, text in [("free", "free a buffer"), ("checksum", "the buffer's hash")]:
        s = sub.add_parser(name, help=text)
        s.add_argument("buffer")
        _job_options(s)
    s = sub.add_parser("fill", help="zero | value V | iota | random SEED")
    # V may be -2.5e-1 or -inf, as gpuq takes it: argparse reads only -2 and -0.5 as
    # numbers rather than options.
    s._negative_number_matcher = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)
    s.add_argument("buffer")
    s.add_argument("pattern", choices=["zero", "value", "iota", "random"])
    s.add_argument("arg", nargs="?", help="the value, or the seed")
    _job_options(s)
    s = sub.add_parser("put", help="file (or - for stdin) -> buffer")
    s.add_argument("file")
    s.add_argument("buffer")
    s.add_argument("--verify", action="store_true")
    _job_options(s)
    s = sub.add_parser("get", help="buffer -> file (or - for stdout)")
    s.add_argument("buffer")
    s.add_argument("file")
    s.add_argument("--verify", action="store_true")
    _job_options(s)
    s = sub.add_parser("plot", help="draw a `gpuq --json bench` result into a PNG (matplotlib)")
    s.add_argument("result", help="the JSON that `gpuq --json bench KIND` printed")
    s.add_argument("-o", "--output", required=True, help="the picture to write (.png, .svg, .pdf)")
    s = sub.add_parser("noop", help="an empty job through a worker")
    s.add_argument("--device", type=int)
    _job_options(s)
    return p


def _fill_args(a: argparse.Namespace) -> Dict[str, Any]:
    """fill's value or seed; ValueError worded as gpuq's usage errors."""
    if a.pattern == "value":
        for kind in (int, float):
            try:
                return {"value": kind(a.arg)}
            except ValueError:
                pass
        raise ValueError(f"V '{a.arg}' is not a number (an integer, or a float such as "
                         "0.5 or 1e-3)")
    if a.pattern == "random":
        try:
            seed = int(a.arg)
        except ValueError:
            seed = -1
        if not 0 <= seed < 1 << 64:
            raise ValueError(f"SEED '{a.arg}' is not a number (0 to 2^64-1)")
        return {"seed": seed}
    return {}


def _alloc_job(made: Any) -> Any:
    """alloc's Job (shown as gpuq shows an alloc, and its record for --json), not the
    Buffer alloc returns unless detached."""
    return made.job if isinstance(made, Buffer) and made.job is not None else made


def _run(c: Client, a: argparse.Namespace) -> Any:
    """Runs the command: the object to print (a reply map, a list, a Job or text)."""
    commands: Dict[str, Callable[[], Any]] = {
        "ping": c.ping, "devices": c.devices, "buffers": c.buffers, "jobs": c.jobs,
        "metrics": c.metrics, "stats": c.stats,
        "status": lambda: c.status(a.job),
        "wait": lambda: c.wait(a.job, timeout=a.timeout),
        "cancel": lambda: {"cancel_requested": c.cancel(a.job)},
        "alloc": lambda: _alloc_job(c.alloc(a.name, nbytes=a.nbytes, count=a.count,
                                            dtype=a.dtype, device=a.device, **_job_kw(a))),
        "free": lambda: c.free(a.buffer, **_job_kw(a)),
        "checksum": lambda: c.checksum(a.buffer, **_job_kw(a)),
        "fill": lambda: c.fill(a.buffer, a.pattern, **a.fill, **_job_kw(a)),
        "put": lambda: c.put(sys.stdin.fileno() if a.file == "-" else a.file, a.buffer,
                             verify=a.verify or None, **_job_kw(a)),
        "get": lambda: c.get(a.buffer, sys.stdout.fileno() if a.file == "-" else a.file,
                             verify=a.verify or None, **_job_kw(a)),
        "noop": lambda: c.noop(a.device, **_job_kw(a)),
    }
    return commands[a.command]()


def _render(out: Any, as_json: bool, command: str = "") -> str:
    plain = out.record if isinstance(out, Job) else (
        [j.record if isinstance(j, Job) else j for j in out] if isinstance(out, list) else out)
    if as_json:
        return json.dumps(plain, indent=None, default=str)
    if isinstance(out, list) and not out:
        return f"no {command}"  # "no buffers", as gpuq says it
    if isinstance(out, Job):
        return _show_job(out)
    if isinstance(out, str):
        return out.rstrip("\n")
    if isinstance(out, list) and out and isinstance(out[0], Job):
        return "\n".join(_show_job(j) for j in out)
    if isinstance(out, list) and out and isinstance(out[0], dict):
        keys = [k for k in out[0] if not isinstance(out[0][k], (dict, list))]
        if any("shape" in row for row in out):  # buffers: the shape beside the dtype
            keys.insert(keys.index("dtype") + 1 if "dtype" in keys else len(keys), "shape")
        return _table(out, keys)
    if isinstance(out, dict):
        return "\n".join(f"{k}: {v}" for k, v in out.items())
    return str(out)


def _plot(src: str, dst: str) -> int:
    """No daemon involved: a result file in, a picture out."""
    try:
        from .plot import plot_file
        kind = plot_file(src, dst)
    except ImportError as exc:
        print(f"python -m gpuq plot: needs matplotlib ({exc}); on Debian: "
              "apt-get install python3-matplotlib", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError, KeyError) as exc:
        print(f"python -m gpuq plot: {src}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{dst}: {kind} benchmark")
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "fill" and args.pattern in ("value", "random") and args.arg is None:
        parser.error(f"fill {args.pattern} needs {'a value' if args.pattern == 'value' else 'a seed'}")
    if args.command == "fill":
        try:
            args.fill = _fill_args(args)
        except ValueError as exc:
            parser.error(f"fill: {exc}")
    if args.command == "plot":
        return _plot(args.result, args.output)
    try:
        with Client(args.socket) as client:
            out = _run(client, args)
    except GpuqError as exc:
        print(f"python -m gpuq {args.command}: {exc.code}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (ConnectionError, TimeoutError) as exc:  # gone, or not answering
        print(f"python -m gpuq {args.command}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (OSError, ValueError) as exc:
        print(f"python -m gpuq {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    text = _render(out, args.json, args.command)
    if text and not (args.command == "get" and args.file == "-"):
        print(text)
    elif text:
        print(text, file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
