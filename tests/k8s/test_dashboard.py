"""k8s/grafana-dashboard.json: every panel queries metrics the code exports (deployments/metrics.py),
and every exported metric has a panel."""
from __future__ import annotations

import json
import re

from support import REPO

DASHBOARD = REPO / "k8s" / "grafana-dashboard.json"
DEFINED = re.compile(r'(?:Counter|Gauge|Histogram)\(\s*"(lwf_[a-z_]+)"')
QUERIED = re.compile(r"ray_(lwf_[a-z_]+)")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def exported() -> set[str]:
    return set(DEFINED.findall((REPO / "deployments" / "metrics.py").read_text()))


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out += [p, *p.get("panels", [])]
    return [p for p in out if p["type"] != "row"]


def test_every_panel_queries_exported_metrics_and_every_metric_is_shown():
    dash = json.loads(DASHBOARD.read_text())
    defined = exported()
    assert len(defined) >= 8, defined
    shown: set[str] = set()
    for panel in panels(dash):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = {base_name(n) for n in QUERIED.findall(target["expr"])}
            assert names, f"{panel['title']}: {target['expr']} queries no ray_lwf_* metric"
            assert names <= defined, f"{panel['title']}: unknown metrics {names - defined}"
            shown |= names
            assert target["datasource"]["uid"] == "${datasource}"
    assert shown == defined, f"metrics without a panel: {defined - shown}"


def test_the_dashboard_is_importable():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "application"}
    for panel in panels(dash):
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
