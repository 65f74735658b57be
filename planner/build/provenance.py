"""Provenance: which graph op, and in which role, each step of a build serves.

`label_owners` reads the lowering in program order and maps every step label
(expansion suffixes removed) to `(op, family, role)`:

- an op's compute step serves the op (role compute; a K-split's `… partials`
  too), the exchange of its partial sums (`… partial sums`) and their
  reduction (`… reduce`) serve it in those roles; a move's `… pack` /
  `… unpack` phases serve the move's op (pack);
- the moves lowered for an op's inputs (`to …`), its parameters (`param …`)
  and absorbed casts, emitted just before its compute step, serve that op
  (input, parameter, cast);
- the move of an op's result to its canonical layout (`canon …`, just after
  it) serves it (canonical);
- a Repeat's own steps, and anything unlabelled, are `(control)`.

`step_provenance` turns a schedule into the package's `provenance`: per step,
the `(op, family, role)` of each phase merged into it, in program order.
This is the one place labels are read; everything downstream (the summary's
per-op breakdown, the trace) reads the package.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.build.lowered import Lowered
from planner.build.schedule import Schedule

CONTROL = "(control)"
_ROLE_SUFFIXES = ((" partial sums", "partial sums"), (" partials", "compute"),
                  (" reduce", "reduction"), (" unpack", "pack"), (" pack", "pack"))


def label_owners(lowered: Lowered) -> dict[str, tuple[str, str, str]]:
    """Step label (without expansion suffixes) -> (op, family, role)."""
    out: dict[str, tuple[str, str, str]] = {}
    pending: list[tuple[str, str]] = []  # (label, role) waiting for the next compute op
    last: tuple[str, str] | None = None
    for st in lowered.steps:
        if st.kind == "compute":
            family = type(st.op).__name__ if st.op is not None else "op"
            out.setdefault(st.label, (st.label, family, "compute"))
            for lab, role in pending:
                out.setdefault(lab, (st.label, family, role))
            pending, last = [], (st.label, family)
        elif st.kind == "cast":
            pending.append((st.label, "cast"))
        elif st.kind == "redistribute" and st.label.startswith("canon ") and last is not None:
            out.setdefault(st.label, (last[0], last[1], "canonical"))
        elif st.kind == "redistribute":
            pending.append((st.label, "parameter" if st.label.startswith("param ")
                            else "input"))
        else:  # loop_begin / loop_end: the Repeat itself
            out.setdefault(st.label, (CONTROL, "control", "loop"))
    for lab, role in pending:  # moves after the last compute op (the outputs)
        out.setdefault(lab, (last[0], last[1], role) if last else (CONTROL, "control", role))
    return out


def owner(label: str, owners: Mapping[str, tuple[str, str, str]]) -> tuple[str, str, str]:
    for suffix, role in _ROLE_SUFFIXES:
        if label.endswith(suffix) and label[: -len(suffix)] in owners:
            op, family, _ = owners[label[: -len(suffix)]]
            return op, family, role
    for key in (label, label.removeprefix("cast ")):
        if key in owners:
            return owners[key]
    return CONTROL, "control", "other"



def step_provenance(schedule: Schedule, owners: Mapping[str, tuple[str, str, str]] | None
                    ) -> tuple[tuple[tuple[str, str, str], ...], ...]:
    """Per step of `schedule`, the (op, family, role) of its phases.  Without
    `owners` (a hand-built program) each label stands for itself."""
    out = []
    for st in schedule.steps:
        labels = st.labels or (CONTROL,)
        if owners is None:
            out.append(tuple((lab, "op", "other") for lab in labels))
        else:
            out.append(tuple(owner(lab, owners) if lab != CONTROL else
                             (CONTROL, "control", "other") for lab in labels))
    return tuple(out)
