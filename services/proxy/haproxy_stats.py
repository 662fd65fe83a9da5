"""What HAProxy saw of the requests it sent straight to replicas, as the proxy's metrics.

How it works: the front door reads `show stat` (CSV) over the admin socket every few seconds;
`parse_stats` (pure) keeps the backend rows of the apps (`app_<app>`: power-of-two choices,
`mux_<app>`: multiplexed requests by model id) and `FrontStats`, a Prometheus collector on the
proxy's registry, serves the last reading: responses by status class, requests queued in
HAProxy, and HAProxy's mean time of the backend's last 1,024 requests. Requests that reach the
Python proxy are counted there (`fleetpulse_proxy_request_duration_seconds`), not here: a request
sent to the Python proxy as a backend's backup server shows in both.

HAProxy's counters start again at a reload (a new worker); Prometheus' `rate` reads that as a
counter reset.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CODES = ("1xx", "2xx", "3xx", "4xx", "5xx", "other")
_BACKENDS = {"app_": "random", "mux_": "model"}


@dataclass(frozen=True, slots=True)
class BackendStats:
    app: str
    balance: str
    """"random" (the app's backend) or "model" (multiplexed requests)."""
    responses: tuple[int, ...]
    """By `CODES`."""
    queued: int
    mean_time_s: float


def parse_stats(text: str) -> list[BackendStats]:
    """The app backends' rows of `show stat` (other rows, and rows that do not parse, skipped)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        return []
    rows = csv.DictReader([lines[0][2:], *lines[1:]])
    out: list[BackendStats] = []
    for row in rows:
        if row.get("svname") != "BACKEND":
            continue
        name = row.get("pxname") or ""
        prefix = name[:4]
        if prefix not in _BACKENDS:
            continue
        try:
            out.append(
                BackendStats(
                    app=name[4:],
                    balance=_BACKENDS[prefix],
                    responses=tuple(_int(row.get(f"hrsp_{c}")) for c in CODES),
                    queued=_int(row.get("qcur")),
                    mean_time_s=_int(row.get("ttime")) / 1000.0,
                )
            )
        except ValueError:
            continue
    return out


def _int(value: str | None) -> int:
    return int(value) if value else 0


class FrontStats(Collector):
    def __init__(self) -> None:
        self.backends: Sequence[BackendStats] = ()

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        responses = CounterMetricFamily(
            "fleetpulse_proxy_front_responses",
            "Responses HAProxy sent for requests it routed to an app's replicas, by status class "
            "(balance: random, or model for multiplexed requests)",
            labels=["app", "balance", "code"],
        )
        queued = GaugeMetricFamily(
            "fleetpulse_proxy_front_queued_requests",
            "Requests waiting in HAProxy for a replica of the app to have room",
            labels=["app", "balance"],
        )
        mean = GaugeMetricFamily(
            "fleetpulse_proxy_front_response_time_seconds",
            "HAProxy's mean time of the app backend's last 1,024 requests, until the last byte",
            labels=["app", "balance"],
        )
        for b in self.backends:
            for code, count in zip(CODES, b.responses, strict=True):
                responses.add_metric([b.app, b.balance, code], count)
            queued.add_metric([b.app, b.balance], b.queued)
            mean.add_metric([b.app, b.balance], b.mean_time_s)
        yield responses
        yield queued
        yield mean
