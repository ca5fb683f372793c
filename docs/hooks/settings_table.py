"""The mkdocs hook that puts the settings table into settings.md at build time, made from opencode_env/settings.py:
the page holds a marker, the code holds the rows, so the two cannot drift."""

from __future__ import annotations

from typing import Any

from opencode_env.settings import markdown_table

MARKER = "<!-- settings-table: generated from opencode_env/settings.py -->"
PAGE = "settings.md"


class MarkerMissing(ValueError):
    """The settings page does not hold the table's marker exactly once."""


def page_with_table(markdown: str) -> str:
    found = markdown.count(MARKER)
    if found != 1:
        raise MarkerMissing(f"{PAGE} must hold {MARKER!r} once, not {found} times")
    return markdown.replace(MARKER, markdown_table())


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return page_with_table(markdown) if page.file.src_uri == PAGE else markdown
