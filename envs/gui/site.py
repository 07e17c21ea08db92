"""A task's web pages, served from memory at a fixed origin; every other request is refused.

Each episode's browser context routes all its requests through `SiteRouter.handle`: a GET for a
page the site has is answered from memory, a POST to the site is recorded (for the judge) and
answered with the site's reply, and anything else (another origin, a missing page) is refused.
Nothing reaches the network: the browser has no network namespace of its own to reach, and its
settings send whatever these routes do not see (WebSockets, WebRTC) to a proxy that cannot exist
(envs/gui/browser.py).
"""
from __future__ import annotations

import mimetypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import parse_qsl, urlsplit

ORIGIN = "http://gui.task"
POSTED_PAGE = "<!doctype html><html><head><title>Sent</title></head><body><p>Your form was sent.</p></body></html>"


@dataclass
class Post:
    """One form or fetch POST the page sent."""

    path: str
    form: dict[str, str]  # the body as form fields (application/x-www-form-urlencoded or JSON objects)
    body: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "form": self.form}


@dataclass
class Site:
    """Pages by path ("/login"), each HTML text or bytes; `files`: a directory served below `files_prefix`."""

    pages: dict[str, str] = field(default_factory=dict)
    origin: str = ORIGIN
    files: Optional[Path] = None
    files_prefix: str = "/"
    post_reply: Callable[[str, dict[str, str]], str] = lambda path, form: POSTED_PAGE

    def url(self, path: str) -> str:
        return self.origin + path

    def lookup(self, path: str) -> Optional[tuple[bytes, str]]:
        """(body, content type) of the resource at `path`, or None."""
        if path in self.pages:
            return self.pages[path].encode(), "text/html; charset=utf-8"
        if self.files is not None and path.startswith(self.files_prefix):
            target = (self.files / path[len(self.files_prefix):]).resolve()
            if target.is_file() and target.is_relative_to(self.files.resolve()):
                return _read_cached(target), content_type(target.name)
        return None


_FILE_CACHE: dict[Path, bytes] = {}


def content_type(name: str) -> str:
    """A file's content type; text is UTF-8 (MiniWoB++'s pages declare no charset, and some hold CJK text)."""
    guessed = mimetypes.guess_type(name)[0] or "application/octet-stream"
    text = guessed.startswith("text/") or guessed in ("application/javascript", "application/json")
    return f"{guessed}; charset=utf-8" if text else guessed


def _read_cached(path: Path) -> bytes:
    if path not in _FILE_CACHE:
        _FILE_CACHE[path] = path.read_bytes()
    return _FILE_CACHE[path]


def parse_form(body: str, content_type: str) -> dict[str, str]:
    """A POST body's fields: url-encoded form fields, or a flat JSON object's values as text."""
    if "json" in content_type:
        import json

        try:
            data = json.loads(body or "null")
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    return dict(parse_qsl(body or "", keep_blank_values=True))


class SiteRouter:
    """Answers one browser context's requests from a `Site`; keeps the POSTs and the refused URLs."""

    def __init__(self, site: Site):
        self.site = site
        self.posts: list[Post] = []
        self.refused: list[str] = []
        self.refused_navigations: list[str] = []  # of those, the ones that would have replaced the page

    async def handle(self, route: Any) -> None:
        request = route.request
        parts = urlsplit(request.url)
        if f"{parts.scheme}://{parts.netloc}" != self.site.origin:
            self.refused.append(request.url)
            if request.is_navigation_request():
                self.refused_navigations.append(request.url)
            return await route.abort("blockedbyclient")
        if request.method == "POST":
            body = request.post_data or ""
            form = parse_form(body, request.headers.get("content-type", ""))
            self.posts.append(Post(parts.path, form, body))
            return await route.fulfill(status=200, content_type="text/html; charset=utf-8",
                                       body=self.site.post_reply(parts.path, form))
        found = self.site.lookup(parts.path) if request.method == "GET" else None
        if found is None:
            self.refused.append(request.url)
            return await route.fulfill(status=404, content_type="text/plain", body=f"no page {parts.path}")
        body, content_type = found
        await route.fulfill(status=200, content_type=content_type, body=body)
