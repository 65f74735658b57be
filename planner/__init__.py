"""The compiler: graph IR and model zoo (`planner.ir`), the decisions
(`planner.decide`), the build stages (`planner.lowering`), baseline policies and
the local optimizer (`planner.search`), and the pipeline, report and CLI.

Public API: the names in `__all__`, imported on first use (PEP 562), so that
`import planner` loads no jitted module before `tilecommon.runtime.configure`
has run: the first name taken from here runs it (the CLI, the tests and the
experiments call it themselves first; `configure` is re-exported here).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    **{name: "planner.ir.graph" for name in (
        "Graph", "Op", "OpBase", "Repeat", "Tensor", "graph_flops", "graph_macs", "make_graph",
        "parameter_count", "verify_graph")},
    **{name: f"planner.ir.ops.{module}" for name, module in (
        ("Add", "add"), ("BatchMatMul", "batch_matmul"), ("Broadcast", "broadcast"),
        ("Cast", "cast"), ("Gelu", "gelu"), ("LayerNorm", "layernorm"), ("MatMul", "matmul"),
        ("MergeHeads", "heads"), ("Softmax", "softmax"), ("SplitHeads", "heads"))},
    **{name: "planner.ir.opkind" for name in ("OPS", "register_op")},
    **{name: "planner.ir.models" for name in (
        "ModelConfig", "load_config", "load_model", "zoo_names")},
    **{name: "planner.ir.reference" for name in ("init_inputs", "init_params", "reference")},
    **{name: "planner.ir.weights" for name in ("load_weights", "save_weights")},
    **{name: "planner.ir.scales" for name in ("data_scales", "quantize_params")},
    "Plan": "planner.decide.plan",
    "lower": "planner.lowering.lower",
    "expand_program": "planner.lowering.expand",
    "build": "planner.lowering.stages",
    "baseline_plan": "planner.search.policies",
    "LocalOptimizer": "planner.search.optimize",
    "PipelineConfig": "planner.search.incumbent",
    "PlanningContext": "planner.search.context",
    "BASELINES": "planner.search.registry",
    "OPTIMIZERS": "planner.search.registry",
    "PROPOSALS": "planner.search.registry",
    "Proposal": "planner.search.proposals",
    "plan": "planner.pipeline",
    "PlanResult": "planner.pipeline",
    "run_model": "planner.pipeline",
    "configure": "tilecommon.runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    from tilecommon.runtime import configure

    configure(announce=True)  # before the first jitted module is imported
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # next time without __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
