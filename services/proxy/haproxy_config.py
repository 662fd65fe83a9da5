"""The HAProxy front door's configuration, and the runtime commands between two states (pure).

How it works. The proxy service feeds two inputs into this module: the route registry
(registry.RouteTable: which apps exist, their route prefix, whether they are registered) and the
members of each app's ingress deployment (KV fp_membership: `http_address`,
`max_ongoing_requests`). `front_state` turns them into a `FrontState`, the whole truth of what
HAProxy should do; `render_config` writes it as an HAProxy configuration, and `transition`
says how to move a running HAProxy from one state to the next:

- the *shape* (the set of apps, their prefixes, slot counts and queue bounds, the settings)
  lives in the configuration; a change of shape needs a reload (graceful: the master starts a
  new worker, the old one finishes its requests);
- everything else (which replica sits in which slot, its address, its `maxconn`, whether the
  app may be served directly) moves through the runtime API (`set server ... addr ... port`,
  `set maxconn server`, `set server ... state ready|maint`), without a reload.

Each app with a route prefix gets two backends over the same slots ("servers"): `app_<app>`
(`balance random(2)`: power-of-two choices on live connections) and `mux_<app>`
(`balance hdr(serve_multiplexed_model_id)`, consistent hashing with bounded load), used when a
request carries that header so a model keeps landing on the replica that loaded it. A slot is a
server line; a replica keeps its slot while it is a member (slots are assigned sticky, the lowest
free one to a newcomer); slot counts only grow, in powers of two, so a deployment growing past
its slots costs one reload and shrinking costs none.

Routing, in the frontend, in this order: the proxy's own paths (`/-/healthz`, `/-/routes`,
`/metrics`) go to the Python proxy; then each app by prefix, longest first, on whole decoded path
segments (`/shop` serves `/shop`, `/shop/`, `/shop/x`, not `/shopping`; `/` last): to its `mux_`
backend if the header is present, else its `app_` backend, when that backend has a usable server
(`nbsrv`); else to the Python proxy, which holds the request while the app wakes from zero and
forwards it over NATS, and answers the 503s with their reasons for apps that cannot serve. A path
no app claims goes to the Python proxy (404). An app that is not registered has every slot in
maintenance, so its requests go to the Python proxy, which says why.

Back-pressure: each server's `maxconn` is its replica's `max_ongoing_requests`; beyond it requests
queue in the backend, at most `max_queued` (then 503 `backpressure` at once) and for at most
`queue_timeout_s` (then 503 `no_replica`). Failures: a connection refused or closed without a
response, or a 503 (a full or stopping replica), is retried on another server, and when no
replica is left, on the Python proxy (each app backend's `backup` server) (`retry-on
conn-failure empty-response 503`, `option redispatch`), and the first failed connection marks the server down (`PASSIVE_HEALTH`: health
from what requests see; no probe of a healthy replica), so a killed replica fails no request
while membership catches up; membership says who serves.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from services.proxy.registry import RouteTable
from shared.kv.membership import Member

PYTHON_BACKEND: Final = "fp_python"
PYTHON_SERVER: Final = "fp_python"
"""The Python proxy as every app backend's backup server."""
FRONTEND: Final = "fp_front"
SERVER_PREFIX: Final = "s"
MULTIPLEXED_MODEL_ID_HEADER: Final = "serve_multiplexed_model_id"
"""The header of multiplexed requests (fleetpulse/serve/multiplex.py defines the same name; the
proxy may not import fleetpulse/)."""
OWN_PATHS: Final = ("/-/healthz", "/-/routes", "/metrics")
MIN_SLOTS: Final = 4
PASSIVE_HEALTH: Final = (
    "check inter 24d downinter 1s fastinter 1s rise 1 fall 1 "
    "observe layer4 error-limit 1 on-error mark-down"
)
"""Health from what requests see, not from probes: the first connection to a replica that fails
(refused, reset, timed out) marks it down at once, so power-of-two choices stops picking it (a
dead server with no connections would otherwise win every draw and swallow the queue). Only a
server marked down is checked again, with a TCP connect once a second, until it accepts; a
healthy replica is never probed (`inter 24d`; HAProxy makes one TCP connect when a server line
starts). No HTTP check: a check never reaches user code or counts as a request."""
PARKED_ADDRESS: Final = ("127.0.0.1", 9)
"""Where an empty slot points (it is in maintenance: nothing is ever sent there)."""
HOP_BY_HOP_REQUEST: Final = (
    "Keep-Alive",
    "Proxy-Connection",
    "Proxy-Authenticate",
    "Proxy-Authorization",
    "TE",
    "Trailer",
)
"""Removed from requests as the Python proxy does (HAProxy itself handles `Connection`, the
framing headers and `Upgrade`, which it passes on so WebSockets reach replicas that accept
them)."""
_SAFE_PREFIX: Final = re.compile(r"/[A-Za-z0-9._~!*()+,;=:@/-]*")
"""Route prefixes HAProxy matches directly; anything else sends every request to the Python
proxy (nothing could be quoted wrongly; `%` would be read as a log-format directive in
`X-Forwarded-Prefix`)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One replica of an app's ingress deployment that serves HTTP itself."""

    replica_id: str
    host: str
    """An IP address (the shell resolves names first: the runtime API takes addresses only)."""
    port: int
    maxconn: int


@dataclass(frozen=True, slots=True)
class AppFront:
    app: str
    prefix: str
    """Normalized: leading `/`, no trailing `/` (but `/` itself)."""
    serving: bool
    """Registered: its filled slots may take requests directly."""
    max_queued: int
    slots: tuple[Endpoint | None, ...]

    @property
    def app_backend(self) -> str:
        return f"app_{self.app}"

    @property
    def mux_backend(self) -> str:
        return f"mux_{self.app}"

    @property
    def shape(self) -> tuple[str, str, int, int]:
        return (self.app, self.prefix, len(self.slots), self.max_queued)


@dataclass(frozen=True, slots=True)
class FrontSettings:
    """What the configuration needs besides the state (fixed while the proxy runs)."""

    bind: str
    """The frontend's `bind` argument: `host:port`, or `fd@N` for a socket the proxy opened."""
    python_host: str
    python_port: int
    admin_socket: str
    queue_timeout_s: float
    retry_after_s: int
    hash_balance_factor: int = 150
    """Bounded-load consistent hashing of multiplexed requests: no server takes more than 150%
    of the average load; beyond it the next server on the ring takes the model."""
    retries: int = 3
    connect_timeout_s: float = 2.0
    server_timeout_s: float = 3600.0
    """Inactivity of a replica's response (a long stream may pause); deadlines are the
    replica's and the client's business."""
    client_timeout_s: float = 3600.0
    keep_alive_timeout_s: float = 60.0
    request_head_timeout_s: float = 30.0
    maxconn: int = 20000
    hard_stop_after_s: float = 30.0
    """How long an old worker may finish its requests after a reload or a stop."""


@dataclass(frozen=True, slots=True)
class FrontState:
    apps: tuple[AppFront, ...] = ()
    """Sorted by app name."""
    direct: bool = True
    """False: some route prefix cannot be matched by HAProxy safely, so every request goes
    through the Python proxy (correct, slower)."""

    @property
    def shape(self) -> tuple[object, ...]:
        return (self.direct, tuple(a.shape for a in self.apps))

    def app(self, name: str) -> AppFront | None:
        return next((a for a in self.apps if a.app == name), None)


@dataclass(frozen=True, slots=True)
class Transition:
    reload: bool
    """True: write `render_config(new)` and reload; `commands` is empty then."""
    commands: tuple[str, ...] = field(default_factory=tuple)


# -- from the registry and membership to the state -------------------------------------------


def normalize_prefix(prefix: str) -> str:
    if not prefix.startswith("/"):
        prefix = "/" + prefix
    return prefix.rstrip("/") or "/"


def parse_address(http_address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host without brackets, port)."""
    host, _, port = http_address.rpartition(":")
    return host.strip("[]"), int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def front_state(
    table: RouteTable,
    endpoints: Mapping[str, Sequence[Endpoint]],
    max_queued: Mapping[str, int],
    previous: FrontState | None,
    *,
    default_max_queued: int,
    min_slots: int = MIN_SLOTS,
) -> FrontState:
    """The state for `table`'s apps with a route prefix and an ingress; `endpoints[app]`: the
    ingress replicas that serve HTTP (addresses resolved), `max_queued[app]` the deployment's
    queue bound where its members carry one. Slots stay where `previous` had them."""
    apps: list[AppFront] = []
    direct = True
    for name in sorted(table.routes):
        route = table.routes[name]
        if route.route_prefix is None or route.ingress is None:
            continue
        prefix = normalize_prefix(route.route_prefix)
        if not _SAFE_PREFIX.fullmatch(prefix):
            direct = False
        before = previous.app(name) if previous is not None else None
        old_slots = before.slots if before is not None and before.prefix == prefix else ()
        apps.append(
            AppFront(
                app=name,
                prefix=prefix,
                serving=route.registered,
                max_queued=max_queued.get(name, default_max_queued),
                slots=assign_slots(old_slots, endpoints.get(name, ()), min_slots),
            )
        )
    return FrontState(tuple(apps), direct)


def assign_slots(
    previous: Sequence[Endpoint | None], endpoints: Iterable[Endpoint], min_slots: int = MIN_SLOTS
) -> tuple[Endpoint | None, ...]:
    """Each endpoint in its previous slot (by replica id), newcomers in the lowest free slots;
    the slot count grows to the next power of two when they do not fit, never shrinks."""
    wanted = {e.replica_id: e for e in endpoints}
    slots: list[Endpoint | None] = [
        wanted.pop(old.replica_id) if old is not None and old.replica_id in wanted else None
        for old in previous
    ]
    count = max(len(slots), min_slots)
    filled = sum(1 for s in slots if s is not None)
    while count < filled + len(wanted):
        count *= 2
    slots.extend([None] * (count - len(slots)))
    newcomers = iter(sorted(wanted.values(), key=lambda e: e.replica_id))
    for i, slot in enumerate(slots):
        if slot is None:
            slots[i] = next(newcomers, None)
    return tuple(slots)


def endpoints_of(
    members: Iterable[Member], resolve: Callable[[str], str | None], default_maxconn: int
) -> list[Endpoint]:
    """The members that serve HTTP, as endpoints; a host that `resolve` cannot turn into an
    address is left out (the shell logs it)."""
    out: list[Endpoint] = []
    for member in members:
        if not member.http_address:
            continue
        host, port = parse_address(member.http_address)
        ip = host if is_ip(host) else resolve(host)
        if ip is None:
            continue
        maxconn = member.max_ongoing_requests or default_maxconn
        out.append(Endpoint(member.replica_id, ip, port, maxconn))
    return out


# -- from one state to the next ----------------------------------------------------------------


def server_name(slot: int) -> str:
    return f"{SERVER_PREFIX}{slot}"


def transition(old: FrontState | None, new: FrontState) -> Transition:
    """How a running HAProxy configured for `old` comes to serve `new`."""
    if old is None or old.shape != new.shape:
        return Transition(reload=True)
    commands: list[str] = []
    for before, after in zip(old.apps, new.apps, strict=True):
        for slot, (was, now) in enumerate(zip(before.slots, after.slots, strict=True)):
            for backend in (after.app_backend, after.mux_backend):
                commands.extend(
                    _slot_commands(
                        f"{backend}/{server_name(slot)}",
                        was if before.serving else None,
                        now if after.serving else None,
                    )
                )
    return Transition(reload=False, commands=tuple(commands))


def _slot_commands(server: str, was: Endpoint | None, now: Endpoint | None) -> list[str]:
    if was == now:
        return []
    if now is None:
        return [f"set server {server} state maint"]
    out: list[str] = []
    if was is None or (was.host, was.port) != (now.host, now.port):
        out.append(f"set server {server} addr {now.host} port {now.port}")
        # a new replica announced itself ready: forget what the slot's last one did
        out.append(f"set server {server} health up")
    if was is None or was.maxconn != now.maxconn:
        out.append(f"set maxconn server {server} {now.maxconn}")
    if was is None:
        out.append(f"set server {server} state ready")
    return out


# -- the configuration ---------------------------------------------------------------------------


def render_config(state: FrontState, s: FrontSettings) -> str:
    """The whole HAProxy configuration for `state` (servers where the state has them)."""
    lines = [
        "# written by the fleetpulse proxy (services/proxy/haproxy_config.py); do not edit",
        "global",
        f"  stats socket {s.admin_socket} mode 600 level admin expose-fd listeners",
        "  stats timeout 30s",
        f"  maxconn {s.maxconn}",
        f"  hard-stop-after {_ms(s.hard_stop_after_s)}",
        "  log stderr format raw local0 warning",
        "",
        "defaults",
        "  mode http",
        "  log global",
        "  option dontlognull",
        f"  timeout connect {_ms(s.connect_timeout_s)}",
        f"  timeout client {_ms(s.client_timeout_s)}",
        f"  timeout server {_ms(s.server_timeout_s)}",
        f"  timeout http-request {_ms(s.request_head_timeout_s)}",
        f"  timeout http-keep-alive {_ms(s.keep_alive_timeout_s)}",
        f"  timeout queue {_ms(s.queue_timeout_s)}",
        f"  retries {s.retries}",
        "  retry-on conn-failure empty-response 503",
        "  option redispatch 1",
        # each chunk of a streamed response leaves as it comes (no MSG_MORE coalescing of a
        # burst: tokens produced together still reach the client one by one, as Ray's does)
        "  option http-no-delay",
        "",
        f"frontend {FRONTEND}",
        f"  bind {s.bind}",
        *(f"  http-request del-header {h}" for h in HOP_BY_HOP_REQUEST),
        # X-Forwarded-For: the incoming value with the client address appended (one header)
        '  http-request set-header X-Forwarded-For "%[req.fhdr(x-forwarded-for)], %[src]" '
        "if { req.fhdr(x-forwarded-for) -m found }",
        "  http-request set-header X-Forwarded-For %[src] "
        "if !{ req.fhdr(x-forwarded-for) -m found }",
        "  http-request set-header X-Forwarded-Proto http "
        "if !{ req.hdr(x-forwarded-proto) -m found }",
        f"  use_backend {PYTHON_BACKEND} if {{ path {' '.join(OWN_PATHS)} }}",
    ]
    if state.direct:
        for app in sorted(state.apps, key=lambda a: (-len(a.prefix), a.app)):
            lines.extend(_frontend_rules(app))
    lines += [f"  default_backend {PYTHON_BACKEND}", ""]
    if state.direct:
        for app in state.apps:
            lines.extend(_backend(app, s, multiplexed=False))
            lines.extend(_backend(app, s, multiplexed=True))
    lines += [
        f"backend {PYTHON_BACKEND}",
        f"  server python {_address(s.python_host, s.python_port)}",
        "",
    ]
    return "\n".join(lines)


def _frontend_rules(app: AppFront) -> list[str]:
    acl = f"p_{app.app}"
    cond = "" if app.prefix == "/" else f"{acl} "
    usable = f"{{ nbsrv({app.app_backend}) gt 0 }}"
    lines = []
    if app.prefix != "/":
        lines += [
            f"  acl {acl} path,url_dec -m str {app.prefix}",
            f"  acl {acl} path,url_dec -m beg {app.prefix}/",
        ]
    lines += [
        f"  use_backend {app.mux_backend} if {cond}"
        f"{{ req.hdr({MULTIPLEXED_MODEL_ID_HEADER}) -m found }} {usable}",
        f"  use_backend {app.app_backend} if {cond}{usable}",
    ]
    if app.prefix != "/":
        lines.append(f"  use_backend {PYTHON_BACKEND} if {acl}")
    return lines


def _backend(app: AppFront, s: FrontSettings, *, multiplexed: bool) -> list[str]:
    name = app.mux_backend if multiplexed else app.app_backend
    if multiplexed:
        balance = [
            f"  balance hdr({MULTIPLEXED_MODEL_ID_HEADER})",
            "  hash-type consistent",
            f"  hash-balance-factor {s.hash_balance_factor}",
        ]
    else:
        balance = ["  balance random(2)"]
    full = _error_body(
        "backpressure",
        f"{app.app}: more than {app.max_queued} requests wait for a replica",
        app.app,
    )
    waited = _error_body(
        "no_replica",
        f"no replica of {app.app} could take the request within {s.queue_timeout_s:g} s",
        app.app,
    )
    lost = _error_body(
        "replica_lost", f"the replica of {app.app} failed before it answered", app.app
    )
    retry = f"hdr Retry-After {s.retry_after_s} hdr Fp-Retryable true"
    lines = [
        f"backend {name}",
        *balance,
        f"  http-request set-header X-Forwarded-Prefix {app.prefix}",
        f"  http-request return status 503 content-type application/json string '{full}' "
        f"hdr Fp-Error backpressure {retry} if {{ queue() ge {app.max_queued} }}",
        f"  http-error status 503 content-type application/json string '{waited}' "
        f"hdr Fp-Error no_replica {retry}",
        f"  http-error status 502 content-type application/json string '{lost}' "
        "hdr Fp-Error replica_lost hdr Fp-Retryable true",
    ]
    for slot, endpoint in enumerate(app.slots):
        lines.append(_server_line(slot, endpoint, app))
    # when every replica is down or gone, a request already here (or being retried after its
    # replica died) goes to the Python proxy, which holds it or says why the app cannot serve
    lines.append(f"  server {PYTHON_SERVER} {_address(s.python_host, s.python_port)} backup")
    lines.append("")
    return lines


def _server_line(slot: int, endpoint: Endpoint | None, app: AppFront) -> str:
    """A slot; in maintenance (`disabled`) when empty or when the app is not served directly."""
    host, port = (endpoint.host, endpoint.port) if endpoint is not None else PARKED_ADDRESS
    maxconn = endpoint.maxconn if endpoint is not None else 1
    line = (
        f"  server {server_name(slot)} {_address(host, port)} maxconn {maxconn} "
        f"maxqueue {app.max_queued} {PASSIVE_HEALTH}"
    )
    return line if endpoint is not None and app.serving else line + " disabled"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _error_body(token: str, message: str, app: str) -> str:
    """The JSON error body of the Python proxy (docs/proxy.md); it sits in single quotes in the
    configuration, so it must not contain one (app names and our messages do not)."""
    body = json.dumps(
        {"error": token, "message": message, "app": app, "retryable": True}, sort_keys=True
    )
    return body.replace("'", "")
