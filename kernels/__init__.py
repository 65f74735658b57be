"""The tile's instruction set: what one tile can execute (docs/contracts.md §1-2).

- `dtypes`     fp8 e4m3fn / fp16 / fp32 codecs on raw bits (jitted scalars, arrays)
- `blocks`     read/write 2-D operand blocks of a tile image as float32
- `matmul`, `reduce`, `elementwise`, `layernorm`, `softmax`, `cast`, `copy`
               one kernel family each: numeric body, streaming cycle model, regions
- `cost`       cycle-model building blocks (workers, rates, element conflicts)
- `transcend`  float64 exp/tanh with bit-identical numpy twins
- `formulas`   the vector kernels' exact fp32 formulas in numpy (the slow twin)
- `dispatch`   vertex_cycles / vertex_execute / vertex_regions / vertex_cost (jitted)
- `registry`   KERNELS: id -> KernelSpec (name, arg names, code bytes, functions)
- `abi`        the one source of dtype codes, kernel ids and argument slots, step,
               buffer and patch codes
- `status`, `tile`, `testing` (tile images for tests)

`kernels` imports `tilecommon` only (its errors and jit options), never `simulator`
or `planner`.
"""
