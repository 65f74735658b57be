"""The exact fp32 formulas of the vector kernels, as plain numpy (the slow twin).

These are the definitions the jitted kernel bodies reproduce bit for bit, and
that a numpy reference forward can call to get the same bits: every function
takes and returns float32 arrays, computes in float32 with the operation order
written here, and leaves the final rounding (to fp16/fp8) to the caller.

Two choices make numpy and numba agree exactly:
- row sums are sequential in column order (`_row_sum`), not numpy's pairwise
  `np.sum`;
- transcendentals (tanh, exp) are evaluated in float64 by kernels.transcend
  (IEEE-exact operations only, relative error ~1e-16) and rounded to float32;
  the jitted and numpy versions there give the same bits.
"""

from __future__ import annotations

import numpy as np

from kernels.transcend import exp_nonpos_np, tanh64_np

GELU_C0 = np.float32(0.7978845608028654)  # sqrt(2 / pi)
GELU_C1 = np.float32(0.044715)
HALF = np.float32(0.5)
ONE = np.float32(1.0)


def _row_sum(x: np.ndarray) -> np.ndarray:
    """float32 sum over the last axis, sequential in column order."""
    acc = np.zeros(x.shape[:-1], dtype=np.float32)
    for j in range(x.shape[-1]):
        acc = acc + x[..., j]
    return acc


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3))) in float32:
    c = ((C1*x)*x)*x; u = C0*(x + c); t = f32(tanh64(f64(u))); y = (0.5*x)*(1 + t)
    (the operation order of planner.reference)."""
    x = np.asarray(x, dtype=np.float32)
    u = GELU_C0 * (x + ((GELU_C1 * x) * x) * x)
    t = tanh64_np(u.astype(np.float64)).astype(np.float32)
    return (HALF * x) * (ONE + t)


def layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Row LayerNorm in float32: mean = sum(x)/N; d = x - mean; var = sum(d*d)/N
    (biased); y = d / sqrt(var + eps) * gamma + beta (left to right)."""
    x = np.asarray(x, dtype=np.float32)
    n = np.float32(x.shape[-1])
    mean = _row_sum(x) / n
    d = x - mean[..., None]
    var = _row_sum(d * d) / n
    den = np.sqrt(var + np.float32(eps))
    return (d / den[..., None]) * np.asarray(gamma, np.float32) + np.asarray(beta, np.float32)


def softmax(x: np.ndarray, scale: float) -> np.ndarray:
    """Row softmax of x*scale in float32: z = x*scale; e = f32(exp_nonpos(f64(z - max z)));
    y = e / sum(e) (sequential sum)."""
    z = np.asarray(x, dtype=np.float32) * np.float32(scale)
    d = z - np.max(z, axis=-1, keepdims=True)
    e = exp_nonpos_np(d.astype(np.float64)).astype(np.float32)
    return e / _row_sum(e)[..., None]


def reduce_parts(parts: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Sum of k float32 partial blocks parts[k, M, N] in order j = 0..k-1
    (starting from part 0), plus the bias row (float32) last."""
    parts = np.asarray(parts, dtype=np.float32)
    acc = parts[0].copy()
    for j in range(1, parts.shape[0]):
        acc = acc + parts[j]
    if bias is not None:
        acc = acc + np.asarray(bias, np.float32)
    return acc


def scale_pow2(x: np.ndarray, shift: int) -> np.ndarray:
    """x * 2**shift in float32 (exact unless it over/underflows)."""
    return np.asarray(x, dtype=np.float32) * np.float32(2.0**shift)
