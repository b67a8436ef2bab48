"""The docs hold together: docs/usage.md's examples run as written, and every relative link and
``#anchor`` in README.md and docs/*.md points at a file and a heading that exist."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but ``-``/``_`` dropped, spaces to ``-``."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # no headings in code
    ids = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


def _links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [
        link for link in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in link and not link.startswith("mailto:")
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_and_anchors_resolve(page):
    for link in _links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name} links a missing file {link}"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{page.name} links {link}: no heading with that id in {target.name}"


def test_anchor_slugs_follow_github():
    # the rule the link check relies on, on headings of the kind these pages use
    page = ROOT / "docs" / "porting.md"
    assert "channels-and-mixed-multiplicities" in _anchors(page)
    assert "functionaltensorproduct--uvu-weights" in _anchors(page)


def test_usage_examples_run():
    """docs/usage.md's Python blocks, run in order in one namespace (later ones reuse earlier names)."""
    page = (ROOT / "docs" / "usage.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    assert len(blocks) >= 3, "docs/usage.md lost its examples"
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/usage.md block {i}", "exec"), namespace)
    conv, m, outs = namespace["conv"], namespace["m"], namespace["outs"]
    # the shapes the comments give
    assert m.shape == (namespace["num_nodes"], 1392) and str(conv.irreps_out) == "112x0e+160x1o+160x2e"
    assert [o.shape[1:] for o in outs] == [(9, 64), (17, 32), (17, 16)]
    assert namespace["coo"].num_paths == 23
