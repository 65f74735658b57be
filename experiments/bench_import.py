"""Benchmark: is importing an ONNX encoder linear in its depth?

Target: a 24-layer model's ONNX file imports (planner.ir.onnx_import:
checker, shape inference, recognition, weights) in under 5 s.  The deep
files are built here from the committed 2-layer TorchScript export of the
tiny BERT fixture (tests/fixtures/models/tiny-bert, experiments/
export_fixtures.py), not committed: layer 1's nodes are cloned for layers
2..L-1 (every value a layer computes renamed per copy, each copy reading the
previous one's output, the shared mask and weights kept), the last copy
writing the graph output the pooler reads.  The result is checked by the
ONNX checker and run once in onnxruntime.  The import time is quoted against
the 2-layer file's, measured in the same process (median of REPEATS).

Reproduce:  .venv/bin/python experiments/bench_import.py [--layers 2,6,12,24]
Writes artifacts/bench_import.txt.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.common import ARTIFACTS, publish, setup
from tilecommon.tables import table

FIXTURE = (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "models" / "tiny-bert"
           / "model.torchscript.onnx")
LAYER = "/model/encoder/layer.1/"
REPEATS = 3


def deepen(layers: int, out: Path) -> Path:
    """The fixture with `layers` encoder layers (module docstring)."""
    import copy

    import onnx

    model = onnx.load(str(FIXTURE))
    nodes = list(model.graph.node)
    mine = [n for n in nodes if n.name.startswith(LAYER)]
    made = {o for n in mine for o in n.output} - {""}
    last = next(n for n in mine if n.name == f"{LAYER}output/LayerNorm/LayerNormalization")
    final = last.output[0]  # the graph output the pooler reads
    first_in = next(n for n in mine if n.op_type == "MatMul").input[0]  # layer 0's output
    renamed = {final: "hidden@1"}
    for n in nodes:  # layer 1 now writes hidden@1
        n.output[:] = [renamed.get(o, o) for o in n.output]
        if n.name.startswith(LAYER):
            n.input[:] = [renamed.get(i, i) for i in n.input]
    clones: list[Any] = []
    prev = "hidden@1"
    for k in range(2, layers):
        for n in mine:
            c = copy.deepcopy(n)
            c.name = f"{n.name}@{k}"
            c.input[:] = [prev if i == first_in else f"{i}@{k}" if i in made else i
                          for i in n.input]
            c.output[:] = [f"hidden@{k}" if o == "hidden@1" else f"{o}@{k}" for o in n.output]
            clones.append(c)
        prev = f"hidden@{k}"
    if layers > 2:  # the last copy writes the graph output
        for c in clones:
            c.output[:] = [final if o == prev else o for o in c.output]
    else:
        for n in nodes:
            n.output[:] = [final if o == "hidden@1" else o for o in n.output]
            n.input[:] = [final if i == "hidden@1" else i for i in n.input]
    cut = max(i for i, n in enumerate(nodes) if n.name.startswith(LAYER)) + 1
    del model.graph.node[:]
    model.graph.node.extend(nodes[:cut] + clones + nodes[cut:])
    onnx.checker.check_model(model)
    path = out / f"bert-{layers}.onnx"
    onnx.save(model, str(path))
    return path


def _median(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> str:
    import numpy as np
    import onnxruntime as ort

    from planner.ir import onnx_import

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="2,6,12,24")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--out-dir", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    setup()
    depths = [int(x) for x in args.layers.split(",")]
    rows = []
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for depth in depths:
            path = deepen(depth, Path(tmp))
            feed = {"input_ids": np.zeros((1, 32), np.int64),
                    "attention_mask": np.ones((1, 32), np.int64)}
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)

            def once(path: Path = path) -> Any:
                onnx_import._import.cache_clear()
                return onnx_import.onnx_model(path)

            got = once()
            assert got.table["layers"] == depth, got.table
            secs = _median(once, args.repeats)
            base = base or secs
            rows.append((depth, f"{path.stat().st_size / 1e6:.2f}", len(got.provenance),
                         f"{secs:.3f}", f"{secs / base:.1f}", f"{secs / depth * 1e3:.1f}"))
    text = ("ONNX import of the tiny BERT deepened (checker, shape inference, recognition, "
            f"weights), median of {args.repeats}; target: 24 layers < 5 s\n"
            + table(("layers", "MB", "parts", "import s", f"x {depths[0]} layers",
                     "ms per layer"), rows))
    print(text)
    publish("bench_import", "ONNX import time by depth", text, args.out_dir)
    return text


if __name__ == "__main__":
    main()
