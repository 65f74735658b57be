"""fp8 scales from data: power-of-two exponents chosen from the values a tensor holds.

The zoo's graphs carry fixed exponents (`planner.ir.models.WEIGHT_SCALE_EXP`,
`CAST_SCALE_EXP`), right for the reference initialisation.  Weights from a
file, or inputs of another range, need their own: `data_scales(g, params,
inputs)` returns `g` with every fp8 tensor's `scale_exp` chosen from data:

- a weight: from its amax over all its values (every layer of an iterated
  parameter; the body tensor gets the same exponent), the smallest exponent e
  with amax · 2^-e <= 448 (the largest finite e4m3fn value), so the largest
  weight uses the top of the fp8 range and none saturates;
- an activation cast: from the amax of its input over a calibration forward
  (the fp32 graph, `reference.fp32_graph`, on `params` and `inputs`; a
  Repeat body's tensor over every iteration), with one bit of headroom
  (amax · 2^-e <= 224) for inputs beyond the calibration's;
- the output of a move op (SplitHeads, MergeHeads, Broadcast, ...) keeps its
  input's exponent (a move copies codes).

fp8 keeps ~3 significant bits at any exponent, so a scale only decides what
saturates (|value| beyond 448 · 2^e is NaN in e4m3fn) and what is flushed to
zero (below 2^(e-9)); `quantize_params` rounds raw parameters to a graph's
dtypes and scales and counts both per parameter.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from planner.ir.graph import Graph, Repeat, make_graph
from planner.ir.reference import FP8_MAX, cast_counts, fp32_graph, quantize, reference

EXP_RANGE = (-60, 60)  # keeps a BATCH_MATMUL's combined exponent in int8
ACTIVATION_HEADROOM_BITS = 1


def exponent_for(amax: float, headroom_bits: int = 0) -> int:
    """The smallest e with amax · 2^-e <= FP8_MAX / 2^headroom_bits (0 for a
    zero tensor), clamped to EXP_RANGE."""
    if not amax > 0 or not math.isfinite(amax):
        return 0
    e = math.ceil(math.log2(amax * 2.0 ** headroom_bits / FP8_MAX))
    while amax * 2.0 ** -e > FP8_MAX / 2.0 ** headroom_bits:  # log2 rounding at powers of 2
        e += 1
    return min(max(e, EXP_RANGE[0]), EXP_RANGE[1])


def with_scales(g: Graph, scales: Mapping[str, int], scope: str = "") -> Graph:
    """`g` with the fp8 tensors named in `scales` at those exponents (a Repeat
    body's tensor `t` is `"<repeat>/t"`; others keep theirs)."""
    tensors = [dataclasses.replace(t, scale_exp=scales.get(scope + t.name, t.scale_exp))
               if t.dtype == "fp8" else t for t in g.tensors]
    ops = [dataclasses.replace(op, body=with_scales(op.body, scales, f"{scope}{op.name}/"))
           if isinstance(op, Repeat) else op for op in g.ops]
    return make_graph(g.name, tensors, ops, g.inputs, g.outputs, g.attrs)


def data_scales(g: Graph, params: Mapping[str, np.ndarray],
                inputs: Mapping[str, np.ndarray]) -> Graph:
    """`g` with every fp8 exponent chosen from `params` (raw float values)
    and a calibration forward on `inputs` (module docstring)."""
    scales: dict[str, int] = {}
    for name in g.parameters:
        t = g.tensor(name)
        if t.dtype == "fp8":
            scales[name] = exponent_for(float(np.max(np.abs(params[name]))))
    for op in g.ops:
        if isinstance(op, Repeat):
            for outer, inner in op.iterated + op.invariant:
                if outer in scales:
                    scales[f"{op.name}/{inner}"] = scales[outer]
    record: dict[str, np.ndarray] = {}
    reference(fp32_graph(g), params, inputs, record=record)
    amax: dict[str, float] = {}
    for key, value in record.items():
        # "encoder[3].gelu_fp8" -> "encoder/gelu_fp8"; top-level names as they are
        name = key.split("[", 1)[0] + "/" + key.split("].", 1)[1] if "[" in key else key
        amax[name] = max(amax.get(name, 0.0), float(np.max(np.abs(value))) if value.size else 0)
    _activation_scales(g, amax, scales, "")
    return with_scales(g, scales)


def _activation_scales(g: Graph, amax: Mapping[str, float], scales: dict[str, int],
                       scope: str) -> None:
    for op in g.ops:
        if isinstance(op, Repeat):
            _activation_scales(op.body, amax, scales, f"{scope}{op.name}/")
        elif op.CONVERSION and g.tensor(op.outputs[0]).dtype == "fp8":
            out = scope + op.outputs[0]
            scales[out] = exponent_for(amax.get(out, 0.0), ACTIVATION_HEADROOM_BITS)
        elif op.FAMILY == "move" and g.tensor(op.outputs[0]).dtype == "fp8":
            src = scope + op.inputs[0]
            scales[scope + op.outputs[0]] = scales.get(src, g.tensor(op.inputs[0]).scale_exp)


def quantize_params(g: Graph, raw: Mapping[str, np.ndarray],
                    counts: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """`raw` parameter values rounded to `g`'s dtypes and scales; with
    `counts`, each fp8 parameter's [values, saturated, flushed] is added
    (reference.cast_counts; the run summary reports their fractions)."""
    out = {}
    for name in g.parameters:
        t = g.tensor(name)
        with np.errstate(over="ignore", invalid="ignore"):
            out[name] = quantize(raw[name], t)
        if counts is not None and t.dtype == "fp8":
            counts[name] = list(cast_counts(raw[name], t))
    return out
