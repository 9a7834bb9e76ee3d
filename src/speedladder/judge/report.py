"""A judgement as the one JSON object `speedladder judge` prints, its exit status, and the JSON Schema it is held to
(schema.json, shipped in the package; `check` is a small validator of the keywords that schema uses)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from speedladder import codec
from speedladder.judge.record import Judgement

SCHEMA_FILE = Path(__file__).with_name("schema.json")
# The exit status of each decision; 2 is bad input (nothing judged), as for every command.
EXIT = {"keep": 0, "revert": 1, "undecided": 3}


def document(j: Judgement) -> dict[str, Any]:
    """The judgement as plain JSON data (non-finite numbers as null)."""
    out: dict[str, Any] = codec.to_data(j, json=True)
    return out


def to_json(j: Judgement) -> str:
    """One line of JSON: what stdout holds, and nothing else."""
    return json.dumps(document(j), allow_nan=False, separators=(",", ":"))


@cache
def schema() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return out


_TYPES: dict[str, Any] = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, name: str) -> bool:
    if name in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return name == "number" or float(value).is_integer()
    return isinstance(value, _TYPES[name])


def check(value: Any, node: dict[str, Any] | None = None, where: str = "$") -> list[str]:
    """Where `value` breaks the schema (the shipped one by default), one line each; empty when it validates.

    The keywords read: $ref (to #/$defs), type, enum, const, pattern, minimum, maximum, required, properties,
    additionalProperties, items, minItems, maxItems, anyOf. Any other keyword in the schema is refused, so that the
    schema never holds a rule this check would silently skip."""
    root = schema()
    node = root if node is None else node
    known = {"$schema", "$id", "$defs", "$ref", "title", "description", "type", "enum", "const", "pattern", "minimum",
             "maximum", "required", "properties", "additionalProperties", "items", "minItems", "maxItems", "anyOf"}
    if unknown := set(node) - known:
        raise ValueError(f"{where}: the schema uses {sorted(unknown)}, which check() does not read")
    if "$ref" in node:
        return check(value, root["$defs"][node["$ref"].rsplit("/", 1)[-1]], where)
    if "anyOf" in node and all(check(value, option, where) for option in node["anyOf"]):
        return [f"{where}: matches none of its allowed forms"]
    errors: list[str] = []
    types = node.get("type")
    if types is not None and not any(_is(value, t) for t in ([types] if isinstance(types, str) else types)):
        return [f"{where}: {type(value).__name__} where {types} is allowed"]
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{where}: {value!r} is not one of {node['enum']}")
    if "const" in node and value != node["const"]:
        errors.append(f"{where}: {value!r} is not {node['const']!r}")
    if "pattern" in node and isinstance(value, str) and not re.search(node["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {node['pattern']!r}")
    if _is(value, "number"):
        if "minimum" in node and value < node["minimum"]:
            errors.append(f"{where}: {value} is below {node['minimum']}")
        if "maximum" in node and value > node["maximum"]:
            errors.append(f"{where}: {value} is above {node['maximum']}")
    if isinstance(value, dict):
        errors += [f"{where}: {k!r} is missing" for k in node.get("required", []) if k not in value]
        props, extra = node.get("properties", {}), node.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                errors += check(v, props[k], f"{where}.{k}")
            elif extra is False:
                errors.append(f"{where}: {k!r} is not a field of it")
            elif isinstance(extra, dict):
                errors += check(v, extra, f"{where}.{k}")
    if isinstance(value, list):
        if "minItems" in node and len(value) < node["minItems"]:
            errors.append(f"{where}: fewer than {node['minItems']} items")
        if "maxItems" in node and len(value) > node["maxItems"]:
            errors.append(f"{where}: more than {node['maxItems']} items")
        if "items" in node:
            for i, item in enumerate(value):
                errors += check(item, node["items"], f"{where}[{i}]")
    return errors
