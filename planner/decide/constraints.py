"""Constraints: decisions of a plan pinned from a file, and saved plans.

A constraints file (TOML, docs/constraints.md) pins any decision of a `Plan`
(planner.decide.plan) and leaves the rest to the baseline policy and the
optimizer.  Every table is optional; op and tensor keys are qualified names
(`encoder/mm_fc1` inside the Repeat `encoder`) or globs (`encoder/mm_*`):

    [plan]                    # plan-wide choices
    packing = "rows"          # element | half | double | rows
    reduction_overlap = true
    row_moves = 57            # rows a narrow redistribution moves one by one
    tile_offset = 0           # logical tile t runs on (offset + t·stride) mod tiles
    tile_stride = 1
    exact = true              # a saved plan: these tables are the whole plan

    [recipes]                 # op or fused group -> recipe key
    "encoder/mm_fc1" = "mm:16x92x1"   # as `tileplan candidates` prints them
    [cast]                    # Cast op -> "before" (cast, then move narrow) | "after"
    "encoder/cast_*" = "before"
    [open]                    # tensor -> true (boundary removed) | false (kept)
    "encoder/fc1" = true
    [fused]                   # sibling-matmul group -> true | false
    "encoder/mm_q+mm_k+mm_v" = true
    [shift]                   # op -> logical tiles its placement moves on (0: none)
    "encoder/gelu" = 3
    [rotation]                # parameter-home rotation key -> logical start tile
    "encoder/mm_fc1" = 1320

`load_constraints(path)` reads and checks the file's form; `resolve(c, graph,
device)` checks it against a model — every glob matches an op (or tensor,
or group), every recipe is one the op's catalogue can build, casts name Cast
ops — and returns `Pins`.  `Pins.apply(plan)` is `plan` with every pinned
decision set (with `exact`, the pinned plan itself: nothing else is chosen),
and `Pins.violation(plan)` names the first pinned decision a plan changes
(the optimizer skips such proposals).  `plan_toml(plan)` writes a plan in this
grammar with `exact = true`: replayed with no optimizer steps it rebuilds the
identical package.  Every mistake is a ConfigError naming the file, the table
and key, and what the model offers.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.decide import catalogue as cat
from planner.decide.fusion import group_key, sibling_groups
from planner.decide.plan import CAST_ORDERS, PACKINGS, Plan
from planner.ir.graph import Graph, Repeat, op_sites
from simulator.device import Device
from tilecommon.config import read_document
from tilecommon.errors import ConfigError

TABLES = ("plan", "recipes", "cast", "open", "fused", "shift", "rotation")
PLAN_FIELDS: dict[str, type] = {"packing": str, "reduction_overlap": bool, "row_moves": int,
                                "tile_offset": int, "tile_stride": int, "exact": bool}
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Constraints:
    """A constraints file as written (patterns not yet matched to a model)."""

    source: str
    plan: tuple[tuple[str, Any], ...] = ()
    recipes: tuple[tuple[str, str], ...] = ()
    cast: tuple[tuple[str, str], ...] = ()
    open: tuple[tuple[str, bool], ...] = ()
    fused: tuple[tuple[str, bool], ...] = ()
    shift: tuple[tuple[str, int], ...] = ()
    rotation: tuple[tuple[str, int], ...] = ()

    @property
    def exact(self) -> bool:
        return bool(dict(self.plan).get("exact", False))


def _where(source: str, table: str, key: str) -> tuple[str, str]:
    return source, f"{table}.{key}" if key else table


def parse_constraints(data: Any, source: str) -> Constraints:
    """Constraints from a parsed TOML table (module docstring); ConfigError
    naming `source` and the table.key otherwise."""
    if not isinstance(data, dict):
        raise ConfigError(source, "constraints", "must be a table", type(data).__name__)
    for table in data:
        if table not in TABLES:
            raise ConfigError(source, table, f"unknown table; known: {', '.join(TABLES)}")
        if not isinstance(data[table], dict):
            raise ConfigError(source, table, "must be a table", data[table])
    plan = data.get("plan", {})
    for key, value in plan.items():
        want = PLAN_FIELDS.get(key)
        if want is None:
            raise ConfigError(source, f"plan.{key}", f"unknown field; known: "
                              f"{', '.join(PLAN_FIELDS)}")
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ConfigError(source, f"plan.{key}", f"must be {want.__name__}", value)
    if plan.get("packing", "element") not in PACKINGS:
        raise ConfigError(source, "plan.packing", f"must be one of {', '.join(PACKINGS)}",
                          plan["packing"])
    for key in ("row_moves", "tile_offset"):
        if plan.get(key, 0) < 0:
            raise ConfigError(source, f"plan.{key}", "must be >= 0", plan[key])
    if plan.get("tile_stride", 1) < 1:
        raise ConfigError(source, "plan.tile_stride", "must be >= 1", plan["tile_stride"])

    def items(table: str, check: Any, what: str) -> tuple[tuple[str, Any], ...]:
        out = []
        for key, value in data.get(table, {}).items():
            if not key:
                raise ConfigError(source, table, "an empty key names nothing")
            if not check(value):
                raise ConfigError(source, f"{table}.{key}", f"must be {what}", value)
            out.append((key, value))
        return tuple(sorted(out))

    return Constraints(
        source, tuple(sorted(plan.items())),
        items("recipes", lambda v: isinstance(v, str) and v,
              "a recipe key such as 'mm:8x15x12' (tileplan candidates lists them)"),
        items("cast", lambda v: v in CAST_ORDERS, f"one of {', '.join(CAST_ORDERS)}"),
        items("open", lambda v: isinstance(v, bool), "true or false"),
        items("fused", lambda v: isinstance(v, bool), "true or false"),
        items("shift", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "an integer >= 0 (logical tiles)"),
        items("rotation", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "an integer >= 0 (a logical tile)"))


def load_constraints(path: str | Path) -> Constraints:
    """The constraints file at `path` (ConfigError naming it when it is
    missing, not TOML or malformed)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(str(path), "constraints", "file not found")
    return parse_constraints(read_document(p, "constraints", "toml", MAX_BYTES), str(path))


# ------------------------------------------------------------------ resolution


@dataclass(frozen=True)
class Names:
    """What a model's plan can name: qualified op names (with their kind),
    tensors with a canonical boundary, fused groups, rotation keys."""

    ops: dict[str, str]  # qualified op name -> kind
    tensors: tuple[str, ...]
    groups: tuple[str, ...]


def model_names(graph: Graph) -> Names:
    """Every name a constraint may match in `graph`."""
    sites = op_sites(graph)
    ops = {s.name: s.op.kind for s in sites}
    tensors = sorted({s.scope + t for s in sites for t in s.op.outputs})
    groups = []
    scopes: dict[str, Graph] = {"": graph}
    for op in graph.ops:
        if isinstance(op, Repeat):
            scopes[f"{op.name}/"] = op.body
    for scope, g in scopes.items():
        groups += [group_key(scope, ops_) for ops_ in sibling_groups(g)]
    return Names(ops, tuple(tensors), tuple(sorted(groups)))


@dataclass(frozen=True)
class Pins:
    """Constraints matched to one model: exact names, checked values."""

    source: str
    exact: bool
    plan_fields: tuple[tuple[str, Any], ...] = ()
    recipes: tuple[tuple[str, str], ...] = ()
    cast: tuple[tuple[str, str], ...] = ()
    open: tuple[tuple[str, bool], ...] = ()
    fused: tuple[tuple[str, bool], ...] = ()
    shift: tuple[tuple[str, int], ...] = ()
    rotation: tuple[tuple[str, int], ...] = ()
    matched: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)

    def apply(self, plan: Plan) -> Plan:
        """`plan` with every pinned decision set; with `exact`, the pinned
        plan alone (the policy's choices are not used)."""
        if self.exact:
            plan = Plan()
        fields_ = {k: v for k, v in self.plan_fields if k != "exact"}
        if fields_:
            plan = replace(plan, **fields_)
        if self.recipes:
            plan = plan.with_recipes(dict(self.recipes))
        if self.cast:
            plan = plan.with_cast_orders(dict(self.cast))
        for tensor, is_open in self.open:
            plan = plan.with_open(tensor, is_open)
        for group, fused in self.fused:
            plan = plan.with_fused(group, fused)
        for op, n in self.shift:
            plan = plan.with_tile_shift(op, n)
        if self.rotation:
            plan = plan.with_rotation(dict(self.rotation))
        return plan

    def violation(self, plan: Plan) -> str | None:
        """The first pinned decision `plan` does not hold, as a phrase, or None."""
        for k, v in self.plan_fields:
            if k != "exact" and getattr(plan, k) != v:
                return f"{k} is pinned to {v!r}"
        for op, key in self.recipes:
            if plan.recipe(op) != key:
                return f"{op}'s recipe is pinned to {key}"
        for op, order in self.cast:
            if ("before" if plan.cast_before(op) else "after") != order:
                return f"{op}'s cast order is pinned to {order}"
        for t, is_open in self.open:
            if plan.is_open(t) != is_open:
                return f"boundary {t} is pinned {'open' if is_open else 'kept'}"
        for gk, fused in self.fused:
            if plan.is_fused(gk) != fused:
                return f"group {gk} is pinned {'fused' if fused else 'unfused'}"
        for op, n in self.shift:
            if plan.shift(op) != n:
                return f"{op}'s tile shift is pinned to {n}"
        for key, base in self.rotation:
            if plan.rotation_base(key) != base:
                return f"rotation {key} is pinned at {base}"
        if self.exact and self.apply(plan) != plan:
            return "the plan is pinned whole (exact)"
        return None


def _match(c: Constraints, table: str, pattern: str, names: tuple[str, ...] | list[str],
           what: str) -> list[str]:
    if any(ch in pattern for ch in "*?["):
        hit = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    else:
        hit = [pattern] if pattern in names else []
    if not hit:
        near = [n for n in names if n.rsplit("/", 1)[-1] == pattern.rsplit("/", 1)[-1]][:3]
        hint = f"; did you mean {', '.join(near)}?" if near else \
            f"; {what}s are named like {', '.join(list(names)[:4])}, ..."
        raise ConfigError(c.source, f"{table}.{pattern}", f"matches no {what} of the model"
                          + hint)
    return hit


def resolve(c: Constraints, graph: Graph, device: Device,
            cache: cat.CatalogueCache | None = None) -> Pins:
    """`c` matched to `graph` on `device` (module docstring): ConfigError
    naming the file and table.key for a pattern that matches nothing, a
    recipe the op's catalogue cannot build, a cast pin on an op that is not a
    Cast, a fused pin on something that is not a sibling group."""
    from planner.decide.fusion import fused_recipe

    names = model_names(graph)
    cache = cache if cache is not None else cat.CatalogueCache()
    sites = {s.name: s for s in op_sites(graph)}
    groups = {}
    for s in sites.values():
        for ops_ in sibling_groups(s.graph):
            groups[group_key(s.scope, ops_)] = (s.graph, ops_)
    matched: dict[str, tuple[str, ...]] = {}
    packing = dict(c.plan).get("packing", "element")

    recipes: dict[str, str] = {}
    for pattern, key in c.recipes:
        hit = _match(c, "recipes", pattern, [*names.ops, *names.groups], "op or fused group")
        matched[f"recipes.{pattern}"] = tuple(hit)
        for name in hit:
            try:
                if name in groups:
                    g, ops_ = groups[name]
                    fused_recipe(g, ops_, device, cache, key, packing)
                else:
                    s = sites[name]
                    cat.recipe_from_key(s.graph, s.op, device, key, packing, cache)
            except (KeyError, ValueError):
                offered = _offered(name, sites, groups, device, cache, packing)
                raise ConfigError(c.source, f"recipes.{pattern}",
                                  f"{name} has no recipe {key!r}; its catalogue offers "
                                  f"{', '.join(offered)} (tileplan candidates)") from None
            recipes[name] = key
    cast: dict[str, str] = {}
    for pattern, order in c.cast:
        hit = _match(c, "cast", pattern, list(names.ops), "op")
        bad = [n for n in hit if names.ops[n] != "Cast"]
        if bad:
            raise ConfigError(c.source, f"cast.{pattern}", f"{bad[0]} is a {names.ops[bad[0]]}, "
                              "not a Cast")
        matched[f"cast.{pattern}"] = tuple(hit)
        cast.update(dict.fromkeys(hit, order))
    opened: dict[str, bool] = {}
    for pattern, flag in c.open:
        hit = _match(c, "open", pattern, names.tensors, "tensor")
        matched[f"open.{pattern}"] = tuple(hit)
        opened.update(dict.fromkeys(hit, flag))
    fused: dict[str, bool] = {}
    for pattern, flag in c.fused:
        hit = _match(c, "fused", pattern, names.groups, "sibling-matmul group")
        matched[f"fused.{pattern}"] = tuple(hit)
        fused.update(dict.fromkeys(hit, flag))
    shift: dict[str, int] = {}
    for pattern, n in c.shift:
        hit = _match(c, "shift", pattern, list(names.ops), "op")
        matched[f"shift.{pattern}"] = tuple(hit)
        shift.update(dict.fromkeys(hit, n))
    rotation = dict(c.rotation)
    return Pins(c.source, c.exact, c.plan, tuple(sorted(recipes.items())),
                tuple(sorted(cast.items())), tuple(sorted(opened.items())),
                tuple(sorted(fused.items())), tuple(sorted(shift.items())),
                tuple(sorted(rotation.items())), matched)


def _offered(name: str, sites: dict, groups: dict, device: Device,
             cache: cat.CatalogueCache, packing: str) -> list[str]:
    from planner.decide.fusion import FUSED_LIMIT, fused_graph

    if name in groups:
        g, ops_ = groups[name]
        fg, fop = fused_graph(g, ops_)
        short = cat.catalogue(fg, fop, device, FUSED_LIMIT, packing, cache)
    else:
        s = sites[name]
        short = cat.catalogue(s.graph, s.op, device, cat.DEFAULT_LIMIT, packing, cache)
    return [r.key for r in short]


# ------------------------------------------------------------------ saving


def _toml_key(k: str) -> str:
    return json.dumps(k)


def plan_toml(plan: Plan, header: tuple[str, ...] = ()) -> str:
    """`plan` in the constraints grammar with `exact = true` (module
    docstring): every decision, so that replaying it chooses nothing."""
    lines = [f"# {h}" for h in header]
    lines += ["[plan]", "exact = true", f"packing = {json.dumps(plan.packing)}",
              f"reduction_overlap = {'true' if plan.reduction_overlap else 'false'}",
              f"row_moves = {plan.row_moves}", f"tile_offset = {plan.tile_offset}",
              f"tile_stride = {plan.tile_stride}", ""]

    def table(name: str, items: Any, fmt: Any) -> None:
        lines.append(f"[{name}]")
        lines.extend(f"{_toml_key(k)} = {fmt(v)}" for k, v in items)
        lines.append("")

    table("recipes", plan.recipes, json.dumps)
    table("cast", plan.cast_order, json.dumps)
    table("open", ((t, True) for t in plan.open_boundaries), lambda v: "true")
    table("fused", ((g, True) for g in plan.fused), lambda v: "true")
    table("shift", plan.tile_shift, str)
    table("rotation", plan.rotation, str)
    return "\n".join(lines)


# ------------------------------------------------------------------ candidates


@dataclass(frozen=True)
class Candidate:
    """One recipe the catalogue offers an op (or a fused group), with its
    estimate; `chosen` when the plan it was listed against picks it."""

    op: str
    kind: str
    recipe: str
    cycles: int
    compute_cycles: int
    exchange_cycles: int
    mem_bytes: int
    home_bytes: int
    chosen: bool

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "kind": self.kind, "recipe": self.recipe,
                "estimate_cycles": self.cycles, "compute_cycles": self.compute_cycles,
                "exchange_cycles": self.exchange_cycles, "bytes_per_tile": self.mem_bytes,
                "home_bytes_per_tile": self.home_bytes, "chosen": self.chosen}


def candidates(graph: Graph, device: Device, plan: Plan, pattern: str = "*",
               limit: int = cat.DEFAULT_LIMIT, cache: cat.CatalogueCache | None = None
               ) -> list[Candidate]:
    """The catalogue's shortlist of every op (and sibling group) whose
    qualified name matches `pattern`, estimated under `plan`'s packing, each
    marked when `plan` picks it (ConfigError when the pattern matches
    nothing).  A chosen recipe outside the shortlist is listed too."""
    from planner.decide.fusion import FUSED_LIMIT, fused_graph

    cache = cache if cache is not None else cat.CatalogueCache()
    names = model_names(graph)
    where = Constraints("--op")
    hit = _match(where, "op", pattern, [*names.ops, *names.groups], "op or fused group")
    sites = {s.name: s for s in op_sites(graph)}
    groups = {}
    for s in sites.values():
        for ops_ in sibling_groups(s.graph):
            groups[group_key(s.scope, ops_)] = (s.graph, ops_)
    out: list[Candidate] = []
    get: Callable[..., cat.Recipe]
    for name in hit:
        if name in groups:
            g, ops_ = groups[name]
            fg, fop = fused_graph(g, ops_)
            short = list(cat.catalogue(fg, fop, device, max(limit, FUSED_LIMIT), plan.packing,
                                       cache))[:limit]
            kind, get = "fused MatMul", (lambda k, fg=fg, fop=fop: cat.recipe_from_key(
                fg, fop, device, k, plan.packing, cache))
        else:
            s = sites[name]
            short = list(cat.catalogue(s.graph, s.op, device, limit, plan.packing, cache))
            kind, get = s.op.kind, (lambda k, s=s: cat.recipe_from_key(
                s.graph, s.op, device, k, plan.packing, cache))
        chosen = plan.recipe(name)
        if chosen is not None and all(r.key != chosen for r in short):
            try:
                short.append(get(chosen))
            except KeyError:
                pass
        out += [Candidate(name, kind, r.key, r.cycles, r.compute_cycles, r.exchange_cycles,
                          r.mem_bytes, r.home_bytes, r.key == chosen) for r in short]
    return out
