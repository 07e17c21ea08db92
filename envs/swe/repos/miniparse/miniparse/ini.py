"""INI files: `[section]` headers, `key = value` (or `key: value`) lines, `#` and `;` comments."""
from __future__ import annotations

from typing import Any, Callable

DEFAULT_SECTION = "DEFAULT"
TRUE_WORDS = {"1", "yes", "true", "on"}
FALSE_WORDS = {"0", "no", "false", "off"}
_MISSING: Any = object()


class IniError(ValueError):
    """A line that is not a section header, a comment or a key-value pair, or a value of the wrong kind."""


def _split_pair(line: str, number: int) -> tuple[str, str]:
    positions = [p for p in (line.find("="), line.find(":")) if p != -1]
    if not positions:
        raise IniError(f"line {number}: expected 'key = value', got {line!r}")
    cut = min(positions)
    key = line[:cut].strip().lower()
    if not key:
        raise IniError(f"line {number}: empty key")
    return key, line[cut + 1:].strip()


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """Sections mapped to their keys (lower case) and values; keys before any header go to DEFAULT."""
    sections: dict[str, dict[str, str]] = {}
    current = DEFAULT_SECTION
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
            if not current:
                raise IniError(f"line {number}: empty section name")
            sections.setdefault(current, {})
            continue
        key, value = _split_pair(line, number)
        sections.setdefault(current, {})[key] = value
    return sections


def get_bool(section: dict[str, str], key: str, default: bool = False) -> bool:
    """A yes/no value; `default` when the key is missing."""
    if key not in section:
        return default
    word = section[key].lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise IniError(f"{key}: {section[key]!r} is not a boolean")


def get_list(section: dict[str, str], key: str) -> list[str]:
    """A comma-separated value as a list of stripped, non-empty items."""
    return [item.strip() for item in section.get(key, "").split(",") if item.strip()]


def _typed(section: dict[str, str], key: str, default: Any, convert: Callable[[str], Any], kind: str) -> Any:
    if key not in section:
        if default is _MISSING:
            raise IniError(f"missing key {key!r}")
        return default
    try:
        return convert(section[key])
    except ValueError:
        raise IniError(f"{key}: {section[key]!r} is not {kind}") from None


def get_int(section: dict[str, str], key: str, default: Any = _MISSING) -> int:
    """An integer value; `default` when the key is missing (IniError when there is no default)."""
    return _typed(section, key, default, int, "an integer")


def get_float(section: dict[str, str], key: str, default: Any = _MISSING) -> float:
    """A number; `default` when the key is missing (IniError when there is no default)."""
    return _typed(section, key, default, float, "a number")


def with_defaults(sections: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Every named section with the DEFAULT keys it does not set itself; DEFAULT itself is left out."""
    defaults = sections.get(DEFAULT_SECTION, {})
    return {name: {**defaults, **keys} for name, keys in sections.items() if name != DEFAULT_SECTION}


def merge_ini(base: dict[str, dict[str, str]], override: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Both configurations section by section; where both set a key, `override` wins."""
    merged = {name: dict(keys) for name, keys in base.items()}
    for name, keys in override.items():
        merged.setdefault(name, {}).update(keys)
    return merged


def _check_writable(what: str, text: str, forbidden_start: str = "", forbidden: str = "") -> None:
    """IniError unless `text` fits on one INI line and reads back unchanged."""
    if text.splitlines() not in ([], [text]) or text != text.strip():
        raise IniError(f"cannot write {what} {text!r}: line breaks and outer whitespace are not kept")
    if text.startswith(tuple(forbidden_start)) or any(char in text for char in forbidden):
        raise IniError(f"cannot write {what} {text!r}")


def dump_ini(sections: dict[str, dict[str, str]]) -> str:
    """INI text that `parse_ini` reads back as `sections` (keys come back in lower case), DEFAULT first."""
    names = sorted(sections, key=lambda name: name != DEFAULT_SECTION)
    blocks = []
    for name in names:
        if not name:
            raise IniError("cannot write an empty section name")
        _check_writable("section name", name)
        lines = [f"[{name}]"]
        for key, value in sections[name].items():
            if not key:
                raise IniError(f"cannot write an empty key in section {name!r}")
            _check_writable("key", key, forbidden_start="#;[", forbidden="=:")
            _check_writable("value", value)
            lines.append(f"{key} = {value}".rstrip())
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n" if blocks else ""
