"""The golden forward: numpy, rounding exactly where the graph says.

Values are float32 arrays of *logical* values (an fp8 tensor's array holds
`code * 2**scale_exp`).  Rounding points (docs/contracts.md §1, §4):

- every tensor an op writes is rounded to its dtype once: fp16 via
  `np.float16`, fp8 via ml_dtypes `float8_e4m3fn` after scaling by
  `2**-scale_exp` (the oracle; independent of kernels/dtypes.py), fp32 as is;
- MatMul: float32 `a @ b` of the decoded values, plus the bias in fp32, one
  rounding; BatchMatMul likewise;
- LayerNorm: fp32, two-pass mean then biased variance,
  `(x - mean) / sqrt(var + eps) * gamma + beta` (eps as float32);
- Softmax: fp32 `exp(s - max(s)) / sum`, `s = x * scale` (scale as float32);
- GELU: tanh form in fp32; Add: fp32 sum (b row-periodic), one rounding.

Accumulation order is numpy's (BLAS, pairwise sums), so a simulator that sums
sequentially agrees to within fp32 accumulation error before the rounding, not
bit-for-bit in every element.

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

import math
import zlib
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from kernels.exceptions import ConfigError
from planner.graph import (
    Add,
    BatchMatMul,
    Cast,
    Gelu,
    Graph,
    LayerNorm,
    MatMul,
    MergeHeads,
    Op,
    Repeat,
    Softmax,
    SplitHeads,
    Tensor,
)
from planner.models import WEIGHT_STD

F32 = np.float32
_GELU_C = F32(math.sqrt(2.0 / math.pi))


def quantize(x: np.ndarray, t: Tensor) -> np.ndarray:
    """Round float32 values `x` to `t`'s dtype (and scale); float32 out."""
    x = np.asarray(x, dtype=F32)
    if t.dtype == "fp32":
        return x
    if t.dtype == "fp16":
        return x.astype(np.float16).astype(F32)
    codes = (x * F32(2.0 ** -t.scale_exp)).astype(ml_dtypes.float8_e4m3fn)
    return codes.astype(F32) * F32(2.0**t.scale_exp)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def parameter_roles(g: Graph) -> dict[str, str]:
    """Role of each parameter by use: weight, bias, gamma, beta or other
    (outer parameters of a Repeat take their body parameter's role)."""
    roles: dict[str, str] = {}
    for op in g.ops:
        if isinstance(op, MatMul):
            roles[op.b] = "weight"
            if op.bias is not None:
                roles[op.bias] = "bias"
        elif isinstance(op, LayerNorm):
            roles[op.gamma] = "gamma"
            roles[op.beta] = "beta"
        elif isinstance(op, Repeat):
            inner = parameter_roles(op.body)
            for outer, body_name in op.iterated + op.invariant:
                roles[outer] = inner.get(body_name, "other")
    return {p: roles.get(p, "other") for p in g.parameters}


def init_params(g: Graph, seed: int) -> dict[str, np.ndarray]:
    """Deterministic parameters: name -> float32 array of logical values,
    exactly representable in the tensor's dtype and scale (module docstring)."""
    out: dict[str, np.ndarray] = {}
    for name, role in parameter_roles(g).items():
        t = g.tensor(name)
        # float32 draws: a 27-layer model's 413M parameters fit in 1.7 GB
        z = _rng(seed, name).standard_normal(t.shape, dtype=F32)
        if role == "gamma":
            z = F32(1.0) + F32(0.1) * z
        else:
            z *= F32(WEIGHT_STD if role == "weight" else 0.02)
        out[name] = quantize(z, t)
    return out


def init_inputs(g: Graph, seed: int) -> dict[str, np.ndarray]:
    """Deterministic inputs: name -> float32 U(-1, 1), rounded to the dtype."""
    return {
        name: quantize(_rng(seed, name).uniform(-1.0, 1.0, g.tensor(name).shape).astype(F32),
                       g.tensor(name))
        for name in g.inputs
    }


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
) -> dict[str, np.ndarray]:
    """Forward pass of `g`: output name -> float32 array.

    `params`/`inputs` map names to logical values (as `init_params` gives);
    a missing or mis-shaped one raises ConfigError naming it.  If `record` is
    given it receives every computed tensor; a Repeat body's tensor `t` at
    iteration i is recorded as `"<repeat>[i].t"`.
    """
    env = _checked(g, params, g.parameters, "params")
    env.update(_checked(g, inputs, g.inputs, "inputs"))
    _run(g, env, record, "")
    return {name: env[name] for name in g.outputs}


def _run(g: Graph, env: dict[str, np.ndarray], record: dict[str, np.ndarray] | None,
         prefix: str) -> None:
    for op in g.ops:
        if isinstance(op, Repeat):
            _repeat(g, op, env, record, prefix)
            continue
        (out_name,) = op.outputs
        out = quantize(_compute(g, op, env), g.tensor(out_name))
        env[out_name] = out
        if record is not None:
            record[prefix + out_name] = out


def _repeat(g: Graph, op: Repeat, env: dict[str, np.ndarray],
            record: dict[str, np.ndarray] | None, prefix: str) -> None:
    carried = [env[name] for name in op.init]
    for i in range(op.trips):
        body_env = dict(zip(op.arguments, carried, strict=True))
        for outer, inner in op.iterated:
            body_env[inner] = env[outer][i]
        for outer, inner in op.invariant:
            body_env[inner] = env[outer]
        _run(op.body, body_env, record, f"{prefix}{op.name}[{i}].")
        carried = [body_env[name] for name in op.yields]
    for name, value in zip(op.final, carried, strict=True):
        env[name] = value
        if record is not None:
            record[prefix + name] = value


def _compute(g: Graph, op: Op, env: dict[str, np.ndarray]) -> np.ndarray:
    """The unrounded fp32 result of one non-Repeat op."""
    if isinstance(op, MatMul):
        y = env[op.a] @ env[op.b]
        return y if op.bias is None else y + env[op.bias]
    if isinstance(op, BatchMatMul):
        b = env[op.b]
        return env[op.a] @ (np.swapaxes(b, 1, 2) if op.transpose_b else b)
    if isinstance(op, LayerNorm):
        x = env[op.x]
        mean = x.mean(axis=-1, keepdims=True, dtype=F32)
        d = x - mean
        var = (d * d).mean(axis=-1, keepdims=True, dtype=F32)
        return d / np.sqrt(var + F32(op.eps)) * env[op.gamma] + env[op.beta]
    if isinstance(op, Softmax):
        s = env[op.x] * F32(op.scale)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True, dtype=F32)
    if isinstance(op, Gelu):
        x = env[op.x]
        return F32(0.5) * x * (F32(1.0) + np.tanh(_GELU_C * (x + F32(0.044715) * x * x * x)))
    if isinstance(op, Add):
        a, b = env[op.a], env[op.b]
        if a.shape == b.shape:
            return a + b
        return (a.reshape(-1, *b.shape) + b).reshape(a.shape)
    if isinstance(op, Cast):
        return env[op.x]
    if isinstance(op, SplitHeads):
        x = env[op.x]
        bh, t, dh = g.tensor(op.out).shape
        return x.reshape(bh // op.heads, t, op.heads, dh).transpose(0, 2, 1, 3).reshape(bh, t, dh)
    if isinstance(op, MergeHeads):
        x = env[op.x]
        bh, t, dh = x.shape
        return x.reshape(bh // op.heads, op.heads, t, dh).transpose(0, 2, 1, 3).reshape(
            -1, op.heads * dh)
    raise TypeError(f"op {op.name}: reference has no rule for {op.kind}")
