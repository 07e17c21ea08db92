"""A small JSON Schema checker for tool arguments (the subset the bundled tool schemas use).

Tools validate their arguments against the very schema the model is shown, so a schema and
its implementation cannot drift apart. Supported: type (object, string, integer, number,
boolean, array), properties, required, additionalProperties: false, enum, minimum, maximum,
exclusiveMinimum, minLength, minItems, items.
"""
from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "string": (str,), "integer": (int,), "number": (int, float),
    "boolean": (bool,), "array": (list,),
}


def schema_errors(value: Any, schema: dict, path: str = "") -> list[str]:
    """Every way `value` breaks `schema`, as short messages naming the argument; [] when valid."""
    where = f"'{path}'" if path else "arguments"
    kind = schema.get("type")
    if kind:
        # bool is an int subclass in Python, but true is not a number in JSON
        if not isinstance(value, _TYPES[kind]) or (isinstance(value, bool) and kind != "boolean"):
            return [f"{where} must be of type {kind}, got {type(value).__name__}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where} must be one of {schema['enum']}, got {value!r}")
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where} must be >= {schema['minimum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append(f"{where} must be > {schema['exclusiveMinimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where} must be <= {schema['maximum']}")
    if kind == "string" and len(value) < schema.get("minLength", 0):
        errors.append(f"{where} must not be empty")
    if kind == "array":
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where} must have at least {schema['minItems']} item(s)")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
    if kind == "object":
        props = schema.get("properties", {})
        inside = f" in {where}" if path else ""
        errors += [f"missing required argument '{k}'{inside}" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            errors += [f"unexpected argument '{k}'{inside}" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                errors += schema_errors(v, props[k], f"{path}.{k}" if path else k)
    return errors
