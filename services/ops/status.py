"""`fleetpulse status`: what the controller reports (KV fp_status) next to what is deployed
(KV fp_apps), as a table, as JSON, or live.

How it works: both buckets are read with a KV watch (every current value in one stream; `--watch`
keeps the watch open and applies changes as they come). Rendering is pure: `render_table` and
`status_json` take the decoded values and `now`, so they are tested without sockets. An app in
fp_apps with no status yet shows as DEPLOYING (waiting for controller); a deployment the
controller has not reported yet shows as UPDATING with the same note. The age column is how long
ago the status last changed; whether a live controller looks after it is read from the group's
leases and member entries (group_view.py), and an app nobody looks after is marked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from services.ops import (
    EXIT_INVALID,
    EXIT_OK,
    add_connect_timeout,
    connect,
    fail,
    run_command,
)
from shared.appconfig import AppConfig
from shared.bus import Bus
from shared.errors import UsageError
from shared.kv.status import AppStatusView, DeploymentStatusView
from shared.kvfollow import follow
from shared.subjects import KV_APPS, KV_STATUS

from . import envnotes
from .group_view import GroupReads, GroupView, group_notes, read_group, unattended

DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.05
READY_POLL_S = 0.05
TEXT_WIDTH = 48
TEXT_CHARS = 96
"""Longer messages and decisions are cut (the column folds them onto lines of TEXT_WIDTH)."""
WIDE_MIN_WIDTH = 120
STALE_NAMED = 5
"""Apps nobody looks after named under the table (the rest are counted)."""
WAITING = "waiting for controller"
NO_STATUS_APP = "DEPLOYING"
NO_STATUS_DEPLOYMENT = "UPDATING"

_COLORS = {
    "RUNNING": "green",
    "HEALTHY": "green",
    "UPSCALING": "cyan",
    "DOWNSCALING": "cyan",
    "DEPLOYING": "yellow",
    "UPDATING": "yellow",
    "DELETING": "magenta",
    "UNHEALTHY": "red",
    "DEPLOY_FAILED": "bold red",
}

_TEXT_HEADER = "MESSAGE / LAST DECISION"
_APP_STATUS_HEADER = "APP STATUS"
_HEADERS = (
    "APP",
    _APP_STATUS_HEADER,
    "DEPLOYMENT",
    "STATUS",
    "REPLICAS",
    "HEALTH",
    "DEMAND",
    _TEXT_HEADER,
    "AGE",
)

_V = TypeVar("_V")


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app", metavar="APP", help="show only this application")
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON instead of a table (with --watch: one line per change)",
    )
    p.add_argument("--watch", action="store_true", help="refresh live until Ctrl-C")
    p.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"refresh period with --watch (default {DEFAULT_INTERVAL_S:g})",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --watch: stop after this long (default: until Ctrl-C)",
    )
    add_connect_timeout(p)


# -- the pure part ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppRow:
    """One application as shown: the controller's status, or a placeholder from fp_apps."""

    name: str
    status: str
    route_prefix: str | None
    updated_at: float | None
    """None: the controller has not written a status for this app yet."""
    deployments: Mapping[str, DeploymentStatusView]


def merge(statuses: Mapping[str, AppStatusView], apps: Mapping[str, AppConfig]) -> list[AppRow]:
    """One row per app known to either bucket, sorted by name."""
    rows = []
    for name in sorted(set(statuses) | set(apps)):
        view, cfg = statuses.get(name), apps.get(name)
        deployments: dict[str, DeploymentStatusView] = {}
        if view is not None:
            deployments.update(view.deployments)
        if cfg is not None and (view is None or view.status != "DELETING"):
            for d in cfg.deployments:
                if d.name not in deployments:
                    deployments[d.name] = _waiting(d.policy.initial)
        if view is not None:
            rows.append(AppRow(name, view.status, view.route_prefix, view.updated_at, deployments))
        elif cfg is not None:
            rows.append(AppRow(name, NO_STATUS_APP, cfg.route_prefix, None, deployments))
    return rows


def _waiting(target: int) -> DeploymentStatusView:
    return DeploymentStatusView(
        status=NO_STATUS_DEPLOYMENT,
        message=WAITING,
        target_replicas=target,
        running_replicas=0,
        demand=0.0,
        healthy_replicas=0,
        unhealthy_replicas=0,
        last_decision="",
    )


def stale_statuses(
    statuses: Mapping[str, AppStatusView], group: GroupView | None, now: float
) -> dict[str, str]:
    """App -> why no live controller looks after its status (`group` None: not judged)."""
    if group is None:
        return {}
    return {a: why for a, v in statuses.items() if (why := unattended(v, group, now)) is not None}


def status_json(
    statuses: Mapping[str, AppStatusView],
    apps: Mapping[str, AppConfig],
    group: GroupView | None = None,
    now: float = 0.0,
) -> dict[str, Any]:
    """The `--json` document (print it with sort_keys=True). With `group`, each app with a
    status says whether a live controller looks after it (`stale`, and why not)."""
    stale = stale_statuses(statuses, group, now)
    return {
        "applications": {
            row.name: {
                "status": row.status,
                "route_prefix": row.route_prefix,
                **_stale_fields(row.name, statuses, group, stale),
                "deployments": {
                    name: {
                        "status": d.status,
                        "target_replicas": d.target_replicas,
                        "running_replicas": d.running_replicas,
                        "healthy_replicas": d.healthy_replicas,
                        "unhealthy_replicas": d.unhealthy_replicas,
                        "demand": d.demand,
                        "message": d.message,
                        "last_decision": d.last_decision,
                    }
                    for name, d in sorted(row.deployments.items())
                },
            }
            for row in merge(statuses, apps)
        }
    }


def _stale_fields(
    app: str,
    statuses: Mapping[str, AppStatusView],
    group: GroupView | None,
    stale: Mapping[str, str],
) -> dict[str, Any]:
    if group is None or app not in statuses:
        return {}
    return {"stale": True, "stale_reason": stale[app]} if app in stale else {"stale": False}


def render_table(
    statuses: Mapping[str, AppStatusView],
    apps: Mapping[str, AppConfig],
    now: float,
    notes: Sequence[str] = (),
    width: int | None = None,
    group: GroupView | None = None,
) -> Table:
    """The status table; `now` (unix s) dates the ages, `notes` go under the table, `group`
    (None: not judged) tells which statuses no live controller looks after. Below
    WIDE_MIN_WIDTH columns of terminal `width` the free-text column is left out."""
    wide = width is None or width >= WIDE_MIN_WIDTH
    table = Table(
        title="fleetpulse status",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    # narrow: the app's status goes under its name, messages and decisions are left out
    narrow_out = (_TEXT_HEADER, _APP_STATUS_HEADER)
    for header in _HEADERS if wide else [h for h in _HEADERS if h not in narrow_out]:
        right = header in ("REPLICAS", "DEMAND", "AGE")
        table.add_column(
            header,
            justify="right" if right else "left",
            no_wrap=header in ("STATUS", "REPLICAS", "HEALTH", "DEMAND", "AGE"),
            max_width=TEXT_WIDTH if header == _TEXT_HEADER else None,
            min_width=None if wide or header != "APP" else len("DEPLOY_FAILED"),
        )
    rows = merge(statuses, apps)
    stale = stale_statuses(statuses, group, now)
    for i, row in enumerate(rows):
        if i:
            table.add_section()
        age = None if row.updated_at is None else max(0.0, now - row.updated_at)
        app_status = _colored(row.status)
        if row.updated_at is None:
            app_status.append(f"\n({WAITING})", style="dim")
        app_cell = Text().append(row.name, style="bold")
        if not wide:
            app_cell.append("\n").append_text(app_status)
        if row.route_prefix:
            app_cell.append(f"\n{row.route_prefix}", style="dim")
        for j, (name, d) in enumerate(sorted(row.deployments.items()) or [("", None)]):
            first = j == 0
            cells: list[Text | str] = [app_cell if first else ""]
            if wide:
                cells.append(app_status if first else "")
            if d is not None:
                replicas = f"{d.running_replicas}/{d.target_replicas}"
                cells += [name, _colored(d.status), replicas, _health(d), f"{d.demand:.1f}"]
                if wide:
                    cells.append(_notes(d))
            else:
                cells += [""] * (len(table.columns) - len(cells) - 1)
            table.add_row(*cells, _age_cell(age, row.name in stale) if first else "")
    captions = list(notes)
    if not rows:
        captions.append("no applications deployed (deploy one with `fleetpulse deploy FILE`)")
    if stale:
        captions.append(_stale_caption(stale))
    if not wide and rows:
        captions.append(
            f"messages and decisions: use --json, or a terminal >= {WIDE_MIN_WIDTH} wide"
        )
    if captions:
        table.caption = "\n".join(captions)
        table.caption_justify = "left"
    return table


def _colored(status: str) -> Text:
    return Text(status, style=_COLORS.get(status, "white"))


def _notes(d: DeploymentStatusView) -> Text:
    """Why the status is what it is (unless healthy), then what the autoscaler did last."""
    cell = Text()
    if d.message and d.status != "HEALTHY":
        cell.append(_truncate(d.message, TEXT_CHARS), style=_COLORS.get(d.status, ""))
    if d.last_decision:
        if cell:
            cell.append("\n")
        cell.append(_truncate(d.last_decision, TEXT_CHARS), style="dim")
    return cell


def _health(d: DeploymentStatusView) -> Text:
    cell = Text(f"{d.healthy_replicas} ok", style="green" if d.healthy_replicas else "dim")
    if d.unhealthy_replicas:
        cell.append(f" / {d.unhealthy_replicas} bad", style="red")
    return cell


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _stale_caption(stale: Mapping[str, str]) -> str:
    named = sorted(stale)[:STALE_NAMED]
    more = len(stale) - len(named)
    lines = [f"{len(stale)} status(es) not looked after by a live controller (is one running?):"]
    lines += [f"  {app}: {stale[app]}" for app in named]
    if more:
        lines.append(f"  and {more} more")
    return "\n".join(lines)


def _age_cell(age: float | None, stale: bool) -> Text:
    if age is None:
        return Text("-", style="dim")
    return Text(format_age(age) + (" !" if stale else ""), style="yellow" if stale else "")


def format_age(seconds: float) -> str:
    """Compact like kubectl: 7s, 3m12s, 2h05m, 4d03h."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


# -- the shell ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Mirror:
    """The current values of the two buckets, as their watches deliver them."""

    statuses: dict[str, AppStatusView] = field(default_factory=dict)
    apps: dict[str, AppConfig] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    """`bucket/key` -> why its value was ignored."""

    def select(self, app: str | None) -> tuple[dict[str, AppStatusView], dict[str, AppConfig]]:
        if app is None:
            return dict(self.statuses), dict(self.apps)
        return _only(self.statuses, app), _only(self.apps, app)

    def notes(self) -> list[str]:
        return [f"ignored {where}: {why}" for where, why in sorted(self.bad.items())]


def _only(values: Mapping[str, _V], key: str) -> dict[str, _V]:
    return {key: values[key]} if key in values else {}


def run_status(args: argparse.Namespace) -> int:
    if args.interval < MIN_INTERVAL_S:
        return fail("status", f"--interval must be >= {MIN_INTERVAL_S:g}", EXIT_INVALID)

    async def main() -> int:
        bus = await connect(args, "fleetpulse-status")
        try:
            mirror = Mirror()
            if args.watch:
                await _watch(bus, mirror, args)
                return EXIT_OK
            ready = [asyncio.Event(), asyncio.Event()]
            await asyncio.gather(
                *_follow_both(bus, mirror, ready, live=False, retry_s=args.interval)
            )
            group = await read_group(bus)
            agents = await envnotes.read_agents(bus)
        finally:
            await bus.close()
        statuses, apps = mirror.select(args.app)
        if args.app is not None and not statuses and not apps:
            known = ", ".join(sorted(set(mirror.statuses) | set(mirror.apps))) or "none"
            raise UsageError(f"no application {args.app!r} (known: {known})")
        if args.json:
            doc = status_json(statuses, apps, group, time.time())
            doc["controllers"] = group.to_json()
            envs = envnotes.env_json(agents, args.app)
            if envs:  # present only when an agent prepares or failed one
                doc["runtime_envs"] = envs
            print(json.dumps(doc, indent=2, sort_keys=True))
        else:
            console = Console()
            notes = [*mirror.notes(), *group_notes(group)]
            notes += envnotes.env_lines(agents, time.time(), args.app)
            table = render_table(statuses, apps, time.time(), notes, console.width, group)
            console.print(table)
        return EXIT_OK

    try:
        return run_command("status", main)
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C is how --watch ends


def _follow_both(
    bus: Bus, mirror: Mirror, ready: Sequence[asyncio.Event], *, live: bool, retry_s: float
) -> list[Coroutine[Any, Any, None]]:
    return [
        follow(
            bus,
            KV_STATUS,
            AppStatusView.decode,
            mirror.statuses,
            mirror.bad,
            ready[0],
            live=live,
            retry_s=retry_s,
        ),
        follow(
            bus,
            KV_APPS,
            AppConfig.from_json,
            mirror.apps,
            mirror.bad,
            ready[1],
            live=live,
            retry_s=retry_s,
        ),
    ]


async def _watch(bus: Bus, mirror: Mirror, args: argparse.Namespace) -> None:
    groups = GroupReads(bus)
    ready = [asyncio.Event(), asyncio.Event()]
    watches = [
        asyncio.create_task(c)
        for c in _follow_both(bus, mirror, ready, live=True, retry_s=args.interval)
    ]
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        while not all(e.is_set() for e in ready):  # no half-empty first frame
            await _tick(watches, READY_POLL_S, None)
        if args.json:
            last = None
            while deadline is None or time.monotonic() < deadline:
                group = await groups.current()
                selected = mirror.select(args.app)
                doc = json.dumps(status_json(*selected, group, time.time()), sort_keys=True)
                if doc != last:
                    print(doc, flush=True)
                    last = doc
                await _tick(watches, args.interval, deadline)
            return
        console = Console()
        with Live(console=console, auto_refresh=False) as live:
            while deadline is None or time.monotonic() < deadline:
                group = await groups.current()
                selected = mirror.select(args.app)
                notes = [*mirror.notes(), *group_notes(group)]
                table = render_table(*selected, time.time(), notes, console.width, group)
                live.update(table, refresh=True)
                await _tick(watches, args.interval, deadline)
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)


async def _tick(watches: list[asyncio.Task[None]], interval: float, deadline: float | None) -> None:
    """Sleep one interval (less at the deadline); a watch that failed ends the command."""
    delay = interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
    done, _ = await asyncio.wait(watches, timeout=delay)
    for task in done:
        task.result()  # raises what the watch raised
