"""The CLI's live progress on stderr: a bar of the optimizer's proposals
(each proposal's line printed on stdout the moment it is decided) and a bar
of a long command's stages.  Both are quiet when stderr is not a terminal or
with --quiet; nothing else in the project draws a bar for a command.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def proposal_progress(args: argparse.Namespace, steps: int) -> Iterator[Callable[[Any], None]]:
    """The optimizer's live output: each proposal's line on stdout the moment
    it is decided (not with --json), and a bar of proposals on stderr when
    stderr is a terminal (not with --quiet)."""
    from tqdm import tqdm

    bar = tqdm(total=steps, desc="proposals", unit="proposal", file=sys.stderr, leave=False,
               disable=args.quiet or steps == 0 or not sys.stderr.isatty())

    def on_record(record: Any) -> None:
        bar.update(1)
        if not args.json:
            if bar.disable:
                print(record.line(), flush=True)
            else:
                bar.write(record.line(), file=sys.stdout)
    try:
        yield on_record
    finally:
        bar.close()


@contextlib.contextmanager
def stage_progress(args: argparse.Namespace, stages: Sequence[str]
                    ) -> Iterator[Callable[[str], None]]:
    """A bar of a long command's stages on stderr (the current one named,
    with its elapsed time) when stderr is a terminal and not --quiet."""
    from tqdm import tqdm

    bar = tqdm(total=len(stages), unit="stage", file=sys.stderr, leave=False,
               disable=getattr(args, "quiet", False) or not sys.stderr.isatty(),
               bar_format="{desc} [{n_fmt}/{total_fmt} stages, {elapsed}]")
    started: list[str] = []

    def on_stage(name: str) -> None:
        if started:
            bar.update(1)
        started.append(name)
        bar.set_description_str(name)
    try:
        yield on_stage
    finally:
        bar.close()
