"""What the agent is shown of a page, built by the env from Playwright's accessibility snapshot (pure, no browser).

A page writes only data: every string it controls (the title, the URL, names, text, property values) is shown
in double quotes, escaped by `quote`, and cut to its own budget. Element ids appear only where the env puts
them, from the structure of the snapshot (`parse`), never from text: a page that writes "[ref=e99]" in a label
shows `"... [ref\\=e99] ..."` inside its quotes, and e99 is not an id the agent may act on. Chat-template
markers a page writes (ChatML's `<|...|>` tokens, `<tool_call>`, ...) have their `<` written `\\u003c`, so they reach the
model as text, never as the template's tokens.

The observation has a budget per part: the title and URL (`LINE_CHARS` each), each string (`STRING_CHARS`), and
the tree (`max_chars`), in which lines with an id come first: page text is dropped before any id, so a page
cannot push its controls out of sight with text. `shown` is exactly the ids the text holds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

LINE_CHARS = 200  # the title's and the URL's budget
STRING_CHARS = 2000  # each name, text or property value in the tree (MiniWoB's scroll-text holds ~1,000)
CUT = "…"
# Where the model's chat template could read page text as its own markers: `<|...|>` tokens, and the tags
# tool-calling templates wrap calls, results and reasoning in.
_TEMPLATE_MARKER = re.compile(r"<(?=\||/?(?:tool_call|tool_response|tools|think|function)\b)")
_LINE = re.compile(r"^( *)- (.*)$")
_KEY = re.compile(r'^(/?[\w-]+)(?: ("(?:[^"\\]|\\.)*"))?((?: \[[^\]]*\])*)$')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "0": "\0"}


@dataclass(frozen=True)
class Entry:
    """One line of the tree: an element (`role`), a text node (`role == "text"`) or a property (`/url`)."""

    depth: int
    role: str
    name: str = ""
    attrs: tuple[str, ...] = ()  # Playwright's own markers ("checked", "level=2"), the ref apart
    ref: str = ""
    text: Optional[str] = None  # after the colon; "" when children follow, None when there is no colon


@dataclass(frozen=True)
class Observation:
    text: str
    shown: frozenset[str]  # the element ids `text` holds


def quote(text: str, limit: int = STRING_CHARS) -> str:
    """`text` as data: cut to `limit`, escaped (`\\`, `"`, control characters, "[ref=", a template marker's `<`), quoted."""
    if len(text) > limit:
        text = text[:limit] + CUT
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    escaped = "".join(out).replace("[ref=", "[ref\\=")
    return '"' + _TEMPLATE_MARKER.sub(r"\\u003c", escaped) + '"'


def unquote(text: str) -> str:
    """The string a double- or single-quoted YAML scalar (or `quote`) holds; plain text as it is."""
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if not (len(text) >= 2 and text[0] == text[-1] == '"'):
        return text
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        width = {"u": 4, "x": 2}.get(nxt, 0)
        if width and re.fullmatch(r"[0-9a-fA-F]{%d}" % width, body[i + 2:i + 2 + width]):
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def parse(tree: str) -> list[Entry]:
    """The lines of a Playwright `aria_snapshot(mode="ai")` (or of an observation `render` wrote)."""
    entries = []
    for line in tree.splitlines():
        m = _LINE.match(line)
        if m:
            entries.append(_entry(len(m.group(1)) // 2, m.group(2)))
        elif line.strip():
            entries.append(Entry(0, "text", text=line.strip()))
    return entries


def _entry(depth: int, body: str) -> Entry:
    key, value = _split(body)
    m = _KEY.match(key)
    if not m:  # not a shape Playwright writes: shown as text, never as an element
        return Entry(depth, "text", text=body)
    markers = re.findall(r"\[([^\]]*)\]", m.group(3))
    ref = next((a[4:] for a in markers if a.startswith("ref=")), "")
    return Entry(depth, m.group(1), unquote(m.group(2) or ""), tuple(a for a in markers if not a.startswith("ref=")),
                 ref, None if value is None else unquote(value))


def _split(body: str) -> tuple[str, Optional[str]]:
    """(key, value): the value is what follows the key's colon ("" for a bare colon, None for none)."""
    if body.startswith("'"):
        end = 1
        while end < len(body):
            if body[end] == "'" and body[end + 1:end + 2] != "'":
                break
            end += 2 if body[end] == "'" else 1
        key, rest = unquote(body[:end + 1]), body[end + 1:]
    else:
        m = re.search(r'^((?:[^":]|"(?:[^"\\]|\\.)*")*?)(:(?: |$).*)?$', body)
        key, rest = (m.group(1), m.group(2) or "") if m else (body, "")
    if not rest.startswith(":"):
        return key, None
    return key, rest[1:].strip()


def render_entry(entry: Entry) -> str:
    line = "  " * entry.depth + "- " + entry.role
    if entry.name:
        line += " " + quote(entry.name)
    line += "".join(f" [{a}]" for a in entry.attrs)
    if entry.ref:
        line += f" [ref={entry.ref}]"
    if entry.text is not None:
        line += ": " + quote(entry.text) if entry.text else ":"
    return line


def render(entries: list[Entry], max_chars: int) -> Observation:
    """The tree in at most `max_chars` (about): every line with an id first, then page text while it fits."""
    lines = [render_entry(e) for e in entries]
    if sum(len(line) + 1 for line in lines) <= max_chars:
        return Observation("\n".join(lines), frozenset(e.ref for e in entries if e.ref))
    with_id = [i for i, e in enumerate(entries) if e.ref]
    keep, used = set(), 0
    for i in with_id:  # ids first, in page order, while they fit
        if used + len(lines[i]) + 1 > max_chars:
            break
        keep.add(i)
        used += len(lines[i]) + 1
    for i, line in enumerate(lines):  # then the page's text, in page order, in what is left
        if i not in keep and not entries[i].ref and used + len(line) + 1 <= max_chars:
            keep.add(i)
            used += len(line) + 1
    ids_left = len(with_id) - sum(1 for i in with_id if i in keep)
    text_left = len(lines) - len(keep) - ids_left
    shown = [lines[i] for i in sorted(keep)]
    if ids_left:
        shown.append(f"(the page has {ids_left} more elements with ids, not shown: the observation is full)")
    if text_left:
        shown.append(f"({text_left} more lines of page text not shown)")
    return Observation("\n".join(shown), frozenset(entries[i].ref for i in keep if entries[i].ref))


def page_observation(title: str, url: str, tree: str, max_chars: int) -> Observation:
    """The whole observation: the quoted title and URL, then the tree (`render`)."""
    header = f"Page: {quote(title or '(untitled)', LINE_CHARS)} at {quote(url, LINE_CHARS)}"
    body = render(parse(tree), max(0, max_chars - len(header) - 1))
    return Observation(header + "\n" + body.text, body.shown)
