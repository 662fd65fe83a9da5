"""Subject builders and parsers for every subject in the wire contract.

All subjects live under `{namespace}.v1` (namespace `fp` by default, so `fp.v1.`). Names that become
subject tokens (app, deployment, replica) use a fixed character set so that a name can never inject a
wildcard (`*`, `>`) or an extra token (`.`) into a subject.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

from shared.errors import UsageError
from shared.kv import buckets

TOKEN_PATTERN = r"[A-Za-z0-9_-]{1,64}"
_TOKEN_RE = re.compile(TOKEN_PATTERN)
DEFAULT_NAMESPACE = "fp"
VERSION_TOKEN = "v1"

ReportKind = Literal["replica", "handle", "heartbeat", "lifecycle"]
REPORT_KINDS: tuple[ReportKind, ...] = ("replica", "handle", "heartbeat", "lifecycle")


def validate_name(value: str, what: str = "name") -> str:
    """Return `value` if it is a valid subject token, else raise a UsageError saying what is allowed."""
    if not isinstance(value, str) or not _TOKEN_RE.fullmatch(value):
        raise UsageError(
            f"invalid {what} {value!r}: use 1-64 characters from A-Z a-z 0-9 '_' '-' "
            "(no dots, spaces or wildcards)"
        )
    return value


@dataclass(frozen=True, slots=True)
class ReportSubject:
    kind: ReportKind
    app: str
    deployment: str
    replica: str | None = None
    """The sender's replica id, when the subject names it (`...{deployment}.{replica}`: what a
    replica publishes; under the auth callout the server lets it publish only its own)."""


@dataclass(frozen=True, slots=True)
class RpcSubject:
    app: str
    deployment: str
    replica: str


@dataclass(frozen=True, slots=True)
class Subjects:
    """Subject names for one namespace. Build once from config and pass down."""

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        validate_name(self.namespace, "namespace")

    @property
    def prefix(self) -> str:
        return f"{self.namespace}.{VERSION_TOKEN}"

    def rpc(self, app: str, deployment: str, replica: str) -> str:
        return (
            f"{self.prefix}.rpc.{validate_name(app, 'app')}."
            f"{validate_name(deployment, 'deployment')}.{validate_name(replica, 'replica')}"
        )

    def call(self, app: str, deployment: str) -> str:
        return f"{self.prefix}.call.{validate_name(app, 'app')}.{validate_name(deployment, 'deployment')}"

    def call_wildcard(self) -> str:
        return f"{self.prefix}.call.*.*"

    def probe(self, replica: str) -> str:
        return f"{self.prefix}.probe.{validate_name(replica, 'replica')}"

    def report(
        self, kind: ReportKind, app: str, deployment: str, replica: str | None = None
    ) -> str:
        """`{prefix}.report.{kind}.{app}.{deployment}`, with `.{replica}` when a replica speaks
        for itself (docs/wire.md)."""
        if kind not in REPORT_KINDS:
            raise UsageError(f"unknown report kind {kind!r}; expected one of {REPORT_KINDS}")
        subject = (
            f"{self.prefix}.report.{kind}.{validate_name(app, 'app')}."
            f"{validate_name(deployment, 'deployment')}"
        )
        return subject if replica is None else f"{subject}.{validate_name(replica, 'replica')}"

    def reports_wildcard(self) -> str:
        return f"{self.prefix}.report.>"

    def parse_report(self, subject: str) -> ReportSubject:
        """Parse `{prefix}.report.{kind}.{app}.{deployment}[.{replica}]`; UsageError if it is
        not one."""
        return _parse_report(self.prefix, subject)

    def report_kind(self, subject: str) -> str:
        """The kind of a report subject, "unknown" when it is not one: `parse_report` (cached),
        for labelling every message, junk included, before ingest refuses it."""
        try:
            return _parse_report(self.prefix, subject).kind
        except UsageError:
            return "unknown"

    def parse_rpc(self, subject: str) -> RpcSubject:
        parts = subject.split(".")
        if len(parts) != 6 or f"{parts[0]}.{parts[1]}" != self.prefix or parts[2] != "rpc":
            raise UsageError(f"not an rpc subject: {subject!r}")
        return RpcSubject(
            app=validate_name(parts[3], "app"),
            deployment=validate_name(parts[4], "deployment"),
            replica=validate_name(parts[5], "replica"),
        )

    def parse_call(self, subject: str) -> tuple[str, str]:
        parts = subject.split(".")
        if len(parts) != 5 or f"{parts[0]}.{parts[1]}" != self.prefix or parts[2] != "call":
            raise UsageError(f"not a call subject: {subject!r}")
        return validate_name(parts[3], "app"), validate_name(parts[4], "deployment")


DEFAULT_SUBJECTS = Subjects()

# KV bucket names, declared with the rest of each bucket in shared.kv.buckets.
KV_APPS = buckets.APPS.name
KV_TARGETS = buckets.TARGETS.name
KV_MEMBERSHIP = buckets.MEMBERSHIP.name
KV_STATUS = buckets.STATUS.name
KV_AGENTS = buckets.AGENTS.name
KV_CONTROLLERS = buckets.CONTROLLERS.name


def deployment_key(app: str, deployment: str) -> str:
    """`{app}.{deployment}`: how a deployment is named in logs, metrics and report streams."""
    return f"{app}.{deployment}"


@functools.lru_cache(maxsize=1 << 18)
def _parse_report(prefix: str, subject: str) -> ReportSubject:
    # cached: the controller parses every report's subject, and a fleet has a few subjects per
    # deployment (at 10,000 apps the split and name checks were ~4% of ingest); refusals
    # raise, and exceptions are never cached
    # and every replica's reports have subjects of their own (1 << 18: 65,536 replicas' three)
    parts = subject.split(".")
    if len(parts) not in (6, 7) or f"{parts[0]}.{parts[1]}" != prefix or parts[2] != "report":
        raise UsageError(f"not a report subject: {subject!r}")
    kind, app, deployment = parts[3], parts[4], parts[5]
    if kind not in REPORT_KINDS:
        raise UsageError(f"unknown report kind in subject {subject!r}")
    validate_name(app, "app")
    validate_name(deployment, "deployment")
    replica = validate_name(parts[6], "replica") if len(parts) == 7 else None
    return ReportSubject(kind=kind, app=app, deployment=deployment, replica=replica)


# The report stream (docs/wire.md, "The report stream"): FP_REPORTS captures `{prefix}.report.>`
# and stores each report under `{prefix}.part.{P}.{kind}.{app}.{deployment}[.{replica}]`. The
# controller reads partitions and the recorder reads the stream; both turn a stored subject back
# into the report subject with `report_subject`.
REPORT_STREAM = "FP_REPORTS"


def report_stream_name(subjects: Subjects) -> str:
    """`FP_REPORTS` for the default namespace, `FP_REPORTS_{namespace}` for another."""
    if subjects.namespace == DEFAULT_NAMESPACE:
        return REPORT_STREAM
    return f"{REPORT_STREAM}_{subjects.namespace}"


def partition_prefix(subjects: Subjects) -> str:
    return f"{subjects.prefix}.part"


def partition_subject(subjects: Subjects, partition: int) -> str:
    return f"{partition_prefix(subjects)}.{partition}.>"


def report_subject(subjects: Subjects, stored: str) -> str:
    """`fp.v1.part.{P}.{kind}.{app}.{dep}[.{replica}]` back to
    `fp.v1.report.{kind}.{app}.{dep}[.{replica}]`; any other subject as it is."""
    head = partition_prefix(subjects) + "."
    if not stored.startswith(head):
        return stored
    rest = stored[len(head) :].split(".", 1)
    return f"{subjects.prefix}.report.{rest[1]}" if len(rest) == 2 else stored
