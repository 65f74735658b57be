"""The golden forward: numpy, rounding exactly where the graph says.

Values are float32 arrays of *logical* values (an fp8 tensor's array holds
`code * 2**scale_exp`).  Rounding points (docs/contracts.md §1, §4):

- every tensor an op writes is rounded to its dtype once: fp16 via
  `np.float16`, fp8 via ml_dtypes `float8_e4m3fn` after scaling by
  `2**-scale_exp` (the oracle; independent of kernels/dtypes.py), fp32 as is;
- each op's value is its kind's formula (`op.compute`, planner.ir.ops):
  MatMul is a float32 `a @ b` of the decoded values plus the bias in fp32,
  one rounding, BatchMatMul likewise; the vector ops (LayerNorm, Softmax,
  GELU, Add, ...) are the formulas of kernels.formulas (the rounding
  contract, docs/contracts.md §6): row statistics accumulated in float64 and
  rounded to fp32, transcendentals in float64 rounded to fp32, everything
  else one fp32 operation at a time.  The simulator's kernels compute the
  same formulas, so these ops agree with it bit for bit whatever either
  side's summation order.

MatMul accumulation order is BLAS's, so a simulated matmul whose K is split
over tiles (partials summed by REDUCE) agrees to within fp32 accumulation
error before its rounding, not bit for bit in every element; with fp16
partials (MatMul.partials, the default) each partial is also rounded to fp16
first, a few more fp16 and fp8 codes flip, and the two forwards agree within
the fp8 noise (planner.report.tolerance).

`init_params`/`init_inputs` draw deterministically per tensor name
(`SeedSequence([seed, crc32(name)])`), so a value does not depend on which other
tensors exist; a per-layer parameter [L, ...] is drawn in C order, so layer i is
the same for any L > i, and the fp32 variant of a model gets the same draws
before rounding.  Scales (realistic ViT init): matmul weights N(0, 0.02),
biases N(0, 0.02), LayerNorm gamma 1 + N(0, 0.1), beta N(0, 0.02), other
parameters (position embedding) N(0, 0.02); inputs (patches of normalized
pixels) U(-1, 1).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from planner.ir.graph import Graph, Op, Repeat, Tensor, make_graph
from planner.ir.models import WEIGHT_STD
from tilecommon.errors import ConfigError

F32 = np.float32


FP8_MAX = 448.0  # largest finite e4m3fn value; |code| >= 464 rounds to NaN


def cast_counts(x: np.ndarray, t: Tensor) -> tuple[int, int, int]:
    """(values, saturated, flushed) of rounding float32 `x` to fp8 tensor `t`:
    saturated ones are beyond the largest finite fp8 value at `t`'s scale
    (they round to NaN), flushed ones are non-zero and round to zero."""
    x = np.asarray(x, dtype=F32)
    scaled = np.abs(x) * F32(2.0 ** -t.scale_exp)
    q = quantize(x, t)
    return (int(x.size), int(np.count_nonzero(~(scaled <= FP8_MAX))),
            int(np.count_nonzero((q == 0) & (x != 0))))


def quantize(x: np.ndarray, t: Tensor) -> np.ndarray:
    """Round float32 values `x` to `t`'s dtype (and scale); float32 out."""
    x = np.asarray(x, dtype=F32)
    if t.dtype == "fp32":
        return x
    if t.dtype == "fp16":
        return x.astype(np.float16).astype(F32)
    codes = (x * F32(2.0 ** -t.scale_exp)).astype(ml_dtypes.float8_e4m3fn)
    return codes.astype(F32) * F32(2.0**t.scale_exp)


def fp32_graph(g: Graph) -> Graph:
    """`g` with every tensor fp32 (scales 0; Casts become fp32 → fp32, Repeat
    bodies too): the unquantised forward the cosine-to-fp32 accuracy of a
    run is measured against (the parameters are the same values)."""
    tensors = [dataclasses.replace(t, dtype="fp32", scale_exp=0) for t in g.tensors]
    ops = [dataclasses.replace(op, body=fp32_graph(op.body)) if isinstance(op, Repeat) else op
           for op in g.ops]
    attrs = [(k, "fp32" if k == "precision" else v) for k, v in g.attrs]
    return make_graph(g.name, tensors, ops, g.inputs, g.outputs, attrs)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def _roles(g: Graph) -> dict[str, str]:
    """Roles the ops of `g` give the tensors they read (a Repeat's outer
    tensors take their body tensor's)."""
    roles: dict[str, str] = {}
    for op in g.ops:
        if isinstance(op, Repeat):
            inner = _roles(op.body)
            for outer, body_name in op.iterated + op.invariant:
                if body_name in inner:
                    roles[outer] = inner[body_name]
        else:
            roles.update(op.param_roles())
    return roles


def parameter_roles(g: Graph) -> dict[str, str]:
    """Role of each parameter by use (`op.param_roles()`: weight, bias,
    gamma, beta, ...; "other" when no op names one; outer parameters of a
    Repeat take their body parameter's role)."""
    roles = _roles(g)
    return {p: roles.get(p, "other") for p in g.parameters}


def _fixed_values(g: Graph) -> dict[str, np.ndarray]:
    """Parameters whose values an op determines (`op.init_values`: RoPE's
    tables), by name; an iterated outer parameter repeats them per trip."""
    out: dict[str, np.ndarray] = {}
    for op in g.ops:
        if isinstance(op, Repeat):
            inner = _fixed_values(op.body)
            for outer, body_name in op.invariant:
                if body_name in inner:
                    out[outer] = inner[body_name]
            for outer, body_name in op.iterated:
                if body_name in inner:
                    out[outer] = np.broadcast_to(inner[body_name],
                                                 (op.trips, *inner[body_name].shape)).copy()
            continue
        for name in op.inputs:
            if g.tensor(name).kind == "parameter" and name not in out:
                v = op.init_values(g, name)
                if v is not None:
                    out[name] = np.asarray(v, dtype=F32)
    return out


# an additive attention mask: masked keys get this (fp16-exact; exp underflows to 0)
MASK_VALUE = -30000.0


def mask_values(shape: tuple[int, ...]) -> np.ndarray:
    """A key-padding mask [rows, keys]: 0 where a key is seen; even rows mask
    their last keys // 8 keys (at least one) with MASK_VALUE, odd rows none."""
    m = np.zeros(shape, dtype=F32)
    pad = max(1, shape[-1] // 8)
    m[0::2, shape[-1] - pad:] = F32(MASK_VALUE)
    return m


def init_params(g: Graph, seed: int) -> dict[str, np.ndarray]:
    """Deterministic parameters: name -> float32 array of logical values,
    exactly representable in the tensor's dtype and scale (module docstring)."""
    out: dict[str, np.ndarray] = {}
    fixed = _fixed_values(g)
    for name, role in parameter_roles(g).items():
        t = g.tensor(name)
        if name in fixed:
            out[name] = quantize(fixed[name], t)
            continue
        # float32 draws: a 27-layer model's 413M parameters fit in 1.7 GB
        z = _rng(seed, name).standard_normal(t.shape, dtype=F32)
        if role == "gamma":
            z = F32(1.0) + F32(0.1) * z
        else:
            z *= F32(WEIGHT_STD if role == "weight" else 0.02)
        out[name] = quantize(z, t)
    return out


def init_inputs(g: Graph, seed: int) -> dict[str, np.ndarray]:
    """Deterministic inputs: name -> float32 U(-1, 1), rounded to the dtype;
    an attention mask (role "mask") `mask_values`."""
    roles = _roles(g)
    out = {}
    for name in g.inputs:
        t = g.tensor(name)
        if roles.get(name) == "mask":
            out[name] = quantize(mask_values(t.shape), t)
        else:
            out[name] = quantize(_rng(seed, name).uniform(-1.0, 1.0, t.shape).astype(F32), t)
    return out


def _checked(g: Graph, values: Mapping[str, np.ndarray], names: tuple[str, ...],
             what: str) -> dict[str, np.ndarray]:
    env: dict[str, np.ndarray] = {}
    for name in names:
        if name not in values:
            raise ConfigError(what, name, f"missing {what[:-1]} of graph {g.name}")
        a = np.asarray(values[name], dtype=F32)
        if a.shape != g.tensor(name).shape:
            raise ConfigError(what, name, f"shape must be {g.tensor(name).shape}", a.shape)
        env[name] = a
    return env


def reference(
    g: Graph,
    params: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray],
    record: dict[str, np.ndarray] | None = None,
    casts: dict[str, list[int]] | None = None,
) -> dict[str, np.ndarray]:
    """Forward pass of `g`: output name -> float32 array.

    `params`/`inputs` map names to logical values (as `init_params` gives);
    a missing or mis-shaped one raises ConfigError naming it.  If `record` is
    given it receives every computed tensor; a Repeat body's tensor `t` at
    iteration i is recorded as `"<repeat>[i].t"`.  If `casts` is given it
    receives, per fp8 tensor an op computes (a Repeat body's as
    `"<repeat>/t"`, summed over iterations), [values, saturated, flushed]
    (`cast_counts`).
    """
    env = _checked(g, params, g.parameters, "params")
    env.update(_checked(g, inputs, g.inputs, "inputs"))
    _run(g, env, record, "", casts)
    return {name: env[name] for name in g.outputs}


def cast_fractions(casts: Mapping[str, list[int]]) -> dict[str, dict[str, float]]:
    """`reference(casts=...)` counts as fractions of each tensor's values."""
    return {k: {"saturated": s / n, "flushed": f / n} for k, (n, s, f) in sorted(casts.items())
            if n}


def _run(g: Graph, env: dict[str, np.ndarray], record: dict[str, np.ndarray] | None,
         prefix: str, casts: dict[str, list[int]] | None = None, scope: str = "") -> None:
    for op in g.ops:
        if isinstance(op, Repeat):
            _repeat(g, op, env, record, prefix, casts, scope)
            continue
        (out_name,) = op.outputs
        t = g.tensor(out_name)
        raw = _compute(g, op, env)
        if casts is not None and t.dtype == "fp8":
            counts = casts.setdefault(scope + out_name, [0, 0, 0])
            for j, c in enumerate(cast_counts(raw, t)):
                counts[j] += c
        out = quantize(raw, t)
        env[out_name] = out
        if record is not None:
            record[prefix + out_name] = out


def _repeat(g: Graph, op: Repeat, env: dict[str, np.ndarray],
            record: dict[str, np.ndarray] | None, prefix: str,
            casts: dict[str, list[int]] | None = None, scope: str = "") -> None:
    carried = [env[name] for name in op.init]
    for i in range(op.trips):
        body_env = dict(zip(op.arguments, carried, strict=True))
        for outer, inner in op.iterated:
            body_env[inner] = env[outer][i]
        for outer, inner in op.invariant:
            body_env[inner] = env[outer]
        _run(op.body, body_env, record, f"{prefix}{op.name}[{i}].", casts,
             f"{scope}{op.name}/")
        carried = [body_env[name] for name in op.yields]
    for name, value in zip(op.final, carried, strict=True):
        env[name] = value
        if record is not None:
            record[prefix + name] = value


def _compute(g: Graph, op: Op, env: dict[str, np.ndarray]) -> np.ndarray:
    """The unrounded fp32 result of one non-Repeat op: its kind's formula."""
    return np.asarray(op.compute(g, env), dtype=F32)
