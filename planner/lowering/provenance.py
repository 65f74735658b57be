"""Provenance: which graph op, and in which role, each step of a build serves.

`label_owners` reads the lowering in program order and maps every lowered
step (by its label; an absorbed cast by `cast <label>`, the label its phase
carries) to `(op, family, role)`:

- an op's compute step serves the op (role compute);
- the moves lowered for an op's inputs (`to …`), its parameters (`param …`)
  and absorbed casts, emitted just before its compute step, serve that op
  (input, parameter, cast);
- the move of an op's result to its canonical layout (`canon …`, just after
  it) serves it (canonical);
- a Repeat's own steps, and anything unknown, are `(control)`.

`step_provenance` turns a schedule into the package's `provenance`: per step,
the `(op, family, role)` of each phase merged into it, in program order.  A
phase names the lowered step it expands and its part (Phase.source /
Phase.part, kept in Step.phases); a part has a role of its own (a K-split's
partials are compute, its partial sums and reduce are `partial sums` and
`reduction`, a move's pack and unpack are `pack`).  Nothing here or
downstream parses a label: the labels are keys, written once by the lowering.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.lowering.lowered import Lowered
from planner.lowering.lowered import Step as LoweredStep
from planner.lowering.schedule import Schedule

CONTROL = "(control)"
# the role of each part of a lowered step (planner.lowering.program.PARTS)
PART_ROLES = {"partials": "compute", "partial sums": "partial sums", "reduce": "reduction",
              "pack": "pack", "unpack": "pack"}


def label_owners(lowered: Lowered) -> dict[str, tuple[str, str, str]]:
    """Lowered step label (`cast <label>` for a cast) -> (op, family, role)."""
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
            pending.append((f"cast {st.label}", "cast"))
        elif st.kind == "redistribute" and move_role(lowered, st) == "canonical":
            if last is not None:
                out.setdefault(st.label, (last[0], last[1], "canonical"))
            else:  # a graph input stored canonically before any op
                pending.append((st.label, "input"))
        elif st.kind == "redistribute":
            pending.append((st.label, move_role(lowered, st)))
        else:  # loop_begin / loop_end: the Repeat itself
            out.setdefault(st.label, (CONTROL, "control", "loop"))
    for lab, role in pending:  # moves after the last compute op (the outputs)
        out.setdefault(lab, (last[0], last[1], role) if last else (CONTROL, "control", role))
    return out


def move_role(lowered: Lowered, st: LoweredStep) -> str:
    """What a lowered move is, from the roles of the values it moves:
    `canonical` (a result to its canonical or graph-output layout),
    `parameter` (from a parameter home) or `input` (into an op's layout)."""
    if lowered.values[st.outputs[0]].role in ("canonical", "output"):
        return "canonical"
    return "parameter" if lowered.values[st.inputs[0]].role == "parameter" else "input"


def owner(source: str, part: str, owners: Mapping[str, tuple[str, str, str]]
          ) -> tuple[str, str, str]:
    """(op, family, role) of the phase `part` of lowered step `source`."""
    op, family, role = owners.get(source, (CONTROL, "control", "other"))
    return op, family, PART_ROLES.get(part, role)


def step_provenance(schedule: Schedule, owners: Mapping[str, tuple[str, str, str]] | None
                    ) -> tuple[tuple[tuple[str, str, str], ...], ...]:
    """Per step of `schedule`, the (op, family, role) of its phases.  Without
    `owners` (a hand-built program) each label stands for itself."""
    out = []
    for st in schedule.steps:
        if owners is None:
            out.append(tuple((lab, "op", "other") for lab in st.labels or (CONTROL,)))
        else:
            out.append(tuple(owner(src, part, owners) for src, part in st.phases)
                       or ((CONTROL, "control", "other"),))
    return tuple(out)
