"""What every experiment shares: the runtime set-up, the artifacts directory,
and publishing a result block into docs/results.md.

An experiment prints its table, writes it to `<out_dir>/<name>.txt` (and its
plots beside it), and, when the environment variable TILEPLAN_RESULTS names
a markdown file (`make results` sets it to docs/results.md), replaces its own
block there: a heading, the command that produced it, the date, the commit,
the machine's load average, then the table.  Blocks are delimited by
`<!-- results:NAME -->` ... `<!-- /results:NAME -->`; a block not yet in the
file is appended, the others are left as they are, so one experiment can be
re-run alone.  Every write is atomic (a temp file, then `os.replace`).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import subprocess
import sys
from pathlib import Path

from tilecommon.files import write_text_atomic
from tilecommon.runtime import configure

ARTIFACTS = Path("artifacts")
RESULTS_ENV = "TILEPLAN_RESULTS"
ROOT = Path(__file__).resolve().parents[1]


def setup() -> None:
    """The runtime every experiment runs under (tilecommon.runtime.configure)."""
    configure()


def command_line() -> str:
    """The command that is running, as a user would type it."""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return " ".join(["python", str(script), *sys.argv[1:]])


def commit() -> str:
    """The short commit of the checkout ('+' when the tree has changes), or '?'."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return sha + ("+" if dirty.strip() else "")


def provenance() -> str:
    """One line: date, commit, load average and cores of this machine."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    today = _dt.date.today().isoformat()
    return f"{today}, commit {commit()}, load {load:.2f} on {os.cpu_count()} cores"


def block(name: str, title: str, text: str, command: str, markdown: bool = False) -> str:
    """The markdown block of one result (`text` verbatim when it is markdown
    already, else in a code block)."""
    body = text.rstrip() if markdown else f"```text\n{text.rstrip()}\n```"
    return (f"<!-- results:{name} -->\n### {title}\n\n`{command}` — {provenance()}\n\n"
            f"{body}\n<!-- /results:{name} -->\n")


def replace_block(doc: str, name: str, new: str) -> str:
    """`doc` with the block `name` replaced by `new` (appended when absent)."""
    pattern = re.compile(rf"<!-- results:{re.escape(name)} -->\n.*?<!-- /results:"
                         rf"{re.escape(name)} -->\n", re.S)
    if pattern.search(doc):
        return pattern.sub(lambda _: new, doc, count=1)
    return doc.rstrip("\n") + "\n\n" + new


def publish(name: str, title: str, text: str, out_dir: Path = ARTIFACTS,
            command: str | None = None, markdown: bool = False) -> None:
    """Print nothing; write `<out_dir>/<name>.txt` and, under `make results`,
    this experiment's block of the results file (module docstring)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / f"{name}.txt", text.rstrip() + "\n")
    target = os.environ.get(RESULTS_ENV)
    if not target:
        return
    path = Path(target)
    doc = path.read_text() if path.exists() else "# Results\n"
    new = block(name, title, text, command or command_line(), markdown)
    write_text_atomic(path, replace_block(doc, name, new))
