"""The built-in placements, one module per recipe family; importing this
package registers them in planner.lowering.placement.PLACEMENTS
(planner.lowering.lower and .expand import it)."""

from planner.lowering.families import bmm, matmul, move, rows  # noqa: F401
