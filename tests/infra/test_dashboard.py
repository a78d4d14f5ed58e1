"""The Grafana dashboard only queries metrics the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fnrt.tracing.metrics import FunctionState, Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "fnrt-dashboard.json"


def exported_names() -> set[str]:
    metrics = Metrics(gpu=False)
    metrics.watch(lambda: [FunctionState("mlp", "v-1", 1, 0)])
    metrics.request("mlp", "v-1", 200, 0.01)
    metrics.batch("mlp", 1, 0.005, [0.001])
    metrics.load("mlp", "l2", 10, 0.2)
    metrics.prewarm("mlp", "hit")
    metrics.watch_jobs(lambda: {"mlp": 10}, lambda: 1)
    metrics.watch_spares(lambda: 1, lambda: 3)
    names = set()
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        names.update(s.name for s in family.samples)
    # GPU gauges exist only where NVML finds a GPU: their names are fixed in tracing/metrics.py
    names |= {
        "fnrt_gpu_utilization_ratio",
        "fnrt_gpu_memory_used_bytes",
        "fnrt_gpu_memory_total_bytes",
    }
    return names


def test_every_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    used = {m for e in exprs for m in re.findall(r"\b((?:fnrt|process)_[a-z_]+)\b", e)}
    missing = used - exported_names()
    assert not missing, missing
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
