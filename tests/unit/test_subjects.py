import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import UsageError
from shared.subjects import (
    DEFAULT_SUBJECTS,
    ReportSubject,
    RpcSubject,
    Subjects,
    partition_subject,
    report_stream_name,
    report_subject,
    validate_name,
)

NAME = st.from_regex(r"\A[A-Za-z0-9_-]{1,64}\Z")


def test_builders_match_the_contract() -> None:
    s = DEFAULT_SUBJECTS
    assert s.rpc("shop", "Cart", "r-1") == "fp.v1.rpc.shop.Cart.r-1"
    assert s.call("shop", "Cart") == "fp.v1.call.shop.Cart"
    assert s.probe("r-1") == "fp.v1.probe.r-1"
    assert s.report("handle", "shop", "Cart") == "fp.v1.report.handle.shop.Cart"
    assert s.reports_wildcard() == "fp.v1.report.>"
    assert Subjects("staging").report("replica", "a", "b") == "staging.v1.report.replica.a.b"


@pytest.mark.parametrize("bad", ["", "a.b", "a*", ">", "a b", "x" * 65, "ä", "a\n"])
def test_bad_tokens_are_refused_with_a_clear_message(bad: str) -> None:
    with pytest.raises(UsageError, match="1-64 characters"):
        validate_name(bad, "app")
    with pytest.raises(UsageError):
        DEFAULT_SUBJECTS.rpc(bad, "d", "r")


@given(NAME, NAME, NAME, st.sampled_from(["replica", "handle", "heartbeat", "lifecycle"]))
def test_parse_inverts_build(app: str, dep: str, rep: str, kind: str) -> None:
    s = DEFAULT_SUBJECTS
    assert s.parse_report(s.report(kind, app, dep)) == ReportSubject(kind, app, dep)  # type: ignore[arg-type]
    mine = s.report(kind, app, dep, rep)  # type: ignore[arg-type]
    assert mine == f"fp.v1.report.{kind}.{app}.{dep}.{rep}"
    assert s.parse_report(mine) == ReportSubject(kind, app, dep, rep)  # type: ignore[arg-type]
    assert s.parse_rpc(s.rpc(app, dep, rep)) == RpcSubject(app, dep, rep)
    assert s.parse_call(s.call(app, dep)) == (app, dep)


@pytest.mark.parametrize(
    "subject",
    [
        "fp.v1.report.bogus.a.b",
        "fp.v2.report.handle.a.b",
        "fp.v1.report.handle.a",
        "fp.v1.report.handle.a.b.c.d",
        "fp.v1.report.handle.a.b.c*",
        "x.v1.rpc.a.b.c",
    ],
)
def test_parse_rejects_foreign_subjects(subject: str) -> None:
    with pytest.raises(UsageError):
        if ".rpc." in subject:
            DEFAULT_SUBJECTS.parse_rpc(subject)
        else:
            DEFAULT_SUBJECTS.parse_report(subject)


def test_the_report_stream_subjects_round_trip_and_the_kind_is_the_parsed_one() -> None:
    s = Subjects("ns1")
    assert report_stream_name(DEFAULT_SUBJECTS) == "FP_REPORTS"
    assert report_stream_name(s) == "FP_REPORTS_ns1"
    assert partition_subject(s, 3) == "ns1.v1.part.3.>"
    stored = "ns1.v1.part.3.handle.shop.api"
    assert report_subject(s, stored) == "ns1.v1.report.handle.shop.api"
    assert (
        report_subject(s, "ns1.v1.report.replica.shop.api.r1")
        == "ns1.v1.report.replica.shop.api.r1"
    )
    assert s.report_kind("ns1.v1.report.lifecycle.shop.api.r1") == "lifecycle"
    assert (
        s.report_kind(report_subject(s, stored)) == s.parse_report(report_subject(s, stored)).kind
    )
    for junk in ("ns1.v1.report.bogus.shop.api", "fp.v1.report.handle.shop.api", "x", ""):
        assert s.report_kind(junk) == "unknown"
