"""The compiler: graph IR, model zoo, numpy reference (and, as they land, the
catalogue, baseline policies, build stages and optimizer).

Public API (DESIGN §10).  To extend: import the new names here and add them to
`__all__` (one line each).
"""

from planner.baseline import baseline_plan
from planner.expand import expand_program
from planner.graph import (
    Add,
    BatchMatMul,
    Cast,
    Gelu,
    Graph,
    LayerNorm,
    MatMul,
    MergeHeads,
    Op,
    Repeat,
    Softmax,
    SplitHeads,
    Tensor,
    graph_flops,
    graph_macs,
    make_graph,
    parameter_count,
    verify_graph,
)
from planner.lower import lower
from planner.models import ModelConfig, load_config, load_model, zoo_names
from planner.optimize import LocalOptimizer, plan
from planner.pipeline import PipelineConfig, PlanResult
from planner.plan import Plan
from planner.reference import init_inputs, init_params, reference

__all__ = [
    "Add",
    "Plan",
    "baseline_plan",
    "expand_program",
    "lower",
    "BatchMatMul",
    "Cast",
    "Gelu",
    "Graph",
    "LayerNorm",
    "LocalOptimizer",
    "MatMul",
    "MergeHeads",
    "ModelConfig",
    "Op",
    "PipelineConfig",
    "PlanResult",
    "Repeat",
    "Softmax",
    "SplitHeads",
    "Tensor",
    "graph_flops",
    "graph_macs",
    "init_inputs",
    "init_params",
    "load_config",
    "load_model",
    "make_graph",
    "parameter_count",
    "plan",
    "reference",
    "verify_graph",
    "zoo_names",
]
