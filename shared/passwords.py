"""Passwords a deployment makes for itself, and the ones it refuses to start with.

A password that ships with the code (`operator-change-me`) or an empty one is no secret: whoever
read the README knows it. Every place that takes a password (a service's own NATS login, the
auth callout's role table, `fleetpulse auth-init`) passes it through `checked_password`, which
refuses it at start with the variable's name and how to set it. `new_password` is what first start
makes where no password was given (docs/operations.md, "Secrets").
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Final

from shared.errors import ConfigError

NEW_PASSWORD_BYTES: Final = 24
"""Random bytes in a made password (32 url-safe characters)."""

_PLACEHOLDER = re.compile(r"change[-_ ]?me|^(password|secret|admin|nats|default|test)$", re.I)
HOW_TO_SET: Final = (
    "leave it unset so that first start makes a random one, or set a secret of your own "
    "(for example the output of `openssl rand -base64 24`)"
)


def is_placeholder(password: str) -> bool:
    """Empty, blank, or a value that ships in examples (`*-change-me`, `password`, ...)."""
    return not password.strip() or _PLACEHOLDER.search(password.strip()) is not None


def checked_password(password: str, source: str) -> str:
    """`password`, or a ConfigError naming `source` (the variable or file it came from)."""
    if is_placeholder(password):
        what = "empty" if not password.strip() else "a placeholder that ships with fleetpulse"
        raise ConfigError(f"the password is {what}: {HOW_TO_SET}", field=source)
    return password


def new_password() -> str:
    return secrets.token_urlsafe(NEW_PASSWORD_BYTES)


def read_password(path: Path, source: str) -> str:
    """The password in a file (surrounding whitespace dropped), checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the password file {path}: {exc}", field=source) from exc
    return checked_password(text.strip(), f"{source} ({path})")


def write_secret(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` atomically, readable by its owner only unless `mode` says
    otherwise; a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(tmp, mode)  # the umask narrowed what os.open asked for
    tmp.replace(path)
