"""Custom policies in the policy worker process (policy_host.py, policy_worker.py): a policy that
never returns, or takes the worker down, costs the control loop one deadline, not the loop; the
other policies keep deciding; the worker never outlives its member."""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import MappingProxyType

import pytest

from services.controller import custom_policy as cp
from services.controller.core import ControllerConfig, ControllerCore
from services.controller.custom_policy import (
    EMPTY_STATE,
    Answer,
    AutoscalingContext,
    PolicyCall,
    PolicyTelemetry,
)
from services.controller.policy_host import ProcessRunner
from shared.appconfig import AppConfig, AutoscalingConfig
from tests.unit.test_controller_core import app_with

ROOT = Path(__file__).resolve().parents[2]
MOD = "tests.integration.misbehaving_policies"
GOOD = f"{MOD}:counts"
DEADLINE_S = 0.3
SLACK_S = 2.0
"""What a busy shared host may add to a tick that waits DEADLINE_S (a fork, descheduling)."""
START_S = 60.0
"""Generous: a worker's interpreter start and imports on a loaded host."""
CFG = AutoscalingConfig(min_replicas=1, max_replicas=8, policy=GOOD)


def call(path: str, app: str = "a", *, state: object = None, suspect: bool = False) -> PolicyCall:
    ctx = AutoscalingContext(
        app, "Model", 2, 2, 4.0, 0.0, MappingProxyType({}), 1, 8, EMPTY_STATE, 0.0, CFG, True
    )
    return PolicyCall(path, ctx, state, suspect)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def until(check: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:g} s: {what}")
        time.sleep(0.02)


@pytest.fixture
def runner() -> Iterator[ProcessRunner]:
    r = ProcessRunner(DEADLINE_S, telemetry=PolicyTelemetry())
    try:
        yield r
    finally:
        pid = r.pid
        r.close()
        assert pid is None or not alive(pid), "close() left the worker running"


def first_called(
    r: ProcessRunner, make: Callable[[], Sequence[PolicyCall]], only: int | None = None
) -> tuple[list[Answer], float]:
    """Run the calls tick after tick until none (or not call `only`) is answered `unavailable`
    (the worker is starting or importing); the answers and how long that run took."""
    result: list[tuple[list[Answer], float]] = []

    def called() -> bool:
        started = time.monotonic()
        answers = r.run(make())
        result[:] = [(answers, time.monotonic() - started)]
        watched = answers if only is None else answers[only : only + 1]
        return all(a.outcome != cp.UNAVAILABLE for a in watched)

    until(called, START_S, "the policy worker started and imported the policies")
    return result[0]


def test_a_policy_answers_from_the_worker_and_its_state_survives_a_restart(
    runner: ProcessRunner,
) -> None:
    (a,), _ = first_called(runner, lambda: [call(GOOD)])
    assert (a.outcome, a.count) == (cp.OK, 3) and isinstance(a.state, bytes)
    assert a.seconds is not None and a.seconds < 1.0
    pid = runner.pid
    assert pid is not None and alive(pid)
    # a policy hangs in the same batch: the worker is killed (the answers it had not sent yet
    # are lost this tick), and the good one's state is not
    answers, _ = first_called(
        runner, lambda: [call(GOOD, state=a.state), call(f"{MOD}:spins")], only=1
    )
    assert [x.outcome for x in answers] == [cp.UNAVAILABLE, cp.TIMEOUT]
    assert runner.pid != pid
    until(lambda: not alive(pid), 10, "the killed worker is gone")
    (b,), _ = first_called(runner, lambda: [call(GOOD, state=a.state)])
    assert isinstance(b.state, bytes) and pickle.loads(b.state) == {"calls": 2}


@pytest.mark.parametrize(
    ("policy", "outcome", "words"),
    [
        ("spins", cp.TIMEOUT, "no answer within 0.3 s"),  # a pure-Python busy loop
        ("sleeps", cp.TIMEOUT, "no answer within 0.3 s"),
        ("holds_the_gil", cp.TIMEOUT, "no answer within 0.3 s"),  # a C loop, GIL held
        ("exits", cp.CRASHED, "exit code 3"),  # os._exit
        ("segfaults", cp.CRASHED, "killed by SIGSEGV"),
    ],
)
def test_a_call_that_never_returns_or_kills_the_worker_costs_one_deadline(
    runner: ProcessRunner, policy: str, outcome: str, words: str
) -> None:
    bad = f"{MOD}:{policy}"
    first_called(runner, lambda: [call(GOOD)])
    pid = runner.pid
    assert pid is not None
    # `bad` is imported at its first call, then called: it hangs, or kills the worker; the good
    # policy behind it in the batch gets no answer from that worker
    answers, took = _batch_with_bad(runner, bad, suspect=False)
    assert [a.outcome for a in answers] == [outcome, cp.UNAVAILABLE]
    assert words in answers[0].detail and took < DEADLINE_S + SLACK_S
    assert runner.pid != pid
    until(lambda: not alive(pid), 10, "the first worker is gone")
    # a suspect (a strike last time) runs after the others: the good one gets its answer
    answers, took = _batch_with_bad(runner, bad, suspect=True)
    assert [a.outcome for a in answers] == [outcome, cp.OK]
    assert took < DEADLINE_S + SLACK_S


def _batch_with_bad(r: ProcessRunner, bad: str, *, suspect: bool) -> tuple[list[Answer], float]:
    """The first tick at which `bad` (and GOOD with it) reaches a worker."""
    return first_called(r, lambda: [call(bad, "b", suspect=suspect), call(GOOD)], only=0)


def test_an_import_that_never_finishes_is_killed_and_blamed() -> None:
    tel = PolicyTelemetry()
    r = ProcessRunner(DEADLINE_S, import_timeout_s=1.0, telemetry=tel)
    hanging = "tests.integration.hanging_import_policy:policy"
    try:
        answers, _ = first_called(r, lambda: [call(hanging), call(GOOD)], only=0)
        assert answers[0].outcome == cp.TIMEOUT and "importing it" in answers[0].detail
        assert tel.restarts["import_timeout"] == 1
        # it is not imported again for a while (not_loaded), and the good one is called
        answers, _ = first_called(r, lambda: [call(hanging), call(GOOD)])
        assert [a.outcome for a in answers] == [cp.NOT_LOADED, cp.OK]
    finally:
        r.close()


# -- the control loop with a hanging policy ---------------------------------------------------


def named(name: str, policy: str) -> AppConfig:
    scaling = AutoscalingConfig(
        min_replicas=1, max_replicas=4, look_back_period_s=1.0, metrics_interval_s=0.5,
        policy=policy,
    )  # fmt: skip
    return dataclasses.replace(app_with(scaling), name=name, route_prefix=f"/{name}")


def test_the_control_loop_keeps_deciding_while_a_policy_never_returns() -> None:
    """The core ticks (as the service does, every 0.1 s) with the process runner: the policy
    that spins times out three times, then is quarantined; no tick waits longer than a deadline;
    the other custom policy and the default one keep deciding. Run inline (the policies on the
    loop, as before the worker), the first tick never returns: the watchdog fails the test."""
    runner = ProcessRunner(DEADLINE_S, telemetry=PolicyTelemetry())
    core = ControllerCore(ControllerConfig(), policies=runner)
    cp.TELEMETRY.drain()
    tel = cp.TELEMETRY  # where the core's policies count
    core.set_apps(
        {
            "stuck": named("stuck", f"{MOD}:spins"),
            "good": named("good", GOOD),
            "shop": app_with(None),
        },
        time.monotonic(),
    )
    stuck, good = core.deployments[("stuck", "Model")], core.deployments[("good", "Model")]
    ticks: list[float] = []
    good_rules: list[str] = []
    done = threading.Event()

    def loop() -> None:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            now = time.monotonic()
            core.tick(now, time.time())
            ticks.append(time.monotonic() - now)
            good_rules.append(good.decision.rule)
            if tel.quarantines and good_rules[-20:] == ["custom"] * 20:
                break
            time.sleep(max(0.0, now + 0.1 - time.monotonic()))  # the control interval
        done.set()

    watchdog = threading.Thread(target=loop, daemon=True)
    watchdog.start()
    try:
        assert done.wait(120), "the control loop is stuck in a custom policy"
        assert tel.quarantines == {("stuck", "Model"): 1}
        timeouts = {k: n for k, n in tel.calls.items() if k[2] == cp.TIMEOUT}
        assert timeouts == {("stuck", "Model", cp.TIMEOUT): 3}
        assert max(ticks) < DEADLINE_S + SLACK_S, max(ticks)
        assert good_rules[-20:] == ["custom"] * 20 and good.state.target == 3
        assert stuck.decision.rule == "custom_fallback"
        assert "quarantined" in stuck.status_view().last_decision
        shop = core.deployments[("shop", "Model")]
        assert shop.decision.rule not in ("custom", "custom_fallback")
    finally:
        pid = runner.pid
        runner.close()
        cp.TELEMETRY.drain()
    assert pid is None or not alive(pid)


CHILD = """
import sys, time
from services.controller.policy_host import ProcessRunner
from tests.integration.test_policy_worker import call, GOOD, MOD
r = ProcessRunner(600.0)
while r.run([call(GOOD)])[0].outcome != "ok":
    time.sleep(0.02)
print(r.pid, flush=True)
while True:
    r.run([call(MOD + ":spins")])  # unavailable while it imports, then stuck for 600 s
    time.sleep(0.02)
"""


def test_the_worker_dies_with_its_member_even_inside_a_policy() -> None:
    """A member that is SIGKILLed cannot close its worker: PR_SET_PDEATHSIG kills it, even
    while it runs a policy that never returns (an idle worker would see its pipe close)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    member = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    worker = 0
    try:
        assert member.stdout is not None
        worker = int(member.stdout.readline())
        assert alive(worker)
        spent = _cpu_ticks(worker)
        until(lambda: _cpu_ticks(worker) > spent + 30, 60, "the worker spins in the policy")
        member.send_signal(signal.SIGKILL)
        member.wait(10)
        until(lambda: not alive(worker), 10, "the worker died with its member")
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
        if worker and alive(worker):
            os.kill(worker, signal.SIGKILL)


def _cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])
