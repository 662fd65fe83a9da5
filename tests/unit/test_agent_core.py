"""The agent's pure core (plan, wanted targets, argv), its fp_agents value and its config."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.agent.config import (
    AgentConfig,
    add_agent_arguments,
    config_from_args,
    default_agent_id,
    parse_resources,
)
from services.agent.core import (
    ChildState,
    Forget,
    Kill,
    OverCapacity,
    Phase,
    Start,
    Stop,
    apply,
    merge_wanted,
    plan,
    replica_argv,
    wanted_target,
)
from services.replica.config import add_replica_arguments
from services.replica.config import config_from_args as replica_config_from_args
from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.bus import KVEntry
from shared.errors import ConfigError, UsageError, WireError
from shared.kv import envelope
from shared.kv.agents import AgentInfo
from shared.kv.envelope import MAX_DOCUMENT_BYTES
from shared.kv.targets import ReplicaTarget, agent_pattern
from shared.replicaspec import ReplicaSpec
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import validate_name

MARGIN = 5.0


def target(
    rid: str,
    grace: float = 2.0,
    app: str = "app",
    dep: str = "dep",
    *,
    order: int = 1,
    slot: int = 0,
) -> ReplicaTarget:
    return ReplicaTarget(
        app=app,
        deployment=dep,
        replica_id=rid,
        agent_id="me",
        slot=slot,
        order=order,
        version="v1",
        rpc_subject=S.rpc(app, dep, rid),
        spec=ReplicaSpec("services.examples.echo:Echo", graceful_shutdown_timeout_s=grace),
    )


def wanted_of(*rids: str) -> dict[str, ReplicaTarget]:
    return {r: target(r) for r in rids}


def running(**phases: str) -> dict[str, ChildState]:
    out = {}
    for rid, what in phases.items():
        child = ChildState(target(rid))
        if what == "stopping":
            child = child.stopping(10.0)
        elif what == "killed":
            child = child.stopping(10.0).killed()
        elif what.startswith("exited"):
            child = child.exited_with(int(what.removeprefix("exited") or 0))
        out[rid] = child
    return out


def starts(actions: list) -> list[str]:
    return [a.target.replica_id for a in actions if isinstance(a, Start)]


# -- plan --------------------------------------------------------------------------------------


def test_starts_missing_replicas_in_target_order() -> None:
    actions = plan(wanted_of("c", "a", "b"), {}, capacity=8, now=0.0)
    assert starts(actions) == ["c", "a", "b"]
    assert len(actions) == 3


def test_running_and_wanted_is_left_alone() -> None:
    assert plan(wanted_of("a", "b"), running(a="running", b="running"), 8, 100.0) == []


def test_capacity_runs_the_first_n_and_reports_the_rest() -> None:
    actions = plan(wanted_of("a", "b", "c", "d"), running(b="running"), capacity=2, now=0.0)
    assert starts(actions) == ["a"]
    over = [a for a in actions if isinstance(a, OverCapacity)]
    assert over == [OverCapacity(("c", "d"), assigned=4, draining=0)]


def test_zero_capacity_starts_nothing() -> None:
    actions = plan(wanted_of("a"), {}, capacity=0, now=0.0)
    assert actions == [OverCapacity(("a",), assigned=1, draining=0)]


def test_stops_unwanted_with_deadline_grace_plus_margin() -> None:
    children = {"a": ChildState(target("a", grace=3.0)), "b": ChildState(target("b"))}
    actions = plan(wanted_of("b"), children, 8, now=50.0, kill_margin_s=MARGIN)
    assert actions == [Stop("a", 50.0 + 3.0 + MARGIN)]


def test_kills_only_once_the_stop_deadline_has_passed() -> None:
    children = {"a": ChildState(target("a")).stopping(deadline=20.0)}
    assert plan({}, children, 8, now=19.999) == []
    assert plan({}, children, 8, now=20.0) == [Kill("a")]
    assert plan({}, children, 8, now=25.0) == [Kill("a")]


def test_a_killed_child_is_not_killed_again() -> None:
    assert plan({}, running(a="killed"), 8, now=1e9) == []


def test_an_exited_replica_still_wanted_is_not_restarted() -> None:
    assert plan(wanted_of("a"), running(a="exited-9"), 8, now=1.0) == []
    assert plan(wanted_of("a"), running(a="exited0"), 8, now=1.0) == []


def test_an_exited_replica_no_longer_wanted_is_forgotten() -> None:
    assert plan({}, running(a="exited1"), 8, now=1.0) == [Forget("a")]


def test_exited_children_free_their_slot() -> None:
    actions = plan(wanted_of("a", "b"), running(a="exited-9"), capacity=1, now=0.0)
    assert starts(actions) == ["b"]


def test_a_draining_child_holds_its_slot_until_it_exits() -> None:
    children = running(old="stopping")
    actions = plan(wanted_of("new"), children, capacity=1, now=0.0)
    # not an over-assignment: one replica is assigned, one slot is busy draining
    assert actions == [OverCapacity(("new",), assigned=1, draining=1)]
    children["old"] = children["old"].exited_with(0)
    actions = plan(wanted_of("new"), children, capacity=1, now=1.0)
    assert actions == [Forget("old"), Start(target("new"))]


def test_a_stopping_child_that_is_wanted_again_is_neither_restarted_nor_stopped_twice() -> None:
    assert plan(wanted_of("a"), running(a="stopping"), 8, now=1.0) == []


def test_agent_shutdown_is_a_plan_against_nothing() -> None:
    children = running(a="running", b="stopping", c="exited0")
    actions = plan({}, children, 8, now=0.0, kill_margin_s=1.0)
    assert actions == [Stop("a", 0.0 + 2.0 + 1.0), Forget("c")]
    children = apply(children, actions)
    assert set(children) == {"a", "b"}
    assert all(c.phase is Phase.STOPPING for c in children.values())
    assert plan({}, children, 8, now=1e6) == [Kill("a"), Kill("b")]


def test_apply_bookkeeping() -> None:
    children = apply({}, [Start(target("a")), Start(target("b"))])
    children = apply(children, [Stop("a", 7.0), Kill("b")])
    assert children["a"].phase is Phase.STOPPING and children["a"].stop_deadline == 7.0
    assert children["b"].phase is Phase.KILLED
    children["b"] = children["b"].exited_with(-9)
    assert apply(children, [Forget("b")]).keys() == {"a"}


# -- plan, properties ----------------------------------------------------------------------------

IDS = [f"r{i}" for i in range(8)]
CHILD = st.one_of(
    st.just("running"),
    st.just("stopping"),
    st.just("killed"),
    st.sampled_from(["exited0", "exited1", "exited-9", "exited-15"]),
)


@st.composite
def situations(
    draw: st.DrawFn,
) -> tuple[dict[str, ReplicaTarget], dict[str, ChildState], int, float]:
    order = draw(st.permutations(IDS))
    wanted_ids = draw(st.lists(st.sampled_from(order), unique=True, max_size=8))
    have = draw(st.dictionaries(st.sampled_from(IDS), CHILD, max_size=8))
    children = running(**have)
    for rid, child in children.items():
        if child.phase is Phase.STOPPING:
            children[rid] = child.stopping(draw(st.floats(0, 100)))
    return wanted_of(*wanted_ids), children, draw(st.integers(0, 10)), draw(st.floats(0, 100))


def live(children: dict[str, ChildState]) -> int:
    return sum(1 for c in children.values() if not c.exited)


@given(situations())
@settings(max_examples=300, deadline=None)
def test_plan_properties(case: tuple) -> None:
    wanted, children, capacity, now = case
    actions = plan(wanted, children, capacity, now)
    after = apply(children, actions)
    # never above capacity through our own starts
    assert live(after) <= max(capacity, live(children))
    for a in actions:
        if isinstance(a, Start):
            assert a.target.replica_id in wanted and a.target.replica_id not in children
        elif isinstance(a, Stop):
            assert a.replica_id not in wanted and children[a.replica_id].phase is Phase.RUNNING
            assert a.deadline > now
        elif isinstance(a, Kill):
            c = children[a.replica_id]
            assert c.phase is Phase.STOPPING and c.stop_deadline is not None
            assert now >= c.stop_deadline
        elif isinstance(a, Forget):
            assert a.replica_id not in wanted and children[a.replica_id].exited
    # exited replicas are never started again
    assert not any(children[r].exited for r in starts(actions) if r in children)
    # starts are the first missing wanted replicas, in order
    missing = [r for r in wanted if r not in children]
    assert starts(actions) == missing[: len(starts(actions))]
    # idempotent: once applied, the same inputs ask for nothing more
    again = plan(wanted, after, capacity, now)
    assert [a for a in again if not isinstance(a, OverCapacity)] == []


# -- targets -> wanted -> argv --------------------------------------------------------------------


CFG = DeploymentConfig(
    name="dep",
    import_path="services.examples.echo:Echo",
    init_args=(0.0,),
    init_kwargs={"fail_health_file": None},
    max_ongoing_requests=3,
    health_check_period_s=0.5,
    graceful_shutdown_timeout_s=4.0,
    autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=4, metrics_interval_s=2.0),
)


def kv_target(
    rid: str, agent: str = "me", slot: int = 0, version: str = "v7", rpc: str = "", order: int = 1
) -> ReplicaTarget:
    return ReplicaTarget(
        "app", "dep", rid, agent, slot, order, version, rpc, CFG.replica_spec()
    )  # fmt: skip


def as_read(t: ReplicaTarget) -> ReplicaTarget:
    """The target as an agent reads it from KV."""
    return envelope.decode(envelope.encode(t), ReplicaTarget)


def doc_of(t: ReplicaTarget, **change: object) -> bytes:
    doc = json.loads(envelope.encode(t))
    for k, v in change.items():
        if k.startswith("spec."):
            doc["spec"][k.removeprefix("spec.")] = v
        else:
            doc[k] = v
    return json.dumps(doc).encode()


def test_wanted_target_takes_mine_and_fills_the_rpc_subject() -> None:
    mine = as_read(kv_target("r-2", slot=2))
    custom = as_read(kv_target("r-0", slot=0, version="v6", rpc="custom.subject"))
    other = as_read(kv_target("r-1", agent="other", slot=1, version="v6"))
    got = wanted_target("me.app.dep.2", mine, "me", S)
    assert got is not None and got.replica_id == "r-2" and got.version == "v7"
    assert got.rpc_subject == S.rpc("app", "dep", "r-2")
    got = wanted_target("me.app.dep.0", custom, "me", S)
    assert got is not None and got.version == "v6"  # the target's own version
    assert got.rpc_subject == "custom.subject"
    assert got.spec.init_args == (0.0,) and got.spec.max_ongoing_requests == 3
    assert got.spec.graceful_shutdown_timeout_s == 4.0
    assert got.spec.metrics_interval_s == 2.0  # the deployment's metrics interval rides along
    assert wanted_target("other.app.dep.1", other, "me", S) is None


def test_unknown_fields_are_ignored() -> None:
    data = doc_of(kv_target("r-0"), future_knob=True, **{"spec.future_knob": 1})
    t = wanted_target("me.app.dep.0", envelope.decode(data, ReplicaTarget), "me", S)
    assert t is not None and t.spec.import_path == "services.examples.echo:Echo"


@pytest.mark.parametrize(
    "bad",
    [
        {"spec.import_path": "no-colon"},
        {"spec.max_ongoing_requests": 0},
        {"spec.health_check_period_s": -1},
        {"spec.metrics_interval_s": 0},
        {"spec.init_args": 5},
        {"spec.env": {"A=B": "x"}},
        {"deployment": "bad name"},
        {"spec": None},
    ],
)
def test_a_bad_spec_is_a_wire_error(bad: dict) -> None:
    with pytest.raises(WireError):
        envelope.decode(doc_of(kv_target("r-0"), **bad), ReplicaTarget)


@pytest.mark.parametrize(
    "bad",
    [
        {"replica_id": 7},
        {"replica_id": "r.0"},
        {"version": 3},
        {"rpc_subject": None},
        {"slot": -1},
        {"order": "1"},
        {"app": "a pp"},
    ],
)
def test_bad_replica_targets_are_wire_errors(bad: dict) -> None:
    with pytest.raises(WireError):
        envelope.decode(doc_of(kv_target("r-0", rpc="custom.subject"), **bad), ReplicaTarget)


@pytest.mark.parametrize(
    "key",
    [
        "me.app.dep.1",  # another slot than the value's
        "me.app.other.0",  # another deployment
        "me.app.dep",  # not a target key
        "me.app.dep.x",
        "me.app.dep.0.1",
    ],
)
def test_a_target_under_the_wrong_key_is_a_wire_error(key: str) -> None:
    with pytest.raises(WireError):
        wanted_target(key, kv_target("r-0"), "me", S)


def test_an_agent_reads_only_its_own_keys() -> None:
    # what replaced "a bad config does not matter when nothing is mine": another agent's targets
    # are not even read (the watch is on `{agent}.>`), and one that shows up is not ours to run
    assert agent_pattern("me") == "me.>"
    assert wanted_target("other.app.dep.0", kv_target("r-0", agent="other"), "me", S) is None


def test_merge_wanted_orders_by_deployment_then_start_order() -> None:
    def t(rid: str, app: str, order: int, slot: int, grace: float = 2.0) -> ReplicaTarget:
        return target(rid, grace=grace, app=app, order=order, slot=slot)

    # slots are not start order: b0 sits in a lower slot but started later
    per_key = {
        f"me.{x.app}.dep.{x.slot}": x
        for x in (
            t("b1", "b", 1, 5),
            t("b0", "b", 2, 0),
            t("a1", "a", 1, 3),
            t("b1", "a", 2, 1, grace=9.0),  # the same id in two deployments
        )
    }
    merged = merge_wanted(per_key)
    assert list(merged) == ["a1", "b1", "b0"]
    assert merged["b1"].spec.graceful_shutdown_timeout_s == 9.0  # first id wins


def test_replica_argv_parses_into_the_same_replica_config() -> None:
    t = wanted_target("me.app.dep.0", as_read(kv_target("r-0")), "me", S)
    assert t is not None
    argv = replica_argv(t, python="/py", nats_url="nats://h:1", agent_id="me", namespace="ns")
    assert argv[:3] == ["/py", "-m", "services.replica"]
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats")
    add_replica_arguments(parser)
    cfg = replica_config_from_args(parser.parse_args(argv[3:]))
    assert (cfg.app, cfg.deployment, cfg.replica_id) == ("app", "dep", "r-0")
    assert cfg.spec == t.spec and cfg.nats_url == "nats://h:1"
    assert cfg.spec.import_path == "services.examples.echo:Echo"
    assert cfg.spec.init_args == (0.0,) and cfg.spec.init_kwargs == {"fail_health_file": None}
    assert cfg.spec.max_ongoing_requests == 3 and cfg.spec.health_check_period_s == 0.5
    assert cfg.spec.health_check_timeout_s == 30.0
    assert cfg.spec.graceful_shutdown_timeout_s == 4.0
    assert (cfg.agent_id, cfg.version, cfg.namespace) == ("me", "v7", "ns")


# -- AgentInfo ----------------------------------------------------------------------------------


def info(**kw: object) -> AgentInfo:
    base: dict = dict(
        agent_id="host-abc123",
        capacity=4,
        running=1,
        hostname="host.example",
        pid=123,
        started_at=1.7e9,
        resources={"gpus": 2.0},
    )
    base.update(kw)
    return AgentInfo(**base)


def test_agent_info_round_trips() -> None:
    a = info()
    assert AgentInfo.decode(a.encode()) == a
    doc = json.loads(a.encode())
    assert doc["v"] == 1 and doc["kind"] == "agent" and doc["capacity"] == 4
    assert AgentInfo.decode(info(resources={}).encode()).resources == {}


def test_agent_info_ignores_unknown_fields_and_defaults_resources() -> None:
    doc = json.loads(info().encode())
    doc["zone"] = "eu-1"
    del doc["resources"]
    assert AgentInfo.decode(json.dumps(doc).encode()) == info(resources={})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"v": 2}, "unsupported_version"),
        ({"kind": "targets"}, "unexpected_kind"),
        ({"capacity": None}, "wrong_type"),
        ({"capacity": True}, "wrong_type"),
        ({"capacity": -1}, "bad_value"),
        ({"running": 1.5}, "wrong_type"),
        ({"started_at": "now"}, "wrong_type"),
        ({"agent_id": "a.b"}, "bad_value"),
        ({"resources": []}, "wrong_type"),
        ({"resources": {"gpus": -1}}, "bad_value"),
        ({"resources": {"gpus": "2"}}, "wrong_type"),
        ({"resources": {"a b": 1}}, "bad_value"),
        ({"hostname": "h" * 300}, "bad_value"),
    ],
)
def test_agent_info_rejects_bad_fields(change: dict, reason: str) -> None:
    doc = json.loads(info().encode())
    doc.update(change)
    with pytest.raises(WireError) as err:
        AgentInfo.decode(json.dumps(doc).encode())
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "malformed"),
        (b"\xff", "malformed"),
        (b"[1]", "not_a_map"),
        (b'{"v": 1, "kind": "agent"}', "missing_field"),
        (
            b'{"v":1,"kind":"agent","agent_id":"a","capacity":1,"running":0,"hostname":"h",'
            b'"pid":1,"started_at":NaN}',
            "bad_value",
        ),
        (b" " * (MAX_DOCUMENT_BYTES + 1), "oversize"),
    ],
)
def test_agent_info_rejects_garbage(data: bytes, reason: str) -> None:
    with pytest.raises(WireError) as err:
        AgentInfo.decode(data)
    assert err.value.reason == reason


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@settings(max_examples=200, deadline=None)
def test_agent_info_decode_raises_only_wire_errors(data: bytes) -> None:
    try:
        decoded = AgentInfo.decode(data)
    except WireError:
        return
    assert AgentInfo.decode(decoded.encode()) == decoded


# -- config ---------------------------------------------------------------------------------------


def test_default_agent_id_is_a_valid_token_from_the_hostname() -> None:
    a, b = default_agent_id("node-1.example.com"), default_agent_id("node-1.example.com")
    assert a.startswith("node-1-example-com-") and a != b
    validate_name(a)
    validate_name(default_agent_id("x" * 200))
    assert default_agent_id("...").startswith("agent-")


def parse(*argv: str) -> AgentConfig:
    p = argparse.ArgumentParser()
    p.add_argument("--nats", default="nats://127.0.0.1:1")
    add_agent_arguments(p)
    return config_from_args(p.parse_args(argv))


def test_config_from_flags(tmp_path: Path) -> None:
    cfg = parse(
        "--agent-id",
        "a1",
        "--max-replicas",
        "3",
        "--resource",
        "gpus=2",
        "--resource",
        "ram_gb=64",
        "--pythonpath",
        "/x:/y",
        "--pythonpath",
        "/z",
        "--log-dir",
        str(tmp_path),
    )
    assert (cfg.agent_id, cfg.max_replicas) == ("a1", 3)
    assert cfg.resources == {"gpus": 2.0, "ram_gb": 64.0}
    assert cfg.pythonpath == ("/x", "/y", "/z")
    assert cfg.log_dir == str(tmp_path)


def test_config_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETPULSE_AGENT_ID", "from-env")
    assert parse().agent_id == "from-env"
    monkeypatch.delenv("FLEETPULSE_AGENT_ID")
    cfg = parse()
    validate_name(cfg.agent_id)
    assert cfg.max_replicas == 8 and cfg.log_dir is None and cfg.resources == {}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--agent-id", "a.b"], UsageError),
        (["--max-replicas", "-1"], ConfigError),
        (["--resource", "gpus"], ConfigError),
        (["--resource", "gpus=many"], ConfigError),
        (["--resource", "gpus=nan"], ConfigError),
        (["--resource", "gpus=inf"], ConfigError),
        (["--resource", "bad name=1"], UsageError),
        (["--workdir", "/does/not/exist"], ConfigError),
        (["--kill-margin-s", "-1"], ConfigError),
    ],
)
def test_bad_flags_are_refused(argv: list[str], error: type[Exception]) -> None:
    with pytest.raises(error):
        parse(*argv)


def test_parse_resources_keeps_the_last_value() -> None:
    assert parse_resources(["gpus=1", "gpus=2"]) == {"gpus": 2.0}


# -- the shell's handling of fp_targets values (no bus, no processes) ----------------------------


def test_a_garbled_targets_value_keeps_the_last_good_one(tmp_path: Path) -> None:
    from services.agent.service import AgentService

    agent = AgentService(
        AgentConfig(nats_url="nats://127.0.0.1:1", agent_id="me", log_dir=str(tmp_path))
    )
    good = envelope.encode(kv_target("r-0"))
    agent._on_targets("me.app.dep.0", good)
    assert agent._targets["me.app.dep.0"].replica_id == "r-0"
    agent._on_targets("me.app.dep.0", b"{not json")
    agent._on_targets("me.app.dep.1", good)  # a value under the wrong key
    assert agent._targets["me.app.dep.0"].replica_id == "r-0"
    assert "me.app.dep.1" not in agent._targets
    assert agent.bad.counts == {"malformed": 1, "bad_value": 1}
    # a value naming another agent under our key is not the key's own: bad, the last good stays
    agent._on_targets("me.app.dep.0", envelope.encode(kv_target("r-0", agent="x")))
    assert agent._targets["me.app.dep.0"].replica_id == "r-0"
    assert agent.bad.counts == {"malformed": 1, "bad_value": 2}


def test_a_deleted_target_key_is_no_longer_wanted(tmp_path: Path) -> None:
    """A replica moved to another agent or stopped: the controller deletes our key for it."""
    from services.agent.service import AgentService

    class Replay:
        def __init__(self, entries: list[KVEntry | None]) -> None:
            self.entries = entries

        async def __aiter__(self):  # type: ignore[no-untyped-def]
            for e in self.entries:
                yield e

        async def stop(self) -> None:
            pass

    agent = AgentService(
        AgentConfig(nats_url="nats://127.0.0.1:1", agent_id="me", log_dir=str(tmp_path))
    )
    a, b = kv_target("r-0", slot=0), kv_target("r-1", slot=1)
    entries: list[KVEntry | None] = [
        KVEntry("fp_targets", a.key, envelope.encode(a), 1, "PUT"),
        KVEntry("fp_targets", b.key, envelope.encode(b), 2, "PUT"),
        None,
        KVEntry("fp_targets", a.key, b"", 3, "DEL"),
    ]
    asyncio.run(agent._consume(Replay(entries)))  # type: ignore[arg-type]
    assert agent._synced
    assert list(merge_wanted(agent._targets)) == ["r-1"]
