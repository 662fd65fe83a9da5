"""Golden vectors of the control-state documents, under schemas/vectors/kv/ (deterministic).

scripts/gen_vectors.py writes and checks them together with the wire vectors:

    .venv/bin/python scripts/gen_vectors.py          # rewrite schemas/vectors (kv/ included)
    .venv/bin/python scripts/gen_vectors.py --check  # exit 1 if the committed files differ

Layout: `<name>.json` per document vector: {kind, bucket, key, value, decoded}, where `value` is
the exact KV value (its bytes, as UTF-8 JSON text) and `decoded` the document every reader
decodes from it (`v`, `kind` and every field, defaults filled in, unknown fields gone).
Canonical vectors are what the Python writer produces, byte for byte; the others are values other
writers may produce (unknown fields, optional fields left out) that readers must accept.
`invalid/<name>.bin` are values every reader must reject, with the reason in `index.json`;
each reason is checked against the Python decoder while generating.
"""

from __future__ import annotations

import json
from typing import Any

from shared.appconfig import AppConfig, AutoscalingConfig, DeploymentConfig
from shared.errors import WireError
from shared.kv import envelope
from shared.kv.agents import AgentInfo, EnvNote
from shared.kv.apps import AppDoc
from shared.kv.audit import AuditRecord
from shared.kv.documents import BUCKET_OF, decode_any
from shared.kv.group import ControllerMember, PartitionLease, lease_key
from shared.kv.membership import Member
from shared.kv.routes import DeploymentRouteDoc, RouteDoc
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.kv.targets import ReplicaTarget
from shared.replicaspec import ReplicaSpec
from shared.rollout import RolloutConfig

T0 = 1_712_345_678.5
LOGS = {"log_level": "INFO", "encoding": "JSON", "enable_access_log": True, "logs_dir": None}
RPC = "fp.v1.rpc.shop.ranker.replica-0007"
SHOP = AppConfig(
    "shop",
    (
        DeploymentConfig(
            "api",
            "shop.api:Api",
            init_args=("small",),
            init_kwargs={"threshold": 0.5, "ranker": {"$fleetpulse_handle": "ranker"}},
            max_ongoing_requests=8,
            env={"MODEL_ID": "small-v2"},
            user_config={"temperature": 0.7},
            autoscaling=AutoscalingConfig(min_replicas=0, max_replicas=16, upscale_delay_s=5.0),
            rollout=RolloutConfig(max_surge="25%", max_unavailable=1),
        ),
        DeploymentConfig(
            "ranker",
            "shop.rank:Ranker",
            num_replicas=2,
            push_metrics=True,
            resources={"cpus": 1.0, "gpus": 0.5},
            logging_config=LOGS,
            max_replicas_per_node=1,
            max_queued_requests=100,
        ),
    ),
    route_prefix="/shop",
    ingress="api",
    version="2024-04-05",
)
SPEC = ReplicaSpec(
    "shop.rank:Ranker",
    init_args=("small",),
    init_kwargs={"threshold": 0.5},
    max_ongoing_requests=8,
    metrics_interval_s=2.0,
    env={"MODEL_DIR": "/models"},
    resources={"cpus": 1.0, "gpus": 0.5},
    logging_config=LOGS,
    user_config={"top_k": 5},
)
TARGET = ReplicaTarget(
    "shop",
    "ranker",
    "replica-0007",
    "agent-a",
    3,
    11,
    SPEC.version(),
    RPC,
    SPEC,
    owner_epoch=4,
    devices=(1,),
)
MEMBER = Member(
    "shop",
    "ranker",
    3,
    "replica-0007",
    RPC,
    11,
    42,
    owner_epoch=4,
    report_interval_s=2.5,
    max_queued_requests=100,
    max_ongoing_requests=8,
    http_address="10.0.0.7:41234",
)
STATUS = AppStatusView(
    "shop",
    "RUNNING",
    "/shop",
    "api",
    T0,
    4,
    {
        "api": DeploymentStatusView("HEALTHY", "", 0, 0, 0.0, 0, 0, "hold at 0"),
        "ranker": DeploymentStatusView(
            "UPSCALING", "2 starting", 4, 2, 7.5, 2, 0, "scale 2 -> 4 (demand 7.50)"
        ),
    },
    partition=5,
)
AGENT = AgentInfo(
    "agent-a",
    16,
    3,
    "node-a.example",
    4242,
    T0,
    {"cpus": 32.0, "gpus": 2.0, "memory": 137438953472.0, "nvme": 4.0},
    (
        EnvNote("shipped.Model", "preparing", T0 - 12.0, "building its Python environment (x==1)"),
        EnvNote("shop.api", "failed", T0 - 30.0, "runtime_env: pip install failed: ERROR: ..."),
    ),
)
ROUTE = RouteDoc(
    "shop",
    "/shop",
    "api",
    True,
    False,
    "serviceable; at zero and woken by requests: api",
    {
        "api": DeploymentRouteDoc("HEALTHY", 0, "idle", "scaled to zero; a request wakes it"),
        "ranker": DeploymentRouteDoc("UPSCALING", 2, "serving", "2 replica(s) running"),
    },
)
AUDIT = AuditRecord(
    "deploy", "shop", "operator", T0, 17, {"api": "v2", "ranker": "3f9a2c41d0e8"}, "ops@bastion"
)


def _value(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _as_doc(document: envelope.Document) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(envelope.encode(document))
    return out


SHIPPED = AppConfig(
    "shipped",
    (
        DeploymentConfig(
            "Model",
            "shipped_app:Model",
            env={"MODE": "prod"},
            num_replicas=2,
            runtime_env={
                "working_dir": {"sha256": "3579b963f72cfdbfc9299d35826f90c2e3418e306bfd341270266e6af4bc16f1", "size": 518},
                "py_modules": [
                    {
                        "url": "https://example.com/tools-1.2.zip",
                        "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                        "size": 20480,
                    }
                ],
                "pip": {"packages": ["fpwheel==1.0"], "installer": "pip", "pip_version": ""},
            },
        ),
    ),
    route_prefix="/shipped",
)  # fmt: skip


def canonical() -> list[tuple[str, str, envelope.Document, str]]:
    """(name, key, document, note): values exactly as the Python writers produce them."""
    return [
        ("app", "shop", AppDoc(SHOP), "two deployments, one autoscaled to zero"),
        ("app_runtime_env", "shipped", AppDoc(SHIPPED), "code and requirements shipped with it"),
        ("replica_target", TARGET.key, TARGET, "one replica of agent-a"),
        ("member", MEMBER.key, MEMBER, "slot 3 of shop.ranker, serving HTTP itself"),
        ("app_status", "shop", STATUS, ""),
        ("agent", "agent-a", AGENT, "with a named resource"),
        ("lease", lease_key(5), PartitionLease("c-1a2b3c4d", 7), "partition 5 held at epoch 7"),
        ("lease_free", lease_key(6), PartitionLease("", 3), "handed over: owner empty"),
        (
            "controller_member",
            "c-1a2b3c4d",
            ControllerMember("c-1a2b3c4d", (5, 9, 13), pending=12, apps=3),
            "",
        ),
        ("route", "shop", ROUTE, "registered while one deployment idles at zero"),
        ("audit", AUDIT.key, AUDIT, "a deploy by the operator role"),
    ]


def lenient() -> list[tuple[str, str, str, dict[str, Any], str]]:
    """(name, kind, key, raw JSON object, note): other writers' values readers must accept."""
    extra = {"zone": "eu-west-1", "future": {"nested": [1, 2]}}
    app = {
        "v": 1,
        "kind": "app",
        "name": "tiny",
        "deployments": [
            {
                "name": "echo",
                "import_path": "echo:Echo",
                "autoscaling": {"max_replicas": 3, "min_replicas": 0, "new_knob": 1},
                "future_option": {"num_gpus": 1},
            }
        ],
        **extra,
    }
    target = _as_doc(TARGET)
    del target["owner_epoch"]
    del target["devices"]
    target["spec"] = {"import_path": SPEC.import_path, "new_setting": True}
    member = {
        k: v
        for k, v in _as_doc(MEMBER).items()
        if k not in ("owner_epoch", "report_interval_s", "max_queued_requests", "http_address")
    }
    agent = {k: v for k, v in _as_doc(AGENT).items() if k != "resources"}
    status = _as_doc(STATUS)
    del status["partition"]
    status["deployments"]["ranker"] = {
        "status": "HEALTHY",
        "target_replicas": 2,
        "running_replicas": 2,
        "extra": 1,
    }
    route = _as_doc(ROUTE)
    for d in route["deployments"].values():
        del d["serviceable"]
        d["weight"] = 1
    return [
        ("app_unknown_fields", "app", "tiny", app, "unknown fields at every level; defaults"),
        (
            "replica_target_lenient",
            "replica_target",
            TARGET.key,
            {**target, **extra},
            "owner_epoch (0) and devices ([]) absent; spec with only import_path and an "
            "unknown setting (no resources, no logging_config)",
        ),
        (
            "member_unknown_fields",
            "member",
            MEMBER.key,
            {**member, **extra},
            "owner_epoch, report_interval_s, max_queued_requests and http_address absent",
        ),
        (
            "member_nil_http_address",
            "member",
            MEMBER.key,
            {**member, "http_address": None},
            "http_address null: serves no HTTP itself",
        ),
        (
            "app_status_lenient",
            "app_status",
            "shop",
            {**status, **extra},
            "optional fields left out (partition: an older writer)",
        ),
        ("agent_no_resources", "agent", "agent-a", {**agent, **extra}, "resources absent: {}"),
        (
            "lease_unknown_field",
            "lease",
            lease_key(5),
            {"owner": "c-1", "kind": "lease", "v": 1, "epoch": 2, "note": "x"},
            "an unknown field",
        ),
        (
            "controller_member_minimal",
            "controller_member",
            "c-2",
            {"v": 1, "kind": "controller_member", "member_id": "c-2", **extra},
            "only the member id",
        ),
        ("route_lenient", "route", "shop", {**route, **extra}, "serviceable left out (derived)"),
        (
            "audit_delete_no_client",
            "audit",
            "operator.shop",
            {
                "v": 1,
                "kind": "audit",
                "action": "delete",
                "app": "shop",
                "user": "operator",
                "at": 1767225600,
                "revision": 18,
                "versions": {},
                **extra,
            },
            "a delete; client left out, an integer time",
        ),
    ]


def invalid() -> list[tuple[str, str, bytes, str, str]]:
    """(name, kind, value, reason, note)."""
    member = _as_doc(MEMBER)
    target = _as_doc(TARGET)
    app = _as_doc(AppDoc(SHOP))
    agent = _as_doc(AGENT)

    def with_(doc: dict[str, Any], **change: Any) -> bytes:
        return _value({**doc, **change})

    def without(doc: dict[str, Any], name: str) -> bytes:
        return _value({k: v for k, v in doc.items() if k != name})

    scaling = app["deployments"][0]["autoscaling"]
    return [
        ("not_json", "member", b"{not json", "malformed", ""),
        (
            "app_local_path",
            "app",
            _value(_local_path(_as_doc(AppDoc(SHIPPED)))),
            "bad_value",
            "a runtime_env package by local path: deploy uploads it, never writes the path",
        ),
        ("invalid_utf8", "member", b'{"v":1,"kind":"member","app":"\xff"}', "malformed", ""),
        ("not_an_object", "member", b"[1,2]", "not_a_map", "top level is an array"),
        ("version_2", "member", with_(member, v=2), "unsupported_version", ""),
        ("version_true", "member", with_(member, v=True), "unsupported_version", "true is not 1"),
        ("wrong_kind", "member", with_(member, kind="replica_target"), "unexpected_kind", ""),
        ("member_no_epoch", "member", without(member, "epoch"), "missing_field", ""),
        ("member_negative_slot", "member", with_(member, slot=-1), "bad_value", ""),
        ("member_slot_bool", "member", with_(member, slot=True), "wrong_type", ""),
        ("member_zero_interval", "member", with_(member, report_interval_s=0), "bad_value", ""),
        ("member_interval_text", "member", with_(member, report_interval_s="1"), "wrong_type", ""),
        ("member_dotted_replica", "member", with_(member, replica_id="a.b"), "bad_value", ""),
        ("member_zero_queue", "member", with_(member, max_queued_requests=0), "bad_value", ""),
        ("member_zero_ongoing", "member", with_(member, max_ongoing_requests=0), "bad_value", ""),
        ("member_http_no_port", "member", with_(member, http_address="h"), "bad_value", ""),
        ("member_http_port_0", "member", with_(member, http_address="h:0"), "bad_value", ""),
        ("member_http_no_host", "member", with_(member, http_address=":80"), "bad_value", ""),
        ("member_http_int", "member", with_(member, http_address=80), "wrong_type", ""),
        (
            "replica_target_device_twice",
            "replica_target",
            with_(target, devices=[1, 1]),
            "bad_value",
            "two replicas' worth of one device",
        ),
        (
            "replica_target_negative_device",
            "replica_target",
            with_(target, devices=[-1]),
            "bad_value",
            "",
        ),
        (
            "replica_target_gpus_1_5",
            "replica_target",
            with_(target, spec={**target["spec"], "resources": {"gpus": 1.5}}),
            "bad_value",
            "above 1, GPUs are whole devices",
        ),
        (
            "replica_target_no_import_path",
            "replica_target",
            with_(target, spec={"max_ongoing_requests": 1}),
            "missing_field",
            "spec without import_path",
        ),
        (
            "replica_target_zero_ongoing",
            "replica_target",
            with_(target, spec={**target["spec"], "max_ongoing_requests": 0}),
            "bad_value",
            "",
        ),
        ("app_no_deployments", "app", without(app, "deployments"), "missing_field", ""),
        (
            "app_min_above_max",
            "app",
            with_(
                app,
                deployments=[
                    {
                        **app["deployments"][0],
                        "autoscaling": {**scaling, "min_replicas": 20},
                    }
                ],
            ),
            "bad_value",
            "the config's own checks: min_replicas > max_replicas",
        ),
        (
            "app_min_replicas_string",
            "app",
            with_(
                app,
                deployments=[
                    {**app["deployments"][0], "autoscaling": {**scaling, "min_replicas": "1"}}
                ],
            ),
            "wrong_type",
            "",
        ),
        (
            "app_policy_not_an_import_path",
            "app",
            with_(
                app,
                deployments=[
                    {**app["deployments"][0], "autoscaling": {**scaling, "policy": "kv_policy"}}
                ],
            ),
            "bad_value",
            "a custom policy must be 'package.module:function'",
        ),
        (
            "app_rollout_both_zero",
            "app",
            with_(
                app,
                deployments=[
                    {**app["deployments"][0], "rollout": {"max_surge": 0, "max_unavailable": "0%"}}
                ],
            ),
            "bad_value",
            "the config's own checks: a rollout that could never move",
        ),
        (
            "app_rollout_percent_without_sign",
            "app",
            with_(app, deployments=[{**app["deployments"][0], "rollout": {"max_surge": "25"}}]),
            "bad_value",
            "a percentage needs its '%'",
        ),
        (
            "app_rollout_bool",
            "app",
            with_(
                app, deployments=[{**app["deployments"][0], "rollout": {"max_unavailable": True}}]
            ),
            "wrong_type",
            "",
        ),
        ("agent_bool_capacity", "agent", with_(agent, capacity=True), "wrong_type", ""),
        (
            "agent_negative_resource",
            "agent",
            with_(agent, resources={"gpus": -1}),
            "bad_value",
            "",
        ),
        (
            "lease_epoch_string",
            "lease",
            _value({"v": 1, "kind": "lease", "owner": "c", "epoch": "7"}),
            "wrong_type",
            "",
        ),
        (
            "controller_member_partitions_map",
            "controller_member",
            _value({"v": 1, "kind": "controller_member", "member_id": "c", "partitions": {}}),
            "wrong_type",
            "",
        ),
        (
            "app_status_nan_demand",
            "app_status",
            envelope.encode(STATUS).replace(b'"demand":7.5', b'"demand":NaN'),
            "bad_value",
            "NaN is not JSON, but some encoders write it",
        ),
        (
            "route_bad_serviceability",
            "route",
            envelope.encode(ROUTE).replace(
                b'"serviceability":"idle"', b'"serviceability":"asleep"'
            ),
            "bad_value",
            "",
        ),
        (
            "audit_bad_action",
            "audit",
            envelope.encode(AUDIT).replace(b'"action":"deploy"', b'"action":"rollback"'),
            "bad_value",
            "",
        ),
    ]


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n").encode()


def _vector(kind: str, key: str, value: bytes) -> bytes:
    decoded = decode_any(kind, value)
    return _json_bytes(
        {
            "kind": kind,
            "bucket": BUCKET_OF[kind].name,
            "key": key,
            "value": value.decode(),
            "decoded": _as_doc(decoded),
        }
    )


def build() -> dict[str, bytes]:
    """File name (relative to schemas/vectors/kv/) -> contents."""
    files: dict[str, bytes] = {}
    documents = []
    for name, key, document, note in canonical():
        files[f"{name}.json"] = _vector(document.KIND, key, envelope.encode(document))
        documents.append({"name": name, "kind": document.KIND, "canonical": True, "note": note})
    for name, kind, key, raw, note in lenient():
        files[f"{name}.json"] = _vector(kind, key, _value(raw))
        documents.append({"name": name, "kind": kind, "canonical": False, "note": note})
    bad = []
    for name, kind, value, reason, note in invalid():
        _expect_reason(kind, value, reason, name)
        files[f"invalid/{name}.bin"] = value
        bad.append({"file": f"{name}.bin", "kind": kind, "reason": reason, "note": note})
    files["index.json"] = _json_bytes({"version": 1, "documents": documents, "invalid": bad})
    return files


def _expect_reason(kind: str, value: bytes, reason: str, name: str) -> None:
    try:
        decode_any(kind, value)
    except WireError as exc:
        if exc.reason != reason:
            msg = f"kv/invalid/{name}: decoder says {exc.reason!r}, index says {reason!r}"
            raise SystemExit(msg) from None
        return
    raise SystemExit(f"kv/invalid/{name}: decoder accepted it")


def _local_path(doc: dict[str, Any]) -> dict[str, Any]:
    doc["deployments"][0]["runtime_env"]["working_dir"] = {"path": "/home/me/app"}
    return doc
