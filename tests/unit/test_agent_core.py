"""The agent's pure core (plan, specs, argv), its fp_agents value and its config."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
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
    ReplicaSpec,
    Start,
    Stop,
    apply,
    deployment_config,
    merge_wanted,
    plan,
    replica_argv,
    specs_for_agent,
)
from services.agent.info import AgentInfo
from services.replica.config import add_replica_arguments
from services.replica.config import config_from_args as replica_config_from_args
from shared.appconfig import AutoscalingConfig, DeploymentConfig
from shared.control import ReplicaTarget, TargetSet
from shared.errors import ConfigError, UsageError, WireError
from shared.kv.envelope import MAX_DOCUMENT_BYTES
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import validate_name

MARGIN = 5.0


def spec(rid: str, grace: float = 2.0, app: str = "app", dep: str = "dep") -> ReplicaSpec:
    return ReplicaSpec(
        app=app,
        deployment=dep,
        replica_id=rid,
        version="v1",
        rpc_subject=S.rpc(app, dep, rid),
        import_path="services.examples.echo:Echo",
        graceful_shutdown_timeout_s=grace,
    )


def wanted_of(*rids: str) -> dict[str, ReplicaSpec]:
    return {r: spec(r) for r in rids}


def running(**phases: str) -> dict[str, ChildState]:
    out = {}
    for rid, what in phases.items():
        child = ChildState(spec(rid))
        if what == "stopping":
            child = child.stopping(10.0)
        elif what == "killed":
            child = child.stopping(10.0).killed()
        elif what.startswith("exited"):
            child = child.exited_with(int(what.removeprefix("exited") or 0))
        out[rid] = child
    return out


def starts(actions: list) -> list[str]:
    return [a.spec.replica_id for a in actions if isinstance(a, Start)]


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
    children = {"a": ChildState(spec("a", grace=3.0)), "b": ChildState(spec("b"))}
    actions = plan(wanted_of("b"), children, 8, now=50.0, kill_margin_s=MARGIN)
    assert actions == [Stop("a", 50.0 + 3.0 + MARGIN)]


def test_kills_only_once_the_stop_deadline_has_passed() -> None:
    children = {"a": ChildState(spec("a")).stopping(deadline=20.0)}
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
    assert actions == [Forget("old"), Start(spec("new"))]


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
    children = apply({}, [Start(spec("a")), Start(spec("b"))])
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
def situations(draw: st.DrawFn) -> tuple[dict[str, ReplicaSpec], dict[str, ChildState], int, float]:
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
            assert a.spec.replica_id in wanted and a.spec.replica_id not in children
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


# -- targets -> specs -> argv ---------------------------------------------------------------------


def targets(replicas: list[ReplicaTarget], **config: object) -> TargetSet:
    cfg = DeploymentConfig(
        name="dep",
        import_path="services.examples.echo:Echo",
        init_args=(0.0,),
        init_kwargs={"fail_health_file": None},
        max_ongoing_requests=3,
        health_check_period_s=0.5,
        graceful_shutdown_timeout_s=4.0,
        autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=4),
    )
    doc = asdict(cfg)
    doc["init_args"] = list(doc["init_args"])
    doc.update(config)
    return TargetSet("app", "dep", "v7", 1, 1, tuple(replicas), doc)


def test_specs_for_agent_picks_mine_in_order() -> None:
    ts = targets(
        [
            ReplicaTarget("r-2", "", "PENDING", "me"),
            ReplicaTarget("r-1", "v6", "RUNNING", "other"),
            ReplicaTarget("r-0", "v6", "RUNNING", "me", "custom.subject"),
        ]
    )
    ts = TargetSet.decode(ts.encode())  # as read from KV
    specs = specs_for_agent(ts, "me")
    assert [s.replica_id for s in specs] == ["r-2", "r-0"]
    assert specs[0].version == "v7" and specs[1].version == "v6"  # the target's own version wins
    assert specs[0].rpc_subject == S.rpc("app", "dep", "r-2")
    assert specs[1].rpc_subject == "custom.subject"
    assert specs[0].init_args == (0.0,) and specs[0].max_ongoing_requests == 3
    assert specs[0].graceful_shutdown_timeout_s == 4.0
    assert specs_for_agent(ts, "nobody") == []


def test_unknown_config_fields_are_ignored() -> None:
    ts = targets([ReplicaTarget("r-0", "", "PENDING", "me")], future_knob=True)
    ts = TargetSet.decode(ts.encode())
    assert specs_for_agent(ts, "me")[0].import_path == "services.examples.echo:Echo"


@pytest.mark.parametrize(
    "bad",
    [
        {"import_path": "no-colon"},
        {"max_ongoing_requests": 0},
        {"health_check_period_s": -1},
        {"autoscaling": {"min_replicas": 3, "max_replicas": 1}},
        {"init_args": 5},
        {"name": "bad name"},
    ],
)
def test_a_bad_config_is_a_wire_error(bad: dict) -> None:
    ts = targets([ReplicaTarget("r-0", "", "PENDING", "me")], **bad)
    with pytest.raises(WireError):
        specs_for_agent(ts, "me")


@pytest.mark.parametrize(
    "target",
    [
        ReplicaTarget(7, "", "PENDING", "me", "custom.subject"),  # type: ignore[arg-type]
        ReplicaTarget("r.0", "", "PENDING", "me", "custom.subject"),
        ReplicaTarget("r-0", 3, "PENDING", "me"),  # type: ignore[arg-type]
        ReplicaTarget("r-0", "", "PENDING", "me", None),  # type: ignore[arg-type]
    ],
)
def test_bad_replica_targets_are_wire_errors(target: ReplicaTarget) -> None:
    with pytest.raises(WireError):
        specs_for_agent(targets([target]), "me")


def test_a_bad_app_name_is_a_wire_error() -> None:
    ts = targets([ReplicaTarget("r-0", "", "PENDING", "me", "custom.subject")])
    bad = TargetSet("a pp", "dep", "v", 1, 1, ts.replicas, ts.config)
    with pytest.raises(WireError):
        specs_for_agent(bad, "me")


def test_a_bad_config_does_not_matter_when_nothing_is_mine() -> None:
    ts = targets([ReplicaTarget("r-0", "", "PENDING", "other")], import_path="no-colon")
    assert specs_for_agent(ts, "me") == []


def test_deployment_config_round_trips() -> None:
    cfg = deployment_config(targets([]).config)
    assert cfg.autoscaling == AutoscalingConfig(min_replicas=1, max_replicas=4)
    assert cfg.health_check_period_s == 0.5


def test_merge_wanted_orders_by_key_then_target_order() -> None:
    merged = merge_wanted(
        {"b.dep": [spec("b1"), spec("b0")], "a.dep": [spec("a1"), spec("b1", grace=9.0)]}
    )
    assert list(merged) == ["a1", "b1", "b0"]
    assert merged["b1"].graceful_shutdown_timeout_s == 9.0  # first id wins


def test_replica_argv_parses_into_the_same_replica_config() -> None:
    ts = TargetSet.decode(targets([ReplicaTarget("r-0", "", "PENDING", "me")]).encode())
    s = specs_for_agent(ts, "me")[0]
    argv = replica_argv(s, python="/py", nats_url="nats://h:1", agent_id="me", namespace="ns")
    assert argv[:3] == ["/py", "-m", "services.replica"]
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats")
    add_replica_arguments(parser)
    cfg = replica_config_from_args(parser.parse_args(argv[3:]))
    assert (cfg.app, cfg.deployment, cfg.replica_id) == ("app", "dep", "r-0")
    assert cfg.import_path == s.import_path and cfg.nats_url == "nats://h:1"
    assert cfg.init_args == (0.0,) and cfg.init_kwargs == {"fail_health_file": None}
    assert cfg.max_ongoing_requests == 3 and cfg.health_check_period_s == 0.5
    assert cfg.health_check_timeout_s == 30.0 and cfg.graceful_shutdown_timeout_s == 4.0
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
    good = targets([ReplicaTarget("r-0", "", "PENDING", "me")])
    agent._on_targets("app.dep", good.encode())
    assert [s.replica_id for s in agent._specs["app.dep"]] == ["r-0"]
    agent._on_targets("app.dep", b"{not json")
    agent._on_targets("other.dep", good.encode())  # a value under the wrong key
    assert [s.replica_id for s in agent._specs["app.dep"]] == ["r-0"]
    assert "other.dep" not in agent._specs
    assert agent.bad.counts == {"malformed": 1, "bad_value": 1}
    agent._on_targets("app.dep", targets([ReplicaTarget("r-0", "", "PENDING", "x")]).encode())
    assert "app.dep" not in agent._specs  # nothing of ours left in it
