"""docs/config.md is generated from the Field descriptions of clawr1/config.py, and every key has one."""
from __future__ import annotations

import re

import yaml
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from clawr1.config import Config, load_config
from clawr1.config_reference import REGENERATE, keys, render_config_reference
from tests.conftest import REPO

DOC = REPO / "docs" / "config.md"
DOC_KEY = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)  # the key cell that starts every table row
CELL = r"(?:\\\||[^|\n])*"  # a table cell's text: anything but a line break or an unescaped |
DOC_ROW = re.compile(rf"^\| `([^`]+)` \|{CELL}\| ({CELL}) \|", re.MULTILINE)  # a row's key and default
ONE_DIRECTIVE = ("judge.directives=[{kind: units, option: word, directive: spell out the units, "
                 "patterns: [kilometers]}]")


def missing_descriptions(cls: type = Config) -> list[str]:
    """Dotted keys (sections and judge.directives[] items included) whose Field has no description."""
    return [key for key, field in keys(cls) if not (field.description or "").strip()]


def documented_keys(text: str) -> list[str]:
    return DOC_KEY.findall(text)


def resolve(cfg: Config, key: str):
    """The value at a dotted key of a loaded config; `name[]` is the list's first item. AttributeError if none."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part.removesuffix("[]"))
        if part.endswith("[]"):
            node = node[0]
    return node


def _yaml_line(value) -> str:
    text = yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, width=1 << 30)
    return text.strip().removesuffix("...").strip()


def unresolved_keys(text: str) -> list[str]:
    """Keys in the rendered reference that are not keys of the config tree, or do not survive a round trip: each
    must resolve on a loaded config, take its own value back as a dotted override, and a default shown whole must
    read back (as YAML) as the default."""
    defaults, cfg = load_config(None), load_config(None, [ONE_DIRECTIVE])
    bad = []
    for key, default in DOC_ROW.findall(text):
        try:
            value = resolve(cfg, key)
        except (AttributeError, IndexError):
            bad.append(f"{key} (no such key)")
            continue
        if "[]" in key:
            continue  # an item's field: resolving it through the loaded list is the round trip
        shown = re.fullmatch(r"`([^`]*)`", default.replace(r"\|", "|"))
        if shown and yaml.safe_load(shown.group(1)) != to_jsonable_python(resolve(defaults, key)):
            bad.append(f"{key} (the default shown, {default}, is not the default)")
        override = f"{key}={_yaml_line(value)}"
        try:
            if resolve(load_config(None, [ONE_DIRECTIVE, override]), key) != value:
                bad.append(f"{key} (reads back otherwise from {override!r})")
        except Exception as e:  # noqa: BLE001 - any failure names the key
            bad.append(f"{key} ({override!r}: {e})")
    return bad


def test_every_key_has_a_description():
    missing = missing_descriptions()
    assert not missing, ("these config keys have no Field(description=...) in clawr1/config.py:\n"
                         + "\n".join(missing))


def test_docs_config_md_is_the_rendered_reference():
    rendered = render_config_reference()
    assert DOC.is_file() and DOC.read_text() == rendered, (
        f"docs/config.md differs from what clawr1/config.py renders; regenerate it with `{REGENERATE}` "
        "(or `python -m clawr1.config_reference > docs/config.md`)")


def test_every_documented_key_is_a_real_key_that_round_trips():
    text = render_config_reference()
    fields = [key for key, field in keys() if not (isinstance(field.annotation, type)
                                                   and issubclass(field.annotation, BaseModel))]  # sections: headings
    documented = documented_keys(text)
    repeated = sorted({k for k in documented if documented.count(k) > 1})
    assert sorted(documented) == sorted(fields), (
        "the reference's table rows should be every key, once: not in the tree "
        f"{sorted(set(documented) - set(fields))}, missing {sorted(set(fields) - set(documented))}, "
        f"repeated {repeated}")
    bad = unresolved_keys(text)
    assert not bad, "the reference names keys the config does not take back:\n" + "\n".join(bad)


def test_the_checks_catch_a_missing_description_and_a_bogus_key():
    from pydantic import Field

    from clawr1.config import Section

    class Inner(Section):
        documented: int = Field(1, description="described")
        bare: int = 2

    class Outer(Section):
        inner: Inner = Field(default_factory=Inner)  # a section without a description

    assert missing_descriptions(Outer) == ["inner", "inner.bare"]
    rows = ["| `trainer.lr` | float > 0 | `0.0001` | d |", "| `trainer.lrr` | float | `1` | d |",
            "| `judge.directives[].kind` | str | (required) | d |",
            "| `trainer.adam_eps` | float > 0 | `1.0e-07` | d |",
            '| `run.mode` | one of "env" \\| "live" | `live` | d |']
    assert unresolved_keys("\n".join(rows)) == ["trainer.lrr (no such key)",
                                                "trainer.adam_eps (the default shown, `1.0e-07`, is not the default)",
                                                "run.mode (the default shown, `live`, is not the default)"]
