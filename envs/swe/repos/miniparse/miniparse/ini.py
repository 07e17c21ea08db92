"""INI files: `[section]` headers, `key = value` (or `key: value`) lines, `#` and `;` comments."""
from __future__ import annotations

DEFAULT_SECTION = "DEFAULT"
TRUE_WORDS = {"1", "yes", "true", "on"}
FALSE_WORDS = {"0", "no", "false", "off"}


class IniError(ValueError):
    """A line that is not a section header, a comment or a key-value pair."""


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
