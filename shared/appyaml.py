"""Application files (YAML, Ray Serve's shape) -> validated `AppConfig`s for `fleetpulse deploy`.

The entry points. The file is checked by shared/serveconfig.py (Ray Serve's forms) over
shared/appcheck.py (the node-tree checker) and shared/appkeys.py (the keys, conversions and
messages): every problem is collected with its field path and line. `load_apps` raises one
`ConfigError` listing every problem (naming the file, the line, the field and the fix), or
returns the apps with all defaults filled in.
"""

from __future__ import annotations

import os

from shared.appconfig import AppConfig
from shared.appkeys import (
    DEFAULT_ROUTE_PREFIX,
    MAX_FILE_BYTES,
    PolicyCheck,
    Problem,
    node_line,
)
from shared.errors import ConfigError
from shared.serveconfig import check_config

__all__ = [
    "DEFAULT_ROUTE_PREFIX",
    "MAX_FILE_BYTES",
    "PolicyCheck",
    "Problem",
    "check_apps",
    "load_apps",
    "parse_apps",
    "problems_error",
    "read_app_file",
]


def load_apps(
    path: str | os.PathLike[str], check_policy: PolicyCheck | None = None
) -> list[AppConfig]:
    """Read and validate an app file; ConfigError (naming file, line and field) if anything is
    wrong, listing every problem found."""
    return parse_apps(read_app_file(path), os.fspath(path), check_policy)


def read_app_file(path: str | os.PathLike[str]) -> str:
    """The file's text; ConfigError when it cannot be read or is not a (small, UTF-8) text."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", source=source) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES} bytes; not an app file", source=source)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})", source=source
        ) from None
    return text


def parse_apps(
    text: str, source: str = "<string>", check_policy: PolicyCheck | None = None
) -> list[AppConfig]:
    """Like `load_apps` for text already in memory; `source` names it in messages."""
    apps, problems = check_apps(text, check_policy)
    if problems:
        raise problems_error(problems, source)
    return apps


def problems_error(problems: list[Problem], source: str) -> ConfigError:
    """One ConfigError for all problems: a single line for one, a list for several."""
    if len(problems) == 1:
        p = problems[0]
        where = source if p.line is None else f"{source}:{p.line}"
        return ConfigError(f"{p.path}: {p.message}" if p.path else p.message, source=where)
    lines = "\n".join(f"  {p.render(source)}" for p in problems)
    return ConfigError(f"{len(problems)} problems:\n{lines}", source=source)


def check_apps(
    text: str, check_policy: PolicyCheck | None = None
) -> tuple[list[AppConfig], list[Problem]]:
    """The pure core: the valid apps, and every problem found (apps are complete only when there
    are no problems). Ray Serve's forms are read too (shared/serveconfig.py); an app defined in
    code is a problem here, since only `fleetpulse deploy` builds it (`check_config`)."""
    checked = check_config(text, check_policy)
    problems = checked.problems + [
        Problem(
            f"{code.path}.import_path",
            node_line(code.import_node),
            "defined in code: `fleetpulse deploy` imports and builds it "
            "(shared.serveconfig.check_config with a build function)",
        )
        for code in checked.code_apps
    ]
    return checked.apps, sorted(problems, key=lambda p: p.line or 0)
