"""Reading a broker's /metrics, and the metric names the shipped dashboard and alert rules use."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "txmq-dashboard.json"
ALERTS = ROOT / "docs" / "prometheus" / "txmq-alerts.yml"
#: rocketmq-exporter's names as recording rules over txmq's series.
EXPORTER_RULES = ROOT / "docs" / "prometheus" / "rocketmq-exporter-rules.yml"
#: The constant labels every sample of /metrics carries (the broker's identity).
IDENTITY = ("cluster", "broker")

_NAME = re.compile(r"\btxmq_[A-Za-z0-9_]+")

#: Names only a broker group's replicas export (cluster mode), leader or follower.
CLUSTER_ONLY = frozenset(
    {
        "txmq_replication_lag_bytes",
        "txmq_replication_lag_seconds",
        "txmq_min_in_sync_replicas",
        "txmq_follower_lag_bytes",
        "txmq_follower_lag_seconds",
    }
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, *, identity: bool = False) -> Samples:
    """``{(sample name, labels): value}`` of one /metrics answer; without ``identity`` the
    constant labels every sample carries (:data:`IDENTITY`) are left out of the keys."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = (
                s.labels if identity else {k: v for k, v in s.labels.items() if k not in IDENTITY}
            )
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "query", "definition") and isinstance(v, str):
                yield v
            else:
                yield from _exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _exprs(v)


def referenced() -> dict[str, set[str]]:
    """``{file: txmq_* names its PromQL expressions use}`` for the dashboard and the rules."""
    dashboard = json.loads(DASHBOARD.read_text())
    rules = yaml.safe_load(ALERTS.read_text())
    exporter = yaml.safe_load(EXPORTER_RULES.read_text())
    out: dict[str, set[str]] = {}
    for path, doc in ((DASHBOARD, dashboard), (ALERTS, rules), (EXPORTER_RULES, exporter)):
        out[path.name] = {m for e in _exprs(doc) for m in _NAME.findall(e)}
    return out
