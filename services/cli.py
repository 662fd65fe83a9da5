"""`fleetpulse`: one entry point for every service and tool.

Each subcommand parses its flags into one frozen config and hands it to its service's `main`.
Services import lazily so that `fleetpulse --help` is instant and one broken extra cannot break
every command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from shared import settings
from shared.cliargs import (
    Command,
    add_nats_auth_flags,
    add_nats_flag,
    apply_nats_flags,
    log_level,
)
from shared.errors import FleetpulseError

QUIET_COMMANDS = frozenset({"deploy", "delete", "status", "audit"})
"""One-shot tools: their output is the answer, connection chatter stays out of it."""


def _cmd_replay(args: argparse.Namespace) -> int:
    """Republish a recording (the recorder), or with --what-if run it through a config (what-if)."""
    if args.what_if is not None:
        from services.whatif.run import run_whatif_args

        return run_whatif_args(args)
    from services.recorder.replay import run_replay

    return run_replay(args)


def _cmd_up(args: argparse.Namespace) -> int:
    from services.up import run_up

    return run_up(args)


def _cmd_replica(args: argparse.Namespace) -> int:
    from services.replica.__main__ import run_from_args

    return run_from_args(args)


def _cmd_controller(args: argparse.Namespace) -> int:
    from services.controller.__main__ import run_from_args

    return run_from_args(args)


def _cmd_agent(args: argparse.Namespace) -> int:
    from services.agent.__main__ import run_from_args

    return run_from_args(args)


def _cmd_auth(args: argparse.Namespace) -> int:
    from services.auth.__main__ import run_from_args

    return run_from_args(args)


def _cmd_auth_key(args: argparse.Namespace) -> int:
    from services.auth.keys import run_keygen

    return run_keygen(args)


def _cmd_auth_init(args: argparse.Namespace) -> int:
    from services.auth.keys import run_init

    return run_init(args)


def _cmd_auth_credentials(args: argparse.Namespace) -> int:
    from services.auth.keys import run_credentials

    return run_credentials(args)


def _cmd_deploy(args: argparse.Namespace) -> int:
    from services.ops.deploy import run_deploy

    return run_deploy(args)


def _cmd_delete(args: argparse.Namespace) -> int:
    from services.ops.deploy import run_delete

    return run_delete(args)


def _cmd_audit(args: argparse.Namespace) -> int:
    from services.ops.audit import run_audit

    return run_audit(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from services.ops.status import run_status

    return run_status(args)


def _cmd_proxy(args: argparse.Namespace) -> int:
    from services.proxy.__main__ import run_from_args

    return run_from_args(args)


def _cmd_router(args: argparse.Namespace) -> int:
    from services.router.__main__ import run_from_args

    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetpulse",
        description=(
            "fleetpulse: a control plane for fleets of serving replicas on NATS. "
            "Run `fleetpulse COMMAND --help` for a command's options."
        ),
    )
    settings.LOG_LEVEL.add_flag(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    from services.up_args import add_up_arguments

    up = sub.add_parser("up", help="run fleetpulse on this machine with an embedded nats-server")
    add_up_arguments(up)
    add_nats_auth_flags(up.add_argument_group("credentials for an external NATS (--nats)"))
    up.set_defaults(func=_cmd_up)

    from services.replica.config import add_replica_arguments

    rep = sub.add_parser("replica", help="run one replica process hosting user code")
    add_nats_flag(rep)
    add_replica_arguments(rep)
    rep.set_defaults(func=_cmd_replica)

    from services.controller.__main__ import add_controller_arguments

    ctl = sub.add_parser(
        "controller", help="run a controller member: ingest, health verdicts, autoscaling"
    )
    add_nats_flag(ctl)
    add_controller_arguments(ctl)
    ctl.set_defaults(func=_cmd_controller)

    from services.agent.config import add_agent_arguments

    agent = sub.add_parser("agent", help="run a node agent: starts and stops replica processes")
    add_nats_flag(agent)
    add_agent_arguments(agent)
    agent.set_defaults(func=_cmd_agent)

    from services.auth.config import add_auth_arguments
    from services.auth.keys import (
        add_credentials_arguments,
        add_init_arguments,
        add_keygen_arguments,
    )

    auth = sub.add_parser("auth", help="run the NATS auth callout: per-connection permissions")
    add_nats_flag(auth)
    add_auth_arguments(auth)
    auth.set_defaults(func=_cmd_auth)
    key = sub.add_parser("auth-key", help="make an nkey seed for the auth callout or an agent")
    add_keygen_arguments(key)
    key.set_defaults(func=_cmd_auth_key)
    init = sub.add_parser(
        "auth-init", help="make the auth callout's missing keys and the files servers read"
    )
    add_init_arguments(init)
    init.set_defaults(func=_cmd_auth_init)
    creds = sub.add_parser(
        "auth-credentials", help="print a role's NATS login as shell exports (for `eval`)"
    )
    add_credentials_arguments(creds)
    creds.set_defaults(func=_cmd_auth_credentials)

    from services.ops.deploy import add_delete_arguments, add_deploy_arguments
    from services.ops.status import add_status_arguments

    dep = sub.add_parser("deploy", help="validate an app YAML and deploy it (KV fp_apps)")
    add_nats_flag(dep)
    add_deploy_arguments(dep)
    dep.set_defaults(func=_cmd_deploy)
    rm = sub.add_parser("delete", help="delete an application (its replicas drain and stop)")
    add_nats_flag(rm)
    add_delete_arguments(rm)
    rm.set_defaults(func=_cmd_delete)
    st = sub.add_parser("status", help="show applications, deployments, replicas and decisions")
    add_nats_flag(st)
    add_status_arguments(st)
    st.set_defaults(func=_cmd_status)
    from services.ops.audit import add_audit_arguments

    au = sub.add_parser("audit", help="who deployed or deleted which app, when, what version")
    add_nats_flag(au)
    add_audit_arguments(au)
    au.set_defaults(func=_cmd_audit)

    from services.proxy.config import add_proxy_arguments

    px = sub.add_parser("proxy", help="run the HTTP ingress: routes by app prefix, holds at zero")
    add_nats_flag(px)
    add_proxy_arguments(px)
    px.set_defaults(func=_cmd_proxy)

    from services.recorder.__main__ import (
        add_record_arguments,
        add_replay_arguments,
        run_record,
    )
    from services.whatif.run import add_whatif_arguments

    rec = sub.add_parser("record", help="record NATS subjects (or FP_REPORTS) to Arrow IPC files")
    add_nats_flag(rec)
    add_record_arguments(rec)
    rec.set_defaults(func=run_record)
    rep = sub.add_parser(
        "replay", help="republish a recording, or run a what-if of an autoscaling config"
    )
    add_nats_flag(rep)
    add_replay_arguments(rep)
    add_whatif_arguments(rep)
    rep.set_defaults(func=_cmd_replay)

    from services.whatif.tune import add_tune_arguments, run_tune

    tun = sub.add_parser(
        "tune", help="search autoscaling configs on a recording for the cheapest meeting an SLO"
    )
    add_tune_arguments(tun)
    tun.set_defaults(func=run_tune)

    from services.router.config import add_gateway_arguments

    gw = sub.add_parser(
        "router",
        help="run the router gateway: any-language callers on fp.v1.call.{app}.{deployment}",
    )
    add_nats_flag(gw)
    add_gateway_arguments(gw)
    gw.set_defaults(func=_cmd_router)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = log_level(args, "WARNING" if args.command in QUIET_COMMANDS else "INFO")
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func: Command | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        apply_nats_flags(args)
        return func(args)
    except FleetpulseError as exc:
        print(f"fleetpulse {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
