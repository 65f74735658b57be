"""The built-in proposal kinds, one module each; importing this package
registers them (planner.search.registry.PROPOSALS), as a plug-in registers
its own.  planner.search.proposals names the default set and its order."""

from planner.search.kinds import (  # noqa: F401
    cast,
    fuse,
    inplace,
    joint,
    open,
    operator,
    overlap,
    packing,
    tiles,
)
