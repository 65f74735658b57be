"""The verifier's exchange-step path (simulator/verify_scan.py) against a slow,
obvious twin: random transfers inside a Repeat, with arithmetic patches on some
endpoints, checked iteration by iteration with a byte map."""

from __future__ import annotations

import re

import numpy as np
import pytest

from simulator import load_device, verify
from simulator.device import Device
from simulator.testing import PackageBuilder
from tilecommon.errors import PackageInvalid

TILES = 3
SPAN = 640  # bytes of tile memory the random endpoints fall into
CASES = 400
Xfer = tuple[int, int, int, int, int]


def _granule(nb: int) -> int:
    return 4 if nb % 4 == 0 else 2 if nb % 2 == 0 else 1


def _naive(xfers: list[Xfer], live: list[tuple[int, int, int]]) -> tuple[str, int, int]:
    """First fault of one exchange step: ("misaligned" | "source" | "destination",
    transfer, -1) in transfer order, else ("race", a, b) for some racing pair found
    with a byte map, else ("", -1, -1).  `live` = (tile, lo, hi) of live buffers."""
    for i, (st, sa, dt, da, nb) in enumerate(xfers):
        for side, (t, addr) in enumerate(((st, sa), (dt, da))):
            if addr % _granule(nb):
                return "misaligned", i, -1
            if not any(t == bt and lo <= addr and addr + nb <= hi for bt, lo, hi in live):
                return ("source", "destination")[side], i, -1
    users: dict[tuple[int, int], list[tuple[int, bool]]] = {}
    for i, (st, sa, dt, da, nb) in enumerate(xfers):
        for t, addr, w in ((st, sa, False), (dt, da, True)):
            for byte in range(addr, addr + nb):
                for j, wj in users.get((t, byte), []):
                    if j != i and (w or wj):
                        return "race", j, i
                users.setdefault((t, byte), []).append((i, w))
    return "", -1, -1


def _conflict(xfers: list[Xfer], i: int, j: int) -> bool:
    """Do transfers i and j (i != j) touch a common byte, one of them writing?"""
    def ends(k: int) -> list[tuple[int, int, int, bool]]:
        st, sa, dt, da, nb = xfers[k]
        return [(st, sa, sa + nb, False), (dt, da, da + nb, True)]
    return i != j and any(ta == tb and la < hb and lb < ha and (wa or wb)
                          for ta, la, ha, wa in ends(i) for tb, lb, hb, wb in ends(j))


def _case(dev: Device, rng: np.random.Generator) -> tuple[PackageBuilder, list[list[Xfer]],
                                                           list[tuple[int, int, int]], bool]:
    """A Repeat of `trips` around one EXCHANGE step (step 1), then two COMPUTE steps.
    Returns the builder, the transfers of each iteration, the buffers live in
    the loop and whether any endpoint is patched.  A dead buffer (live only
    after the loop) shares addresses with them."""
    base = dev.memory_base
    b = PackageBuilder(dev)
    live = []
    for t in range(TILES):
        cuts = sorted({0, SPAN, *(8 * int(c) for c in rng.integers(1, SPAN // 8, 2))})
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=False):
            if rng.random() < 0.95:
                b.buffer(f"t{t}_{lo}", t, base + lo, hi - lo, "exchange-landing", 0, 2)
                live.append((t, base + lo, base + hi))
        b.buffer(f"dead{t}", t, base, SPAN, "activation", 3, 4)
    trips = int(rng.integers(1, 4))
    n = int(rng.integers(1, 7))
    xfers: list[Xfer] = []
    for _ in range(n):
        nb = int(rng.choice([2, 3, 4, 8, 12, 16, 24]))
        st, dt = (int(v) for v in rng.integers(0, TILES, 2))
        # word addresses, now and then a half-word one (misaligned for word data)
        sa, da = (base + 4 * int(v) + 2 * int(rng.random() < 0.04)
                  for v in rng.integers(0, (SPAN - 24) // 4, 2))
        xfers.append((st, sa, dt, da, nb))
    if rng.random() < 0.3 and n > 1:  # multicast: several transfers of one source
        xfers[1] = (xfers[0][0], xfers[0][1], xfers[1][2], xfers[1][3], xfers[0][4])
    loop = b.repeat(trips)
    ids = b.exchange(*xfers)
    strides: dict[tuple[int, int], int] = {}
    for k in ids:
        for target in (1, 2):
            if rng.random() < 0.4:
                stride = 4 * int(rng.integers(-6, 7))
                strides[(k, target)] = stride
                b.patch(target, k, 0, loop, xfers[k][2 * target - 1], stride)
    b.end_repeat()
    b.compute()
    b.compute()
    per_it = []
    for i in range(trips):
        cur = []
        for k, (st, sa, dt, da, nb) in enumerate(xfers):
            sa += i * strides.get((k, 1), 0)
            da += i * strides.get((k, 2), 0)
            cur.append((st, sa, dt, da, nb))
        per_it.append(cur)
    return b, per_it, live, bool(strides)


def test_exchange_scan_agrees_with_a_byte_map() -> None:
    dev = load_device("tiny")
    rng = np.random.default_rng(2026)
    seen: dict[str, int] = {}
    for _ in range(CASES):
        b, per_it, live, patched = _case(dev, rng)
        want, it = ("", -1, -1), -1
        for i, xf in enumerate(per_it):
            want = _naive(xf, live)
            if want[0]:
                it = i
                break
        pkg = b.build()
        seen[want[0]] = seen.get(want[0], 0) + 1
        seen["later iteration"] = seen.get("later iteration", 0) + (it > 0)
        if not want[0]:
            verify(pkg)
            continue
        with pytest.raises(PackageInvalid) as info:
            verify(pkg)
        msg = str(info.value)
        assert msg.startswith("step 1 (EXCHANGE)"), msg
        if patched:
            assert f"iteration {it} of loop at step 0" in msg, (msg, it)
        if want[0] == "race":
            got = re.search(r"race: transfer (\d+) and transfer (\d+)", msg)
            assert got is not None, (msg, want)
            assert _conflict(per_it[it], int(got[1]), int(got[2])), (msg, per_it[it])
        elif want[0] == "misaligned":
            assert f"transfer {want[1]} endpoint misaligned" in msg, (msg, want)
        else:
            assert f"transfer {want[1]} {want[0]} (" in msg, (msg, want)
    assert all(seen.get(k, 0) >= 15 for k in ("", "race", "source", "destination",
                                             "misaligned", "later iteration")), seen


def test_a_source_read_by_many_transfers_races_with_a_writer_of_another() -> None:
    # three transfers multicast one source; a fourth writes over the middle of it
    dev = load_device("tiny")
    base = dev.memory_base
    b = PackageBuilder(dev)
    b.buffer("a", 0, base, 256, "activation")
    b.buffer("c", 1, base, 256, "exchange-landing")
    b.exchange((0, base, 1, base, 16), (0, base, 1, base + 16, 16), (0, base, 1, base + 32, 16),
               (1, base + 128, 0, base + 8, 4))
    with pytest.raises(PackageInvalid, match=r"step 0 \(EXCHANGE\), tile 0, address 0x4c008: "
                                             r"race: transfer 0 and transfer 3"):
        verify(b.build())


def test_tile_order_is_a_stable_sort_by_tile_then_key() -> None:
    from simulator.access import tile_order

    rng = np.random.default_rng(8)
    for case in range(200):
        n = int(rng.integers(0, 300))
        tiles = rng.integers(0, int(rng.integers(1, 6)), n).astype(np.int64)
        keys = rng.integers(0, int(rng.integers(1, 60)), n).astype(np.int64)
        if case % 3 == 1:  # mostly sorted: a few ascending runs, as planners emit
            cut = int(rng.integers(0, n + 1))
            keys = np.concatenate([np.sort(keys[:cut]), np.sort(keys[cut:])])
        if case % 3 == 2:
            keys = np.sort(keys)
        got = tile_order(tiles, keys, n)
        assert got.tolist() == np.lexsort((keys, tiles)).tolist(), case


def test_compute_race_only_in_a_later_iteration() -> None:
    # vertex 1's destination walks down by 256 bytes per iteration: in iteration 1
    # it lands on vertex 0's destination (unpatched, same tile); tile 1 is unrelated
    from kernels.abi import COPY

    dev = load_device("tiny")
    base = dev.memory_base
    b = PackageBuilder(dev)
    for tile in (0, 1):
        b.buffer(f"a{tile}", tile, base, 512, "activation")
        b.buffer(f"c{tile}", tile, base + 512, 512, "activation")
    cp = {1: 64, 3: 64, 4: 4, 5: 64}
    loop = b.repeat(2)
    _, v1, _ = b.compute((0, COPY, {**cp, 0: base, 2: base + 512}),
                         (0, COPY, {**cp, 0: base + 256, 2: base + 768}),
                         (1, COPY, {**cp, 0: base, 2: base + 512}))
    b.patch(0, v1, 2, loop, base + 768, -256)
    b.end_repeat()
    with pytest.raises(PackageInvalid, match=r"step 1 \(COMPUTE\), tile 0, .*iteration 1 of loop "
                                             r"at step 0: race: vertex [01] \(kernel 10\) and "
                                             r"vertex [01] "):
        verify(b.build())


def test_exchange_source_race_only_in_a_later_iteration() -> None:
    # transfer 1's source walks down 32 bytes per iteration onto the bytes transfer 0
    # writes on tile 1 (only sources are patched: the later-iteration path)
    dev = load_device("tiny")
    base = dev.memory_base
    b = PackageBuilder(dev)
    b.buffer("a", 0, base, 256, "activation")
    b.buffer("c", 1, base, 256, "exchange-landing")
    loop = b.repeat(3)
    b.exchange((0, base, 1, base, 16), (1, base + 64, 0, base + 128, 16),
               (0, base + 32, 1, base + 128, 16))
    b.patch(1, 1, 0, loop, base + 64, -32)
    b.end_repeat()
    with pytest.raises(PackageInvalid, match=r"step 1 \(EXCHANGE\), tile 1, address 0x4c000, "
                                             r"iteration 2 of loop at step 0: race: transfer 0 "
                                             r"and transfer 1"):
        verify(b.build())


def test_bisection_agrees_with_the_standard_library() -> None:
    import bisect

    from tilecommon.search import bisect_left, bisect_right

    rng = np.random.default_rng(3)
    for _ in range(200):
        values = np.sort(rng.integers(0, 20, rng.integers(0, 12))).astype(np.int64)
        start = int(rng.integers(0, values.size + 1))
        stop = int(rng.integers(start, values.size + 1))
        x = int(rng.integers(-2, 22))
        part = values.tolist()
        assert bisect_right(values, start, stop, x) == bisect.bisect_right(part, x, start, stop)
        assert bisect_left(values, start, stop, x) == bisect.bisect_left(part, x, start, stop)
