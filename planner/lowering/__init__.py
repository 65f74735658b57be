"""The build: a Graph under a Plan lowered, expanded, scheduled, allocated
and linked into a package."""
