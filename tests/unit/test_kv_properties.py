"""Properties of every control-state document: encode -> decode is the identity, the bytes are
stable, unknown fields (at the top and in every nested object a reader ignores them in) change
nothing any reader decodes, and arbitrary input raises only WireError."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.errors import ConfigError, WireError
from shared.kv import envelope
from shared.kv.agents import AgentInfo
from shared.kv.apps import AppDoc
from shared.kv.audit import ACTIONS, AuditRecord
from shared.kv.documents import BY_KIND, decode_any
from shared.kv.group import ControllerMember, PartitionLease
from shared.kv.membership import Member
from shared.kv.routes import SERVICEABILITY, DeploymentRouteDoc, RouteDoc
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.kv.targets import ReplicaTarget
from shared.replicaspec import ReplicaSpec

names = st.text("abcXYZ019_-", min_size=1, max_size=12)
counts = st.integers(0, 2**53)
small = st.integers(0, 50)
texts = st.text(max_size=20)
finite = st.floats(0, 1e12, allow_nan=False)
positive = st.floats(0.001, 1e6, allow_nan=False)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts
json_scalars |= st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
import_paths = st.builds(lambda m, a: f"{m}:{a}", names, names)

specs = st.builds(
    ReplicaSpec,
    import_path=import_paths,
    init_args=st.lists(json_values, max_size=3).map(tuple),
    init_kwargs=st.dictionaries(texts, json_values, max_size=3),
    max_ongoing_requests=st.integers(1, 1000),
    health_check_period_s=positive,
    health_check_timeout_s=positive,
    graceful_shutdown_timeout_s=finite,
    metrics_interval_s=positive,
    push_metrics=st.booleans(),
    env=st.dictionaries(st.text("ABC_xyz1", min_size=1, max_size=8), texts, max_size=3),
)


@st.composite
def autoscaling(draw: st.DrawFn) -> AutoscalingConfig:
    lo = draw(st.integers(0, 5))
    hi = draw(st.integers(max(lo, 1), 10))
    return AutoscalingConfig(
        min_replicas=lo,
        max_replicas=hi,
        initial_replicas=draw(st.none() | st.integers(lo, hi)),
        target_ongoing_requests=draw(positive),
        upscale_delay_s=draw(finite),
        downscale_delay_s=draw(finite),
        downscale_to_zero_delay_s=draw(st.none() | finite),
        look_back_period_s=draw(positive),
        metrics_interval_s=draw(positive),
        upscaling_factor=draw(positive),
        downscaling_factor=draw(positive),
        panic_mode=draw(st.booleans()),
        panic_window_s=draw(positive),
        panic_threshold=draw(positive),
    )


@st.composite
def deployment(draw: st.DrawFn, name: str) -> DeploymentConfig:
    size = draw(st.sampled_from(["fixed", "auto", "default"]))
    return DeploymentConfig(
        name,
        draw(import_paths),
        init_args=tuple(draw(st.lists(json_values, max_size=2))),
        init_kwargs=draw(st.dictionaries(texts, json_values, max_size=2)),
        max_ongoing_requests=draw(st.integers(1, 100)),
        health_check_period_s=draw(positive),
        health_check_timeout_s=draw(positive),
        graceful_shutdown_timeout_s=draw(finite),
        push_metrics=draw(st.booleans()),
        num_replicas=draw(small) if size == "fixed" else None,
        autoscaling=draw(autoscaling()) if size == "auto" else None,
    )


@st.composite
def apps(draw: st.DrawFn) -> AppDoc:
    dnames = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    return AppDoc(
        AppConfig(
            draw(names),
            tuple(draw(deployment(n)) for n in dnames),
            route_prefix=draw(st.none() | texts.map(lambda t: "/" + t)),
            ingress=draw(st.none() | st.sampled_from(dnames)),
            version=draw(texts),
        )
    )


targets = st.builds(
    ReplicaTarget,
    app=names,
    deployment=names,
    replica_id=names,
    agent_id=names | st.just(""),
    slot=counts,
    order=counts,
    version=texts,
    rpc_subject=texts,
    spec=specs,
    owner_epoch=counts,
)
members = st.builds(
    Member,
    app=names,
    deployment=names,
    slot=counts,
    replica_id=names,
    rpc_subject=texts,
    order=counts,
    epoch=counts,
    owner_epoch=counts,
)
deployment_statuses = st.builds(
    DeploymentStatusView,
    status=texts,
    message=texts,
    target_replicas=counts,
    running_replicas=counts,
    demand=finite,
    healthy_replicas=counts,
    unhealthy_replicas=counts,
    last_decision=texts,
)
statuses = st.builds(
    AppStatusView,
    app=names,
    status=texts,
    route_prefix=st.none() | texts,
    ingress=st.none() | texts,
    updated_at=finite,
    owner_epoch=counts,
    deployments=st.dictionaries(names, deployment_statuses, max_size=3),
    partition=st.none() | counts,
)
agents = st.builds(
    AgentInfo,
    agent_id=names,
    capacity=counts,
    running=counts,
    hostname=st.text(max_size=255),
    pid=counts,
    started_at=finite,
    resources=st.dictionaries(names, finite, max_size=4),
)
leases = st.builds(PartitionLease, owner=texts, epoch=counts)
controller_members = st.builds(
    ControllerMember,
    member_id=texts.filter(bool),
    partitions=st.lists(st.integers(0, 4095), max_size=20).map(tuple),
    pending=counts,
    apps=counts,
)
routes = st.builds(
    RouteDoc,
    app=names,
    route_prefix=st.none() | texts,
    ingress=st.none() | texts,
    registered=st.booleans(),
    down=st.booleans(),
    reason=texts,
    deployments=st.dictionaries(
        names,
        st.builds(
            DeploymentRouteDoc,
            status=texts,
            running_replicas=counts,
            serviceability=st.sampled_from(SERVICEABILITY),
            reason=texts,
        ),
        max_size=3,
    ),
)
audits = st.builds(
    AuditRecord,
    action=st.sampled_from(ACTIONS),
    app=names,
    user=names,
    at=finite,
    revision=counts,
    versions=st.dictionaries(names, texts, max_size=3),
    client=texts,
)
STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "app": apps(),
    "replica_target": targets,
    "member": members,
    "app_status": statuses,
    "agent": agents,
    "lease": leases,
    "controller_member": controller_members,
    "route": routes,
    "audit": audits,
}
documents = st.sampled_from(sorted(STRATEGIES)).flatmap(lambda k: STRATEGIES[k])

NESTED: dict[str, tuple[tuple[str, ...], ...]] = {
    "app": (("deployments", "*"), ("deployments", "*", "autoscaling")),
    "replica_target": (("spec",),),
    "app_status": (("deployments", "*"),),
    "route": (("deployments", "*"),),
}
"""The objects inside each document whose unknown fields its reader ignores ("*": every item)."""


def test_every_kind_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(BY_KIND)


@given(documents)
@settings(max_examples=400, deadline=None)
def test_round_trip(document: envelope.Document) -> None:
    data = envelope.encode(document)
    back = decode_any(document.KIND, data)
    assert back == document
    assert envelope.encode(back) == data


def _objects(doc: Any, path: tuple[str, ...]) -> list[dict[str, Any]]:
    if not path:
        return [doc] if isinstance(doc, dict) else []
    head, rest = path[0], path[1:]
    if head == "*":
        items = doc if isinstance(doc, list) else list(doc.values())
        return [o for item in items for o in _objects(item, rest)]
    return _objects(doc.get(head), rest)


extras = st.dictionaries(names.map(lambda n: "x_" + n), json_values, min_size=1, max_size=3)


@given(documents, extras, st.data())
@settings(max_examples=300, deadline=None)
def test_unknown_fields_change_nothing(
    document: envelope.Document, extra: dict[str, Any], data: st.DataObject
) -> None:
    doc = json.loads(envelope.encode(document))
    doc.update(extra)
    for path in NESTED.get(document.KIND, ()):
        for obj in _objects(doc, path):
            obj.update(data.draw(extras))
    value = json.dumps(doc).encode()
    assert decode_any(document.KIND, value) == document
    if isinstance(document, AppDoc):  # the API the services call
        assert AppConfig.from_json(value) == document.config


@given(st.sampled_from(sorted(BY_KIND)), st.binary(max_size=300) | json_values.map(json.dumps))
@settings(max_examples=300, deadline=None)
def test_arbitrary_input_raises_only_wire_errors(kind: str, raw: bytes | str) -> None:
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        decoded = decode_any(kind, data)
    except WireError:
        return
    assert decode_any(kind, envelope.encode(decoded)) == decoded


@given(st.sampled_from(sorted(BY_KIND)), documents, json_values)
@settings(max_examples=300, deadline=None)
def test_any_field_value_raises_only_wire_errors(kind: str, document: Any, junk: Any) -> None:
    """Swap one field of a valid document of `kind` for any JSON value: decoded or WireError."""
    doc = json.loads(envelope.encode(document))
    doc["kind"] = kind
    for field in sorted(doc)[:3]:
        if field not in ("v", "kind"):
            doc[field] = junk
    with contextlib.suppress(WireError):
        decode_any(kind, json.dumps(doc).encode())
    if kind == "app":
        with contextlib.suppress(ConfigError):
            AppConfig.from_json(json.dumps(doc).encode())
