"""The exact formulas of the vector kernels, as plain numpy: the rounding contract.

These are the definitions the jitted kernel bodies reproduce bit for bit and
that planner.reference calls for its vector ops, so kernel and reference get
the same bits (docs/contracts.md §6).  Every function takes and returns float32
arrays and leaves the final rounding (to fp16/fp8) to the caller.

What makes the result independent of summation order (numpy sums pairwise,
the kernels sequentially):
- row statistics (LayerNorm sum and sum of squares, softmax sum) accumulate in
  float64 and are rounded to float32 once, after dividing by N where the
  formula says so.  The LayerNorm sum of fp16 inputs is exact in float64 in
  any order (every fp16 value is k * 2**-24 with |k| < 2**40, and N < 2**13);
  the sums of squares and of exponentials are sums of non-negative terms whose
  float64 value differs between orders by under N * 2**-53 relative, so two
  orders round to the same float32 unless the exact sum lies that close to a
  float32 rounding boundary (probability about N * 2**-29 per row; never seen
  in the tests' rows of up to 4304 elements);
- maxima are exact in any order;
- transcendentals (tanh, exp) are evaluated in float64 by kernels.transcend
  (IEEE-exact operations only, relative error ~1e-16) and rounded to float32;
  the jitted and numpy versions there give the same bits (tested), and these
  formulas call the jitted array form (`exp_f32`, `tanh_f32`) for speed;
- everything else is one float32 IEEE operation at a time, in the order
  written here.
"""

from __future__ import annotations

import numpy as np

from kernels.transcend import erf_f32, exp_f32, tanh_f32

GELU_C0 = np.float32(0.7978845608028654)  # sqrt(2 / pi)
GELU_C1 = np.float32(0.044715)
SQRT1_2 = np.float32(0.7071067811865476)  # 1 / sqrt(2): the erf form's argument scale
QUICK_GELU = np.float32(1.702)  # CLIP's quick GELU: x * sigmoid(1.702 x)
HALF = np.float32(0.5)
ONE = np.float32(1.0)
# the activation forms of the GELU kernel (its `form` argument) and of the IR's ops
ACT_GELU_TANH, ACT_GELU_ERF, ACT_QUICK_GELU, ACT_SILU, ACT_TANH = 0, 1, 2, 3, 4


def row_sum64(x: np.ndarray) -> np.ndarray:
    """float64 sum over the last axis (any order: module docstring)."""
    return np.asarray(np.sum(x, axis=-1, dtype=np.float64))


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3))) in float32:
    c = ((C1*x)*x)*x; u = C0*(x + c); t = f32(tanh64(f64(u))); y = (0.5*x)*(1 + t)."""
    x = np.asarray(x, dtype=np.float32)
    u = GELU_C0 * (x + ((GELU_C1 * x) * x) * x)
    t = tanh_f32(u)
    return (HALF * x) * (ONE + t)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """0.5*x*(1 + erf(x/sqrt(2))) in float32: u = x*SQRT1_2; t = f32(erf64(f64(u)));
    y = (0.5*x)*(1 + t)."""
    x = np.asarray(x, dtype=np.float32)
    t = erf_f32(x * SQRT1_2)
    return (HALF * x) * (ONE + t)


def quick_gelu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x) in float32: z = 1.702*x; e = f32(exp64(f64(-z)));
    y = x / (1 + e)."""
    x = np.asarray(x, dtype=np.float32)
    e = exp_f32(-(QUICK_GELU * x))
    return x / (ONE + e)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) in float32: e = f32(exp64(f64(-x))); y = x / (1 + e)."""
    x = np.asarray(x, dtype=np.float32)
    e = exp_f32(-x)
    return x / (ONE + e)


def tanh(x: np.ndarray) -> np.ndarray:
    """tanh in float32: f32(tanh64(f64(x)))."""
    return tanh_f32(np.asarray(x, dtype=np.float32))


def activation(form: int, x: np.ndarray) -> np.ndarray:
    """The activation `form` (ACT_*) of float32 `x`, unrounded."""
    fns = {ACT_GELU_TANH: gelu, ACT_GELU_ERF: gelu_erf, ACT_QUICK_GELU: quick_gelu,
           ACT_SILU: silu, ACT_TANH: tanh}
    return fns[form](x)


def gated(form: int, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """activation(form, x) * b in float32 (one multiply): the gated MLP's
    product (SwiGLU: silu(gate) * up)."""
    return activation(form, x) * np.asarray(b, dtype=np.float32)


def rmsnorm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """Row RMSNorm: ms = f32(sum64(f64(x)**2) / N); y = x / sqrt(ms + eps) * gamma
    in float32, left to right (eps as float32; sqrt correctly rounded)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    x64 = x.astype(np.float64)
    ms = (row_sum64(x64 * x64) / n).astype(np.float32)
    den = np.sqrt(ms + np.float32(eps))
    return (x / den[..., None]) * np.asarray(gamma, np.float32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int) -> np.ndarray:
    """Rotary position embedding, rotate-half form, of rows x [R, heads·head_dim]
    with the tables of those rows cos/sin [R, head_dim/2]: per head, with x1,
    x2 its two halves, y1 = x1*cos - x2*sin, y2 = x2*cos + x1*sin (float32,
    one operation at a time)."""
    x = np.asarray(x, dtype=np.float32)
    c = np.asarray(cos, dtype=np.float32)
    s = np.asarray(sin, dtype=np.float32)
    rows, width = x.shape
    half = head_dim // 2
    h = x.reshape(rows, width // head_dim, 2, half)
    x1, x2 = h[:, :, 0, :], h[:, :, 1, :]
    c, s = c[:, None, :], s[:, None, :]
    y = np.empty_like(h)
    y[:, :, 0, :] = (x1 * c) - (x2 * s)
    y[:, :, 1, :] = (x2 * c) + (x1 * s)
    return y.reshape(rows, width)


def layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Row LayerNorm: mean = f32(sum64(x) / N); d = x - mean (float32);
    var = f32(sum64(f64(d)**2) / N) (biased; d*d exact in float64);
    y = d / sqrt(var + eps) * gamma + beta in float32, left to right
    (eps as float32; sqrt correctly rounded)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    mean = (row_sum64(x) / n).astype(np.float32)
    d = x - mean[..., None]
    d64 = d.astype(np.float64)
    var = (row_sum64(d64 * d64) / n).astype(np.float32)
    den = np.sqrt(var + np.float32(eps))
    return (d / den[..., None]) * np.asarray(gamma, np.float32) + np.asarray(beta, np.float32)


def softmax(x: np.ndarray, scale: float, add: np.ndarray | None = None,
            valid: np.ndarray | None = None) -> np.ndarray:
    """Row softmax of x*scale: z = x*scale (float32), plus `add` (an additive
    mask, float32, one add) when given; e = f32(exp_nonpos(f64(z - max z)));
    s = f32(sum64(e)); y = e / s (float32).  With `valid` (keys per row, x's
    shape without its last dim), only a row's first valid keys take part
    (max, exp and sum over them); the others are 0 (the causal mask)."""
    z = np.asarray(x, dtype=np.float32) * np.float32(scale)
    if add is not None:
        z = z + np.asarray(add, dtype=np.float32)
    if valid is None:
        d = z - np.max(z, axis=-1, keepdims=True)
        e = exp_f32(d)
    else:
        keep = np.arange(z.shape[-1]) < np.asarray(valid)[..., None]
        mx = np.max(np.where(keep, z, -np.inf), axis=-1, keepdims=True)
        e = np.where(keep, exp_f32(z - mx), np.float32(0.0))
    s = row_sum64(e).astype(np.float32)
    return e / s[..., None]


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b in float32 (one IEEE add per element)."""
    return np.asarray(a, dtype=np.float32) + np.asarray(b, dtype=np.float32)


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
