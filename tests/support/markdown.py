"""Reading the project's Markdown documents as GitHub renders them: the anchors of their
headings, so that tests can check the links into a document lead somewhere."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^```.*?^```$", re.M | re.S)


def anchors(text: str) -> set[str]:
    """The anchor GitHub gives each heading of ``text`` (lower case, punctuation other than
    ``-`` and ``_`` dropped, spaces made hyphens; a repeated one gets ``-1``, ``-2``...).
    Lines in fenced code blocks are not headings."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.*)$", _FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found
