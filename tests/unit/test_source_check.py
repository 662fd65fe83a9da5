"""source_check: a report's payload must name the source its subject names (pure, no bus)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.controller.source_check import speaks_for_another
from shared.subjects import DEFAULT_SUBJECTS as S
from shared.subjects import TOKEN_PATTERN, ReportSubject
from shared.wire.messages import HealthStatus, Heartbeat, Lifecycle, ReplicaReport

IDS = st.sampled_from(["r1", "r2"])  # two siblings: equal and different ids both come up


def health(rid: str) -> HealthStatus:
    return HealthStatus(rid, True, 1.0, 0)


@given(IDS, IDS, st.none() | IDS, st.booleans())
def test_a_report_speaks_for_another_exactly_when_an_id_differs_from_the_subjects(
    sender: str, claimed: str, health_of: str | None, named: bool
) -> None:
    where = ReportSubject("replica", "a", "d", sender if named else None)
    r = ReplicaReport(claimed, 1.0, 1, 0.0, {}, None if health_of is None else health(health_of))
    ids = {claimed} | ({health_of} if health_of else set())
    assert speaks_for_another(S, where, r) == (named and ids != {sender})
    beat = Heartbeat(health(claimed), 1.0)
    assert speaks_for_another(S, ReportSubject("heartbeat", "a", "d", where.replica), beat) == (
        named and claimed != sender
    )


@given(st.from_regex(f"\\A{TOKEN_PATTERN}\\Z", fullmatch=True), st.booleans())
def test_a_lifecycle_event_names_its_own_deployment_and_rpc_subject(rid: str, named: bool) -> None:
    where = ReportSubject("lifecycle", "a", "d", rid if named else None)

    def ev(app: str = "a", dep: str = "d", rpc: str | None = None) -> Lifecycle:
        rpc = S.rpc("a", "d", rid) if rpc is None else rpc
        return Lifecycle(rid, "", "ready", 1.0, rpc, "v1", None, app, dep)

    assert not speaks_for_another(S, where, ev())
    assert not speaks_for_another(S, where, ev(rpc=""))  # an agent's `starting`: no rpc yet
    assert speaks_for_another(S, where, ev(app="b"))
    assert speaks_for_another(S, where, ev(dep="e"))
    other = "zz" if rid != "zz" else "yy"
    assert speaks_for_another(S, where, ev(rpc=S.rpc("a", "d", other)))
