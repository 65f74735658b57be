"""A tile image with a bump allocator, for kernel tests and benchmarks.

`TileImage.put` lays a 2-D array of codes (uint8 fp8, uint16 fp16, float32)
into the image with a chosen byte row stride and returns its absolute
address; `get` reads a block back.  Addresses are absolute (base included),
as in vertex args.
"""

from __future__ import annotations

import numpy as np

from kernels import abi
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32, DTYPE_BYTES, fp8_encode, fp16_encode
from kernels.registry import KERNELS

ALIGN = 8
BASE = 0x4C000  # the C600's first tile address (a hardware fact; tests place images there)


class TileImage:
    """uint8 memory image of one tile starting at `base`, filled with `fill`."""

    def __init__(self, size: int, base: int = BASE, fill: int = 0) -> None:
        self.mem = np.full(size, fill, dtype=np.uint8)
        self.base = base
        self.next = base

    def alloc(self, nbytes: int, at: int | None = None) -> int:
        """Reserve nbytes (8-aligned) at the bump pointer or at absolute `at`."""
        if at is not None and (at - self.base) % ALIGN != 0:
            raise ValueError(f"block address {at:#x} is not {ALIGN}-byte aligned")
        addr = self.next if at is None else at
        addr = (addr + ALIGN - 1) // ALIGN * ALIGN
        end = addr + nbytes
        if addr < self.base or end > self.base + self.mem.size:
            raise ValueError(f"block {addr:#x}+{nbytes} outside image "
                             f"{self.base:#x}+{self.mem.size}")
        self.next = max(self.next, end)
        return addr

    def put(self, block: np.ndarray, ld: int | None = None, at: int | None = None) -> int:
        """Store a 1-D or 2-D array of codes with row stride `ld` bytes; returns address."""
        b = np.atleast_2d(np.ascontiguousarray(block))
        rows, row_bytes = b.shape[0], b.shape[1] * b.itemsize
        stride = row_bytes if ld is None else ld
        addr = self.alloc(stride * (rows - 1) + row_bytes, at)
        raw = b.view(np.uint8).reshape(rows, row_bytes)
        for r in range(rows):
            off = addr - self.base + r * stride
            self.mem[off:off + row_bytes] = raw[r]
        return addr

    def get(self, addr: int, rows: int, cols: int, ld: int, dtype: type) -> np.ndarray:
        """rows x cols elements of numpy `dtype` at `addr`, row stride `ld` bytes."""
        item = np.dtype(dtype).itemsize
        out = np.empty((rows, cols * item), dtype=np.uint8)
        for r in range(rows):
            off = addr - self.base + r * ld
            out[r] = self.mem[off:off + cols * item]
        return out.view(dtype).reshape(rows, cols)


def random_codes(rng: np.random.Generator, shape: tuple[int, ...], dtype: int,
                 std: float = 1.0) -> np.ndarray:
    """Codes of N(0, std) values in kernel dtype `dtype` (uint8 / uint16 / float32)."""
    x = (rng.standard_normal(shape) * std).astype(np.float32)
    if dtype == DT_FP8:
        return fp8_encode(x)
    if dtype == DT_FP16:
        return fp16_encode(x)
    return x


def _pad(rng: np.random.Generator, row_bytes: int) -> int:
    """A row stride >= row_bytes, 8-aligned, sometimes with extra padding."""
    ld = (row_bytes + ALIGN - 1) // ALIGN * ALIGN
    return ld + ALIGN * int(rng.integers(0, 3))


def random_vertex(kid: int, rng: np.random.Generator, img: TileImage, max_dim: int = 12
                  ) -> np.ndarray:
    """Args of a random valid vertex of kernel `kid` whose operands (random codes,
    random padded strides) have been placed in `img`."""
    spec = KERNELS[kid]

    def dim() -> int:
        return int(rng.integers(1, max_dim + 1))

    def block(rows: int, cols: int, dt: int, std: float = 1.0) -> tuple[int, int]:
        ld = _pad(rng, cols * DTYPE_BYTES[dt])
        return img.put(random_codes(rng, (rows, cols), dt, std), ld=ld), ld

    def out(rows: int, cols: int, dt: int) -> tuple[int, int]:
        ld = _pad(rng, cols * DTYPE_BYTES[dt])
        return img.alloc(ld * (rows - 1) + cols * DTYPE_BYTES[dt]), ld

    m, n = dim(), dim()
    if kid in (abi.MATMUL, abi.BATCH_MATMUL):
        k = dim()
        in_dt = DT_FP8 if rng.random() < 0.5 else DT_FP16
        out_dt = DT_FP32 if kid == abi.MATMUL and rng.random() < 0.5 else DT_FP16
        flags = abi.FLAG_TRANS_B if rng.random() < 0.5 else 0
        batch = int(rng.integers(1, 4)) if kid == abi.BATCH_MATMUL else 1
        b_rows, b_cols = (n, k) if flags & abi.FLAG_TRANS_B else (k, n)
        a_ld = _pad(rng, k * DTYPE_BYTES[in_dt])
        b_ld = _pad(rng, b_cols * DTYPE_BYTES[in_dt])
        c_ld = _pad(rng, n * DTYPE_BYTES[out_dt])
        a = img.put(random_codes(rng, (batch * m, k), in_dt), ld=a_ld)
        b = img.put(random_codes(rng, (batch * b_rows, b_cols), in_dt), ld=b_ld)
        if kid == abi.BATCH_MATMUL:
            c = img.alloc(c_ld * (batch * m - 1) + n * DTYPE_BYTES[out_dt])
            return spec.make_args(a=a, lda=a_ld, b=b, ldb=b_ld, c=c, ldc=c_ld, M=m, K=k, N=n,
                                  in_dtype=in_dt, out_dtype=out_dt, flags=flags, batch=batch,
                                  batch_stride_a=m * a_ld, batch_stride_b=b_rows * b_ld,
                                  batch_stride_c=m * c_ld)
        bias = img.put(random_codes(rng, (n,), DT_FP16)) if rng.random() < 0.5 else 0
        if out_dt == DT_FP32 and rng.random() < 0.5:
            flags |= abi.FLAG_ACCUMULATE
            c = img.put(random_codes(rng, (m, n), DT_FP32), ld=c_ld)
        else:
            c = img.alloc(c_ld * (m - 1) + n * DTYPE_BYTES[out_dt])
        return spec.make_args(a=a, lda=a_ld, b=b, ldb=b_ld, c=c, ldc=c_ld, M=m, K=k, N=n,
                              in_dtype=in_dt, out_dtype=out_dt, flags=flags,
                              scale_exp=int(rng.integers(-3, 4)), bias=bias)
    if kid == abi.REDUCE:
        k = int(rng.integers(1, 5))
        half = int(rng.random() < 0.5)
        ld = _pad(rng, n * (2 if half else 4))
        parts = img.put(random_codes(rng, (k * m, n), DT_FP16 if half else DT_FP32), ld=ld)
        o_dt = DT_FP16 if rng.random() < 0.5 else DT_FP32
        o, ldo = out(m, n, o_dt)
        bias = img.put(random_codes(rng, (n,), DT_FP16)) if rng.random() < 0.5 else 0
        return spec.make_args(parts=parts, ld_parts=ld, part_stride=m * ld, k=k, out=o, ldo=ldo,
                              M=m, N=n, out_dtype=o_dt, bias=bias, parts_fp16=half)
    if kid == abi.ADD:
        dts = [int(d) for d in rng.integers(1, 3, size=3)]
        a, lda = block(m, n, dts[0])
        b, ldb = block(m, n, dts[1])
        c, ldc = out(m, n, dts[2])
        return spec.make_args(a=a, lda=lda, b=b, ldb=ldb, c=c, ldc=ldc, M=m, N=n,
                              dtype_a=dts[0], dtype_b=dts[1], dtype_c=dts[2])
    if kid == abi.BIAS_ADD:
        x, ldx = block(m, n, DT_FP16)
        bias = img.put(random_codes(rng, (n,), DT_FP16))
        y, ldy = out(m, n, DT_FP32)
        return spec.make_args(x=x, ldx=ldx, bias=bias, y=y, ldy=ldy, M=m, N=n,
                              dtype_x=DT_FP16, dtype_y=DT_FP32)
    if kid == abi.LAYERNORM:
        x, ldx = block(m, n, DT_FP16, std=3.0)
        gamma = img.put(random_codes(rng, (n,), DT_FP16))
        beta = img.put(random_codes(rng, (n,), DT_FP16))
        y, ldy = out(m, n, DT_FP16)
        return spec.make_args(x=x, ldx=ldx, gamma=gamma, beta=beta, y=y, ldy=ldy, M=m, N=n,
                              eps=1e-6)
    if kid == abi.RMSNORM:
        x, ldx = block(m, n, DT_FP16, std=3.0)
        gamma = img.put(random_codes(rng, (n,), DT_FP16))
        y, ldy = out(m, n, DT_FP16)
        return spec.make_args(x=x, ldx=ldx, gamma=gamma, y=y, ldy=ldy, M=m, N=n, eps=1e-6)
    if kid == abi.ROPE:
        hd = 2 * int(rng.integers(1, 5))
        width = hd * int(rng.integers(1, 4))
        dt_t = DT_FP16 if rng.random() < 0.5 else DT_FP32
        x, ldx = block(m, width, DT_FP16, std=2.0)
        ldt = _pad(rng, hd // 2 * DTYPE_BYTES[dt_t])
        cos = img.put(random_codes(rng, (m, hd // 2), dt_t), ld=ldt)
        sin = img.put(random_codes(rng, (m, hd // 2), dt_t), ld=ldt)
        y, ldy = out(m, width, DT_FP16)
        return spec.make_args(x=x, ldx=ldx, cos=cos, sin=sin, ldt=ldt, y=y, ldy=ldy, M=m,
                              N=width, head_dim=hd, dtype_t=dt_t)
    if kid in (abi.GELU, abi.SOFTMAX):
        x, ldx = block(m, n, DT_FP16, std=2.0)
        y, ldy = out(m, n, DT_FP16)
        if kid == abi.GELU:
            form = int(rng.integers(0, 5))
            gate = {}
            if rng.random() < 0.3:
                b, ldb = block(m, n, DT_FP16)
                gate = {"b": b, "ldb": ldb}
            return spec.make_args(x=x, ldx=ldx, y=y, ldy=ldy, M=m, N=n, form=form, **gate)
        masks: dict[str, int] = {}
        if rng.random() < 0.3:
            rows = int(rng.integers(1, 4))
            ldm = _pad(rng, n * 2)
            mask = img.put(random_codes(rng, (rows, n), DT_FP16, std=4.0), ld=ldm)
            masks.update(mask=mask, ldm=ldm, mask_rep=int(rng.integers(1, 4)), mask_rows=rows,
                         row0=int(rng.integers(0, 20)))
        if rng.random() < 0.3:
            masks.update(causal=int(rng.integers(1, n + 1)), row0=int(rng.integers(0, 20)))
        return spec.make_args(x=x, ldx=ldx, y=y, ldy=ldy, M=m, N=n, scale=0.35,
                              dtype_x=DT_FP16, dtype_y=DT_FP16, **masks)
    if kid == abi.CAST:
        dx, dy = (int(d) for d in rng.permutation(3)[:2])
        x, ldx = block(m, n, dx, std=4.0)
        y, ldy = out(m, n, dy)
        return spec.make_args(x=x, ldx=ldx, y=y, ldy=ldy, M=m, N=n, dtype_x=dx, dtype_y=dy,
                              shift=int(rng.integers(-2, 3)))
    if kid == abi.COPY:
        nb = dim() * 3
        src, lds = block(m, nb, DT_FP8)
        dst, ldd = out(m, nb, DT_FP8)
        return spec.make_args(src=src, lds=lds, dst=dst, ldd=ldd, rows=m, row_bytes=nb)
    if kid == abi.TRANSPOSE:
        eb = int(rng.choice([1, 2, 4]))
        dt = {1: DT_FP8, 2: DT_FP16, 4: DT_FP32}[eb]
        src, lds = block(m, n, dt)
        dst, ldd = out(n, m, dt)
        return spec.make_args(src=src, lds=lds, dst=dst, ldd=ldd, M=m, N=n, elem_bytes=eb)
    raise ValueError(f"no random vertex generator for kernel id {kid}")


def region_mask(regions: np.ndarray, n: int, base: int, size: int, write: int) -> np.ndarray:
    """bool[size]: bytes covered by the first n regions with is_write == write."""
    mask = np.zeros(size, dtype=bool)
    for addr, outer, ostride, rows, ld, row_bytes, is_write in regions[:n]:
        if is_write != write:
            continue
        for o in range(outer):
            for r in range(rows):
                start = addr - base + o * ostride + r * ld
                mask[start:start + row_bytes] = True
    return mask
