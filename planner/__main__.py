"""`python -m planner` = the `tileplan` command."""

from planner.cli import main

raise SystemExit(main())
