"""Count where each user- or operator-set setting is declared by hand (issue 35).

A declaration is a place in `shared/` or `services/` (tests excluded) that writes one of the
setting's facts itself instead of taking it from a table: a default on a config field, a row of a
settings table, a validation naming it, a key table entry, a command-line flag, or its
environment variable's name. A field whose default comes from a table (`= _D[...]`,
`= settings.X.default`, ...) is not counted. The goal is 1 per setting: its row in a table.

    python -m scripts.settings_census            # the working tree
    python -m scripts.settings_census --rev HEAD~5   # a commit, for the "before" numbers
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (setting, its flags, its environment variable)
SETTINGS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("metrics_interval_s", ("--metrics-interval", "--metrics-interval-s"), "FLEETPULSE_METRICS_INTERVAL_S"),
    ("push_metrics", ("--push-metrics",), None),
    ("namespace", ("--namespace",), "FLEETPULSE_NAMESPACE"),
    ("columnar_min_replicas", ("--columnar-min-replicas",), "FLEETPULSE_COLUMNAR_MIN_REPLICAS"),
    ("min_replicas", (), None),
    ("max_replicas", (), None),
    ("initial_replicas", (), None),
    ("target_ongoing_requests", (), None),
    ("upscale_delay_s", (), None),
    ("downscale_delay_s", (), None),
    ("downscale_to_zero_delay_s", (), None),
    ("look_back_period_s", (), None),
    ("upscaling_factor", (), None),
    ("downscaling_factor", (), None),
    ("panic_mode", (), None),
    ("panic_window_s", (), None),
    ("panic_threshold", (), None),
    ("max_ongoing_requests", ("--max-ongoing-requests",), None),
    ("graceful_shutdown_timeout_s", ("--graceful-shutdown-timeout-s",), None),
    ("member_id", ("--member-id",), "FLEETPULSE_MEMBER_ID"),
    ("owner_epoch", ("--owner-epoch",), "FLEETPULSE_OWNER_EPOCH"),
    ("stream_replicas", ("--stream-replicas",), "FLEETPULSE_STREAM_REPLICAS"),
    ("decode_threads", ("--decode-threads",), "FLEETPULSE_DECODE_THREADS"),
    ("agent_id", ("--agent-id",), "FLEETPULSE_AGENT_ID"),
    ("replica_key_seed", ("--replica-key-seed",), "FLEETPULSE_AGENT_REPLICA_KEY_FILE"),
    ("queue_group", ("--queue-group",), "FLEETPULSE_GATEWAY_QUEUE_GROUP"),
    ("issuer_seed", ("--issuer-seed",), "FLEETPULSE_AUTH_ISSUER_SEED_FILE"),
    ("replica_keys_file", ("--replica-keys-file",), "FLEETPULSE_AUTH_REPLICA_KEYS_FILE"),
    ("role_passwords_dir", ("--role-passwords-dir",), "FLEETPULSE_AUTH_ROLE_PASSWORDS_DIR"),
    ("log_level", ("--log-level",), "FLEETPULSE_LOG_LEVEL"),
    ("metrics_port", ("--metrics-port",), "FLEETPULSE_METRICS_PORT"),
    ("metrics_host", (), "FLEETPULSE_METRICS_HOST"),
    ("admission_timeout_s", ("--admission-timeout",), None),
    ("max_queued_requests", ("--max-queued",), None),
    ("drain_timeout_s", ("--drain-timeout",), None),
    ("max_held_per_app", ("--max-held",), None),
    ("max_wait_s", ("--max-wait",), None),
    ("retry_after_s", ("--retry-after",), None),
    ("request_timeout_s", ("--request-timeout",), None),
    ("publish_routes", ("--no-publish-routes",), None),
    ("partitions", ("--partitions",), None),
    ("retention_s", ("--retention-s",), None),
    ("rebuild_s", ("--rebuild-s",), None),
    ("control_interval_s", ("--control-interval-s",), None),
    ("member_ttl_s", ("--member-ttl-s",), None),
    ("heartbeat_s", ("--heartbeat-s",), None),
    ("policy_timeout_s", ("--custom-policy-timeout-s",), "FLEETPULSE_CUSTOM_POLICY_TIMEOUT_S"),
    ("stats_file", ("--stats-file",), None),
    ("workdir", ("--workdir",), None),
    ("log_dir", ("--log-dir",), None),
    ("python", ("--python",), None),
    ("kill_margin_s", ("--kill-margin-s",), None),
    ("credential_ttl_s", ("--credential-ttl-s",), None),
    ("published_nats_url", ("--nats-url",), "FP_PUBLISHED_NATS_URL"),
    ("prefix", ("--prefix",), None),
    ("batch_rows", ("--batch-rows",), None),
    ("flush_interval_s", ("--flush-interval-s",), None),
    ("rotate_mb", ("--rotate-mb",), None),
    ("rotate_s", ("--rotate-s",), None),
    ("zstd", ("--zstd",), None),
    ("progress_interval_s", ("--progress-interval-s",), None),
)  # fmt: skip

_DERIVED = r"(?:_\w*\[|settings\.|[A-Z][A-Z0-9_]*\b)"
"""Defaults taken from a table or a named constant (declared once, where it is defined)."""
EXCLUDED = ("shared/wire/", "shared/kv/")
"""Wire and KV document fields share some names but are not settings."""


def _patterns(name: str, flags: tuple[str, ...], env: str | None) -> dict[str, re.Pattern[str]]:
    n = re.escape(name)
    out = {
        # a config field with a default written out (not taken from a table)
        "default": re.compile(rf"^\s*{n}\s*:\s*[^=\n]+=\s*(?![\s]|{_DERIVED})", re.M),
        # a table row: replicaspec.Param(...), settings.Setting(...)
        "row": re.compile(rf"(?:Param|Setting)\(\s*\"(?:no_)?{n}\"", re.M),
        # a YAML key table entry ("name": conversion) or a name listed for validation
        "key": re.compile(rf"^\s*\"{n}\"\s*(?::\s*\S|,\s*$)", re.M),
        # a validation message naming it
        "check": re.compile(rf"field=\"{n}\""),
    }
    if flags:
        alts = "|".join(re.escape(f) for f in flags)
        out["flag"] = re.compile(rf"add_argument\(\s*\"(?:{alts})\"", re.M)
    if env:
        out["env"] = re.compile(rf"\"{re.escape(env)}\"")
    return out


def _files(rev: str | None) -> Iterator[tuple[str, str]]:
    if rev is None:
        for top in ("shared", "services"):
            for path in sorted((ROOT / top).rglob("*.py")):
                if str(path.relative_to(ROOT)).startswith(EXCLUDED):
                    continue
                yield str(path.relative_to(ROOT)), path.read_text()
        return
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "shared", "services"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    for name in names:
        if name.endswith(".py") and not name.startswith(EXCLUDED):
            text = subprocess.run(
                ["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True,
                text=True,
            ).stdout  # fmt: skip
            yield name, text


_ROW_START = re.compile(r"(?:Param|Setting)\(")


def _in_row(text: str, at: int) -> bool:
    """Whether `at` lies inside a `Param(...)`/`Setting(...)` call (parentheses balanced)."""
    for m in _ROW_START.finditer(text, max(0, at - 3000), at):
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        if m.start() < at < i:
            return True
    return False


def census(rev: str | None = None) -> dict[str, dict[str, list[str]]]:
    """setting -> kind of declaration -> the places (file:line)."""
    files = list(_files(rev))
    out: dict[str, dict[str, list[str]]] = {}
    for name, flags, env in SETTINGS:
        found: dict[str, list[str]] = {}
        for kind, pattern in _patterns(name, flags, env).items():
            for path, text in files:
                for m in pattern.finditer(text):
                    if kind != "row" and _in_row(text, m.start()):
                        continue  # part of a row: the row is the one declaration
                    line = text.count("\n", 0, m.start()) + 1
                    found.setdefault(kind, []).append(f"{path}:{line}")
        out[name] = found
    return out


def totals(rev: str | None = None) -> dict[str, int]:
    flags = envs = 0
    for _, text in _files(rev):
        flags += len(re.findall(r"add_argument\(\s*(?:f?\"--)", text))
        envs += len(re.findall(r"environ(?:\.get\(|\[)|\bgetenv\(", text))
    return {"add_argument sites": flags, "os.environ read sites": envs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=None, help="count in this commit (default: the work tree)")
    ap.add_argument("--before", default=None, help="also count in this commit, side by side")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every place")
    args = ap.parse_args()
    now = census(args.rev)
    then = census(args.before) if args.before else None
    for name, found in now.items():
        count = sum(len(v) for v in found.values())
        kinds = ", ".join(f"{k} {len(v)}" for k, v in found.items() if v)
        was = ""
        if then is not None:
            was = f"{sum(len(v) for v in then[name].values())} -> "
        print(f"{name:30} {was}{count:3}   ({kinds})")
        if args.verbose:
            for places in found.values():
                for place in places:
                    print(f"    {place}")
    for what, n in totals(args.rev).items():
        was = f"{totals(args.before)[what]} -> " if args.before else ""
        print(f"{what:30} {was}{n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
