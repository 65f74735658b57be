"""Plain-text and markdown tables: the one formatter the CLI and the
experiments print with."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[object], rows: Sequence[Sequence[object]],
          left: Sequence[int] = (0,)) -> str:
    """Fixed-width table: the columns in `left` (indices, negative from the
    end) left-aligned, the rest right-aligned."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    n = len(header)
    widths = [max(len(r[i]) for r in cells) for i in range(n)]
    lefts = {i % n for i in left}
    lines = []
    for r in cells:
        parts = [c.ljust(w) if i in lefts else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def markdown(header: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table."""
    out = ["| " + " | ".join(str(h) for h in header) + " |",
           "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
