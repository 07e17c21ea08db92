"""docs/config.md, generated: every key of the config tree with its type, default and description.

The descriptions live in clawr1/config.py, one `Field(description=...)` per key; this module only walks the
tree in declaration order and writes them out as Markdown, one table per section. Regenerate the page with
`clawr1 config-docs > docs/config.md` (or `python -m clawr1.config_reference > docs/config.md`);
tests/test_config_reference.py fails while the committed page differs from what this renders.
"""
from __future__ import annotations

import inspect
import math
import re
import sys
import typing
from typing import Any, Iterator, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from clawr1.config import Config

REGENERATE = "clawr1 config-docs > docs/config.md"
MAX_DEFAULT_CHARS = 60  # longer defaults (pattern lists) show their first items and a count

INTRO = f"""\
# Config reference

<!-- Generated from the Field descriptions in clawr1/config.py by `{REGENERATE}`; do not edit by hand. -->

Every key of the one config tree that all of clawr1's loops read, with its type, default and meaning. Every
default lives in `clawr1/config.py`; a key's description is its `Field(description=...)` there.

**Setting keys.** A recipe is a YAML file whose keys mirror the tree: `trainer: {{lr: 1.0e-05}}` sets `trainer.lr`.
A recipe may `include:` another YAML file (a path relative to itself) and override parts of it. On the command
line, dotted overrides follow the recipe, each `key.path=value` with the value read as YAML, e.g.
`clawr1 run recipes/combined/cpu.yaml trainer.lr=1e-5 run.max_steps=4` or
`rollout.env_args={{kinds: [format]}}` (every loop's command takes them after `--config FILE` as well). The whole
tree is checked once, when it is loaded and before any process starts: an unknown key, a value outside its type,
choices or range, and settings that contradict each other are refused, naming the key, the value and what is
allowed.

Types: `int ≥ 1` and the like give the allowed range; `one of "a" | "b"` lists the choices; `(required)` marks a
key without a default. A port of 0 is given a free port by `clawr1 run`.
"""


# ---------------------------------------------------------------- types


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _bounds(constraints: list[Any]) -> str:
    """`≥ 1`, `in [0, 1)`... from annotated_types constraints (empty when unbounded)."""
    low = high = None
    for c in constraints:
        if isinstance(c, annotated_types.Ge):
            low = ("[", c.ge)
        elif isinstance(c, annotated_types.Gt):
            low = ("(", c.gt)
        elif isinstance(c, annotated_types.Le):
            high = ("]", c.le)
        elif isinstance(c, annotated_types.Lt):
            high = (")", c.lt)
    if low and high:
        return f"in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
    if low:
        return f"{'≥' if low[0] == '[' else '>'} {_number(low[1])}"
    if high:
        return f"{'≤' if high[0] == ']' else '<'} {_number(high[1])}"
    return ""


def _length(constraints: list[Any]) -> str:
    low = next((c.min_length for c in constraints if isinstance(c, annotated_types.MinLen)), None)
    high = next((c.max_length for c in constraints if isinstance(c, annotated_types.MaxLen)), None)
    if low is not None and low == high:
        return f"{low} items"
    if low is not None and high is not None:
        return f"{low} to {high} items"
    if low is not None:
        return f"at least {low} item{'s' if low != 1 else ''}"
    if high is not None:
        return f"at most {high} items"
    return ""


def _flatten(metadata: list[Any]) -> list[Any]:
    """Constraints as annotated_types objects, those of nested FieldInfos included."""
    out = []
    for m in metadata:
        out.extend(_flatten(m.metadata) if isinstance(m, FieldInfo) else [m])
    return out


def type_text(annotation: Any, metadata: list[Any] = ()) -> str:
    """A readable type: `int ≥ 1`, `float in [0, 1]`, `one of "env" | "live"`, `list[str]`, `dict`..."""
    constraints = _flatten(list(metadata))
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return type_text(inner, [*constraints, *extra])
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + " | ".join(f'"{a}"' for a in args)
    if origin is list:
        item = args[0] if args else Any
        if isinstance(item, type) and issubclass(item, BaseModel):
            text = "list of mappings"
        else:
            text = f"list[{type_text(item)}]"
        length = _length(constraints)
        return f"{text}, {length}" if length else text
    if origin is dict:
        if not args or args[1] is Any:
            return "dict"
        return f"dict[{type_text(args[0])}, {type_text(args[1])}]"
    if annotation is Any:
        return "any"
    name = getattr(annotation, "__name__", str(annotation))
    bounds = _bounds(constraints)
    return f"{name} {bounds}" if bounds else name


# ---------------------------------------------------------------- defaults


def _yaml(value: Any) -> str:
    """`value` as YAML writes it on one line (so that it reads back as the same value)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True).strip()
    return text.removesuffix("...").strip()


def default_text(field: FieldInfo) -> str:
    """The default as YAML writes it, long lists cut after their first items; `(required)` when there is none."""
    if field.is_required():
        return "(required)"
    value = field.get_default(call_default_factory=True)
    text = _yaml(value)
    if len(text) <= MAX_DEFAULT_CHARS or not isinstance(value, list):
        return f"`{text}`"
    shown: list[Any] = []
    for item in value:
        if len(_yaml([*shown, item])) > MAX_DEFAULT_CHARS - 10:
            break
        shown.append(item)
    return f"`{_yaml(shown).removesuffix(']')}, …]` ({len(value)} items)"


# ---------------------------------------------------------------- the walk


def _section_class(field: FieldInfo) -> type[BaseModel] | None:
    a = field.annotation
    return a if isinstance(a, type) and issubclass(a, BaseModel) else None


def _item_class(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a list's items (judge.directives), if its items are one."""
    if typing.get_origin(field.annotation) is list:
        (item,) = typing.get_args(field.annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def sections(cls: type[BaseModel] = Config, prefix: str = "",
             field: FieldInfo | None = None) -> Iterator[tuple[str, type[BaseModel], FieldInfo | None]]:
    """(dotted name, model class, the field holding it) of every section, in declaration order, each right
    before the sections nested in it. A list of models (judge.directives) is a section named `judge.directives[]`."""
    if prefix:
        yield prefix, cls, field
    for name, f in cls.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if (sub := _section_class(f)) is not None:
            yield from sections(sub, key, f)
        elif (item := _item_class(f)) is not None:
            yield from sections(item, key + "[]", f)


def keys(cls: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted key, field) of every field of every section reachable from `cls`, sections included."""
    for name, f in cls.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        yield key, f
        if (sub := _section_class(f)) is not None:
            yield from keys(sub, key)
        elif (item := _item_class(f)) is not None:
            yield from keys(item, key + "[]")


# ---------------------------------------------------------------- markdown


def _prose(text: str) -> str:
    """Text for a Markdown table cell or paragraph. Outside code spans, a `<` that could open an HTML tag and a
    `*` that could open or close emphasis are escaped; `|` is escaped everywhere (it would end the cell)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", parts[i])
        parts[i] = re.sub(r"(?<! )\*|\*(?! )", r"\\*", parts[i])
    return "`".join(parts).replace("|", r"\|")


def _cell(text: str) -> str:
    return _prose(" ".join(text.split()))


def _docstring(cls: type[BaseModel]) -> list[str]:
    """The class's own docstring as paragraphs (none for a class without one)."""
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return []
    return [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n") if p.strip()]


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", name.lower())


def _table(cls: type[BaseModel], prefix: str) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, f in cls.model_fields.items():
        if _section_class(f) is not None:
            continue  # its own section below
        key = f"{prefix}.{name}"
        kind = f"list of mappings, see [`{key}[]`](#{_anchor(key + '[]')})" if _item_class(f) else \
            type_text(f.annotation, f.metadata)
        rows.append(f"| `{key}` | {_cell(kind)} | {_cell(default_text(f))} | {_cell(f.description or '')} |")
    return rows


def render_config_reference() -> str:
    """docs/config.md: the intro, then one heading and table per section of `Config`, in declaration order."""
    top = list(Config.model_fields)
    out = [INTRO, "Sections: " + ", ".join(f"[`{name}`](#{_anchor(name)})" for name in top) + ".", ""]
    for name, cls, field in sections():
        out.append(f"{'#' * (name.count('.') + 2)} {name}")
        out.append("")
        for paragraph in [field.description or ""] + _docstring(cls):
            if paragraph:
                out += [_prose(paragraph), ""]
        out += _table(cls, name)
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> int:
    sys.stdout.write(render_config_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
