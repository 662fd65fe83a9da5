"""`fleetpulse deploy FILE` and `fleetpulse delete APP`: the desired apps in KV `fp_apps`.

How it works: deploy validates the whole file (shared.serveconfig over shared.appyaml; a custom
autoscaling policy must import here, as the controller will import it). An app defined in code
(an app-level `import_path`) is built here, where the code is (shared/appbuild.py): its
module is imported, the graph walked, and the deployments it yields are checked with the file's
overrides like deployments written out in the file; the controller never imports user code.
`--dry-run` imports nothing and says what it left unchecked. Then deploy checks every cross-app
rule it can
check against what is deployed already (one route_prefix per app, values under the server's
max_payload) before it writes anything; then it writes one key per app, value
`AppConfig.to_json()`. Each write is revision-checked (create a new key, update the revision just
read), so two operators deploying at once cannot silently overwrite each other. The controller
watches fp_apps and does the rest; delete removes the key and the controller drains the app.
Each change leaves a record in fp_audit under the NATS user that made it (services/ops/audit.py).
An app whose runtime_env ships code (a local working_dir or py_modules) is packaged first:
zipped, uploaded to the object store fp_packages by content address, and written with the
addresses instead of the paths (services/ops/packaging.py); a zip URL is fetched here once and
pinned by its sha256. After a change, packages no app refers to are garbage-collected.

NATS KV has no multi-key transaction: if the connection drops between two apps of one file, the
earlier ones are written. Deploying is idempotent, so running it again finishes the job (an
unchanged app is not rewritten, which would only wake every watcher for nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from services.ops import (
    EXIT_INVALID,
    EXIT_OK,
    add_connect_timeout,
    audit,
    connect,
    fail,
    packaging,
    pkgindex,
    plural,
    run_command,
)
from shared import settings
from shared.appbuild import check_file
from shared.appconfig import AppConfig
from shared.appyaml import problems_error
from shared.bus import KV
from shared.errors import ConfigError, KVConflict, UsageError
from shared.kv import envelope
from shared.kvfollow import existing_kv
from shared.serveconfig import Checked
from shared.subjects import KV_APPS, validate_name


def add_deploy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="application file (YAML, see docs/deploy.md)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the file without importing any code and print what would be deployed "
        "and what was not checked; connect to nothing",
    )
    p.add_argument(
        "--app-dir",
        default=".",
        help="import apps defined in code (an app-level import_path) from this directory first "
        "(default: the current directory)",
    )
    settings.DEPLOY_MAX_PACKAGE_MB.add_flag(p)
    add_connect_timeout(p)


def add_delete_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("app", metavar="APP", help="name of the application to delete")
    add_connect_timeout(p)


def run_deploy(args: argparse.Namespace) -> int:
    checked = check_file(args.file, dry_run=args.dry_run, app_dir=getattr(args, "app_dir", "."))
    for warning in checked.warnings:
        print(f"fleetpulse deploy: warning: {warning.render(args.file)}", file=sys.stderr)
    if checked.problems:
        message = str(problems_error(checked.problems, args.file))
        return fail("deploy", message, EXIT_INVALID)
    apps = checked.apps
    if args.dry_run:
        print_dry_run(checked)
        return EXIT_OK

    async def main() -> int:
        bus = await connect(args, "fleetpulse-deploy")
        try:
            resolved = apps
            if packaging.unresolved(apps):
                limit = settings.DEPLOY_MAX_PACKAGE_MB.resolve(
                    getattr(args, "max_package_mb", None), os.environ
                )
                packager = packaging.Packager(
                    packaging.store_of(bus, create=True),
                    limit=limit << 20,
                    index=pkgindex.PackageIndex(pkgindex.default_path()),
                )
                resolved = await packaging.resolve_apps(apps, packager)
                print(packaging.describe(packager.stats))
            kv = await bus.kv(KV_APPS)
            current = await read_apps(kv)
            plan = plan_deploy(resolved, current, bus.max_payload, str(args.file))
            for step in plan:
                revision = await write(kv, step)
                print(f"deployed {describe(step.app)}{'' if step.changed else ', unchanged'}")
                if revision is not None:
                    versions = {d.name: step.app.version_of(d) for d in step.app.deployments}
                    await audit.record(bus, "deploy", step.app.name, revision, versions)
            if any(step.changed for step in plan):
                now = await read_apps(kv)
                live = [c.app for c in now.values() if c.app is not None]
                await packaging.collect_after_change(bus, live, time.time())
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
            await audit.record(bus, "delete", app, entry.revision)
            now = await read_apps(kv)
            live = [c.app for c in now.values() if c.app is not None]
            await packaging.collect_after_change(bus, live, time.time())
        finally:
            await bus.close()
        print(
            f"deleted {app}: the controller drains and stops its replicas "
            f"(follow it with `fleetpulse status --app {app}`)"
        )
        return EXIT_OK

    return run_command("delete", main)


def print_dry_run(checked: Checked) -> None:
    where = f" (from the {checked.manifest})" if checked.manifest else ""
    for app in checked.apps:
        policies = sorted({d.policy.policy for d in app.deployments if d.policy.policy})
        unchecked = f"; not checked: that {', '.join(policies)} imports" if policies else ""
        print(f"valid: {describe(app)}{where} (dry run: nothing written{unchecked})", flush=True)
    for code in checked.code_apps:
        route = f", route {code.route_prefix}" if code.route_prefix else ", no HTTP route"
        named = ", ".join(code.overrides) or "none"
        print(
            f"valid as far as checked without importing: {code.name} (import_path "
            f"{code.import_path}{route}){where} (dry run: nothing written; not checked: that "
            f"{code.import_path} imports and builds an application{' with these args' if code.args else ''}, "
            f"the deployments it defines and the options set in code, and that the overridden "
            f"deployments ({named}) exist in it; `fleetpulse deploy` checks these where the "
            "code is)",
            flush=True,
        )


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
    for entry in await kv.snapshot([">"]):  # one read, however many apps
        try:
            decoded: AppConfig | None = AppConfig.from_json(entry.value)
        except ConfigError:
            decoded = None  # the controller ignores it too; overwriting it is a fix
        out[entry.key] = Current(entry.value, entry.revision, decoded)
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


async def write(kv: KV, step: Step) -> int | None:
    """The revision written; None when the app is unchanged (nothing written)."""
    if not step.changed:
        return None
    try:
        if step.revision is None:
            return await kv.create(step.app.name, step.value)
        return await kv.update(step.app.name, step.value, step.revision)
    except KVConflict:
        raise KVConflict(
            step.app.name, step.revision, "changed by someone else meanwhile; run deploy again"
        ) from None


def describe(app: AppConfig) -> str:
    route = f", route {app.route_prefix}" if app.route_prefix else ", no HTTP route"
    return f"{app.name} ({plural(len(app.deployments), 'deployment')}{route})"
