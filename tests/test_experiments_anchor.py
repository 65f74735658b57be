"""experiments/hardware_anchor.py: the published rows come from the repo's
measurements by id, and our row of a small MAP model has real numbers."""

from __future__ import annotations

from pathlib import Path

import planner
from experiments.hardware_anchor import COLUMNS, main, published

MICRO = (Path(planner.__file__).parent / "ir" / "zoo" / "vit-micro.toml").read_text()


def test_published_rows_read_the_dataset() -> None:
    b1, sdk = published(("vit27-b1-best-0913", "sdk-model-fp8-cycles"))
    assert b1[2] == "10,088,124" and b1[5] == f"{10088124 // 27:,}" and b1[1] == 1
    assert sdk[2] == "17,804,824"
    (b2,) = published(("vit27-b2-qkfp8-search",))
    assert b2[2] == "16,065,444" and b2[-1] == "0.994154827"  # the run's noted cosine


def test_a_micro_map_model_row(tmp_path: Path) -> None:
    model = tmp_path / "m.toml"
    model.write_text(MICRO.replace('name = "vit-micro"', 'name = "m"') + 'pool = "map"\n')
    text = main(["--model", str(model), "--device", "tiny", "--layers", "2", "--batches", "2",
                 "--steps", "1"], out_dir=tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("ours"))
    cells = line.split()
    assert len(cells) == len(COLUMNS) + 4  # "ours (1 steps)" and "0.9xxx (1 layer)" split
    cycles = int(cells[4].replace(",", ""))
    assert cycles > 0 and int(cells[7].replace(",", "")) == cycles // 2
    assert float(cells[-3]) > 0.99  # cosine to fp32 of the 1-layer run
    shares = [float(c.rstrip("%")) for c in cells[8:12]]
    assert abs(sum(shares) - 100) < 0.5  # compute + exchange + sync + loop
    assert (tmp_path / "hardware_anchor.txt").read_text().startswith("run")
    # where the cycles went: the families' cycles add up to the run's, and the tau line
    fam = [x.split() for x in text.split("where the cycles went")[1].splitlines()[2:]
           if x.split() and x.split()[0] == "2"]
    assert {"MatMul", "LayerNorm"} <= {f[1] for f in fam}
    per_layer = sum(int(f[3].replace(",", "")) for f in fam)
    assert abs(per_layer - cycles // 2) <= len(fam)  # integer division per family
    for f in fam:
        assert int(f[3].replace(",", "")) >= sum(int(c.replace(",", "")) for c in f[4:7]) - 2
    assert "Kendall tau-b" in text
