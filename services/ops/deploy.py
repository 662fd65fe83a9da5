"""`fleetpulse deploy FILE` and `fleetpulse delete APP`: the desired apps in KV `fp_apps`.

How it works: deploy validates the whole file (shared.appyaml; a custom autoscaling policy must
import here, as the controller will import it) and every cross-app rule it can
check against what is deployed already (one route_prefix per app, values under the server's
max_payload) before it writes anything; then it writes one key per app, value
`AppConfig.to_json()`. Each write is revision-checked (create a new key, update the revision just
read), so two operators deploying at once cannot silently overwrite each other. The controller
watches fp_apps and does the rest; delete removes the key and the controller drains the app.

NATS KV has no multi-key transaction: if the connection drops between two apps of one file, the
earlier ones are written. Deploying is idempotent, so running it again finishes the job (an
unchanged app is not rewritten, which would only wake every watcher for nothing).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from services.controller.custom_policy import policy_problem
from services.ops import (
    EXIT_INVALID,
    EXIT_OK,
    add_connect_timeout,
    connect,
    existing_kv,
    fail,
    plural,
    run_command,
)
from shared.appconfig import AppConfig
from shared.appyaml import load_apps
from shared.bus import KV
from shared.errors import ConfigError, KVConflict, UsageError
from shared.kv import envelope
from shared.subjects import KV_APPS, validate_name


def add_deploy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="application file (YAML, see docs/deploy.md)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the file and print what would be deployed; connect to nothing",
    )
    add_connect_timeout(p)


def add_delete_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("app", metavar="APP", help="name of the application to delete")
    add_connect_timeout(p)


def run_deploy(args: argparse.Namespace) -> int:
    try:
        apps = load_apps(args.file, check_policy=policy_problem)
    except ConfigError as exc:
        return fail("deploy", str(exc), EXIT_INVALID)
    if args.dry_run:
        for app in apps:
            print(f"valid: {describe(app)} (dry run: nothing written)", flush=True)
        return EXIT_OK

    async def main() -> int:
        bus = await connect(args, "fleetpulse-deploy")
        try:
            kv = await bus.kv(KV_APPS)
            current = await read_apps(kv)
            plan = plan_deploy(apps, current, bus.max_payload, str(args.file))
            for step in plan:
                await write(kv, step)
                print(f"deployed {describe(step.app)}{'' if step.changed else ', unchanged'}")
        finally:
            await bus.close()
        return EXIT_OK

    return run_command("deploy", main)


def run_delete(args: argparse.Namespace) -> int:
    async def main() -> int:
        app = validate_name(args.app, "application name")
        bus = await connect(args, "fleetpulse-delete")
        try:
            kv = await existing_kv(bus, KV_APPS)
            entry = None if kv is None else await kv.get(app)
            if kv is None or entry is None:
                names = [] if kv is None else await kv.keys()
                deployed = ", ".join(names) if names else "none"
                raise UsageError(f"no application {app!r} is deployed (deployed: {deployed})")
            try:
                await kv.delete(app, last_revision=entry.revision)
            except KVConflict:
                raise KVConflict(
                    app, entry.revision, "redeployed meanwhile; run delete again"
                ) from None
        finally:
            await bus.close()
        print(
            f"deleted {app}: the controller drains and stops its replicas "
            f"(follow it with `fleetpulse status --app {app}`)"
        )
        return EXIT_OK

    return run_command("delete", main)


@dataclass(frozen=True, slots=True)
class Current:
    """What fp_apps holds for one app: the raw value, its revision, and the decoded config
    (None when the value is not a valid app document)."""

    value: bytes
    revision: int
    app: AppConfig | None


@dataclass(frozen=True, slots=True)
class Step:
    app: AppConfig
    value: bytes
    revision: int | None
    """The revision to update, or None to create the key."""
    changed: bool


async def read_apps(kv: KV) -> dict[str, Current]:
    out: dict[str, Current] = {}
    for key in await kv.keys():
        entry = await kv.get(key)
        if entry is None:  # deleted between keys() and get()
            continue
        try:
            decoded: AppConfig | None = AppConfig.from_json(entry.value)
        except ConfigError:
            decoded = None  # the controller ignores it too; overwriting it is a fix
        out[key] = Current(entry.value, entry.revision, decoded)
    return out


def plan_deploy(
    apps: list[AppConfig], current: dict[str, Current], max_payload: int, source: str
) -> list[Step]:
    """The writes for `apps`, or ConfigError (listing every reason) when any app cannot go in."""
    problems: list[str] = []
    redeployed = {app.name for app in apps}  # the file itself has one prefix per app
    owners = {
        c.app.route_prefix: name
        for name, c in current.items()
        if c.app is not None and c.app.route_prefix is not None and name not in redeployed
    }
    steps: list[Step] = []
    limit = min(max_payload, envelope.MAX_DOCUMENT_BYTES)
    for app in apps:
        try:
            value = app.to_json()
        except UsageError:  # over the control-state limit: no KV value may be larger
            value = b""
        if not value or len(value) > limit:
            size = f"{len(value)} bytes" if value else f"over {envelope.MAX_DOCUMENT_BYTES} bytes"
            problems.append(
                f"application {app.name!r}: its config is {size}, more than the limit of "
                f"{limit} bytes (a control value, and the server's max_payload of {max_payload}); "
                "pass large init values by file or URL"
            )
        owner = None if app.route_prefix is None else owners.get(app.route_prefix)
        if owner is not None:
            problems.append(
                f"application {app.name!r}: route_prefix {app.route_prefix!r} is already used by "
                f"the deployed application {owner!r}; choose another, or delete {owner!r} first"
            )
        old = current.get(app.name)
        changed = old is None or old.value != value
        steps.append(Step(app, value, None if old is None else old.revision, changed))
    if problems:
        raise ConfigError("; ".join(problems), source=source)
    return steps


async def write(kv: KV, step: Step) -> None:
    if not step.changed:
        return
    try:
        if step.revision is None:
            await kv.create(step.app.name, step.value)
        else:
            await kv.update(step.app.name, step.value, step.revision)
    except KVConflict:
        raise KVConflict(
            step.app.name, step.revision, "changed by someone else meanwhile; run deploy again"
        ) from None


def describe(app: AppConfig) -> str:
    route = f", route {app.route_prefix}" if app.route_prefix else ", no HTTP route"
    return f"{app.name} ({plural(len(app.deployments), 'deployment')}{route})"
