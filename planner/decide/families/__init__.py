"""The built-in recipe families, one module each; importing this package
registers them in planner.decide.recipe.FAMILIES (planner.decide.catalogue
imports it)."""

from planner.decide.families import bmm, matmul, move, rows  # noqa: F401
