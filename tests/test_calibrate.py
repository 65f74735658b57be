"""Calibration: the fit recovers known constants, the shipped c600 is the fit of
the shipped measurements (a fixed point, within the stated error bounds), and
every kind of bad measurements file is a typed error; `tileplan calibrate`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from planner.cli import main
from simulator.calibrate import calibrate, format_report
from simulator.cost import kernel_cycles
from simulator.device import COST_FIELDS, load_device
from simulator.measurements import read_file, select
from tilecommon.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "simulator" / "calibration" / "ipu21.toml"
C600 = load_device("c600")


@pytest.fixture(scope="module")
def shipped():  # noqa: ANN201
    return calibrate(read_file(DATASET), C600)


def test_c600_is_the_fit_of_the_shipped_measurements(shipped) -> None:  # noqa: ANN001
    """Fitting the dataset from c600 changes nothing: the preset is the fit."""
    assert shipped.device.costs == C600.costs
    assert all(c.before == c.after for c in shipped.changes)
    assert {c.how.split(" ")[0] for c in shipped.changes} >= {"fitted", "fact:", "kept"}


def test_checked_families_within_the_stated_bounds(shipped) -> None:  # noqa: ANN001
    n, med, mx = shipped.checked_errors("fit")
    assert n >= 25 and med <= 0.03 and mx <= 0.10
    hn, hmed, hmx = shipped.checked_errors("holdout")
    assert hn >= 4 and hmx <= 0.05  # measurements not fitted to land within 5%
    fams = shipped.family_errors("fit")
    for fam in ("MATMUL", "REDUCE", "GELU", "LAYERNORM", "ADD", "SOFTMAX"):
        assert fam in fams, fam
    # the GEMM, reduction and GELU hardware tables are all used
    used = {r.m.id for r in shipped.rows}
    assert {"hw-gemm-f16-r184-k288-c48", "hw-reduce-1472-p2", "hw-gelu-2",
            "fit-gelu-kernelcost-v2[94]", "ln-1152-pipe", "add-1152-pipe",
            "softmax-seg-729-pipe"} <= used


def test_skipped_entries_say_why(shipped) -> None:  # noqa: ANN001
    why = {s.id: s.reason for s in shipped.skipped}
    assert "no kernel of ours" in why["biasgelu-1x1408"]
    assert "packed" in why["gemm-packed-r128-k64-c64"]
    assert "earlier" in why["softmax-17x729"]
    assert "tiles" in why["add-final-288tiles"]
    assert "superseded" in why["fit-gelu-kernelcost-v1[16]"]
    assert "needs" in why["qk-gemm-fp8"]


def test_calibration_moves_the_issue_geometries_onto_the_hardware() -> None:
    """The first model against IPU21 (the table the calibration started from)."""
    ideal = load_device("c600-ideal")
    cases = [("MATMUL", dict(M=184, K=288, N=48, in_dtype="fp16", out_dtype="fp16"), 48654),
             ("MATMUL", dict(M=120, K=80, N=272, in_dtype="fp16", out_dtype="fp16"), 55344),
             ("MATMUL", dict(M=146, K=576, N=32, in_dtype="fp16", out_dtype="fp16"), 53718),
             ("REDUCE", dict(M=1, N=1472, k=2), 2700), ("REDUCE", dict(M=1, N=576, k=15), 3090),
             ("LAYERNORM", dict(M=1, N=1152), 6732), ("GELU", dict(M=1, N=2208), 10956),
             ("ADD", dict(M=1, N=1152), 1368)]
    for kernel, args, hw in cases:
        cal = kernel_cycles(C600, kernel, **args)
        assert abs(cal - hw) / hw < 0.03, (kernel, args, cal, hw)
        first = kernel_cycles(ideal, kernel, **args)
        assert abs(first - hw) / hw > abs(cal - hw) / hw, (kernel, args)


def _write(path: Path, entries: list[dict]) -> Path:
    lines = []
    for e in entries:
        lines.append("[[measurement]]")
        for k, v in e.items():
            text = json.dumps(v)
            lines.append(f"{k} = {dict(Infinity='inf', NaN='nan').get(text, text)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def test_fit_recovers_known_constants_from_synthetic_measurements(tmp_path: Path) -> None:
    """Measurements made by a device with known constants, fitted from c600:
    the fitted constants are the known ones."""
    truth = C600.with_costs(mm_call=250, mm_panel=190, mm_row=5, mm_min_rows=11,
                            reduce_call=300, reduce_chunk=13, reduce_partial=3,
                            gelu_call=350, gelu_block=500, ln_row=1500, ln_chunk=90)
    rng = np.random.default_rng(7)
    entries = []
    for i in range(16):  # rows on both sides of the AMP's minimum
        m, k, n = (int(rng.integers(2, 10 if i % 3 == 0 else 200)), int(rng.integers(16, 600)),
                   int(rng.integers(16, 300)))
        entries.append(dict(id=f"mm{i}", kind="kernel", op="gemm", R=m, K=k, C=n,
                            dtype_in="fp16", dtype_out="fp16", what="synthetic",
                            cycles=kernel_cycles(truth, "MATMUL", M=m, K=k, N=n,
                                                 in_dtype="fp16", out_dtype="fp16")))
    for i in range(10):
        c, p = int(rng.integers(8, 3000)), int(rng.integers(2, 16))
        entries.append(dict(id=f"red{i}", kind="kernel", op="reduce_add", K=p, C=c,
                            what="synthetic", cycles=kernel_cycles(truth, "REDUCE", M=1,
                                                                   N=c, k=p)))
    for i, c in enumerate((96, 480, 960, 1920, 2880, 4800, 16, 32)):
        entries.append(dict(id=f"gelu{i}", kind="kernel", op="gelu", C=c, what="synthetic",
                            cycles=kernel_cycles(truth, "GELU", M=1, N=c)))
    for i, (r, c) in enumerate(((1, 1152), (3, 1152), (1, 384), (2, 768), (4, 192))):
        entries.append(dict(id=f"ln{i}", kind="kernel", op="layernorm", R=r, C=c,
                            what="synthetic", cycles=kernel_cycles(truth, "LAYERNORM", M=r, N=c)))
    cal = calibrate(read_file(_write(tmp_path / "m.toml", entries)), C600)
    got = cal.device.costs
    for f in ("mm_call", "mm_panel", "mm_row", "mm_min_rows", "reduce_call", "reduce_chunk",
              "reduce_partial", "gelu_call", "gelu_block", "ln_row", "ln_chunk"):
        assert getattr(got, f) == getattr(truth.costs, f), f
    assert cal.checked_errors("fit")[2] == 0.0 and cal.checked_errors("holdout")[2] == 0.0
    # what no measurement touches is kept
    assert got.softmax_panel == C600.costs.softmax_panel


@pytest.mark.parametrize("entry, field, message", [
    ({"kind": "kernel", "op": "gemm"}, "id", "missing"),
    ({"id": "a", "op": "gemm"}, "kind", "missing"),
    ({"id": "a", "kind": "kernel", "cycles": 0}, "cycles", "integer in"),
    ({"id": "a", "kind": "kernel", "cycles": -5}, "cycles", "integer in"),
    ({"id": "a", "kind": "kernel", "cycles": "many"}, "cycles", "integer in"),
    ({"id": "a", "kind": "kernel", "cycles": 2 ** 62}, "cycles", "integer in"),
    ({"id": "a", "kind": "kernel", "R": 2.5}, "R", "integer in"),
    ({"id": "a", "kind": "kernel", "C": 2 ** 40}, "C", "per tile"),
    ({"id": "a", "kind": "kernel", "K": 0}, "K", "integer in"),
    ({"id": "a", "kind": "kernel", "value": float("inf")}, "value", "finite"),
    ({"id": "a", "kind": "kernel", "value": float("nan")}, "value", "finite"),
    ({"id": "a", "kind": "exchange", "unit": "percent_useful_efficiency", "value": 140.0},
     "value", "efficiency"),
    ({"id": "a", "kind": "exchange", "unit": "percent_useful_efficiency", "value": 0},
     "value", "efficiency"),
    ({"id": "a", "kind": "kernel", "dtype_in": "fp4"}, "dtype_in", "one of"),
    ({"id": "a", "kind": "kernel", "date": "13 Sept"}, "date", "YYYY-MM-DD"),
    ({"id": "a", "kind": 3}, "kind", "string"),
])
def test_bad_entries_name_file_entry_and_field(tmp_path: Path, entry: dict, field: str,
                                               message: str) -> None:
    path = _write(tmp_path / "bad.toml", [dict(id="ok", kind="kernel", op="gemm"), entry])
    with pytest.raises(ConfigError, match=message) as info:
        read_file(path)
    assert info.value.field == field and str(path) in info.value.source
    if "id" in entry:
        assert "'a'" in info.value.source


def test_bad_files(tmp_path: Path) -> None:
    for text, field in (("[[measurement]\n", "toml"), ("x = 1\n", "measurement"),
                        ('measurement = "no"\n', "measurement")):
        path = tmp_path / "f.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            read_file(path)
        assert info.value.field == field
    dup = _write(tmp_path / "dup.toml", [dict(id="a", kind="fit"), dict(id="a", kind="fit")])
    with pytest.raises(ConfigError, match="duplicate"):
        read_file(dup)
    with pytest.raises(ConfigError, match="not found"):
        read_file(tmp_path / "absent.toml")


def test_selection_keeps_one_measurement_per_call() -> None:
    ms, _ = select(read_file(DATASET), 64, 128)
    keys = [m.key for m in ms]
    assert len(keys) == len(set(keys))


def test_cli_calibrate_writes_a_loadable_device_and_plot(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    out, png = tmp_path / "cal.toml", tmp_path / "cal.png"
    assert main(["calibrate", str(DATASET), "--out", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "checked families" in text and "skipped entry" in text and "hw-gemm" in text
    dev = load_device(out)
    assert dev.name == "cal" and dev.costs == C600.costs
    assert "tileplan calibrate" in out.read_text().splitlines()[1]
    assert png.stat().st_size > 10_000
    assert main(["devices", str(out)]) == 0
    assert "mm_panel" in capsys.readouterr().out
    assert main(["calibrate", str(DATASET), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checked"]["max_abs_error"] <= 0.10 and doc["skipped"]
    assert {r["role"] for r in doc["rows"]} == {"fit", "holdout"}


def test_cli_calibrate_bad_input_exits_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = _write(tmp_path / "bad.toml", [dict(id="x1", kind="kernel", cycles=-1)])
    assert main(["calibrate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x1" in err and "'cycles'" in err
    assert main(["calibrate", str(DATASET), "--out", str(tmp_path / "no" / "x.toml")]) == 2
    assert "directory does not exist" in capsys.readouterr().err


def test_too_few_points_leave_constants_unidentified(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Two GELU calls cannot pin GELU's constants and one held-out point: the report
    and the device both say so, and a file without a `Source:` header claims no source."""
    entries = [dict(id=f"g{c}", kind="kernel", op="gelu", C=c, what="mine",
                    cycles=kernel_cycles(C600, "GELU", M=1, N=c) + 7 * i)
               for i, c in enumerate((96, 960, 4800))]
    cal = calibrate(read_file(_write(tmp_path / "m.toml", entries)), C600)
    assert cal.unidentified["GELU"][0] < cal.unidentified["GELU"][1]
    assert "unidentified" in format_report(cal, "m.toml")
    assert any("unidentified" in c.how for c in cal.changes if c.name.startswith("gelu"))
    out = tmp_path / "mine.toml"
    assert main(["calibrate", str(tmp_path / "m.toml"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "unidentified" in text and "names no public source" in text
    assert "osmarks" not in text
    capsys.readouterr()
    shipped = tmp_path / "shipped.toml"
    assert main(["calibrate", str(DATASET), "--out", str(shipped)]) == 0
    assert "header names their source: the public GitHub repository" in shipped.read_text()


def test_every_cost_field_documented() -> None:
    from simulator.device import COST_DOCS

    assert set(COST_DOCS) == set(COST_FIELDS)
    assert all(COST_DOCS[f] for f in COST_FIELDS)


def test_c600_preset_cites_its_sources() -> None:
    text = (ROOT / "simulator" / "devices" / "c600.toml").read_text()
    assert "tileplan calibrate" in text and "fitted (" in text and "fact:" in text
    for line in text.splitlines():
        if line.startswith("mm_panel"):
            assert int(line.split("=")[1]) == C600.costs.mm_panel
    assert math.isclose(C600.clock_hz, 1.5e9)
