"""Code packages: a directory as a content-addressed zip, and a zip unpacked safely.

How it works: `build_zip` walks a directory in sorted order, leaves out what `excludes` matches
(gitignore-style patterns: a pattern with a `/` is anchored at the root, one without matches any
path component; `dir/` matches a directory; `__pycache__` and `.git` are always left out), and
writes a zip whose bytes depend only on the files' relative paths, contents and executable bit
(fixed timestamps), so the same tree gives the same sha256 on any machine: the package's name.
A tree whose zip would exceed `limit` bytes fails with the biggest files named, before anything
is uploaded.

`unpack` is the agent's side: it refuses a member with an absolute path, a `..` component or a
link (zip-slip), and stops at `max_bytes` uncompressed (a zip bomb). It writes into a temporary
directory beside the destination and renames it into place at the end, so the destination either
holds the whole package or does not exist: nothing is ever half-installed, even when the agent
dies mid-way (`clean_partial` removes the leftovers at the next start).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import stat
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

MAX_PACKAGE_BYTES = 512 * 1024 * 1024
"""A working_dir or py_modules package larger than this is refused (Ray's own limit)."""
MAX_UNPACKED_BYTES = 4 * MAX_PACKAGE_BYTES
"""A package that unpacks to more than this is refused (a zip bomb)."""
URL_TIMEOUT_S = 60.0
"""A zip URL's connection and each read give up after this long."""
ALWAYS_EXCLUDED = ("__pycache__", ".git", "*.pyc")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
PARTIAL_PREFIX = ".partial-"
SHA256_RE = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20


class PackageError(Exception):
    """A package that cannot be built, fetched or unpacked; the message says why."""


def excluded(rel: str, is_dir: bool, patterns: Sequence[str]) -> bool:
    """Whether the relative posix path `rel` matches one of the gitignore-style `patterns`."""
    parts = PurePosixPath(rel).parts
    for raw in (*ALWAYS_EXCLUDED, *patterns):
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        if dir_only and not is_dir:
            continue
        if "/" in pattern:  # anchored at the root
            if fnmatch.fnmatchcase(rel, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(parts[-1], pattern):
            return True
    return False


def walk(root: Path, patterns: Sequence[str]) -> Iterator[tuple[str, Path]]:
    """(relative posix path, file) of every file kept, in sorted order; links followed only
    when they stay inside `root`."""
    root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if not excluded(rel, True, patterns):
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            path = here / f
            if excluded(rel, False, patterns):
                continue
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                continue  # a link out of the tree is not part of it
            if path.is_file():
                yield rel, path


def build_zip(
    root: Path, out: Path, *, excludes: Sequence[str] = (), limit: int, prefix: str = ""
) -> tuple[str, int]:
    """Write the package of `root` to `out`; (sha256 hex, size). `prefix` puts every member
    under a folder (a py_modules entry keeps its package name). PackageError when `root` is not
    a directory or the package would be over `limit` bytes."""
    if not root.is_dir():
        raise PackageError(f"{root} is not a directory")
    files = sorted(walk(root, excludes))
    total = sum(p.stat().st_size for _, p in files)
    if total > limit:
        biggest = sorted(files, key=lambda f: -f[1].stat().st_size)[:3]
        named = ", ".join(f"{rel} ({_mib(p.stat().st_size)})" for rel, p in biggest)
        raise PackageError(
            f"{root} holds {_mib(total)} after excludes, over the package limit of "
            f"{_mib(limit)}; leave out large files with `excludes` (biggest: {named})"
        )
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for rel, path in files:
            info = zipfile.ZipInfo(f"{prefix}{rel}", date_time=FIXED_TIME)
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as src, z.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
    size = out.stat().st_size
    if size > limit:
        raise PackageError(f"{root}: its package is {_mib(size)}, over the limit of {_mib(limit)}")
    return sha256_file(out), size


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, sha256: str, size: int) -> None:
    """PackageError unless the file at `path` is `size` bytes with this sha256."""
    got = path.stat().st_size
    if got != size:
        raise PackageError(f"package {sha256[:12]}: {got} bytes, declared {size}")
    digest = sha256_file(path)
    if digest != sha256:
        raise PackageError(f"package {sha256[:12]}: content hash {digest[:12]} does not match")


def _safe_name(name: str) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
        raise PackageError(f"refused: member {name!r} would unpack outside its folder")
    return p


def unpack(zip_path: Path, dest: Path, *, max_bytes: int) -> Path:
    """Unpack `zip_path` into `dest` (which must not exist) atomically; returns `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{dest.name}-", dir=dest.parent))
    try:
        try:
            z = zipfile.ZipFile(zip_path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise PackageError(f"not a zip file: {exc}") from None
        with z:
            members = z.infolist()
            for info in members:  # judge every name before writing anything
                _safe_name(info.filename)
                if stat.S_ISLNK(info.external_attr >> 16):
                    raise PackageError(f"refused: member {info.filename!r} is a link")
            if sum(i.file_size for i in members) > max_bytes:
                raise PackageError(f"unpacks to more than {_mib(max_bytes)}")
            written = 0
            for info in members:
                target = tmp / _safe_name(info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(target, "wb") as dst:
                    while block := src.read(CHUNK):
                        written += len(block)
                        if written > max_bytes:  # a header that lied about its size
                            raise PackageError(f"unpacks to more than {_mib(max_bytes)}")
                        dst.write(block)
                if (info.external_attr >> 16) & 0o111:
                    target.chmod(0o755)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def download(url: str, path: Path, *, timeout: float = URL_TIMEOUT_S, limit: int) -> None:
    """Fetch `url` into `path`: https only, at most `limit` bytes, `timeout` for the connection
    and each read. OSError or PackageError."""
    if not url.startswith("https://"):
        raise PackageError("only https URLs are fetched")
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(path, "wb") as out:
        n = 0
        while block := resp.read(CHUNK):
            n += len(block)
            if n > limit:
                raise PackageError(f"{url} is over the package limit of {_mib(limit)}")
            out.write(block)


def strip_single_top(path: Path) -> Path:
    """A zip from a URL (a GitHub archive, say) often holds one top folder: that folder is the
    package's root, as in Ray."""
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return path


def clean_partial(root: Path) -> int:
    """Remove what an interrupted unpack or download left under `root`; how many."""
    if not root.is_dir():
        return 0
    n = 0
    for p in root.iterdir():
        if p.name.startswith(PARTIAL_PREFIX):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            n += 1
    return n


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
