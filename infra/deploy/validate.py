"""Offline checks of the deployment files: the Compose file against the Compose specification's JSON
schema, the Kubernetes manifests with kubeconform against Kubernetes' schemas and JSON schemas made
here from the CRDs (Strimzi's, KEDA's). `infra/bootstrap.sh` installs the tools under
`~/.cache/undertow/deploy-check/` (`TOOLS`); tests/infra/test_deploy.py runs them.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

HERE = Path(__file__).resolve().parent
TOOLS = Path("~/.cache/undertow/deploy-check").expanduser()
KUBERNETES = "1.33.0"  # the schemas' Kubernetes version (StatefulSet pod-index labels need >= 1.28)


@dataclass
class Tools:
    """Where bootstrap put each tool; `missing()` names those that are not there."""

    root: Path = TOOLS

    @property
    def kubeconform(self) -> Path:
        return self.root / "bin" / "kubeconform"

    @property
    def compose_schema(self) -> Path:
        return self.root / "compose-spec.json"

    @property
    def kubernetes_schemas(self) -> Path:  # kubernetes-validate's strict, self-contained schemas
        return self.root / "kubernetes-json-schema" / f"v{KUBERNETES}-local-strict"

    @property
    def crds(self) -> list[Path]:
        return sorted((HERE / "k8s" / "crds").glob("*.yaml")) + sorted((self.root / "crds").glob("*.yaml"))

    def missing(self) -> list[str]:
        return [str(p) for p in (self.kubeconform, self.compose_schema, self.kubernetes_schemas) if not p.exists()]


def compose_errors(compose: Path, schema: Path) -> list[str]:
    """Where `compose` breaks the Compose specification's schema (empty: it conforms)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(schema.read_text()))
    doc = yaml.safe_load(compose.read_text())
    return [f"{'.'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in validator.iter_errors(doc)]


def crd_schemas(crds: list[Path], out: Path) -> list[Path]:
    """One strict JSON schema per CRD version, at `<out>/<group>/<kind>_<version>.json` (kubeconform's
    `{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json`): the CRD's openAPIV3Schema with
    unknown fields refused wherever the CRD does not say it keeps them."""
    written = []
    for path in crds:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                schema = _strict(version["schema"]["openAPIV3Schema"])
                target = out / spec["group"] / f"{spec['names']['kind'].lower()}_{version['name']}.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(schema))
                written.append(target)
    return written


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        return node
    return [_strict(v) for v in node] if isinstance(node, list) else node


def kubernetes_schemas(manifests: list[Path], source: Path, out: Path) -> list[Path]:
    """Self-contained copies of the Kubernetes schemas the manifests' kinds need, at kubeconform's
    `{{ .ResourceKind }}{{ .KindSuffix }}.json`. kubernetes-validate's files point into one shared
    `/api/_definitions.json`, which kubeconform cannot follow: each copy carries those definitions."""
    definitions = json.loads((source / "_definitions.json").read_text())["$defs"]
    written = []
    for doc in documents(manifests):
        group, _, version = doc["apiVersion"].rpartition("/")
        name = doc["kind"].lower() + (f"-{group.split('.')[0].lower()}" if group else "") + f"-{version}.json"
        if (source / name).exists() and not (out / name).exists():
            text = (source / name).read_text().replace('"/api/_definitions.json#/$defs/', '"#/$defs/')
            out.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(json.dumps({**json.loads(text), "$defs": definitions}))
            written.append(out / name)
    return written


def kubeconform(manifests: list[Path], tools: Tools, schema_dir: Path, crd_dir: Path) -> subprocess.CompletedProcess:
    """kubeconform -strict over `manifests` (Kubernetes kinds from `schema_dir`, made by
    kubernetes_schemas; CRDs' from `crd_dir`, by crd_schemas); a kind with no schema is an error."""
    return subprocess.run(
        [str(tools.kubeconform), "-strict", "-summary", "-output", "json",
         "-schema-location", f"{schema_dir}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
         "-schema-location", f"{crd_dir}/{{{{ .Group }}}}/{{{{ .ResourceKind }}}}_{{{{ .ResourceAPIVersion }}}}.json",
         *map(str, manifests)], capture_output=True, text=True, timeout=120)


def documents(paths: list[Path]) -> Iterator[dict]:
    """Every Kubernetes object in `paths`."""
    for path in paths:
        yield from (d for d in yaml.safe_load_all(path.read_text()) if d)
