"""Replaying one plan change on another plan: what the parallel optimizer's
speculation uses to guess the proposals of the next round."""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.decide.plan import Plan


def _merged(base: tuple, changed: tuple, onto: tuple) -> tuple:
    """Sorted (key, value) items of `onto` updated with the items in which
    `changed` differs from `base`, without the keys `changed` dropped."""
    b = dict(base)
    c = dict(changed)
    out = dict(onto)
    out.update({k: v for k, v in changed if b.get(k) != v})
    for k in b.keys() - c.keys():  # a key `changed` removed
        out.pop(k, None)
    return tuple(sorted(out.items()))


# Plan fields that map keys to decisions (the rest are scalars or open_boundaries)
PER_KEY_FIELDS = ("recipes", "cast_order", "rotation", "tile_shift")


def apply_change(base: Plan, changed: Plan, onto: Plan) -> Plan:
    """`onto` with the decisions in which `changed` differs from `base` (a
    proposal's change replayed on another plan, e.g. on a proposal that may
    be accepted first).  Scalar decisions take `changed`'s value when it
    differs from `base`; per-key decisions and open boundaries merge."""
    opened = (set(onto.open_boundaries) | (set(changed.open_boundaries)
                                           - set(base.open_boundaries)))
    opened -= set(base.open_boundaries) - set(changed.open_boundaries)

    def pick(name: str) -> Any:
        new = getattr(changed, name)
        return new if new != getattr(base, name) else getattr(onto, name)

    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Plan):
        if f.name == "open_boundaries":
            fields[f.name] = tuple(sorted(opened))
        elif f.name in PER_KEY_FIELDS:
            fields[f.name] = _merged(getattr(base, f.name), getattr(changed, f.name),
                                     getattr(onto, f.name))
        else:
            fields[f.name] = pick(f.name)
    return Plan(**fields)
