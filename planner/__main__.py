"""`python -m planner` = the `tileplan` command."""

from planner.cli import console

console()
