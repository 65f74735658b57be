"""Hostile inputs at the command line: every one ends in one line and the
right exit status, before any work where the input is a path to write; run
directories are whole or absent; Ctrl-C and closed pipes end quietly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import planner
import simulator
from planner import pipeline
from planner import report as report_mod
from planner.cli import main
from simulator.hardware import HardwareResult, save_hardware_result
from simulator.testing import ksplit_matmul
from tilecommon.errors import ConfigError, HardwareResultInvalid

ROOT = Path(__file__).resolve().parents[1]
TILEPLAN = [sys.executable, "-m", "planner"]


def _one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tileplan: error: "), err
    for w in words:
        assert w in err[0], (w, err[0])
    return err[0]


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pkg = ksplit_matmul(simulator.load_device("tiny"))[0]
    return simulator.save_package(pkg, tmp_path_factory.mktemp("pkg") / "p")


@pytest.mark.parametrize("argv, words", [
    (["reference", "vit-micro", "--seed", "-1"], ["--seed", ">= 0", "-1"]),
    (["run", "vit-micro", "--layers", "0"], ["--layers", ">= 1"]),
    (["run", "vit-micro", "--optimization-steps", "x"], ["not an integer"]),
    (["crosscheck", "p", "h", "--cycle-tolerance", "nan"], ["--cycle-tolerance", "finite"]),
    (["crosscheck", "p", "h", "--rel-fro-tolerance", "-1"], ["finite number >= 0"]),
])
def test_numbers_are_checked_where_parsed(argv: list[str], words: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    _one_line_error(capsys, *words)


def test_simulate_seed_and_trace_path(package_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(package_dir), "--seed", "-1"]) == 2
    _one_line_error(capsys, "--seed")
    missing = tmp_path / "no" / "such" / "trace.json"
    assert main(["simulate", str(package_dir), "--trace", str(missing)]) == 2
    _one_line_error(capsys, "--trace", "directory does not exist")
    assert not (tmp_path / "no").exists()  # nothing created
    assert main(["simulate", str(package_dir), "--trace", str(tmp_path)]) == 2
    _one_line_error(capsys, "is a directory")


def test_bad_out_is_refused_before_planning(micro_toml: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def never(*a: object, **k: object) -> None:
        raise AssertionError("planned before checking --out")

    monkeypatch.setattr(pipeline, "plan", never)
    afile = tmp_path / "afile"
    afile.write_text("x")
    other = tmp_path / "other"
    (other / "keep").mkdir(parents=True)
    for out, words in ((tmp_path / "no" / "dir", "parent directory does not exist"),
                       (afile, "not a directory"), (other, "not a run directory")):
        assert main(["run", str(micro_toml), "--device", "tiny", "--out", str(out)]) == 2
        _one_line_error(capsys, "--out", words)
    assert (other / "keep").is_dir()


def test_run_directory_is_whole_or_old(micro_toml: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    args = ["run", str(micro_toml), "--device", "tiny", "--optimization-steps", "0",
            "--no-numerics", "--out", str(out)]
    assert main(args) == 0
    first = json.loads((out / "summary.json").read_text())
    assert simulator.load_package(out / "package").content_hash() == first["package_hash"]
    real = report_mod.write_file_atomic
    calls = []

    def interrupted(path, write, mode="w"):  # type: ignore[no-untyped-def]
        calls.append(path)
        raise KeyboardInterrupt  # Ctrl-C after the new package, before its summary

    monkeypatch.setattr(report_mod, "write_file_atomic", interrupted)
    assert main([*args[:-3], "--optimization-steps", "1", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "tileplan: interrupted"
    assert calls  # the interrupt came while the new run was being written
    monkeypatch.setattr(report_mod, "write_file_atomic", real)
    again = json.loads((out / "summary.json").read_text())
    assert again == first  # the old run, whole
    assert simulator.load_package(out / "package").content_hash() == first["package_hash"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no stray temp dirs
    assert main(["report", str(out)]) == 0


def test_report_of_minimal_and_mistyped_summaries(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    minimal = {k: 0 for k in report_mod.SUMMARY_KEYS}
    minimal.update(model="m", device="d", package_hash="h" * 64, max_abs_error=None,
                   rel_fro_error=None, layers=1, batch=1)
    path = tmp_path / "hand-made.json"  # not summary.json: conftest checks those
    path.write_text(json.dumps(minimal))
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model m (1 layer, batch 1) on d" in out and "numerics         not computed" in out
    for key, bad, field in (
            ("cycles", "many", "cycles"), ("cycles", True, "cycles"), ("cycles", -3, "cycles"),
            ("faults", "none", "faults"), ("numerics_ok", 3, "numerics_ok"),
            ("layers", 0, "layers"), ("model", ["m"], "model"),
            ("stage_seconds", {"expand": "slow"}, "stage_seconds.expand"),
            ("peak_tile", {"tile": "zero"}, "peak_tile.tile"),
            ("ops", [{"op": "a", "family": "f", "cycles": -1}], "ops.0.cycles"),
            ("ops", [{"op": "a", "cycles": 1}], "ops.0"),
            ("ops", {"op": "a"}, "ops"),
            ("casts", {"t": {"saturated": 2}}, "casts.t.saturated"),
            ("cycle_totals", {"compute": 1.5}, "cycle_totals.compute"),
            ("tile_busy", {"max": "x"}, "tile_busy.max")):
        path.write_text(json.dumps({**minimal, key: bad}))
        assert main(["report", str(path)]) == 2, (key, bad)
        _one_line_error(capsys, str(path), field)


def test_bad_model_and_device_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    dev = tmp_path / "six.toml"
    dev.write_text('base = "tiny"\nname = "six"\nalignment = 6\n')
    with pytest.raises(ConfigError, match="alignment.*power of two"):
        simulator.load_device(dev)
    fifo = tmp_path / "model.toml"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    assert main(["models", str(fifo)]) == 2
    assert time.perf_counter() - t0 < 5  # refused, not read (a FIFO would block)
    _one_line_error(capsys, "not a regular file")
    assert main(["devices", "/dev/zero"]) == 2
    _one_line_error(capsys, "not a regular file")
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * 300_000)
    assert main(["models", str(big)]) == 2
    _one_line_error(capsys, "larger than")
    monkeypatch.chdir(tmp_path)
    Path("vit-tiny").write_text("not a model")  # a file named like a zoo model
    assert planner.load_model("vit-tiny").name == "vit-tiny"
    assert main(["models", "./vit-tiny"]) == 2  # as a path it is the file
    _one_line_error(capsys, "vit-tiny")


@pytest.mark.parametrize("text, field, words", [
    ('base = "tiny"\nelement_bytes = 1073741824\n', "element_bytes", "fit in memory_size"),
    ('base = "tiny"\nalignment = 6\n', "alignment", "power of two"),
    ('base = "tiny"\nmemory_size = 0\n', "memory_size", ""),
    ('base = "tiny"\ntiles = 0\n', "tiles", ""),
    ('base = "tiny"\n[costs]\nmm_call = -1\n', "mm_call", ""),
    ('base = "self.toml"\n', "base", "circle"),
])
def test_bad_device_fields(tmp_path: Path, text: str, field: str, words: str,
                           capsys: pytest.CaptureFixture[str]) -> None:
    dev = tmp_path / "self.toml"
    dev.write_text(text)
    assert main(["devices", str(dev)]) == 2
    _one_line_error(capsys, str(dev), field, words)


def test_a_long_base_chain_is_refused_not_a_recursion_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d0.toml").write_text('base = "tiny"\n')
    for i in range(1, 400):
        (tmp_path / f"d{i}.toml").write_text(f'base = "d{i - 1}.toml"\n')
    assert main(["devices", str(tmp_path / "d399.toml")]) == 2
    _one_line_error(capsys, "base", "inherit one from another")
    assert simulator.load_device(tmp_path / "d20.toml").tiles == \
        simulator.load_device("tiny").tiles  # a short chain is fine


def test_negative_value_seed_in_a_hardware_result(tmp_path: Path) -> None:
    pkg = ksplit_matmul(simulator.load_device("tiny"))[0]
    path = save_hardware_result(HardwareResult(pkg.content_hash(), "tiny", 10), tmp_path / "h")
    doc = json.loads((path / "hwresult.json").read_text())
    doc["value_seed"] = -1
    (path / "hwresult.json").write_text(json.dumps(doc))
    with pytest.raises(HardwareResultInvalid, match="value_seed.*>= 0"):
        simulator.load_hardware_result(path)


def test_closed_pipe_and_ctrl_c_end_quietly(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([*TILEPLAN, "devices", "c600"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # `| head -1`
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err
    # long enough (27 layers, 8 proposals: tens of seconds) to be interrupted for sure
    slow = subprocess.Popen([*TILEPLAN, "plan", "siglip-so400m-map"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=tmp_path)
    time.sleep(4)
    assert slow.poll() is None, "the plan ended before it could be interrupted"
    slow.send_signal(signal.SIGINT)
    out, err_b = slow.communicate(timeout=120)
    lines = err_b.decode().strip().splitlines()
    assert slow.returncode == 130 and lines[-1] == "tileplan: interrupted", lines
    assert "Traceback" not in err_b.decode()
    assert np.all([not p.name.startswith(".") for p in tmp_path.iterdir()])


@pytest.mark.parametrize("delay", [0.6, 1.2, 2.0, 3.0])
def test_sigterm_at_any_moment_leaves_no_half_written_run(micro_toml: Path, tmp_path: Path,
                                                          delay: float) -> None:
    """SIGTERM while a run plans, simulates or saves over an existing run
    directory: exit 143 (or 0 when it had finished), and the directory holds
    the old run or the new one, whole, with no temporary files beside it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    args = [*TILEPLAN, "run", str(micro_toml), "--device", "tiny", "--quiet", "--out", str(out)]
    assert subprocess.run(args + ["--optimization-steps", "0"], env=env, cwd=tmp_path,
                          capture_output=True).returncode == 0
    first = json.loads((out / "summary.json").read_text())
    proc = subprocess.Popen(args + ["--optimization-steps", "2"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert code in (0, 143) and "Traceback" not in err and "Exception ignored" not in err, err
    now = json.loads((out / "summary.json").read_text())
    assert now == first or code == 0
    assert simulator.load_package(out / "package").content_hash() == now["package_hash"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no .tmp, no .old


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, micro_toml: Path) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["run", str(micro_toml), "--device", "tiny", "--optimization-steps", "0",
                 "--no-numerics", "--quiet", "--out", str(out)]) == 0
    return out


UNWRITABLE = Path("/sys/tileplan-test-output")  # sysfs refuses new files, even to root


def _bad_paths(tmp: Path) -> list[tuple[str, str]]:
    afile = tmp / "afile"
    afile.write_text("x")
    (tmp / "adir").mkdir(exist_ok=True)
    cases = [(str(tmp / "no" / "such" / "x.out"), "does not exist"),
             (str(afile / "x.out"), "not a directory"),
             (str(tmp / "adir"), "directory")]
    if Path("/sys").is_dir():
        cases.append((str(UNWRITABLE), "cannot be written"))
    return cases


@pytest.mark.parametrize("command", ["run --report", "run --out", "simulate --trace",
                                     "report --html", "calibrate --out", "calibrate --plot",
                                     "sweep --out"])
def test_every_output_path_is_checked_before_work(command: str, tmp_path: Path,
                                                  micro_toml: Path, run_dir: Path,
                                                  package_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    name, flag = command.split()
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'[sweep]\nmodel = ["{micro_toml}"]\ndevice = ["tiny"]\n')
    base = {"run": ["run", str(micro_toml), "--device", "tiny", "--optimization-steps", "0",
                    "--no-numerics", "--quiet"],
            "simulate": ["simulate", str(package_dir), "--quiet"],
            "report": ["report", str(run_dir)],
            "calibrate": ["calibrate", str(ROOT / "simulator" / "calibration" / "ipu21.toml")],
            "sweep": ["sweep", str(sweep)]}[name]
    for path, words in _bad_paths(tmp_path):
        if flag == "--out" and name in ("run", "sweep") and words == "directory":
            continue  # an empty directory is a fine output directory
        before = sorted(p.name for p in tmp_path.iterdir())
        assert main([*base, flag, path]) == 2, (command, path)
        _one_line_error(capsys, flag)
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_report_never_writes_over_its_own_run(run_dir: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    summary = (run_dir / "summary.json").read_text()
    for target in (run_dir / "summary.json", run_dir / "package" / "x.html"):
        assert main(["report", str(run_dir), "--html", str(target)]) == 2
        _one_line_error(capsys, "--html", "the run's own")
    assert (run_dir / "summary.json").read_text() == summary


@pytest.mark.parametrize("signal_, code, word", [("term", 143, "terminated"),
                                                 ("int", 130, "interrupted")])
def test_a_signal_wrapped_by_an_import_is_still_the_signal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signal_: str,
        code: int, word: str) -> None:
    """A SIGTERM that lands while a dataclass is made during an import comes
    back as RuntimeError("Error calling __set_name__ ...") from the signal's
    exception: one line and the signal's exit status, no traceback."""
    import argparse

    from planner import cli

    def handler(args: argparse.Namespace) -> int:
        cause = cli.Terminated() if signal_ == "term" else KeyboardInterrupt()
        raise RuntimeError("Error calling __set_name__ on 'Field' instance") from cause

    class Parser:
        def parse_args(self, argv: object) -> argparse.Namespace:
            return argparse.Namespace(handler=handler)

    monkeypatch.setattr(cli, "build_parser", Parser)
    assert cli.main([]) == code
    assert capsys.readouterr().err.strip() == f"tileplan: {word}"

    def other(args: argparse.Namespace) -> int:
        raise RuntimeError("not a signal")

    monkeypatch.setattr(cli, "build_parser", lambda: type(
        "P", (), {"parse_args": lambda self, a: argparse.Namespace(handler=other)})())
    with pytest.raises(RuntimeError, match="not a signal"):
        cli.main([])


def test_signal_inside_native_reentry_is_deferred() -> None:
    """A signal whose handler runs in Numba's Python code called from a
    jitted function (its result boxing unpickles types) is raised again a
    moment later instead of there: Numba does not check that call, and the
    KeyboardInterrupt crashed the process (SIGSEGV) at a Ctrl-C 4 s into
    `tileplan plan siglip-so400m-map`."""
    from types import SimpleNamespace

    from planner.cli import _native_reentry

    def frame(module: str, back: object = None) -> object:
        return SimpleNamespace(f_globals={"__name__": module}, f_back=back)

    ours = frame("simulator.xschedule")
    assert _native_reentry(frame("numba.core.serialize", ours))  # native code between
    assert not _native_reentry(frame("numba.core.compiler", frame("numba.core.dispatcher")))
    assert not _native_reentry(ours)
    assert not _native_reentry(None)
