"""What the largest job the operator accepts costs it: one reconcile pass, the event loop, memory.

The largest accepted job: a spec of about 1 MiB (the job size limit; the bulk in environment kwargs, which
only the learner reads), three pod templates of 32,000 bytes (the per-template bound is 32 KiB) and 62
rollout workers, so the templates times their pods come to 2,048,000 bytes (the per-job bound is 2 MiB).
The real `kuberl-operator` process (default settings) runs against the tests' real control plane; a job of the
example's size (4 workers, no template) is measured in the same operator for comparison, alternating,
--repeats times each. For each job: create request -> all its pods exist; then, from the operator's own
/metrics: the reconcile passes' time, how late its event loop woke a 0.1 s timer (the most any one task
held it up; the target is under 100 ms), and its peak RSS (VmHWM) against the chart's 256 MiB limit.

    .venv/bin/python bench/bench_operator_large_job.py [--repeats 3] [--output bench/results/operator_large_job.json]
"""

from __future__ import annotations

import copy
import json
import sys
import time
import urllib.request
from pathlib import Path

from bench_operator import NS, _Bench, pod_names, real_cluster, rss_mb, running_operator
from common import RESULTS, Bench, free_port, load_average, stats
from prometheus_client.parser import text_string_to_metric_families

TEMPLATE_BYTES = 32_000
LARGE_WORKERS = 62
KWARGS_BYTES = 900_000
OPERATOR_MEMORY_LIMIT_MB = 256


def padded(size: int) -> dict:
    """A schema-valid pod template of exactly `size` bytes as compact JSON (one long annotation), counted as
    kuberl.api.pod_template.template_bytes counts (not imported: the script also measures older code)."""
    template = {"metadata": {"annotations": {"note": ""}}}
    template["metadata"]["annotations"]["note"] = "x" * (size - len(json.dumps(template, separators=(",", ":"))))
    return template


def largest(base: dict, name: str) -> dict:
    body = copy.deepcopy(base)
    body["metadata"] = {"name": name, "namespace": NS}
    spec = body["spec"]
    spec["rolloutWorkers"]["replicas"] = LARGE_WORKERS
    spec["rolloutWorkers"]["template"] = padded(TEMPLATE_BYTES)
    spec["learner"] = {**spec.get("learner", {}), "template": padded(TEMPLATE_BYTES)}
    spec["head"] = {**spec.get("head", {}), "template": padded(TEMPLATE_BYTES)}
    # A module id is the learner's to import and check: the operator never does, whatever its kwargs.
    spec["environment"] = {"id": "user_envs:Corridor", "kwargs": {"blob": "y" * KWARGS_BYTES}}
    return body


def scrape(port: int) -> dict[str, dict]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def lag_report(before: dict, after: dict) -> dict:
    """The event-loop lag observed between two scrapes: count, ticks later than 100 ms, the largest bucket."""
    def bucket(metrics: dict, le: str) -> float:
        return metrics.get("kuberl_operator_event_loop_lag_seconds_bucket", {}).get((("le", le),), 0.0)

    les = ["0.001", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "+Inf"]
    counts = {le: bucket(after, le) - bucket(before, le) for le in les}
    total = counts["+Inf"]
    worst = next((le for le in les if counts[le] == total), "+Inf")
    return {"ticks": int(total), "ticks_over_100ms": int(total - counts["0.1"]), "max_lag_at_most_s": worst}


def passes(before: dict, after: dict) -> dict:
    name = "kuberl_operator_reconcile_duration_seconds"
    key = (("handler", "reconcile"),)
    count = after[f"{name}_count"][key] - before.get(f"{name}_count", {}).get(key, 0.0)
    total = after[f"{name}_sum"][key] - before.get(f"{name}_sum", {}).get(key, 0.0)
    return {"passes": int(count), "mean_pass_s": round(total / count, 4) if count else None}


def measure(bench: _Bench, metrics_port: int, body: dict, workers: int) -> dict:
    before = scrape(metrics_port)
    t0 = time.perf_counter()
    bench.custom.create_namespaced_custom_object("kuberl.dev", "v1alpha1", NS, "rltrainingjobs", body,
                                                 _preload_content=False)
    created = bench.clock.wait_all(pod_names(body["metadata"]["name"], workers), timeout=300) - t0
    time.sleep(1.0)  # the status write and a quiet pass after it, inside the window measured
    after = scrape(metrics_port)
    return {"all_pods_created_s": round(created, 3), **passes(before, after), **lag_report(before, after),
            "loadavg_1min": load_average()[0]}


def main() -> int:
    bench_run = Bench(__doc__, RESULTS / "operator_large_job.json",
                      lambda parser: parser.add_argument("--repeats", type=int, default=3))
    args = bench_run.args

    import yaml

    base = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "cartpole-ppo.yaml").read_text())
    runs: dict[str, list[dict]] = {"example (4 workers, no template)": [], "largest accepted": []}
    with real_cluster() as (cluster, tmp):
        bench = _Bench(cluster, Path(tmp))
        port = free_port()
        with running_operator(cluster, Path(tmp) / "operator.log", metrics_port=port) as operator:
            for i in range(args.repeats):
                small = copy.deepcopy(base)
                small["metadata"] = {"name": f"example-{i}", "namespace": NS}
                small["spec"]["rolloutWorkers"]["replicas"] = 4
                runs["example (4 workers, no template)"].append(measure(bench, port, small, 4))
                runs["largest accepted"].append(measure(bench, port, largest(base, f"largest-{i}"), LARGE_WORKERS))
                print({name: r[-1] for name, r in runs.items()}, flush=True)
            memory = rss_mb(operator.pid)
        bench.clock.stop = True
    summary = {name: {"all_pods_created_s": stats([r["all_pods_created_s"] for r in rs]),
                      "mean_pass_s": stats([r["mean_pass_s"] for r in rs if r["mean_pass_s"] is not None]),
                      "ticks_over_100ms": sum(r["ticks_over_100ms"] for r in rs),
                      "max_lag_at_most_s": max((r["max_lag_at_most_s"] for r in rs), key=lambda le: float(le))}
               for name, rs in runs.items()}
    results = {
        "largest_job": {"spec_bytes": len(json.dumps(largest(base, "x")["spec"])),
                        "template_bytes": TEMPLATE_BYTES, "workers": LARGE_WORKERS,
                        "pods": LARGE_WORKERS + 2},
        "summary": summary,
        "operator_rss_peak_mb": round(memory["VmHWM"], 1),
        "operator_memory_limit_mb": OPERATOR_MEMORY_LIMIT_MB,
        "targets": {"no event-loop tick later than 100 ms": all(s["ticks_over_100ms"] == 0 for s in summary.values()),
                    "peak RSS under the 256 MiB limit": memory["VmHWM"] < OPERATOR_MEMORY_LIMIT_MB},
        "runs": runs,
        "machine_notes": "the control plane and the operator (subprocess) share the machine's cores",
    }
    previous = bench_run.previous()
    if "before" in previous:  # the older operator's run, kept beside this one (see its "what")
        results["before"] = previous["before"]
    bench_run.write(results, summary)
    print(f"{summary} peak RSS {results['operator_rss_peak_mb']} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
