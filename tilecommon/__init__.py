"""What every layer of tileplan shares and no layer owns: the bottom of the stack.

- `errors`    the domain errors (ConfigError, BuildFailure, ...) every package raises
- `jit`       the one place Numba options are chosen (`kjit`, `kjit_parallel`, ...)
- `runtime`   configure(): BLAS threads and the Numba cache directory
- `config`    reading and validating flat TOML tables (devices, models, sweeps)
- `files`     atomic writes of files and result directories, strict npz reads
- `tables`    the plain-text and markdown table formatter
- `registry`  named extensions (policies, proposal kinds, optimizers, op kinds)

`tilecommon` imports nothing of tileplan's; every other package may import it.
"""
