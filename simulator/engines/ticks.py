"""A cycle counter readable inside jitted code, for the engine's profile.

`ticks()` is LLVM's `readcyclecounter` (the CPU's time-stamp counter on
x86-64): a few cycles to read, so the engine can time each phase of every
step without changing what it measures.  Its rate is found per run by timing
the whole loop with `time.perf_counter` as well (simulator.engines.numba).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic


@intrinsic
def ticks(typingctx: Any) -> Any:
    """The time-stamp counter now (int64)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty)
        return builder.call(fn, [])
    return types.int64(), codegen
