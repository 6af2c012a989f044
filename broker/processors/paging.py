"""Admin listings a page at a time.

A listing RocketMQ answers whole (every topic's config, every consumer group's settings) is
answered a page at a time when the request carries txmq's ``after`` field
(:class:`~txmq.protocol.headers.ListPageRequestHeader`): the first ``limit`` entries in name
order after the cursor, cut at about :data:`LIST_PAGE_BYTES` of JSON, with the answer's
``nextCursor`` (the name of the page's last entry) when more remain.  A cursor is a position,
not an index: entries created or deleted between two pages move no other entry across it, so
a listing paged to its end gives every entry that existed throughout exactly once.

Without ``after`` (a stock RocketMQ client) the whole listing is answered as before; one past
the frame limit is refused with an error naming the limit (``protocol/aio.py``).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from txmq.protocol.errors import InvalidParameterError
from txmq.protocol.headers import ListPageRequestHeader

#: About how much JSON one page carries at most (always one entry at least).
LIST_PAGE_BYTES = 4 * 1024 * 1024
#: Entries a page holds when the request does not say.
DEFAULT_PAGE = 1000
#: Entries a page holds at most, whatever the request asks.
MAX_PAGE = 10_000


def page_request(ext_fields: Mapping[str, Any]) -> ListPageRequestHeader | None:
    """The paging a listing request asks for, or None: the whole listing (a stock client).

    Raises:
        InvalidParameterError: a ``limit`` below 1.
    """
    h = ListPageRequestHeader.from_ext_fields(dict(ext_fields))
    if h.after is None:
        return None
    if h.limit is not None and h.limit < 1:
        raise InvalidParameterError(f"limit must be at least 1, got {h.limit}")
    return h


def page_by_name(
    names: Iterable[str], h: ListPageRequestHeader, render: Callable[[str], str]
) -> tuple[list[tuple[str, str]], str | None]:
    """The page of ``names`` that ``h`` asks for, in name order, each with its entry's JSON
    text (``render(name)``), and the cursor of the next page (None: this was the last)."""
    limit = min(h.limit or DEFAULT_PAGE, MAX_PAGE)
    after = h.after or ""
    candidates = heapq.nsmallest(limit + 1, (n for n in names if n > after))
    page: list[tuple[str, str]] = []
    used = 0
    for name in candidates[:limit]:
        if page and used > LIST_PAGE_BYTES:
            break
        text = render(name)
        page.append((name, text))
        used += len(name) + len(text) + 4
    more = len(page) < len(candidates)
    return page, (page[-1][0] if more else None)


def json_table(page: list[tuple[str, str]]) -> str:
    """A page as the JSON object ``{name: entry, ...}`` (each entry's text as rendered)."""
    return "{" + ",".join(f"{json.dumps(name)}:{text}" for name, text in page) + "}"
