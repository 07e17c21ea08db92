"""CSV lines with double-quoted fields (`""` inside quotes is one quote)."""
from __future__ import annotations

from typing import Any, Callable, Iterable


def split_line(line: str, delimiter: str = ",") -> list[str]:
    """The fields of one CSV line."""
    fields: list[str] = []
    field: list[str] = []
    quoted = False
    i = 0
    while i < len(line):
        char = line[i]
        if quoted:
            if char == '"' and i + 1 < len(line) and line[i + 1] == '"':
                field.append('"')
                i += 1
            elif char == '"':
                quoted = False
            else:
                field.append(char)
        elif char == '"':
            quoted = True
        elif char == delimiter:
            fields.append("".join(field))
            field = []
        else:
            field.append(char)
        i += 1
    if quoted:
        raise ValueError(f"unterminated quote in {line!r}")
    fields.append("".join(field))
    return fields


def parse_csv(text: str, delimiter: str = ",") -> list[dict[str, str]]:
    """Rows as dicts keyed by the header line; blank lines are skipped; short rows are padded with ''."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = split_line(lines[0], delimiter)
    rows = []
    for line in lines[1:]:
        values = split_line(line, delimiter)
        if len(values) > len(header):
            raise ValueError(f"row has {len(values)} fields, the header {len(header)}: {line!r}")
        values += [""] * (len(header) - len(values))
        rows.append(dict(zip(header, values)))
    return rows


def _has_line_break(value: str) -> bool:
    return value.splitlines() not in ([], [value])


def quote_field(value: str, delimiter: str = ",") -> str:
    """`value` as a CSV field: quoted, inner quotes doubled, when it holds the delimiter or a quote."""
    if _has_line_break(value):
        raise ValueError(f"a field cannot hold a line break in line-based CSV: {value!r}")
    if delimiter in value or '"' in value:
        return '"' + value.replace('"', '""') + '"'
    return value


def join_line(fields: Iterable[str], delimiter: str = ",") -> str:
    """One CSV line that `split_line` reads back as `fields` (a line that would be blank is quoted, so it is kept)."""
    fields = list(fields)
    line = delimiter.join(quote_field(field, delimiter) for field in fields)
    if not line.strip():
        return delimiter.join(f'"{field}"' for field in fields)
    return line


def _header_of(rows: list[dict[str, str]]) -> list[str]:
    header: dict[str, None] = {}
    for row in rows:
        header.update(dict.fromkeys(row))
    return list(header)


def write_csv(rows: list[dict[str, str]], header: list[str] | None = None, delimiter: str = ",") -> str:
    """CSV text that `parse_csv` reads back as `rows`; missing keys are written as ''.

    Without `header`, the columns are the keys in the order they first appear.
    """
    header = _header_of(rows) if header is None else header
    if not header:
        return ""
    lines = [join_line(header, delimiter)]
    for number, row in enumerate(rows, start=1):
        unknown = [key for key in row if key not in header]
        if unknown:
            raise ValueError(f"row {number} has keys that are not in the header: {unknown}")
        lines.append(join_line((row.get(name, "") for name in header), delimiter))
    return "\n".join(lines) + "\n"


def convert_rows(rows: list[dict[str, str]], converters: dict[str, Callable[[str], Any]]) -> list[dict[str, Any]]:
    """The rows with the named columns converted; a ValueError names the row and the column that failed."""
    converted = []
    for number, row in enumerate(rows, start=1):
        out: dict[str, Any] = dict(row)
        for name, convert in converters.items():
            try:
                out[name] = convert(row[name])
            except (KeyError, ValueError) as error:
                raise ValueError(f"row {number}, column {name!r}: {error}") from None
        converted.append(out)
    return converted
