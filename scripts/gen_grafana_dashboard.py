"""Write compose/grafana/dashboards/fleetpulse.json, the Grafana dashboard of the compose stack.

    .venv/bin/python -m scripts.gen_grafana_dashboard       # rewrite the dashboard
    .venv/bin/python -m scripts.gen_grafana_dashboard --check  # exit 1 if the committed file differs

Panels are listed here as (title, unit, queries) per row; the layout, ids and boilerplate of
Grafana's JSON model are generated. tests/e2e/test_compose.py checks that every metric these
queries name is exposed by a running service. Metric meanings: docs/metrics.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from scripts.generated import write_or_check

OUT = Path(__file__).resolve().parents[1] / "compose" / "grafana" / "dashboards" / "fleetpulse.json"
W = "[$__rate_interval]"


def quantiles(metric: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le{', ' + by if by else ''}"
    legend = "{{" + by + "}} " if by else ""
    return [
        (f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{W})))", f"{legend}p{p}")
        for q, p in ((0.5, 50), (0.99, 99))
    ]


def none_is_zero(expr: str) -> str:
    """A count of events labelled by what happened (reason, outcome, code) has no series until
    the first event: read 0 then, not "No data" (which looks like a broken scrape)."""
    return f"{expr} or on() vector(0)"


Panel = tuple[str, str, list[tuple[str, str]]]
ROWS: list[tuple[str, list[Panel]]] = [
    ("Control loop", [
        ("Control-loop duration", "s", quantiles("fleetpulse_controller_loop_seconds")),
        ("Partitions owned per member", "short",
         [("fleetpulse_controller_partitions_owned", "{{instance}}")]),
        ("Ingest backlog (pending reports)", "short",
         [("sum by (instance) (fleetpulse_controller_ingest_pending)", "{{instance}}")]),
        ("Stalled (ingest behind, decisions held)", "short",
         [("fleetpulse_controller_stalled", "{{instance}}")]),
    ]),
    ("Ingest", [
        ("Report messages / s by kind and format", "short",
         [(f"sum by (kind, format) (rate(fleetpulse_controller_ingest_messages_total{W}))",
           "{{kind}} {{format}}")]),
        ("Report bytes / s by format", "Bps",
         [(f"sum by (format) (rate(fleetpulse_controller_ingest_bytes_total{W}))", "{{format}}")]),
        ("Heartbeats received / s", "short",
         [(f"sum(rate(fleetpulse_controller_heartbeats_received_total{W}))", "heartbeats")]),
        ("Rejected messages / s by reason", "short",
         [(none_is_zero(f"sum by (reason) (rate(fleetpulse_controller_rejected_total{W}))"), "{{reason}}")]),
    ]),
    ("Health", [
        ("Replicas by health state", "short",
         [("sum by (state) (fleetpulse_controller_health_replicas)", "{{state}}")]),
        ("Unhealthy verdicts by reason", "short",
         [(none_is_zero(f"sum by (reason) (increase(fleetpulse_controller_health_verdicts_total{W}))"),
           "{{reason}}")]),
        ("Probes / s by outcome", "short",
         [(none_is_zero(f"sum by (outcome) (rate(fleetpulse_controller_probe_outcomes_total{W}))"),
           "{{outcome}}"),
          (f"sum(rate(fleetpulse_controller_probes_total{W}))", "sent")]),
    ]),
    ("Autoscaling", [
        ("Replicas per deployment", "short",
         [("sum by (app, deployment, state) (fleetpulse_controller_replicas)",
           "{{app}}.{{deployment}} {{state}}")]),
        ("Demand (ongoing requests)", "short",
         [("sum by (app, deployment) (fleetpulse_controller_demand)", "{{app}}.{{deployment}}")]),
        ("Scaling decisions", "short",
         [(none_is_zero(f"sum by (app, deployment, direction) "
                        f"(increase(fleetpulse_controller_decisions_total{W}))"),
           "{{app}}.{{deployment}} {{direction}}")]),
    ]),
    ("Requests", [
        ("Router latency by deployment", "s",
         quantiles("fleetpulse_router_request_duration_seconds", "deployment")),
        ("Proxy latency by app", "s", quantiles("fleetpulse_proxy_request_duration_seconds", "app")),
        ("Queued at routers / held by the proxy", "short",
         [("sum by (deployment) (fleetpulse_router_queued_requests)", "queued {{deployment}}"),
          (none_is_zero("sum by (app) (fleetpulse_proxy_held_requests)"), "held {{app}}")]),
        ("Proxy requests / s by status", "reqps",
         [(f"sum by (code) (rate(fleetpulse_proxy_request_duration_seconds_count{W}))",
           "{{code}}")]),
    ]),
    ("Agents", [
        ("Replicas running / capacity per agent", "short",
         [("fleetpulse_agent_replicas_running", "running {{agent}}"),
          ("fleetpulse_agent_capacity", "capacity {{agent}}")]),
        ("Replica starts, exits, kills / s", "short",
         [(f"sum(rate(fleetpulse_agent_replica_starts_total{W}))", "starts"),
          (none_is_zero(f"sum by (code) (rate(fleetpulse_agent_replica_exits_total{W}))"), "exit {{code}}"),
          (f"sum(rate(fleetpulse_agent_replica_kills_total{W}))", "kills")]),
    ]),
    ("Recorder", [
        ("Recorded messages / s", "short",
         [(f"sum(rate(fleetpulse_recorder_messages_total{W}))", "messages")]),
        ("Bytes written / s", "Bps",
         [(f"sum(rate(fleetpulse_recorder_written_bytes_total{W}))", "written")]),
        ("Write errors", "short",
         [(f"sum(increase(fleetpulse_recorder_write_errors_total{W}))", "errors")]),
    ]),
]  # fmt: skip


def render() -> str:
    panels: list[dict[str, Any]] = []
    y, next_id = 0, 1
    for row_title, row in ROWS:
        panels.append({"type": "row", "title": row_title, "id": next_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        next_id, y = next_id + 1, y + 1
        width = 24 // len(row)
        for i, (title, unit, queries) in enumerate(row):
            panels.append({
                "type": "timeseries",
                "title": title,
                "id": next_id,
                "datasource": {"type": "prometheus", "uid": "prometheus"},
                "gridPos": {"h": 8, "w": width, "x": i * width, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "prometheus"}}
                    for j, (expr, legend) in enumerate(queries)
                ],
            })  # fmt: skip
            next_id += 1
        y += 8
    dashboard = {
        "uid": "fleetpulse",
        "title": "fleetpulse",
        "description": "Control loop, ingest, health, autoscaling, requests, agents, recorder "
        "(generated by scripts/gen_grafana_dashboard.py; metrics: docs/metrics.md)",
        "tags": ["fleetpulse"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "panels": panels,
    }
    return json.dumps(dashboard, indent=2) + "\n"


if __name__ == "__main__":
    sys.exit(write_or_check(__doc__, OUT, render))
