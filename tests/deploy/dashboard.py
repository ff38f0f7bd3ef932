"""The Grafana dashboard the chart ships (deploy/helm/baton/files/dashboards/baton.json): its queries,
and the metric names they read, for the tests that hold it to the metrics Baton exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "helm" / "baton" / "files" / "dashboards" / "baton.json"
DASHBOARD_LINK = ROOT / "deploy" / "grafana" / "baton.json"  # the same file, outside the chart

# A metric name in PromQL: not a label name (before `=`, `!=`, `=~` or inside by/without (...)),
# not a function (before `(`), not inside a string.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\([^)]*\)")
_NAME = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*(?:\(|=|!=|=~|!~))")
_KEYWORDS = {
    "sum",
    "avg",
    "max",
    "min",
    "count",
    "rate",
    "increase",
    "histogram_quantile",
    "by",
    "without",
    "le",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "label_values",
}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict) -> list[str]:
    """Every panel's PromQL, and the template variables' queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads (sample names as exposed: ``_total``, ``_bucket``, ...)."""
    expr = re.sub(r"label_values\(\s*(.*?),\s*\w+\s*\)", r"\1", expr)  # Grafana's: (metric{...}, label)
    bare = _GROUPING.sub("", _STRING.sub('""', expr))
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # range selectors ([$__rate_interval], [1h])
    bare = re.sub(r"\$\w+", "", bare)
    return {n for n in _NAME.findall(bare) if n not in _KEYWORDS and not re.fullmatch(r"[0-9.]+", n)}
