"""onnxruntime as the independent reference of an ONNX model source.

`ort_inputs(imported, graph, seed)` makes the same inputs for our graph and
for the file; `ort_check(path, feed, names)` runs the file in onnxruntime
(CPU) once and returns the comparison the run applies to its simulated
outputs (`ort_cosine_min`, `ort_rel_error`: planner.pipeline.run_model's
`also`).  Kept apart from the importer, which the model loader uses: this
module needs the numpy reference's input conventions.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from planner.ir.onnx_import import Imported
from tilecommon.errors import ConfigError


def ort_inputs(imported: Imported, graph: Any, seed: int
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The same inputs for our graph and for the ONNX file (from `seed`): for
    a text encoder, random token ids, their embeddings gathered on the host
    (rounded to the graph's fp16 input) for ours, and the key-padding pattern
    of `planner.ir.reference.init_inputs` as our additive mask and as the
    file's 0/1 `attention_mask`; for a tower, fp16-valued images and their
    patches (channel-major, the class and distillation tokens' rows zero) for ours."""
    from planner.ir.reference import init_inputs

    ours = init_inputs(graph, seed=seed)
    if imported.dag is not None:  # each input as the file shapes it
        return ours, {name: ours[mine].reshape(shape).astype(np.float32)
                      for name, mine, shape in imported.dag.inputs}
    batch, tokens = graph.attr_int("batch"), graph.attr_int("tokens")
    rng = np.random.default_rng(seed)
    if "patches" in ours:  # a tower: images, and their patches with the class row zero
        c, p = graph.attr_int("channels"), graph.attr_int("patch")
        # the class (and DeiT's distillation) tokens ride on zero rows in front
        side = math.isqrt(tokens)
        cls = tokens - side * side
        px = rng.uniform(-1, 1, (batch, c, side * p, side * p)).astype(np.float16)
        px = px.astype(np.float32)  # what both runs see: fp16 values
        rows = np.zeros((batch, tokens, c * p * p), np.float32)
        rows[:, cls:] = px.reshape(batch, c, side, p, side, p).transpose(
            0, 2, 4, 1, 3, 5).reshape(batch, side * side, c * p * p)
        ours["patches"] = rows.reshape(batch * tokens, -1)
        return ours, {"pixel_values": px}
    table = imported.word_embeddings
    ids = rng.integers(0, table.shape[0], (batch, tokens))
    ours["embeds"] = table[ids].reshape(batch * tokens, -1).astype(np.float16).astype(
        np.float32)
    feed = {"input_ids": ids.astype(np.int64)}
    if "attention_mask" in ours:
        feed["attention_mask"] = (ours["attention_mask"] == 0).astype(np.int64)
    else:
        feed["attention_mask"] = np.ones((batch, tokens), np.int64)
    return ours, feed


def our_outputs(imported: Imported, graph: Any) -> list[str | None]:
    """Our output for each of the file's outputs, in the file's order (None:
    one we do not compute, such as a MAP tower's hidden states beside its
    pooled output).  Our graph lists the hidden states first when it has
    them, the pooled output last."""
    if imported.dag is not None:
        return [mine for _, mine in imported.dag.outputs]
    pooled = imported.table.get("pool", "none") != "none"
    outs = list(graph.outputs)
    ours = {"hidden": outs[0] if not pooled or len(outs) > 1 else None,
            "pooled": outs[-1] if pooled else None}
    roles = imported.output_roles or ("hidden",) * len(outs)
    return [ours.get(r) for r in roles]


def ort_check(path: str | Path, feed: dict[str, np.ndarray], names: list[str | None]
              ) -> Any:
    """A comparison of simulated outputs with onnxruntime's (CPU) run of the
    file on `feed`: the file's outputs in order are our outputs `names`
    (None: not compared; `our_outputs`).  Returns a function of the simulated
    outputs giving `ort_cosine_min` (the smallest cosine similarity of a row)
    and `ort_rel_error` (relative Frobenius distance) over all of them."""
    import onnxruntime as ort

    if not any(names):
        raise ConfigError(str(path), "onnx", "none of the file's outputs is one the "
                                             "imported model computes")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    got = session.run(None, {k: v for k, v in feed.items() if k in wanted})

    def compare(outputs: Any) -> dict[str, Any]:
        cos, num, den = 1.0, 0.0, 0.0
        for name, theirs in zip(names, got, strict=False):
            if name is None:
                continue
            a = np.asarray(outputs[name], np.float64).reshape(-1, theirs.shape[-1])
            b = np.asarray(theirs, np.float64).reshape(a.shape)
            dots = (a * b).sum(1)
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            cos = min(cos, float(np.min(dots / np.maximum(norms, 1e-30))))
            num += float(((a - b) ** 2).sum())
            den += float((b ** 2).sum())
        return {"ort_cosine_min": cos, "ort_rel_error": (num / max(den, 1e-30)) ** 0.5}

    return compare
