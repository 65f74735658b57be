"""kernels.transcend: jitted exp/tanh bit-identical to their numpy twins and
within 1e-15 relative of numpy's float64 exp/tanh; the float32 array forms
equal the numpy twins rounded to float32."""

from __future__ import annotations

import numpy as np

from kernels.transcend import (
    EXP_MIN,
    exp_f32,
    exp_nonpos,
    exp_nonpos_np,
    tanh64,
    tanh64_np,
    tanh_f32,
)
from tilecommon.jit import kjit

SEED = 17


@kjit
def _exp_all(x, out):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = exp_nonpos(x[i])


@kjit
def _tanh_all(x, out):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = tanh64(x[i])


def _exp_inputs() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    ln2 = np.log(2.0)
    halfway = (np.arange(-160, 1) + 0.5) * ln2  # reduction boundaries
    edges = np.array([0.0, -0.0, -1e-300, -5e-324, -1e-17, EXP_MIN, EXP_MIN + 1e-9, -745.0,
                      -np.inf, np.nan, 3.0, 700.0])
    return np.concatenate([
        -rng.exponential(5.0, 200_000), rng.uniform(-110.0, 0.0, 200_000), halfway,
        np.nextafter(halfway, 0.0), np.nextafter(halfway, -1.0), edges])


def test_exp_twins_bitwise_and_accurate() -> None:
    x = _exp_inputs()
    got = np.empty_like(x)
    _exp_all(x, got)
    np.testing.assert_array_equal(got.view(np.int64), exp_nonpos_np(x).view(np.int64))
    ok = (x >= EXP_MIN) & (x <= 700.0)
    rel = np.abs(got[ok] - np.exp(x[ok])) / np.exp(x[ok])
    assert rel.max() <= 1e-15
    assert np.isnan(got[np.isnan(x)]).all()
    assert got[x == -np.inf][0] < 1e-47  # clamped at EXP_MIN: 0 in float32
    assert np.float32(got[x == -np.inf][0]) == 0.0


def test_tanh_twins_bitwise_and_accurate() -> None:
    rng = np.random.default_rng(SEED + 1)
    u = np.concatenate([rng.standard_normal(200_000) * 3, rng.uniform(-0.02, 0.02, 100_000),
                        np.array([0.0, -0.0, 0.01, -0.01, np.nextafter(0.01, 0), 1e-300, 20.0,
                                  -40.0, 400.0, -np.inf, np.inf])])
    got = np.empty_like(u)
    _tanh_all(u, got)
    np.testing.assert_array_equal(got.view(np.int64), tanh64_np(u).view(np.int64))
    nz = u != 0
    rel = np.abs(got[nz] - np.tanh(u[nz])) / np.abs(np.tanh(u[nz]))
    assert rel.max() <= 1e-14
    assert np.array_equal(got[np.isinf(u)], np.sign(u[np.isinf(u)]))


def test_float32_array_forms_equal_numpy_twins() -> None:
    rng = np.random.default_rng(SEED + 2)
    x = np.concatenate([_exp_inputs(), rng.standard_normal(1001) * 40]).astype(np.float32)
    x = x[: x.size // 7 * 7].reshape(-1, 7)[:, ::2]  # a non-contiguous 2-D view
    with np.errstate(over="ignore"):  # exp(700) is inf in float32
        want = exp_nonpos_np(x.astype(np.float64)).astype(np.float32)
    got = exp_f32(x)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    want = tanh64_np(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(tanh_f32(x).view(np.uint32), want.view(np.uint32))
