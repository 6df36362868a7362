"""The Grafana dashboard (etc/grafana-gpuq.json) against a live gpuqd's metrics.

Usage: python3 tests/dashboard_check.py DASHBOARD.json METRICS.txt
Checks that the dashboard is valid JSON, that every metric its queries use
is one gpuqd exports (a histogram's _bucket/_sum/_count series count as the
histogram), and that every label its queries group or name series by is a
label of such a metric. Prints ok/FAIL lines and exits 1 on a failure.
"""
import json
import re
import sys


def metric_labels(text):
    """{metric name: set of label names} from Prometheus text output."""
    found = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            found.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?", line)
            name = re.sub(r"_(bucket|sum|count)$", "", m[1]) if m[1] not in found else m[1]
            found.setdefault(name, set()).update(re.findall(r"(\w+)=\"", m[3] or ""))
    return found


def main(dashboard_path, metrics_path):
    failures = 0
    try:
        dash = json.load(open(dashboard_path, encoding="utf-8"))
    except ValueError as exc:
        print(f"FAIL dashboard/valid_json: {exc}")
        return 1
    print("ok   dashboard/valid_json")
    exported = metric_labels(open(metrics_path, encoding="utf-8").read())
    exprs = [t["expr"] for p in dash.get("panels", []) for t in p.get("targets", [])]
    exprs += [v["query"] for v in dash.get("templating", {}).get("list", []) if v.get("type") == "query"]
    for expr in exprs:
        for name in sorted(set(re.findall(r"\bgpuq_[a-z_]+", expr))):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in exported and base not in exported:
                print(f"FAIL dashboard/metric_{name}: not in gpuq metrics (query: {expr})")
                failures += 1
                continue
            labels = exported.get(name, exported.get(base, set())) | {"le"}
            used = set(re.findall(r"by \(([^)]*)\)", expr))
            used = {l.strip() for group in used for l in group.split(",")}
            used |= set(re.findall(r"(\w+)=~?\"", expr))
            missing = sorted(l for l in used if l not in labels and not any(
                l in exported.get(other, set()) for other in re.findall(r"\bgpuq_[a-z_]+", expr)))
            if missing:
                print(f"FAIL dashboard/labels_{name}: {', '.join(missing)} not labels of it")
                failures += 1
            else:
                print(f"ok   dashboard/metric_{name}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
