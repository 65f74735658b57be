"""One source for the ABI: kernels.abi against the tables docs/contracts.md
states for readers, and against the modules that use it."""

from __future__ import annotations

import re
from pathlib import Path

from kernels import abi
from kernels.registry import KERNELS
from simulator import package

DOC = (Path(__file__).resolve().parents[1] / "docs" / "contracts.md").read_text()


def test_kernel_table_matches_the_abi() -> None:
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (.+) \|$", DOC, flags=re.M)
    assert len(rows) == len(abi.KERNEL_ARGS)
    for kid, name, args in rows:
        assert abi.KERNEL_IDS[name] == int(kid), name
        # "0 a, 1 lda, 2 b, ..." -> slot numbers and names, in order
        slots = re.findall(r"(?:^|, )(\d+) (\w+)", args)
        assert [int(i) for i, _ in slots] == list(range(len(slots))), name
        names = [n for _, n in slots]
        assert tuple(names) == abi.KERNEL_ARGS[name][:len(names)], name
        assert len(names) == len(abi.KERNEL_ARGS[name]), name


def test_step_and_buffer_kinds_match() -> None:
    steps = dict(re.findall(r"`(COMPUTE|EXCHANGE|REPEAT_BEGIN|REPEAT_END) = (\d)`", DOC))
    assert {k: int(v) for k, v in steps.items()} == {
        n: i for i, n in enumerate(abi.STEP_KIND_NAMES)}
    kinds = re.search(r"Buffer kinds: (.+?)\.", DOC, flags=re.S)
    assert kinds is not None
    found = re.findall(r"([a-z-]+) (\d)", kinds.group(1))
    assert [n for n, _ in found] == list(abi.BUFFER_KIND_NAMES)
    assert [int(i) for _, i in found] == list(range(len(abi.BUFFER_KIND_NAMES)))


def test_dtype_codes_match() -> None:
    codes = dict(re.findall(r"`DT_(FP8|FP16|FP32) = (\d)`", DOC))
    assert {k.lower(): int(v) for k, v in codes.items()} == {
        n: i for i, n in enumerate(abi.DTYPE_NAMES)}
    assert (abi.DT_FP8, abi.DT_FP16, abi.DT_FP32) == (0, 1, 2)


def test_slots_and_users_agree() -> None:
    assert abi.ARGS.MATMUL.lda == 1 and abi.ARGS.SOFTMAX.path == 9
    assert abi.ARGS.COPY.row_bytes == 5
    for kid, spec in KERNELS.items():
        assert spec.arg_names == abi.KERNEL_ARGS[spec.name]
        assert tuple(getattr(abi.ARGS, spec.name)) == tuple(range(len(spec.arg_names)))
        assert len(spec.arg_names) <= abi.N_ARGS and abi.KERNEL_IDS[spec.name] == kid
    assert package.STEP_REPEAT_BEGIN is abi.STEP_REPEAT_BEGIN
    assert package.IO_DTYPES == abi.DTYPE_NAMES
