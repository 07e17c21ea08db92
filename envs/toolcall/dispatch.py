"""Running one tool call from a model: parse, validate against the tool's schema, call, wrap.

Whatever a model sends (unknown tool, broken JSON, missing or extra arguments, wrong types,
a call the tool refuses) comes back as a `ToolResult` with `ok=False`, an `error` message,
and `{"error": "..."}` as the content the model reads. Nothing raises.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from envs.toolcall.schema import schema_errors


@dataclass
class ToolResult:
    content: str  # what goes back to the model in the `tool` message
    ok: bool
    error: Optional[str] = None


class ToolError(Exception):
    """A well-formed call the tool refuses (unknown id, rule broken, ...)."""


def error_result(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}), ok=False, error=message)


def parse_arguments(arguments: str | dict | None) -> dict | str:
    """The arguments as a dict, or an error message."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return f"arguments are not valid JSON: {e.msg}"
    return arguments if isinstance(arguments, dict) else "arguments must be a JSON object"


def run_tool(schemas: Mapping[str, dict], impls: Mapping[str, Callable[..., Any]], name: str,
             arguments: str | dict | None, *context: Any) -> ToolResult:
    """Call `impls[name](*context, **arguments)` after checking `arguments` against `schemas[name]`.

    A string result is sent as is; anything else as JSON.
    """
    if name not in impls:
        return error_result(f"unknown tool '{name}'; tools are: {', '.join(impls)}")
    args = parse_arguments(arguments)
    if isinstance(args, str):
        return error_result(args)
    problems = schema_errors(args, schemas[name])
    if problems:
        return error_result("; ".join(problems))
    try:
        result = impls[name](*context, **args)
    except ToolError as e:
        return error_result(str(e))
    return ToolResult(result if isinstance(result, str) else json.dumps(result), ok=True)
