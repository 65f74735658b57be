"""Plain-text and markdown tables: the one formatter the CLI and the
experiments print with."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """Fixed-width table: first column left-aligned, the rest right-aligned."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:],
                                                                      strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def markdown(header: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table."""
    out = ["| " + " | ".join(str(h) for h in header) + " |",
           "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
