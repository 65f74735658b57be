"""The `open` proposal kind: open one canonical boundary. Opening saves one hop
only when the value moves twice (producer → canonical → consumer layout): gain =
the smaller of the measured canonical redistribution (`canon <tensor>`) and the
consumer's conversion from canonical (`to <tensor>@…`); 0 when the consumer
reads the canonical layout as is.  A move op consumer (SplitHeads, MergeHeads)
is its own redistribution, which then starts from the producer's cells: gain =
the canonical redistribution.
"""

from __future__ import annotations

from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS


@PROPOSALS.register("open")
def open(around: Around) -> list[Proposal]:
    """Remove one canonical boundary: the producer's output moves straight to its consumer."""
    out = []
    for _prod, cons, q in around.boundaries():
        gain = around.measured_moves("canonical", q)
        if cons.op.FAMILY != "move":
            gain = min(gain, around.measured_moves("input", q))
        out.append(Proposal("open", f"open boundary {q} (into {cons.name})", gain,
                            around.plan.with_open(q)))
    return out
