"""The GUI env's tools (OpenAI function schemas) and the checking of a call's arguments (pure, no browser)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


def _function(name: str, description: str, properties: dict[str, str], required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": required,
                       "properties": {k: {"type": "string", "description": v} for k, v in properties.items()}}}}


ELEMENT = "the element's id from the page observation, e.g. e5"
TOOLS = [
    _function("click", "Click an element of the page.", {"id": ELEMENT}, ["id"]),
    _function("fill", "Replace the text of a text box with `text`.", {"id": ELEMENT, "text": "the text"},
              ["id", "text"]),
    _function("select_option", "Choose an option of a drop-down list (combobox) by its label.",
              {"id": ELEMENT, "option": "the option's label"}, ["id", "option"]),
    _function("press", "Press a key (Enter, Tab, Escape, ArrowDown, a letter...), on an element if `id` is given.",
              {"key": "the key, as Playwright names it (Enter, Control+a...)", "id": ELEMENT}, ["key"]),
    _function("go_back", "Go back to the previous page.", {}, []),
    _function("submit", "End the task. Give `answer` when the task asks a question.",
              {"answer": "the answer, if the task asks for one"}, []),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
_SPEC = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
_ID = re.compile(r"^\[?(?:ref=)?(f\d+)?e?(\d+)\]?$")


class ActionError(ValueError):
    """A call the env cannot act on; the message goes back to the agent as the tool's error."""


@dataclass(frozen=True)
class Action:
    tool: str
    args: dict[str, str]

    @property
    def element(self) -> str:
        """The element id ("e5"), or "" when the action names none."""
        return self.args.get("id", "")


def parse_call(name: str, arguments: str) -> Action:
    """Check a tool call: a known tool, arguments a JSON object with every required key, as text."""
    if name not in _SPEC:
        raise ActionError(f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
    try:
        raw = json.loads(arguments) if arguments.strip() else {}
    except ValueError as e:
        raise ActionError(f"{name}: the arguments are not valid JSON ({e.msg} at position {e.pos})") from None
    if not isinstance(raw, dict):
        raise ActionError(f"{name}: the arguments must be a JSON object, got {type(raw).__name__}")
    spec = _SPEC[name]
    missing = [k for k in spec["required"] if k not in raw or raw[k] is None]
    if missing:
        raise ActionError(f"{name}: missing argument {', '.join(repr(k) for k in missing)}")
    unknown = sorted(set(raw) - set(spec["properties"]))
    if unknown:
        raise ActionError(f"{name}: unknown argument {', '.join(repr(k) for k in unknown)}; it takes "
                          f"{', '.join(spec['properties']) or 'none'}")
    args = {k: _text(name, k, v) for k, v in raw.items() if v is not None}
    if "id" in args:
        args["id"] = element_id(name, args["id"])
    return Action(name, args)


def _text(tool: str, key: str, value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise ActionError(f"{tool}: argument {key!r} must be text, got {type(value).__name__}")
    return value if isinstance(value, str) else json.dumps(value)


def element_id(tool: str, value: str) -> str:
    """An element id as the observation writes it ("e5", or "f2e5" after the page changed); "5", "[ref=e5]" and
    "ref=e5" are read the same."""
    m = _ID.match(value.strip())
    if not m:
        raise ActionError(f"{tool}: {value!r} is not an element id; ids look like e5 (see [ref=e5] in the page)")
    return f"{m.group(1) or ''}e{m.group(2)}"
