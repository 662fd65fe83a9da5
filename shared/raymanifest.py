"""RayService manifests (Kubernetes YAML): the Ray Serve config file inside, and its lines.

A RayService carries the config file as a string, `spec.serveConfigV2`. `unwrap` finds it (or
says what is wrong with the manifest) and the line offset of its first line; `relocate` moves the
problems found in the inner text back to the manifest's lines and field paths. Used by
shared/serveconfig.py `check_config`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode

from shared.appkeys import Problem, node_keys, node_kind, node_line

_STR, _MAP = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map"


def unwrap(text: str) -> tuple[str | None, int, str | None, list[Problem]]:
    """(config text, line offset, which manifest, problems): the text itself unless it is
    Kubernetes YAML (a document with apiVersion and kind)."""
    try:
        docs = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return text, 0, None, []  # the single-document parse reports it with its line
    kube = [
        d for d in docs if isinstance(d, MappingNode) and {"apiVersion", "kind"} <= node_keys(d)
    ]
    if not kube:
        return text, 0, None, []
    for doc in kube:
        fields = _scalars(doc)
        if fields.get("kind") != "RayService":
            continue
        name = _scalars(_child(doc, "metadata") or MappingNode(_MAP, [])).get("name", "?")
        spec = _child(doc, "spec")
        v2 = None if spec is None else _child(spec, "serveConfigV2")
        which = f"RayService {name!r}, spec.serveConfigV2"
        if v2 is None:
            old = spec is not None and _child(spec, "serveConfig") is not None
            why = ("has only spec.serveConfig, KubeRay's older form; move it to serveConfigV2 "
                   "(the Ray Serve config file as a string)") if old else "has no spec.serveConfigV2"  # fmt: skip
            return (
                None,
                0,
                which,
                [Problem("spec.serveConfigV2", node_line(doc), f"this RayService {why}")],
            )
        if not (isinstance(v2, ScalarNode) and v2.tag == _STR):
            got = node_kind(v2)
            return (
                None,
                0,
                which,
                [
                    Problem(
                        "spec.serveConfigV2",
                        node_line(v2),
                        f"expected the config file as a string (`serveConfigV2: |`), got {got}",
                    )
                ],
            )
        # a block scalar's text starts on the line after its indicator; other styles keep no lines
        offset = (v2.start_mark.line + 1) if v2.style in ("|", ">") and v2.start_mark else -1
        return str(v2.value), offset, which, []
    kinds = ", ".join(sorted({str(_scalars(d).get("kind")) for d in kube}))
    return (
        None,
        0,
        None,
        [
            Problem(
                "kind",
                1,
                f"a Kubernetes manifest ({kinds}) without a RayService; give a RayService or the Serve config file itself",
            )
        ],
    )


def _child(node: MappingNode, key: str) -> Any:
    for k, v in node.value:
        if isinstance(k, ScalarNode) and k.value == key:
            return v
    return None


def _scalars(node: MappingNode) -> dict[str, str]:
    return {
        str(k.value): str(v.value)
        for k, v in node.value
        if isinstance(k, ScalarNode) and isinstance(v, ScalarNode)
    }


def relocate(problems: list[Problem], offset: int, manifest: str | None) -> list[Problem]:
    """Problems in a manifest's serveConfigV2: lines of the file, paths under the key."""
    if manifest is None:
        return problems

    def move(p: Problem) -> Problem:
        path = f"spec.serveConfigV2.{p.path}" if p.path else "spec.serveConfigV2"
        line = None if p.line is None or offset < 0 else p.line + offset
        return replace(p, path=path if not p.path.startswith("spec.") else p.path, line=line)

    return [move(p) for p in problems]
