"""Catalogue: recipes, estimates from the kernel cycle models, shortlist, cache."""

from __future__ import annotations

import math

import planner
import simulator
from planner.decide import catalogue as cat
from planner.decide.catalogue import Recipe, shortlist


def _recipe(key: str, cycles: int, mem: int, xbytes: int) -> Recipe:
    return Recipe(cycles=cycles, mem_bytes=mem, key=key, family="rows", grid=(1,),
                  compute_cycles=cycles, exchange_cycles=0, syncs=0, in_bytes=0,
                  xbytes=xbytes, tiles=1)


def test_shortlist_keeps_smallest_buffer_and_exchange_extreme() -> None:
    rs = [_recipe("fast", 10, 900, 500), _recipe("mid", 20, 800, 400),
          _recipe("small", 90, 100, 300), _recipe("lowx", 80, 700, 5)]
    out = shortlist(rs, 1)
    assert [r.key for r in out] == ["fast", "lowx", "small"]  # sorted by estimate
    assert [r.key for r in shortlist(rs, 10)] == ["fast", "mid", "lowx", "small"]


def test_real_shortlist_keeps_extremes() -> None:
    dev = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    body = g.op("encoder").body  # type: ignore[attr-defined]
    op = body.op("mm_fc1")
    every = cat._generate(body, op, dev, "element")
    out = cat.catalogue(body, op, dev, 2)
    assert 2 <= len(out) <= 4
    assert list(out) == sorted(out)
    keys = {r.key for r in out}
    assert min(every, key=lambda r: (r.mem_bytes, r.cycles, r.key)).key in keys
    assert min(every, key=lambda r: (r.xbytes, r.mem_bytes, r.cycles, r.key)).key in keys
    assert out[0].cycles == min(r.cycles for r in every)


def test_matmul_estimate_is_compute_plus_exchange() -> None:
    dev = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    body = g.op("encoder").body  # type: ignore[attr-defined]
    r = cat.recipe_from_key(body, body.op("mm_q"), dev, "mm:4x8x1")
    assert r.grid == (4, 8, 1) and r.tiles == 32
    mb, kb, nb = math.ceil(197 / 4), 192, math.ceil(192 / 8)
    # the fp16 a block arrives wide and one CAST narrows it on the tile (cast after)
    cast = cat.call_cycles("CAST", dev, M=mb, N=kb, dtype_x="fp16", dtype_y="fp8")
    mm = cat.matmul_cycles(mb, kb, nb, "fp8", "fp16", dev, bias=True)
    assert r.compute_cycles == mm + cast
    assert r.cycles == r.compute_cycles + r.exchange_cycles
    # cast before: the fp8 block arrives as is, half the bytes, no CAST, no wide copy
    n = cat.recipe_from_key(body, body.op("mm_q"), dev, "mm:4x8x1", narrow=True)
    assert n.key == r.key and n.compute_cycles == mm
    assert n.mem_bytes == r.mem_bytes - mb * kb * 2 and n.exchange_cycles < r.exchange_cycles
    # phases: a in (+bias), weight all-gather, out to canonical
    assert r.syncs == 3
    assert r.in_bytes >= mb * kb and r.out_bytes == mb * nb * 2  # fp8 a in, fp16 result out
    assert r.exchange_cycles >= 3 * dev.exchange_fixed_cycles + (mb * kb) // 4
    # a larger block costs more cycles (monotone cycle model)
    assert cat.matmul_cycles(2 * mb, kb, nb, "fp8", "fp16", dev) > mm


def test_every_vit_op_has_recipes() -> None:
    dev = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    body = g.op("encoder").body  # type: ignore[attr-defined]
    for graph in (g, body):
        for op in graph.ops:
            if op.kind == "Repeat":
                continue
            rs = cat.catalogue(graph, op, dev)
            assert rs and all(r.cycles > 0 and r.mem_bytes > 0 for r in rs), op.name
            assert all(r.mem_bytes <= dev.memory_size for r in rs)


def test_cache_hits_on_unchanged_signature() -> None:
    dev = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    body = g.op("encoder").body  # type: ignore[attr-defined]
    cache = cat.CatalogueCache()
    cat.catalogue(body, body.op("mm_q"), dev, 3, cache=cache)
    assert (cache.hits, cache.misses) == (0, 1)
    a = cat.catalogue(body, body.op("mm_k"), dev, 3, cache=cache)  # same shapes: a hit
    assert (cache.hits, cache.misses) == (1, 1)
    b = cat.catalogue(body, body.op("mm_q"), dev, 3, cache=cache)
    assert a is b
    cat.catalogue(body, body.op("mm_q"), dev, 4, cache=cache)  # another limit: a miss
    assert (cache.hits, cache.misses) == (2, 2)
    # no cache given: nothing is remembered between calls
    assert cat.catalogue(body, body.op("mm_q"), dev, 3) is not a


def test_elementwise_grid_recipes_split_columns() -> None:
    dev = simulator.load_device("c600")
    g = planner.load_model("siglip-so400m", layers=1)
    body = g.op("encoder").body  # type: ignore[attr-defined]
    every = cat._generate(body, body.op("gelu"), dev, "element")
    grids = [r for r in every if len(r.grid) == 2]
    assert grids and all(r.grid[0] <= dev.workers * 2 and r.tiles <= dev.tiles for r in grids)
    best = min(every)
    assert len(best.grid) == 2  # 729 rows < tiles: column blocks keep all workers busy
    assert cat.recipe_from_key(body, body.op("gelu"), dev, best.key) == best
    # row kernels that need whole rows never split columns
    assert all(len(r.grid) == 1 for r in cat._generate(body, body.op("ln2"), dev, "element"))


def test_canonical_owner_bounds_the_moves_and_follows_packing() -> None:
    """A move from (to) canonical costs at least the canonical owner's whole
    block sent (received): 42 rows × 192 × 2 B on vit-tiny under the element
    packing, one row under "rows"; a row op on its canonical owners moves
    nothing but its LayerNorm parameters."""
    dev = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    body = g.op("encoder").body  # type: ignore[attr-defined]
    elem = cat.recipe_from_key(body, body.op("mm_q"), dev, "mm:4x8x1")
    rows = cat.recipe_from_key(body, body.op("mm_q"), dev, "mm:4x8x1", "rows")
    assert cat.canonical_bytes(197, 192, 2, dev) == 42 * 192 * 2
    assert cat.canonical_bytes(197, 192, 2, dev, "rows") == 192 * 2
    assert elem.compute_cycles == rows.compute_cycles
    # a in (fp16 block before the cast), weight all-gather, out to canonical
    a_wide = math.ceil(197 / 4) * 192 * 2
    assert elem.exchange_cycles == (cat.exchange_cycles(max(42 * 384, a_wide + 24 * 2), dev)
                                    + cat.exchange_cycles(192 * 24, dev)
                                    + cat.exchange_cycles(42 * 384, dev))
    assert rows.exchange_cycles < elem.exchange_cycles
    ln_elem = cat.recipe_from_key(body, body.op("ln2"), dev, "rows:42")
    ln_rows = cat.recipe_from_key(body, body.op("ln2"), dev, "rows:1", "rows")
    assert ln_elem.syncs == ln_rows.syncs == 1  # gamma/beta only
    assert cat.recipe_from_key(body, body.op("ln2"), dev, "rows:1").syncs == 3
