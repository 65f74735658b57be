"""tileplan sweep: the same rows on local processes and on a real Dask
LocalCluster; a case that does not fit is a row with its stage; --resume
finishes an interrupted sweep without re-running or duplicating a case; a
malformed sweep TOML is one line naming the field, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.sweep import RESULTS_FILE, case_key, load_sweep, read_rows, run_sweep
from tilecommon.errors import ConfigError

SWEEP = """
[sweep]
name = "micro"
model = ["vit-micro"]
device = ["tiny"]
layers = [1, 2]
optimization_steps = [0, 1]
numerics = [false]
metrics = ["cycles", "baseline_cycles"]

[plot]
metric = "cycles"
axis = "layers"
"""


def _write(tmp: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def _by_key(rows: list[dict]) -> dict[str, tuple]:
    return {r["key"]: (r["status"], r.get("package_hash"), r.get("cycles")) for r in rows}


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("sweep")
    sweep = load_sweep(_write(tmp, SWEEP))
    res = run_sweep(sweep, tmp / "local", executor="local", workers=2, progress=False)
    return tmp, res.rows


def test_local_sweep_rows_and_files(local_rows: tuple[Path, list[dict]]) -> None:
    tmp, rows = local_rows
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert len({r["package_hash"] for r in rows}) == 4
    one = {(r["layers"], r["optimization_steps"]): r for r in rows}
    assert one[(2, 0)]["cycles"] > one[(1, 0)]["cycles"]
    assert one[(1, 1)]["cycles"] <= one[(1, 0)]["cycles"]  # the optimizer never loses
    csv = (tmp / "local" / "results.csv").read_text().splitlines()
    assert len(csv) == 5 and csv[0].startswith("model,device,layers")
    assert (tmp / "local" / "cycles-vs-layers.png").stat().st_size > 1000


def test_dask_local_cluster_gives_identical_rows(local_rows: tuple[Path, list[dict]]) -> None:
    tmp, rows = local_rows
    sweep = load_sweep(tmp / "s.toml")
    res = run_sweep(sweep, tmp / "dask", executor="dask", workers=2, progress=False)
    assert _by_key(res.rows) == _by_key(rows)


def test_a_case_that_does_not_fit_is_a_row_with_its_stage(tmp_path: Path) -> None:
    _write(tmp_path, 'name = "small"\nbase = "tiny"\nmemory_size = 8192\n'
           'element_bytes = 4096\n', "small.toml")
    sweep = load_sweep(_write(tmp_path, SWEEP.replace('device = ["tiny"]',
                                                      'device = ["small.toml"]')
                              .replace("layers = [1, 2]", "layers = [1]")
                              .replace("optimization_steps = [0, 1]", "optimization_steps = [0]")))
    res = run_sweep(sweep, tmp_path / "out", workers=1, progress=False)
    (row,) = res.rows
    assert row["status"] == "build-failure" and res.failures == 0
    assert row["stage"] in ("lower", "expand", "schedule", "allocate", "link")
    assert row["need"] > row["have"] >= 0 and row["tile"] >= -1


def test_resume_finishes_without_rerunning_or_duplicating(tmp_path: Path) -> None:
    sweep = load_sweep(_write(tmp_path, SWEEP))
    out = tmp_path / "out"
    first = run_sweep(sweep, out, workers=2, progress=False)
    # a results file torn mid-line is refused with the line, not trusted
    lines = (out / RESULTS_FILE).read_text().splitlines()
    (out / RESULTS_FILE).write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    with pytest.raises(ConfigError, match=r"results.jsonl:3.*not JSON"):
        read_rows(out)
    # an interrupted sweep: two rows written
    (out / RESULTS_FILE).write_text("\n".join(lines[:2]) + "\n")
    kept = {r["key"]: r for r in read_rows(out)}
    assert len(kept) == 2
    with pytest.raises(Exception, match="--resume"):
        run_sweep(sweep, out, workers=1, progress=False)
    again = run_sweep(sweep, out, workers=2, resume=True, progress=False)
    assert again.ran == 2
    keys = [r["key"] for r in read_rows(out)]
    assert sorted(keys) == sorted(case_key(c) for c in sweep.cases)  # each once
    for r in read_rows(out):
        if r["key"] in kept:
            assert r == kept[r["key"]]  # not run again
    assert _by_key(again.rows) == _by_key(first.rows)
    assert run_sweep(sweep, out, resume=True, progress=False).ran == 0


@pytest.mark.parametrize("text, field", [
    ('[sweep]\nlayers = 2\n', "sweep.layers"),
    ('[sweep]\nlayers = [1, "two"]\n', "sweep.layers"),
    ('[sweep]\ndevices = ["c600"]\n', "sweep.devices"),
    ('[sweep]\nnumerics = [1]\n', "sweep.numerics"),
    ('[[case]]\nmodel = "vit-tiny"\nbatchsize = 2\n', "case[0].batchsize"),
    ('[plot]\nmetric = "cycles"\naxis = "tiles"\n', "plot.axis"),
    ('[sweep\n', "toml"),
    ('', "sweep"),  # an empty grid
    ('[sweep]\nlayers = [0]\n', "sweep.layers"),
    ('[sweep]\nbatch = [0]\n', "sweep.batch"),
    ('[sweep]\nmodel = ["no-such-model"]\n', "sweep.model"),
    ('[sweep]\nmodel = ["vit-micro"]\nbaseline = ["greedy"]\n', "sweep.baseline policy"),
    ('[sweep]\nmodel = ["vit-micro"]\noptimizer = ["annealing"]\n', "sweep.optimizer"),
    ('[sweep]\nmodel = ["vit-micro"]\nmetrics = ["speed"]\n', "sweep.metrics"),
    ('[sweep]\nmodel = ["vit-micro"]\n[plot]\nmetric = "model"\naxis = "layers"\n',
     "plot.metric"),
    ('[sweep]\nmodel = ["vit-micro"]\n[plot]\nmetric = "cycles"\naxis = "device.tiles"\n',
     "plot.axis"),
    ('[sweep]\nmodel = ["vit-micro"]\n"device.stripes" = [2]\n', "sweep.device.stripes"),
    ('[sweep]\nmodel = ["vit-micro"]\n"device.tiles" = [0]\n', "sweep.tiles"),
    ('[sweep]\nmodel = ["vit-micro"]\n"device.memory_size" = ["big"]\n',
     "sweep.device.memory_size"),
])
def test_malformed_sweep_exits_2_naming_the_field(text: str, field: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["sweep", str(_write(tmp_path, text)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err, err
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("edit, field", [
    (lambda r: {k: v for k, v in r.items() if k != "status"}, "status"),
    (lambda r: {**r, "cycles": -5}, "cycles"),
    (lambda r: {**r, "cycles": "many"}, "cycles"),
    (lambda r: {**r, "layers": "two"}, "layers"),
    (lambda r: {**r, "key": "not-a-key"}, "key"),
    (lambda r: [r], "row"),
])
def test_resume_refuses_rows_edited_by_hand(local_rows: tuple[Path, list[dict]], tmp_path: Path,
                                            edit, field: str,  # noqa: ANN001
                                            capsys: pytest.CaptureFixture[str]) -> None:
    tmp, rows = local_rows
    out = tmp_path / "out"
    out.mkdir()
    lines = [json.dumps(r, sort_keys=True) for r in rows]
    lines[1] = json.dumps(edit(rows[1]))
    (out / RESULTS_FILE).write_text("\n".join(lines) + "\n")
    assert main(["sweep", str(tmp / "s.toml"), "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results.jsonl:2" in err and f"'{field}'" in err, err
    (out / RESULTS_FILE).write_bytes(b"\n".join(x.encode() for x in lines[:1]) + b"\n\xff\xfe\n")
    assert main(["sweep", str(tmp / "s.toml"), "--out", str(out), "--resume"]) == 2
    assert "results.jsonl:2" in capsys.readouterr().err


def test_resume_keeps_another_sweeps_rows_and_one_dir_one_sweep(
        local_rows: tuple[Path, list[dict]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    tmp, rows = local_rows
    out = tmp_path / "out"
    out.mkdir()
    (out / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    other = _write(tmp, SWEEP.replace("layers = [1, 2]", "layers = [3]"), "other.toml")
    assert main(["sweep", str(other), "--out", str(out), "--resume"]) == 2
    assert "another sweep" in capsys.readouterr().err
    assert len(read_rows(out)) == len(rows)  # nothing dropped
    with open(out / ".lock", "a+") as f:  # a sweep running into the same --out
        fcntl.flock(f, fcntl.LOCK_EX)
        assert main(["sweep", str(tmp / "s.toml"), "--out", str(out), "--resume"]) == 2
        assert "in use by another sweep" in capsys.readouterr().err


def test_a_sweep_over_device_fields_runs_and_plots(tmp_path: Path) -> None:
    """device.memory_size and device.tiles as axes: chips that do not exist."""
    text = (SWEEP.replace('layers = [1, 2]', 'layers = [1]')
            .replace('optimization_steps = [0, 1]', 'optimization_steps = [0]')
            .replace('axis = "layers"', 'axis = "device.tiles"')
            + '')
    text = text.replace('[plot]', '"device.memory_size" = [98304, 196608]\n'
                                  '"device.tiles" = [8, 16]\n\n[plot]')
    sweep = load_sweep(_write(tmp_path, text))
    res = run_sweep(sweep, tmp_path / "out", workers=2, progress=False)
    assert len(res.rows) == 4 and all(r["status"] == "ok" for r in res.rows)
    by = {(r["device.memory_size"], r["device.tiles"]): r for r in res.rows}
    assert by[(98304, 8)]["device"] == "tiny"
    assert by[(98304, 8)]["cycles"] != by[(98304, 16)]["cycles"]  # the chip changed
    assert (tmp_path / "out" / "cycles-vs-device.tiles.png").stat().st_size > 1000
    assert "device.tiles" in (tmp_path / "out" / "results.csv").read_text().splitlines()[0]


def test_cli_json_and_table(local_rows: tuple[Path, list[dict]], tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    tmp, rows = local_rows
    assert main(["sweep", str(tmp / "s.toml"), "--out", str(tmp_path / "o"), "--workers",
                 "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert _by_key(got["rows"]) == _by_key(rows)
    assert main(["sweep", str(tmp / "s.toml"), "--out", str(tmp_path / "o"), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "sweep micro: 4 cases (0 run now, 4 finished before)" in out
    assert out.splitlines()[0].split()[:4] == ["layers", "optimization_steps", "status", "cycles"]


def test_ctrl_c_then_resume(tmp_path: Path) -> None:
    """A real interrupt: SIGINT to `tileplan sweep` once a row is written; the
    run exits 130 and --resume finishes the rest, each case once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    # a dozen cases, numerics on: still running when the first row is written
    text = (SWEEP.replace("layers = [1, 2]", "layers = [1, 2, 3, 4]")
            .replace("optimization_steps = [0, 1]", "optimization_steps = [0, 1, 2]")
            .replace("numerics = [false]", "numerics = [true]"))
    path = _write(tmp_path, text)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "planner.cli", "sweep", str(path), "--out", str(out),
           "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not read_rows(out) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    # the workers got the Ctrl-C too: they ignore it and are stopped quietly
    assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    before = {r["key"]: r for r in read_rows(out)}
    assert 1 <= len(before) < 12
    assert main(["sweep", str(path), "--out", str(out), "--resume", "--json"]) == 0
    rows = read_rows(out)
    assert sorted(r["key"] for r in rows) == sorted(case_key(c) for c in load_sweep(path).cases)
    for r in rows:
        if r["key"] in before:
            assert r == before[r["key"]]


def test_sigterm_stops_the_workers_too(tmp_path: Path) -> None:
    """SIGTERM to `tileplan sweep` (the main process only, as a scheduler
    would send it): exit 143, its worker processes gone, the rows written so
    far whole."""
    import os
    import signal
    import subprocess
    import sys
    import time

    text = (SWEEP.replace("layers = [1, 2]", "layers = [1, 2, 3, 4]")
            .replace("optimization_steps = [0, 1]", "optimization_steps = [0, 1, 2]")
            .replace("numerics = [false]", "numerics = [true]"))
    path = _write(tmp_path, text)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "sweep", str(path), "--out",
                             str(out), "--workers", "2"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    children: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        if kids.exists():
            children |= {int(p) for p in kids.read_text().split()}
        if len(children) >= 2 and read_rows(out):
            break
        time.sleep(0.05)
    assert proc.poll() is None and children, "the sweep finished before the signal"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert "terminated" in err and "Traceback" not in err  # workers stopped quietly
    time.sleep(0.5)
    alive = []
    for pid in children:
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text().split()
            if stat[2] != "Z":
                alive.append(pid)
        except (ProcessLookupError, FileNotFoundError):
            pass
    assert alive == []
    assert read_rows(out)  # the finished rows are kept


def test_constraints_as_a_sweep_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    """A constraints file per case (relative to the sweep file): the pinned recipe is
    in the case's plan; a bad pin fails the sweep up front, nothing written."""
    (tmp_path / "pin.toml").write_text('[recipes]\n"encoder/mm_fc1" = "mm:1x1x1"\n')
    text = ('[sweep]\nmodel = ["vit-micro"]\ndevice = ["tiny"]\noptimization_steps = [0]\n'
            'numerics = [false]\nconstraints = ["pin.toml"]\n')
    res = run_sweep(load_sweep(_write(tmp_path, text)), tmp_path / "out", workers=1,
                    progress=False)
    (row,) = res.rows
    assert row["status"] == "ok" and row["constraints"] == str(tmp_path / "pin.toml")
    free = run_sweep(load_sweep(_write(tmp_path, text.replace('constraints = ["pin.toml"]\n',
                                                              ""), "free.toml")),
                     tmp_path / "free", workers=1, progress=False)
    assert free.rows[0]["cycles"] != row["cycles"]  # one tile's fc1 is another plan
    (tmp_path / "bad.toml").write_text('[recipes]\n"encoder/mm_nope" = "mm:1x1x1"\n')
    out = tmp_path / "bad-out"
    assert main(["sweep", str(_write(tmp_path, text.replace("pin.toml", "bad.toml"),
                                     "b.toml")), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "encoder/mm_nope" in err and not out.exists()
