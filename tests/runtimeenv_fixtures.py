"""Test material for runtime environments: app code in a working_dir, wheels built on the spot
(no internet: the agents install with `--no-index --find-links` from a local directory)."""

from __future__ import annotations

import base64
import hashlib
import textwrap
import zipfile
from pathlib import Path

APP_CODE = """
import os

from fleetpulse import serve


@serve.deployment
class Shipped:
    async def __call__(self, request: object = None) -> dict:
        import shipped_helper  # only in the uploaded working_dir

        out = {{"helper": shipped_helper.VERSION, "cwd": os.getcwd()}}
        try:
            import {pkg}

            out["pkg"] = {pkg}.VERSION
        except ImportError:
            out["pkg"] = None
        try:
            import fp_extra  # a py_modules package, when the app ships one

            out["extra"] = fp_extra.VALUE
        except ImportError:
            out["extra"] = None
        return out


app = Shipped.bind()
"""


def write_app(root: Path, helper_version: str, pkg: str = "fpwheel") -> Path:
    """A working_dir with an app module and a helper module that exist nowhere else."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "shipped_app.py").write_text(APP_CODE.format(pkg=pkg))
    (root / "shipped_helper.py").write_text(f"VERSION = {helper_version!r}\n")
    return root


def write_module(parent: Path, value: str) -> Path:
    """A package directory `fp_extra` (for py_modules) whose VALUE is `value`."""
    pkg = parent / "fp_extra"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f"VALUE = {value!r}\n")
    return pkg


def make_wheel(out_dir: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of package `name` whose `VERSION` is `version`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": textwrap.dedent(
            """\
            Wheel-Version: 1.0
            Generator: fleetpulse-tests
            Root-Is-Purelib: true
            Tag: py3-none-any
            """
        ),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    wheel = out_dir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel
