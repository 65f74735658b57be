"""The built-in op kinds, one module each (planner.ir.opkind says what a
declaration holds).  Importing this package imports every module in it, which
registers each kind in planner.ir.opkind.OPS; code imports an op class from
its own module (`from planner.ir.ops.matmul import MatMul`)."""

import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_m.name}")
