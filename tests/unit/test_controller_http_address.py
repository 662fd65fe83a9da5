"""The controller copies a ready replica's http_address (its Lifecycle) into its Member value,
keeps it across rewrites of the member and across a takeover."""

from __future__ import annotations

import dataclasses

import msgpack

from services.controller.actions import CoreStats
from services.controller.deployment_state import ReplicaState
from services.controller.kv_delta import PutDoc
from services.controller.landing import land
from services.controller.managed import ManagedDeployment, StepResult
from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.kv import envelope
from shared.kv.membership import Member
from shared.kv.targets import ReplicaTarget
from shared.subjects import ReportSubject, Subjects
from shared.wire import codec
from shared.wire.messages import Lifecycle

CFG = DeploymentConfig("Api", "services.examples.echo:Echo", num_replicas=2)
SUBJECTS = Subjects()
KV = dict[tuple[str, str], ReplicaTarget | Member]


def deployment() -> ManagedDeployment:
    return ManagedDeployment("app", CFG, "v1", 0.0, id_prefix="app-Api-0000", subjects=SUBJECTS)


def finish(m: ManagedDeployment, kv: KV) -> list[PutDoc]:
    res = StepResult()
    m.finish(0.0, res)
    for c in res.kv:
        if isinstance(c, PutDoc):
            kv[(c.bucket, c.key)] = envelope.decode(envelope.encode(c.doc), type(c.doc))
        else:
            kv.pop((c.bucket, c.key), None)
    return [c for c in res.kv if isinstance(c, PutDoc)]


def members(kv: KV) -> dict[str, Member]:
    return {d.replica_id: d for (b, _), d in kv.items() if isinstance(d, Member)}


def announce(m: ManagedDeployment, rid: str, state: str, http: str | None) -> None:
    """A replica's lifecycle message, as bytes on its subject, landed as the core lands it."""
    msg = Lifecycle(
        rid, "a1", state, 1.0, SUBJECTS.rpc("app", "Api", rid), "v1", None, "app", "Api", 5,
        http_address=http,
    )  # fmt: skip
    where = ReportSubject("lifecycle", "app", "Api", rid)
    stats = CoreStats()
    land(m, where, codec.encode(msg), 1.0, None, SUBJECTS, stats)
    assert not stats.dropped


def started(kv: KV) -> tuple[ManagedDeployment, list[str]]:
    m = deployment()
    m.state.reconcile(0.0)
    rids = sorted(m.state.replicas, key=lambda r: m.state.replicas[r].order)
    for rid in rids:
        m.state.replicas[rid].agent_id = "a1"
    finish(m, kv)
    return m, rids


def test_a_ready_replica_member_carries_its_http_address() -> None:
    kv: KV = {}
    m, (one, two) = started(kv)
    announce(m, one, "starting", None)
    announce(m, one, "ready", "10.0.0.7:41234")
    announce(m, two, "ready", None)  # not an ingress replica: serves no HTTP itself
    finish(m, kv)
    got = members(kv)
    assert got[one].http_address == "10.0.0.7:41234"
    assert got[two].http_address is None
    assert m.state.replicas[one].state is ReplicaState.RUNNING


def test_a_draining_message_keeps_the_address_until_the_member_goes() -> None:
    kv: KV = {}
    m, (one, _) = started(kv)
    announce(m, one, "ready", "h:1")
    finish(m, kv)
    announce(m, one, "draining", None)
    finish(m, kv)
    assert one not in members(kv)
    assert m.state.replicas[one].http_address == "h:1"


def test_a_rewrite_of_every_member_keeps_the_address() -> None:
    kv: KV = {}
    m, (one, _) = started(kv)
    announce(m, one, "ready", "h:1")
    finish(m, kv)
    policy = AutoscalingConfig(min_replicas=0, max_replicas=8, metrics_interval_s=1.5)
    m.reconfigure(dataclasses.replace(CFG, num_replicas=None, autoscaling=policy), "v1", 0.0)
    assert finish(m, kv)  # the report interval changed: members rewritten
    assert members(kv)[one].http_address == "h:1"
    assert members(kv)[one].report_interval_s == 1.5


def test_a_new_owner_keeps_the_address_and_does_not_rewrite() -> None:
    kv: KV = {}
    old, (one, two) = started(kv)
    announce(old, one, "ready", "h:1")
    announce(old, two, "ready", "h:2")
    finish(old, kv)
    new = deployment()
    targets = [d for d in kv.values() if isinstance(d, ReplicaTarget)]
    new.restore(targets, list(members(kv).values()), 5.0)
    assert finish(new, kv) == []
    assert new.state.replicas[one].http_address == "h:1"
    policy = AutoscalingConfig(min_replicas=0, max_replicas=8, metrics_interval_s=1.5)
    new.reconfigure(dataclasses.replace(CFG, num_replicas=None, autoscaling=policy), "v1", 0.0)
    finish(new, kv)
    assert {r: x.http_address for r, x in members(kv).items()} == {one: "h:1", two: "h:2"}


def test_a_bad_address_is_dropped_by_the_decoder_and_counted() -> None:
    kv: KV = {}
    m, (one, _) = started(kv)
    good = Lifecycle(
        one, "a1", "ready", 1.0, SUBJECTS.rpc("app", "Api", one), "v1", None, "app", "Api"
    )
    bad = {**codec.to_wire_map(good), "http_address": "no-port"}
    stats = CoreStats()
    land(m, ReportSubject("lifecycle", "app", "Api", one), msgpack.packb(bad), 1.0, None,
         SUBJECTS, stats)  # fmt: skip
    assert stats.dropped["bad_value"] == 1
    assert m.state.replicas[one].state is ReplicaState.PENDING
