"""The rounding contract (docs/contracts.md §6): every vector kernel's output is
bit-identical to its op kind's reference formula (`op.compute`, what
planner.reference evaluates), rounded to the output dtype by
reference.quantize — on random fp16 data with odd sizes, rows as long as
siglip's MLP (4304), and extreme values (fp16 maximum, subnormals,
constant rows, mixed magnitudes).  Also: the row statistics do not depend on
the summation order (permuting a row's columns permutes the output bits), and
a planned, simulated chain of vector ops equals the reference bit for bit
(no matmul, so the accumulation order is the same)."""

from __future__ import annotations

import numpy as np
import pytest

import planner
import simulator
from kernels import dispatch
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32, fp8_decode, fp16_decode, fp16_encode
from kernels.registry import by_name
from kernels.testing import TileImage
from planner.ir.graph import Graph, Op, Tensor, make_graph
from planner.ir.ops.add import Add
from planner.ir.ops.cast import Cast
from planner.ir.ops.gelu import Gelu
from planner.ir.ops.layernorm import LayerNorm
from planner.ir.ops.softmax import Softmax
from planner.ir.reference import quantize
from planner.lowering.stages import build
from planner.search.policies import baseline_plan


def layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    return LayerNorm("ln", "x", "g", "b", "y", eps).compute(None, {"x": x, "g": gamma, "b": beta})


def softmax(x: np.ndarray, scale: float) -> np.ndarray:
    return Softmax("sm", "x", "y", scale).compute(None, {"x": x})


def gelu(x: np.ndarray) -> np.ndarray:
    return Gelu("ge", "x", "y").compute(None, {"x": x})


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return Add("add", "a", "b", "c").compute(None, {"a": a, "b": b})


SEED = 41
SHAPES = [(1, 1), (3, 17), (5, 257), (2, 1152), (7, 729), (3, 4304)]
KINDS = ["normal", "offset", "huge", "tiny", "constant", "mixed"]
DT_NAME = {DT_FP8: "fp8", DT_FP16: "fp16", DT_FP32: "fp32"}
CODE_TYPE = {DT_FP8: np.uint8, DT_FP16: np.uint16, DT_FP32: np.float32}
ELEM_BYTES = {DT_FP8: 1, DT_FP16: 2, DT_FP32: 4}
FP16_MAX = 65504.0
OUTPUTS = ["ln", "ge", "sm", "sum", "out"]


def _fp16_data(rng: np.random.Generator, shape: tuple[int, int], kind: str) -> np.ndarray:
    """fp16-representable float32 values of one of KINDS."""
    z = rng.standard_normal(shape)
    if kind == "offset":
        x = 1.5 + 3.0 * z
    elif kind == "huge":
        x = np.clip(8000.0 * z, -FP16_MAX, FP16_MAX)
    elif kind == "tiny":
        x = 3e-6 * z  # fp16 subnormals (below 6.1e-5) and zeros
    elif kind == "constant":
        x = np.full(shape, 0.3)
    else:  # mixed: normal values with a few at the fp16 extremes
        x = z.copy()
        picks = rng.random(shape)
        x[picks < 0.02] = FP16_MAX * np.sign(z[picks < 0.02])
        x[(picks >= 0.02) & (picks < 0.04)] = 1e-7
    return fp16_decode(fp16_encode(x.astype(np.float32)))


def _quantize(x: np.ndarray, dt: int, scale_exp: int = 0) -> np.ndarray:
    t = Tensor("y", x.shape, DT_NAME[dt], "activation", scale_exp if dt == DT_FP8 else 0)
    with np.errstate(over="ignore", invalid="ignore"):
        return quantize(x, t)


def _codes(x: np.ndarray, dt: int) -> np.ndarray:
    """Codes of values exactly representable in dt."""
    if dt == DT_FP16:
        return fp16_encode(x)
    assert dt == DT_FP32
    return x.astype(np.float32)


class _Vertex:
    """One tile image with the operands of one vertex."""

    def __init__(self, nbytes: int) -> None:
        self.img = TileImage(nbytes + 4096)

    def block(self, x: np.ndarray, dt: int) -> tuple[int, int]:
        ld = x.shape[-1] * ELEM_BYTES[dt] + 8  # padded rows
        return self.img.put(_codes(x, dt), ld=ld), ld

    def out(self, m: int, n: int, dt: int) -> tuple[int, int]:
        ld = n * ELEM_BYTES[dt] + 16
        return self.img.alloc(ld * (m - 1) + n * ELEM_BYTES[dt]), ld

    def run(self, name: str, **named: float | int) -> None:
        spec = by_name(name)
        status = dispatch.vertex_execute(spec.id, self.img.mem, self.img.base,
                                         spec.make_args(**named))
        assert status == 0, name

    def values(self, addr: int, m: int, n: int, ld: int, dt: int,
               scale_exp: int = 0) -> np.ndarray:
        """Logical float32 values of an output block (codes decoded, fp8 scaled)."""
        codes = self.img.get(addr, m, n, ld, CODE_TYPE[dt])
        if dt == DT_FP16:
            return fp16_decode(codes)
        if dt == DT_FP32:
            return codes.astype(np.float32)
        return fp8_decode(codes) * np.float32(2.0**scale_exp)


def _assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    got32 = np.ascontiguousarray(got, dtype=np.float32).view(np.uint32)
    want32 = np.ascontiguousarray(want, dtype=np.float32).view(np.uint32)
    bad = np.flatnonzero(got32 != want32)
    assert bad.size == 0, (f"{bad.size} of {got32.size} elements differ, first at "
                           f"{np.unravel_index(bad[0], got.shape)}: "
                           f"{got.flat[bad[0]]!r} != {want.flat[bad[0]]!r}")


def _cases() -> list[tuple[tuple[int, int], str]]:
    return [(shape, kind) for shape in SHAPES for kind in KINDS]


@pytest.mark.parametrize(("shape", "kind"), _cases())
def test_layernorm_matches_reference(shape: tuple[int, int], kind: str) -> None:
    m, n = shape
    rng = np.random.default_rng([SEED, m, n, KINDS.index(kind)])
    x = _fp16_data(rng, shape, kind)
    gamma = _fp16_data(rng, (1, n), "normal")[0] * np.float32(0.5) + np.float32(1.0)
    gamma = fp16_decode(fp16_encode(gamma))
    beta = _fp16_data(rng, (1, n), "normal")[0]
    v = _Vertex(8 * m * n + 8 * n + 64 * m)
    xa, ldx = v.block(x, DT_FP16)
    y, ldy = v.out(m, n, DT_FP16)
    v.run("LAYERNORM", x=xa, ldx=ldx, gamma=v.block(gamma, DT_FP16)[0],
          beta=v.block(beta, DT_FP16)[0], y=y, ldy=ldy, M=m, N=n, eps=1e-6)
    want = _quantize(layernorm(x, gamma, beta, 1e-6), DT_FP16)
    _assert_bits(v.values(y, m, n, ldy, DT_FP16), want)


@pytest.mark.parametrize(("shape", "kind"), _cases())
def test_softmax_matches_reference(shape: tuple[int, int], kind: str) -> None:
    m, n = shape
    rng = np.random.default_rng([SEED + 1, m, n, KINDS.index(kind)])
    x = _fp16_data(rng, shape, kind)
    for dx, dy, scale in [(DT_FP16, DT_FP16, 0.125), (DT_FP32, DT_FP16, 1.0 / 3.0),
                          (DT_FP16, DT_FP32, 1.0)]:
        v = _Vertex(12 * m * n + 64 * m)
        xa, ldx = v.block(x, dx)
        y, ldy = v.out(m, n, dy)
        v.run("SOFTMAX", x=xa, ldx=ldx, y=y, ldy=ldy, M=m, N=n, scale=scale, dtype_x=dx,
              dtype_y=dy)
        want = _quantize(softmax(x, scale), dy)
        _assert_bits(v.values(y, m, n, ldy, dy), want)


@pytest.mark.parametrize(("shape", "kind"), _cases())
def test_gelu_and_add_match_reference(shape: tuple[int, int], kind: str) -> None:
    m, n = shape
    rng = np.random.default_rng([SEED + 2, m, n, KINDS.index(kind)])
    x = _fp16_data(rng, shape, kind)
    b = _fp16_data(rng, shape, "mixed")
    v = _Vertex(12 * m * n + 64 * m)
    xa, ldx = v.block(x, DT_FP16)
    ba, ldb = v.block(b, DT_FP16)
    y, ldy = v.out(m, n, DT_FP16)
    v.run("GELU", x=xa, ldx=ldx, y=y, ldy=ldy, M=m, N=n)
    _assert_bits(v.values(y, m, n, ldy, DT_FP16), _quantize(gelu(x), DT_FP16))
    c, ldc = v.out(m, n, DT_FP16)
    v.run("ADD", a=xa, lda=ldx, b=ba, ldb=ldb, c=c, ldc=ldc, M=m, N=n, dtype_a=DT_FP16,
          dtype_b=DT_FP16, dtype_c=DT_FP16)
    with np.errstate(over="ignore"):
        want = _quantize(add(x, b), DT_FP16)
    _assert_bits(v.values(c, m, n, ldc, DT_FP16), want)


@pytest.mark.parametrize(("shape", "kind"), _cases())
def test_cast_to_fp8_matches_reference(shape: tuple[int, int], kind: str) -> None:
    """A graph Cast fp16 -> fp8 with scale exponent e is CAST with shift -e."""
    m, n = shape
    rng = np.random.default_rng([SEED + 3, m, n, KINDS.index(kind)])
    x = _fp16_data(rng, shape, kind)
    for e in (-4, 0, 3):
        v = _Vertex(4 * m * n + 64 * m)
        xa, ldx = v.block(x, DT_FP16)
        y, ldy = v.out(m, n, DT_FP8)
        v.run("CAST", x=xa, ldx=ldx, y=y, ldy=ldy, M=m, N=n, dtype_x=DT_FP16,
              dtype_y=DT_FP8, shift=-e)
        _assert_bits(v.values(y, m, n, ldy, DT_FP8, e), _quantize(x, DT_FP8, e))


def test_add_row_periodic() -> None:
    """Add of a [T, N] operand to [B*T, N] repeats it per block of T rows."""
    rng = np.random.default_rng(SEED + 4)
    a = _fp16_data(rng, (6, 5), "normal")
    b = _fp16_data(rng, (3, 5), "normal")
    np.testing.assert_array_equal(add(a, b), a + np.tile(b, (2, 1)))


@pytest.mark.parametrize("n", [729, 1152, 4304])
def test_row_statistics_independent_of_order(n: int) -> None:
    """Permuting the columns of a row permutes the LayerNorm and softmax output bits:
    the float64 statistics do not depend on the summation order."""
    rng = np.random.default_rng([SEED + 5, n])
    x = _fp16_data(rng, (16, n), "offset")
    gamma = _fp16_data(rng, (1, n), "normal")[0]
    beta = _fp16_data(rng, (1, n), "normal")[0]
    perm = rng.permutation(n)
    ln = layernorm(x, gamma, beta, 1e-6)
    _assert_bits(layernorm(x[:, perm], gamma[perm], beta[perm], 1e-6), ln[:, perm])
    sm = softmax(x, 0.125)
    _assert_bits(softmax(x[:, perm], 0.125), sm[:, perm])


def _vector_chain(m: int, n: int) -> Graph:
    """x -> LayerNorm (ln) -> GELU (ge) -> Softmax (sm) -> + ln (sum) -> Cast to fp8
    (out); every tensor but x is a graph output."""
    def act(name: str, dtype: str = "fp16", kind: str = "activation", e: int = 0) -> Tensor:
        return Tensor(name, (m, n), dtype, kind, e)

    tensors = [act("x", kind="input"), Tensor("gamma", (n,), "fp16", "parameter"),
               Tensor("beta", (n,), "fp16", "parameter"), act("out", "fp8", "output", -6)]
    tensors += [act(name, kind="output") for name in ("ln", "ge", "sm", "sum")]
    ops: list[Op] = [LayerNorm("ln_op", "x", "gamma", "beta", "ln", 1e-6),
                     Gelu("gelu", "ln", "ge"), Softmax("softmax", "ge", "sm", 0.07),
                     Add("add", "sm", "ln", "sum"), Cast("cast", "sum", "out")]
    return make_graph("vector_chain", tensors, ops, ["x"], OUTPUTS,
                      (("model", "vector_chain"), ("layers", 0), ("batch", 1)))


@pytest.mark.parametrize(("device", "m", "n"), [("tiny", 17, 150), ("c600", 29, 1152)])
def test_simulated_vector_chain_equals_reference(device: str, m: int, n: int) -> None:
    g = _vector_chain(m, n)
    dev = simulator.load_device(device)
    package = build(g, dev, baseline_plan(g, dev)).package
    params, inputs = planner.init_params(g, seed=0), planner.init_inputs(g, seed=1)
    inputs["x"] = quantize(inputs["x"] * np.float32(6.0), g.tensor("x"))
    want = planner.reference(g, params, inputs)
    sim = simulator.run(package, params=params, inputs=inputs, numerics=True)
    assert not sim.faults
    for name in OUTPUTS:
        assert np.count_nonzero(want[name]) > want[name].size // 2
        _assert_bits(sim.outputs[name], want[name])


# ------------------------------------------------ the activations, RMSNorm, RoPE, masks

NEW_SHAPES = [(1, 1), (3, 17), (5, 257), (2, 1152), (3, 4304)]


def _new_cases() -> list[tuple[tuple[int, int], str]]:
    return [(shape, kind) for shape in NEW_SHAPES for kind in KINDS]


@pytest.mark.parametrize(("shape", "kind"), _new_cases())
def test_activation_forms_and_gate_match_reference(shape: tuple[int, int], kind: str) -> None:
    """Every GELU-kernel form (tanh/erf/quick GELU, SiLU, tanh) and the gated
    product (SwiGLU) equal their op kinds' formulas bit for bit."""
    from planner.ir.ops.silu import Silu, Tanh
    from planner.ir.ops.swiglu import SwiGLU

    m, n = shape
    rng = np.random.default_rng([SEED + 5, m, n, KINDS.index(kind)])
    x = _fp16_data(rng, shape, kind)
    up = _fp16_data(rng, shape, "normal")
    refs = {0: Gelu("g", "x", "y", "tanh"), 1: Gelu("g", "x", "y", "erf"),
            2: Gelu("g", "x", "y", "quick"), 3: Silu("s", "x", "y"), 4: Tanh("t", "x", "y")}
    v = _Vertex(16 * m * n + 96 * m)
    xa, ldx = v.block(x, DT_FP16)
    ua, ldu = v.block(up, DT_FP16)
    for form, op in refs.items():
        y, ldy = v.out(m, n, DT_FP16)
        v.run("GELU", x=xa, ldx=ldx, y=y, ldy=ldy, M=m, N=n, form=form)
        with np.errstate(over="ignore", invalid="ignore"):
            want = _quantize(op.compute(None, {"x": x}), DT_FP16)
        _assert_bits(v.values(y, m, n, ldy, DT_FP16), want)
    y, ldy = v.out(m, n, DT_FP16)
    v.run("GELU", x=xa, ldx=ldx, y=y, ldy=ldy, M=m, N=n, form=3, b=ua, ldb=ldu)
    with np.errstate(over="ignore", invalid="ignore"):
        want = _quantize(SwiGLU("sw", "x", "u", "y").compute(None, {"x": x, "u": up}),
                         DT_FP16)
    _assert_bits(v.values(y, m, n, ldy, DT_FP16), want)


@pytest.mark.parametrize(("shape", "kind"), _new_cases())
def test_rmsnorm_matches_reference(shape: tuple[int, int], kind: str) -> None:
    from planner.ir.ops.rmsnorm import RMSNorm

    m, n = shape
    rng = np.random.default_rng([SEED + 6, m, n, KINDS.index(kind)])
    x = _fp16_data(rng, shape, kind)
    gamma = fp16_decode(fp16_encode(
        _fp16_data(rng, (1, n), "normal")[0] * np.float32(0.5) + np.float32(1.0)))
    v = _Vertex(8 * m * n + 8 * n + 64 * m)
    xa, ldx = v.block(x, DT_FP16)
    y, ldy = v.out(m, n, DT_FP16)
    v.run("RMSNORM", x=xa, ldx=ldx, gamma=v.block(gamma, DT_FP16)[0], y=y, ldy=ldy, M=m, N=n,
          eps=1e-6)
    with np.errstate(over="ignore", invalid="ignore"):
        want = _quantize(RMSNorm("r", "x", "g", "y", 1e-6).compute(None, {"x": x, "g": gamma}),
                         DT_FP16)
    _assert_bits(v.values(y, m, n, ldy, DT_FP16), want)


@pytest.mark.parametrize("table_dt", [DT_FP16, DT_FP32])
@pytest.mark.parametrize(("rows", "heads", "head_dim"), [(1, 1, 2), (7, 3, 8), (33, 14, 64)])
def test_rope_matches_reference(rows: int, heads: int, head_dim: int, table_dt: int) -> None:
    from planner.ir.ops.rope import Rope, rope_tables

    rng = np.random.default_rng([SEED + 7, rows, heads, head_dim])
    x = _fp16_data(rng, (rows, heads * head_dim), "normal")
    cos, sin = rope_tables(rows, head_dim, 10000.0)
    if table_dt == DT_FP16:
        cos, sin = fp16_decode(fp16_encode(cos)), fp16_decode(fp16_encode(sin))
    v = _Vertex(16 * rows * heads * head_dim + 64 * rows)
    xa, ldx = v.block(x, DT_FP16)
    ca, ldt = v.block(cos, table_dt)
    sa, _ = v.block(sin, table_dt)
    y, ldy = v.out(rows, heads * head_dim, DT_FP16)
    v.run("ROPE", x=xa, ldx=ldx, cos=ca, sin=sa, ldt=ldt, y=y, ldy=ldy, M=rows,
          N=heads * head_dim, head_dim=head_dim, dtype_t=table_dt)
    op = Rope("rope", "x", "c", "s", "y", head_dim)
    want = _quantize(op.compute(None, {"x": x, "c": cos, "s": sin}), DT_FP16)
    _assert_bits(v.values(y, rows, heads * head_dim, ldy, DT_FP16), want)


@pytest.mark.parametrize(("batch", "heads", "tq", "tk"), [(1, 1, 5, 5), (2, 3, 7, 7),
                                                         (2, 2, 4, 9)])
def test_masked_and_causal_softmax_match_reference(batch: int, heads: int, tq: int,
                                                   tk: int) -> None:
    """Blocks of rows of a masked (key padding) and causal softmax, each
    block at its own row0, equal the op's formula over the whole scores."""
    rng = np.random.default_rng([SEED + 8, batch, heads, tq, tk])
    scores = _fp16_data(rng, (batch * heads, tq, tk), "offset")
    mask = np.zeros((batch, tk), dtype=np.float32)
    mask[0, tk - max(1, tk // 3):] = -30000.0
    rows = batch * heads * tq
    for causal, masked in ((tq, False), (0, True), (tq, True)):
        op = Softmax("sm", "x", "y", 0.25, "m" if masked else None, heads * tq, causal)
        want = _quantize(op.compute(None, {"x": scores, "m": mask}).reshape(rows, tk), DT_FP16)
        flat = scores.reshape(rows, tk)
        v = _Vertex(16 * rows * tk + 64 * rows)
        ma, ldm = v.block(mask, DT_FP16)
        cuts = [0, rows // 3, rows // 3 + 1, rows]
        for r0, r1 in zip(cuts, cuts[1:], strict=False):
            if r1 <= r0:
                continue
            xa, ldx = v.block(flat[r0:r1], DT_FP16)
            y, ldy = v.out(r1 - r0, tk, DT_FP16)
            extra = dict(mask=ma, ldm=ldm, mask_rep=heads * tq, mask_rows=batch) if masked else {}
            v.run("SOFTMAX", x=xa, ldx=ldx, y=y, ldy=ldy, M=r1 - r0, N=tk, scale=0.25,
                  dtype_x=DT_FP16, dtype_y=DT_FP16, row0=r0, causal=causal, **extra)
            _assert_bits(v.values(y, r1 - r0, tk, ldy, DT_FP16), want[r0:r1])
