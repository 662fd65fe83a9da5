"""Check public Ray Serve config files with fleetpulse's dry run, and with Ray's own schema.

    .venv/bin/python -m scripts.ray_configs DIR [--json out.json]

DIR holds config files as their authors wrote them (serve configs with `applications:`, the
single-app form, RayService manifests with `serveConfigV2`, Anyscale service files), fetched by
you: this repository ships none of them. Each file gets the check `fleetpulse deploy --dry-run
FILE` makes (shared.appbuild.check_file: nothing imported, nothing connected; relative
working_dir and requirements paths start at the current directory, as for deploy), and a verdict:

    accepted      no problem (apps defined in code are checked as far as a dry run can)
    needs files   every problem is a local file or folder the file names and DIR lacks
                  (a requirements file, a working_dir): the app's own files, not a rule
    refused       a rule of fleetpulse's refuses it (the messages say which)
    crash         the check raised (a bug: the table shows the exception)

Beside it, what Ray 2.x's own schema (ray.serve.schema, when Ray is installed) says of the same
serve config, deployments' autoscaling_config included: `ok`, `refused` or `needs code` (it
imported something that is not here). For an Anyscale service file Ray judges the Serve part, as
Anyscale's CLI hands it over (its own keys taken out, its local working_dir uploaded; the older
schema's `ray_serve_config`). The table lists every file not accepted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from shared.appbuild import check_file

_MISSING = ("cannot read", "is not a directory", "does not exist", "No such file")
_SERVE_KEYS = ("applications", "http_options", "grpc_options", "logging_config", "proxy_location",
               "target_capacity")  # fmt: skip
_ANYSCALE_MARKS = ("image_uri", "compute_config", "cloud", "containerfile", "working_dir",
                   "requirements", "name")  # fmt: skip


def fleetpulse_verdict(path: Path) -> dict[str, Any]:
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            checked = check_file(str(path), dry_run=True, app_dir=str(path.parent))
    except Exception as exc:  # a bug of the checker's: counted, and the run goes on
        crash = f"{type(exc).__name__}: {exc}"
        return {"verdict": "crash", "problems": [crash], "warnings": [], "code_apps": 0}
    problems = [p.render(path.name) for p in checked.problems]
    if not problems:
        verdict = "accepted"
    elif all(any(m in p for m in _MISSING) for p in problems):
        verdict = "needs files"
    else:
        verdict = "refused"
    return {
        "verdict": verdict,
        "problems": problems,
        "warnings": [w.render(path.name) for w in checked.warnings],
        "code_apps": len(checked.code_apps),
    }


def serve_part(text: str) -> tuple[dict[str, Any] | None, bool]:
    """The serve config in a file (a RayService manifest's serveConfigV2 too), and whether it
    is an Anyscale service file."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "RayService":
            inner = yaml.safe_load((doc.get("spec") or {}).get("serveConfigV2") or "")
            return (inner if isinstance(inner, dict) else None), False
    top = docs[0] if docs and isinstance(docs[0], dict) else None
    if top is not None and isinstance(top.get("ray_serve_config"), dict):  # older Anyscale form
        return top["ray_serve_config"], True
    if top is None or "applications" not in top or not (_ANYSCALE_MARKS & top.keys()):
        return top, False
    return {k: v for k, v in top.items() if k in _SERVE_KEYS}, True


def ray_verdict(path: Path) -> str:
    try:
        from ray.serve.config import AutoscalingConfig
        from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema
    except ImportError:
        return "n/a (Ray not installed)"
    try:
        config, anyscale = serve_part(path.read_text())
    except yaml.YAMLError as exc:
        return f"refused: {str(exc).splitlines()[0]}"
    if config is None:
        return "refused: no serve config"
    schema = ServeDeploySchema if "applications" in config else ServeApplicationSchema
    try:
        schema.model_validate(config)
        for app in config.get("applications") or [config]:
            for d in app.get("deployments") or []:  # the schema takes any mapping here
                if isinstance(d, dict) and isinstance(d.get("autoscaling_config"), dict):
                    AutoscalingConfig.model_validate(d["autoscaling_config"])
    except ImportError as exc:
        return f"needs code: {exc}"
    except Exception as exc:
        text = " ".join(str(exc).split())
        if anyscale and "support only remote URIs" in text:
            return "ok"  # Anyscale's CLI uploads the local working_dir
        return f"refused: {text[:160]}"
    return "ok"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dir", type=Path, help="a folder of Ray Serve config files (*.yaml, *.yml)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    files = sorted([*args.dir.glob("*.yaml"), *args.dir.glob("*.yml")])
    if not files:
        p.error(f"no *.yaml or *.yml files in {args.dir}")
    rows = []
    for path in files:
        row = {"file": path.name, **fleetpulse_verdict(path), "ray": ray_verdict(path)}
        rows.append(row)
    counts = Counter(str(r["verdict"]) for r in rows)
    print(f"{len(rows)} files: " + ", ".join(f"{counts[v]} {v}" for v in
                                             ("accepted", "needs files", "refused", "crash")))  # fmt: skip
    both = Counter((str(r["verdict"]), str(r["ray"]).split(":")[0]) for r in rows)
    print("fleetpulse / Ray: " + ", ".join(f"{n} {f} / {r}" for (f, r), n in sorted(both.items())))
    print(f"\n{'verdict':<12} {'file':<60} first problem  [Ray]")
    for r in rows:
        if r["verdict"] != "accepted":
            first = str(r["problems"][0]).split(": ", 1)[-1][:110]
            print(f"{r['verdict']:<12} {str(r['file'])[:60]:<60} {first}  [{r['ray']}]")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
