"""Front-door metrics from HAProxy's `show stat` (services/proxy/haproxy_stats.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from services.proxy.haproxy_stats import FrontStats, parse_stats

HEADER = "# pxname,svname,qcur,qmax,scur,stot,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,ttime,"
STAT = "\n".join([
    HEADER,
    "fp_front,FRONTEND,,,3,100,0,90,0,5,5,0,,",
    "app_shop,s0,0,0,1,50,0,48,0,1,1,0,3,",
    "app_shop,BACKEND,2,4,1,50,0,48,0,1,1,0,3,",
    "mux_shop,BACKEND,0,0,0,7,0,7,0,0,0,0,12,",
    "fp_python,BACKEND,0,0,0,40,0,35,0,4,1,0,9,",
    "app_bad,BACKEND,x,0,0,0,0,0,0,0,0,0,0,",
    "",
])  # fmt: skip


def test_only_the_app_backends_are_read() -> None:
    got = parse_stats(STAT)
    assert [(b.app, b.balance, b.queued, b.mean_time_s) for b in got] == [
        ("shop", "random", 2, 0.003),
        ("shop", "model", 0, 0.012),
    ]
    assert got[0].responses == (0, 48, 0, 1, 1, 0)


def test_garbage_is_no_stats() -> None:
    assert parse_stats("") == []
    assert parse_stats("Unknown command\n") == []


def test_the_collector_serves_the_last_reading() -> None:
    registry = CollectorRegistry()
    stats = FrontStats()
    registry.register(stats)
    assert b"fleetpulse_proxy_front_responses_total{" not in generate_latest(registry)
    stats.backends = parse_stats(STAT)
    text = generate_latest(registry).decode()
    assert (
        'fleetpulse_proxy_front_responses_total{app="shop",balance="random",code="2xx"} 48.0'
        in text
    )
    assert 'fleetpulse_proxy_front_queued_requests{app="shop",balance="random"} 2.0' in text
    assert 'fleetpulse_proxy_front_response_time_seconds{app="shop",balance="model"} 0.012' in text
