"""Leaderboard and paired-table cells as HTML, written in Python rather than in the template.

At 1,000 configurations the page has about 100,000 cells; Jinja2 looking up each attribute of
each cell was most of a report's time. These functions write exactly the markup the template's
loops wrote (``tests/test_reports.py`` and the browser tests read it), every value escaped with
``markupsafe.escape`` as the template's autoescape did.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from markupsafe import Markup, escape

_ATTR = r'(?: (?:data-col|data-value|data-std|data-ci|class|title)="[^"<>]*"| hidden)'
_SPAN = r' ?<span class="[\w -]*"(?: aria-label="shared device")?>[^<>]*</span>'
_CELLS = re.compile(rf"(?:<td{_ATTR}*>(?:{_SPAN})*</td>)*")


_TEXT = r'[^<>"]*'
_PAIRED = re.compile(
    rf'(?:<td data-col="{_TEXT}" data-value="{_TEXT}" data-lo="{_TEXT}" data-hi="{_TEXT}" '
    rf'data-n="{_TEXT}" class="delta num(?: sig [\w-]+)?" title="{_TEXT}">[^<>]*'
    rf'(?: <span class="n">[^<>]*</span>)?(?: <span class="sig-mark [\w-]+">[^<>]*</span>)?'
    r"</td>)*"
)


def is_paired_markup(html: str) -> bool:
    """Whether ``html`` is markup :func:`paired_cells` can write (as
    :func:`is_leaderboard_markup`, for a cached paired-table row)."""
    return _PAIRED.fullmatch(html) is not None


def is_leaderboard_markup(html: str) -> bool:
    """Whether ``html`` is markup :func:`leaderboard_cells` can write: only its tags and
    attributes, every value and text without a raw ``<``, ``>`` or ``"`` (it escapes them).
    A cached row (:mod:`reports.row_cache`) is used only if it is, so a cache file written by
    someone else can never put a script or an event handler into the page."""
    return _CELLS.fullmatch(html) is not None


def leaderboard_cells(cells: Iterable[Mapping[str, Any]]) -> Markup:
    """The ``<td>`` elements of one leaderboard row (see :func:`reports.page.context`)."""
    out = []
    for c in cells:
        attrs = f'data-col="{escape(c["key"])}" data-value="{escape(c["value"])}"'
        if c["alt"]:
            attrs += f' data-std="{escape(c["alt"]["std"])}" data-ci="{escape(c["alt"]["ci"])}"'
        cls = f"g-{escape(c['group'])}"
        cls += " num" if c["num"] else ""
        cls += " best" if c["best"] else ""
        cls += " shared" if c["shared"] else ""
        cls += "".join(f" sig sig-{escape(s['cls'])}" for s in c["sig"])
        attrs += f' class="{cls}"'
        attrs += f' title="{escape(c["title"])}"' if c["title"] else ""
        attrs += " hidden" if c["hidden"] else ""
        body = f'<span class="v">{escape(c["text"])}</span>'
        if c["shared"]:
            body += '<span class="shared-mark" aria-label="shared device">⚠</span>'
        body += "".join(
            f'<span class="sig-mark {escape(s["cls"])}">{escape(s["symbol"])}</span>'
            for s in c["sig"]
        )
        if c["n"] is not None:
            body += f' <span class="n">({escape(c["n"])})</span>'
        out.append(f"<td {attrs}>{body}</td>")
    return Markup("".join(out))


def paired_cells(cells: Iterable[Mapping[str, Any]]) -> Markup:
    """The Δ ``<td>`` elements of one paired-table row (see :mod:`reports.paired_view`)."""
    out = []
    for c in cells:
        sig = c["sig"]
        cls = "delta num" + (f" sig {escape(sig['cls'])}" if sig else "")
        body = str(escape(c["text"]))
        body += f' <span class="n">{escape(c["extra"])}</span>' if c["extra"] else ""
        if sig:
            body += f' <span class="sig-mark {escape(sig["cls"])}">{escape(sig["symbol"])}</span>'
        out.append(
            f'<td data-col="{escape(c["key"])}" data-value="{escape(c["value"])}" '
            f'data-lo="{escape(c["lo"])}" data-hi="{escape(c["hi"])}" data-n="{escape(c["n"])}" '
            f'class="{cls}" title="{escape(c["title"])}">{body}</td>'
        )
    return Markup("".join(out))
