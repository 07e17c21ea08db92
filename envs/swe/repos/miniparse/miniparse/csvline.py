"""CSV lines with double-quoted fields (`""` inside quotes is one quote)."""
from __future__ import annotations


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
