"""The fleet's NATS roles and their permissions: the one declaration of who may do what.

Two places turn it into server rules: scripts/gen_nats_accounts.py writes it out as the static
users of compose/nats/accounts.conf, and the auth callout (services/auth) issues it in the user
JWT of each connection, narrowing the replica role to one replica (`services.auth.perms`).
Subjects assume the default namespace `fp`.
"""

from __future__ import annotations

from dataclasses import dataclass


def kv_read(bucket: str) -> list[str]:
    """Bind (stream info), get (direct or message get), watch and list keys (ordered consumer),
    read many keys at once (a pull consumer: `KV.snapshot`)."""
    s = f"KV_{bucket}"
    return [
        f"$JS.API.STREAM.INFO.{s}",
        f"$JS.API.DIRECT.GET.{s}",
        f"$JS.API.DIRECT.GET.{s}.>",
        f"$JS.API.STREAM.MSG.GET.{s}",
        f"$JS.API.CONSUMER.CREATE.{s}",
        f"$JS.API.CONSUMER.CREATE.{s}.>",
        f"$JS.API.CONSUMER.DELETE.{s}.>",
        f"$JS.API.CONSUMER.INFO.{s}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{s}.>",
        f"$JS.FC.{s}.>",
    ]


def kv_write(bucket: str) -> list[str]:
    """Read, create the bucket when missing, and put/create/update/delete its keys."""
    return [*kv_read(bucket), f"$JS.API.STREAM.CREATE.KV_{bucket}", f"$KV.{bucket}.>"]


def stream_read(stream: str) -> list[str]:
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def objects_read(bucket: str) -> list[str]:
    """A JetStream object store: bind, read an object's meta (last message of its subject)
    and its chunks (an ordered consumer, found by subject), list the objects."""
    s = f"OBJ_{bucket}"
    return [
        *stream_read(s),
        "$JS.API.STREAM.NAMES",  # nats-py finds a consumer's stream by subject
        f"$JS.API.STREAM.MSG.GET.{s}",
        f"$JS.API.DIRECT.GET.{s}",
        f"$JS.API.DIRECT.GET.{s}.>",
    ]


def objects_write(bucket: str) -> list[str]:
    """Read, create the store when missing, put (chunks and meta), delete (purge its chunks)."""
    s = f"OBJ_{bucket}"
    return [
        *objects_read(bucket),
        f"$JS.API.STREAM.CREATE.{s}",
        f"$JS.API.STREAM.PURGE.{s}",
        f"$O.{bucket}.>",
    ]


PACKAGES = "fp_packages"
"""The code packages' object store (shared/packagestore.py): deploying writes, agents read."""

DESTRUCTIVE = [
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.ACCOUNT.PURGE.>",
]
OPERATOR_READS = ("fp_status", "fp_targets", "fp_membership", "fp_agents", "fp_routes",
                  "fp_controllers", "fp_leases")  # fmt: skip
CONTROL_BUCKETS = ("fp_targets", "fp_membership", "fp_status", "fp_leases", "fp_controllers")


@dataclass(frozen=True)
class Role:
    user: str
    why: str
    publish: list[str]
    subscribe: list[str]
    deny_publish: list[str]


ROLES = [
    Role(
        "controller",
        "the consumer group: FP_REPORTS and the control buckets; probes replicas",
        publish=[
            "$JS.API.>",  # creates/updates FP_REPORTS and its buckets, pinned pull consumers
            "$JS.FC.>",
            "$JS.ACK.>",
            *(f"$KV.{b}.>" for b in CONTROL_BUCKETS),
            "fp.v1.probe.>",
            "_INBOX.>",
        ],
        subscribe=["_INBOX.>", "fp.v1.report.>"],
        deny_publish=DESTRUCTIVE,
    ),
    Role(
        "agent",
        "a node agent: registers in fp_agents, follows fp_targets, reports replica exits, "
        "fetches code packages (read only)",
        publish=[
            *kv_write("fp_agents"),
            *kv_read("fp_targets"),
            "fp.v1.report.lifecycle.>",
            *objects_read(PACKAGES),
        ],
        subscribe=["_INBOX.>"],
        deny_publish=[],
    ),
    Role(
        "replica",
        "a replica: its reports and its answers; never a request on an rpc subject, never a KV write",
        publish=[
            "fp.v1.report.replica.>",
            "fp.v1.report.heartbeat.>",
            "fp.v1.report.lifecycle.>",
            "_INBOX.>",  # admissions, results, probe replies: to the caller's inbox
            *kv_read("fp_membership"),
            *kv_read("fp_apps"),  # a class with reconfigure() follows its user_config
        ],
        subscribe=["fp.v1.rpc.>", "fp.v1.probe.>", "_INBOX.>"],
        deny_publish=["fp.v1.rpc.>", "fp.v1.call.>", "fp.v1.probe.>", "$KV.>", "$O.>"],
    ),
    Role(
        "router",
        "the HTTP proxy and the router gateway: call deployments, report what they see",
        publish=[
            "fp.v1.rpc.>",
            "fp.v1.probe.>",  # liveness of a replica gone silent on an admitted request
            "fp.v1.report.handle.>",
            "_INBOX.>",
            *kv_write("fp_routes"),
            *kv_read("fp_membership"),
            *kv_read("fp_apps"),
            *kv_read("fp_status"),
        ],
        # the gateway is a NATS micro service: discoverable on $SRV.PING/INFO/STATS
        subscribe=["fp.v1.call.>", "_INBOX.>", "$SRV.>"],
        deny_publish=[],
    ),
    Role(
        "recorder",
        "fleetpulse record: subscribes to the fleet's subjects, exports FP_REPORTS",
        publish=["_INBOX.>", *stream_read("FP_REPORTS")],
        subscribe=["fp.v1.>", "_INBOX.>"],
        deny_publish=[],
    ),
    Role(
        "operator",
        "fleetpulse deploy/delete/status, calls through the gateway, replay into a fleet; the only "
        "role that may write apps and code packages (deploying runs code on every agent host)",
        publish=[
            *kv_write("fp_apps"),
            *objects_write(PACKAGES),
            # its deploy and delete records, under its own name only (shared/kv/audit.py)
            *kv_read("fp_audit"),
            "$JS.API.STREAM.CREATE.KV_fp_audit",
            "$KV.fp_audit.operator.>",
            *(s for b in OPERATOR_READS for s in kv_read(b)),
            *stream_read("FP_REPORTS"),
            "fp.v1.report.>",
            "fp.v1.call.>",
            "_INBOX.>",
        ],
        subscribe=["fp.v1.>", "_INBOX.>"],
        deny_publish=[],
    ),
]

ROLE_BY_NAME = {r.user: r for r in ROLES}
