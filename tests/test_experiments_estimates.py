"""experiments/estimate_accuracy.py: the small variant runs, writes its table
and plot, and its per-op rows account for the simulated cycles."""

from __future__ import annotations

from pathlib import Path

import simulator
from experiments import estimate_accuracy as mod


def test_estimate_accuracy_small(tmp_path: Path) -> None:
    text = mod.main(["--small", "--out-dir", str(tmp_path)])
    assert (tmp_path / "estimate_accuracy.txt").read_text().strip() == text.strip()
    assert (tmp_path / "estimate_accuracy.png").stat().st_size > 1000
    assert "vit-tiny, 1 layer(s)" in text and "all cases" in text
    assert "proposals evaluated on vit-tiny" in text and "Kendall tau-b" in text


def test_kendall_tau_of_proposals() -> None:
    row = mod.ProposalRow
    same = [row("k", str(i), e, s, True) for i, (e, s) in enumerate([(9, 90), (5, 50), (1, 10)])]
    assert mod.kendall_tau(same) == 1.0
    flipped = [row("k", str(i), e, s, True) for i, (e, s) in enumerate([(9, 10), (5, 50),
                                                                        (1, 90)])]
    assert mod.kendall_tau(flipped) == -1.0
    # a proposal that did not build has no simulated gain and is left out
    assert mod.kendall_tau(same + [row("k", "x", 100, None, False)]) == 1.0


def test_rows_account_for_the_simulated_cycles() -> None:
    rows, total, attributed = mod.case_rows("vit-tiny", 1, simulator.load_device("c600"))
    # every compute op once: 21 ops and the 5 casts the default policy runs early
    assert len({r.op for r in rows}) == len(rows) == 26
    assert sum(r.kind == "Cast" for r in rows) == 5
    assert all(r.estimate > 0 and r.measured > 0 for r in rows)
    # every step belongs to some op: only the per-label integer split is lost
    assert 0.97 * total <= attributed <= total
    summary = {s[0]: s for s in mod.kind_summary(rows)}
    assert set(summary) == {r.kind for r in rows}
    mm = [r for r in rows if r.kind == "MatMul"]
    assert summary["MatMul"][1] == str(len(mm))
    ratio = sum(r.measured for r in mm) / sum(r.estimate for r in mm)
    assert summary["MatMul"][4] == f"{ratio:.2f}"
    # the canonical-owner bound keeps the matmul estimates within 2x of measured
    assert 0.5 <= ratio <= 2.0
    # LayerNorm's own steps are its kernel model exactly (gamma and beta in
    # separate elements on both sides: no conflict penalty in the estimate)
    assert summary["LayerNorm"][5] == "1.00"
