"""Pictures of ``gpuq --json bench KIND`` results: ``python -m gpuq plot RESULT.json -o FILE.png``.

Each benchmark's JSON is drawn as people read it: bandwidth against size
with the same run's ceiling as a dashed line (copy, allreduce, the other
collectives), latency percentiles as bars (dispatch, the scheduler's
head-of-line), and the chain and attach figures beside their baselines.
matplotlib comes from the distribution (Debian's ``python3-matplotlib``);
it is imported only here, so the client itself never needs it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Tuple

Result = Dict[str, Any]


def bench_kind(result: Result) -> str:
    """Which benchmark a ``gpuq --json bench`` result came from."""
    if "bench" in result:
        return str(result["bench"])
    job = result.get("job") or {}
    if job.get("op") == "bench_chain":
        return "chain"
    raise ValueError("not a gpuq benchmark result: no 'bench' key and no bench_chain job")


def _figure(panels: int):
    import matplotlib
    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt
    cols = min(2, panels)
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for unused in flat[panels:]:
        unused.set_visible(False)
    return fig, flat[:panels]


def _size_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.grid(True, which="both", alpha=0.3)


def _bandwidth_panel(ax, title: str, rows: List[Result]) -> None:
    """GB/s against bytes, one line per method; ceilings and baselines dashed."""
    methods: Dict[str, List[Tuple[int, float]]] = {}
    roles: Dict[str, str] = {}
    for row in rows:
        methods.setdefault(row["method"], []).append((row["bytes"], row["gbps"]))
        roles[row["method"]] = row.get("role", "gpuq")
    for method, points in methods.items():
        points.sort()
        style = "--" if roles[method] != "gpuq" else "-"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=method)
    _size_axis(ax)
    ax.set_ylabel("GB/s")
    ax.set_title(title)
    ax.legend(fontsize="small")


def plot_copy(result: Result):
    rows = list(result.get("bench_copy", {}).get("job", {}).get("result", {}).get("rows", []))
    rows += result.get("bench_d2d", {}).get("job", {}).get("result", {}).get("rows", [])
    groups: Dict[str, List[Result]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    fig, axes = _figure(max(1, len(groups)))
    for ax, (group, grows) in zip(axes, groups.items()):
        _bandwidth_panel(ax, f"copy {group}", grows)
    return fig


def plot_collective(result: Result):
    """allreduce and the other collectives: bus bandwidth of gpuqd beside the raw NCCL loop."""
    results = result.get("results", [])
    rows = []
    for r in results:
        rows.append({"method": "raw NCCL loop", "role": "ceiling", "bytes": r["bytes"],
                     "gbps": r["raw_busbw_gbps"]})
        rows.append({"method": "gpuqd jobs", "role": "gpuq", "bytes": r["bytes"],
                     "gbps": r["gpuqd_busbw_gbps"]})
    fig, (bw, added) = _figure(2)
    _bandwidth_panel(bw, f"{result['bench']} ({result.get('ranks', '?')} ranks, "
                         f"{result.get('backend', '?')}): bus bandwidth", rows)
    added.plot([r["bytes"] for r in results], [r["raw_us"] for r in results], "--", marker="o",
               label="raw NCCL loop")
    added.plot([r["bytes"] for r in results], [r["gpuqd_us"] for r in results], "-", marker="o",
               label="gpuqd jobs")
    _size_axis(added)
    added.set_yscale("log")
    added.set_ylabel("µs per operation")
    added.set_title("time per operation")
    added.legend(fontsize="small")
    return fig


def _percentile_bars(ax, title: str, labels: List[str], series: Dict[str, List[float]]) -> None:
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, fontsize="small")
    ax.set_ylabel("µs")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)


def plot_dispatch(result: Result):
    rows = result.get("results", [])
    labels = [f"{r['kind']}\n{r['clients']} client{'s' if r['clients'] != 1 else ''}" for r in rows]
    fig, (ax,) = _figure(1)
    _percentile_bars(ax, "request latency (echo is the bare socket)", labels,
                     {"p50": [r["p50_us"] for r in rows], "p99": [r["p99_us"] for r in rows]})
    return fig


def plot_sched(result: Result):
    hol = result.get("parts", {}).get("head_of_line", {}).get("figures", {})
    kinds = [k for k in ("checksum", "put", "get") if f"{k}_idle_p50_us" in hol]
    fig, (ax, over) = _figure(2)
    series = {f"{state} {p}": [hol[f"{k}_{state}_{p}_us"] for k in kinds]
              for state in ("idle", "busy") for p in ("p50", "p99")}
    _percentile_bars(ax, "a small job's latency, idle and behind a long one", kinds, series)
    ov = result.get("parts", {}).get("overlap", {}).get("figures", {})
    names = [("raw_serial_s", "raw, one after another"), ("raw_together_s", "raw, together"),
             ("serial_s", "gpuq, one after another"), ("together_s", "gpuq, together")]
    shown = [(label, ov[key]) for key, label in names if key in ov]
    over.barh([s[0] for s in shown], [s[1] for s in shown],
              color=["grey", "grey", "tab:blue", "tab:blue"][:len(shown)])
    over.set_xlabel("seconds")
    over.set_title("a put, a get and a chain: overlap")
    return fig


def plot_chain(result: Result):
    res = result["job"]["result"]
    fig, (launch, bw) = _figure(2)
    ops = [str(r["ops"]) for r in res.get("launch", [])]
    _percentile_bars(launch, "launch-bound chains: µs per kernel", ops,
                     {"eager": [r["eager_us_per_kernel"] for r in res["launch"]],
                      "graph": [r["graph_us_per_kernel"] for r in res["launch"]]})
    launch.set_xlabel("ops in the chain")
    band = res.get("bandwidth", {})
    names = ["eager", "graph", "fused", "compiled"]
    values = [band.get(f"{n}_gbps", 0.0) for n in names]
    bw.bar(names, values, color="tab:blue")
    if "memcpy_gbps" in band:
        bw.axhline(band["memcpy_gbps"], linestyle="--", color="grey", label="cudaMemcpy D2D")
        bw.legend(fontsize="small")
    bw.set_ylabel("GB/s")
    bw.set_title(f"bandwidth-bound chain over {band.get('bytes', 0) >> 20} MiB")
    return fig


def plot_attach(result: Result):
    fig, (ax,) = _figure(1)
    names = [("cold_ms", "new process attach"), ("warm_ms", "attach, driver warm"),
             ("get_ms", "gpuq get (staged)"), ("copy_ms", "cudaMemcpy to pinned"),
             ("attach_release_ms", "attach and release per use"),
             ("kept_use_ms", "use of a kept attachment")]
    names = [(key, label) for key, label in names if key in result]  # older runs lack some
    ax.barh([label for _, label in names], [result[key] for key, _ in names])
    ax.axvline(result.get("target_ms", 0), linestyle="--", color="grey", label="target")
    ax.set_xscale("log")
    ax.set_xlabel("ms")
    ax.set_title(f"attach of a {result['bytes'] >> 20} MiB buffer")
    ax.legend(fontsize="small")
    return fig


PLOTTERS: Dict[str, Callable[..., Any]] = {
    "copy": plot_copy, "allreduce": plot_collective, "dispatch": plot_dispatch,
    "sched": plot_sched, "chain": plot_chain, "attach": plot_attach,
}


def plot(result: Result, path: str) -> str:
    """Draws ``result`` (one ``gpuq --json bench`` output) into ``path``; returns its kind."""
    kind = bench_kind(result)
    plotter = PLOTTERS.get(kind, plot_collective if "results" in result and
                           "raw_busbw_gbps" in (result["results"] or [{}])[0] else None)
    if plotter is None:
        raise ValueError(f"no plot for benchmark '{kind}' (known: {', '.join(sorted(PLOTTERS))}, "
                         "and every collective)")
    fig = plotter(result)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return kind


def plot_file(src: str, dst: str) -> str:
    """``python -m gpuq plot``: reads the JSON in ``src`` (the last JSON line, so a log works too)."""
    with open(src, encoding="utf-8") as f:
        lines = [line for line in f if line.lstrip().startswith("{")]
    if not lines:
        raise ValueError(f"{src}: no JSON object (run `gpuq --json bench KIND > {src}`)")
    return plot(json.loads(lines[-1]), dst)
