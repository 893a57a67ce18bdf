"""Custom resources checked against their CRD the way the API server checks them: the openAPIV3Schema's defaults
applied first (as the API server does before validating), then the structural schema (openapi-schema-validator)
and the x-kubernetes-validations CEL rules (cel-python) at every level they are declared."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import celpy
import yaml
from openapi_schema_validator import OAS30Validator

CRD_DIR = Path(__file__).resolve().parents[1] / "octavo" / "crds"


def load_crds(crd_dir: Path = CRD_DIR) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, for every CRD in `crd_dir`."""
    schemas = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            schemas[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = version["schema"][
                "openAPIV3Schema"]
    return schemas


def with_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults filled in, recursively (an absent field with a default gets it, and
    the defaulted object's own fields are defaulted in turn)."""
    if not isinstance(value, dict):
        if isinstance(value, list) and "items" in schema:
            return [with_defaults(schema["items"], v) for v in value]
        return value
    out = dict(value)
    for key, sub in (schema.get("properties") or {}).items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = with_defaults(sub, out[key])
    return out


def _cel_errors(schema: Mapping[str, Any], value: Any, path: str) -> list[str]:
    errors = []
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        try:
            ok = bool(program.evaluate({"self": celpy.json_to_cel(value)}))
        except Exception as e:  # a rule that cannot evaluate fails, as on the API server
            errors.append(f"{path}: {rule.get('message', rule['rule'])} (rule error: {e})")
            continue
        if not ok:
            errors.append(f"{path}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                errors += _cel_errors(sub, value[key], f"{path}.{key}")
    return errors


def validate(obj: Mapping[str, Any], schemas: Mapping[tuple[str, str], Mapping[str, Any]] | None = None
             ) -> list[str]:
    """What the API server would refuse in this custom resource (empty: accepted). KeyError when its kind has
    no CRD here."""
    schemas = schemas if schemas is not None else load_crds()
    schema = schemas[(obj["apiVersion"], obj["kind"])]
    defaulted = with_defaults(schema, dict(obj))
    errors = [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}"
              for e in OAS30Validator(schema).iter_errors(defaulted)]
    if errors:
        return errors
    return _cel_errors(schema, defaulted, "<root>")


def custom_resources(docs: Iterable[Mapping[str, Any]],
                     schemas: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [d for d in docs if (d.get("apiVersion"), d.get("kind")) in schemas]
