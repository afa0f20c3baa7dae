"""Pages opened in a real browser (Debian's headless Chromium), for the tests of `b70lab report` and of the
sweep page: the DOM after plotly drew, as a tree in which traces and points can be counted.

Importable as `browser` from any test module: tests/conftest.py puts this folder on sys.path."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest


class Node:
    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs, self.children, self.text = tag, attrs, [], []

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        return [
            n
            for n in self.walk()
            if (tag is None or n.tag == tag)
            and (cls is None or cls in n.classes)
            and all(n.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def all_text(self) -> str:
        return "".join(t for n in self.walk() for t in n.text)


class Tree(HTMLParser):
    """HTML (and the inline SVG plotly draws) as nested nodes; enough to count what a browser rendered."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        if self.stack[-1].tag not in ("script", "style"):
            self.stack[-1].text.append(data)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed, and CI must run the pages' browser tests (.ci/run installs it)")
    pytest.skip("chromium is not installed (apt-get install chromium): the report page was not opened in a browser")


def browse(page: Path, profile: Path, *args: str) -> str:
    """Open the page offline (every host name fails to resolve) and give plotly time to draw."""
    done = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=15000",
            "--window-size=1400,5000",
            *args,
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def traces(page: Node, name: str) -> list[Node]:
    (plot,) = page.find("div", data_plot=name)
    (div,) = plot.find("div", cls="plotly-graph-div")
    assert div.attrs.get("data-rendered") == "true", f"plot {name} did not finish drawing"
    return [g for g in div.find("g") if "trace" in g.classes]


def points(trace: Node) -> int:
    return len(trace.find("path", cls="point"))
