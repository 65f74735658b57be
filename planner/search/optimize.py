"""The bounded local optimizer: ordered proposals, complete
builds, strict acceptance, incumbent retention, parallel speculation.

`LocalOptimizer(executor=None, kinds=None)` is an `Optimizer` for
`planner.pipeline.plan`.  Called with the baseline `Incumbent` it

1. generates the proposals around the incumbent (`planner.search.proposals`,
   ordered by estimated gain, using the incumbent's simulated per-step
   cycles), skipping plans it has already evaluated and changes (same kind
   and description) already rejected around an earlier incumbent — a
   rejected move is not retried;
2. evaluates them in that order — each is built into a complete package
   (expand, schedule, allocate, link, verify) and simulated timing-only —
   until one is strictly cheaper than the incumbent or `optimization_steps`
   proposals have been evaluated in total;
3. accepts a strictly cheaper one: its package is verified again (on a
   checker thread while the next proposal builds; the run waits for that
   check before it accepts again or returns, and fails with what it
   raised), it becomes the incumbent, and proposals are regenerated around
   it (step 1).  A proposal that is not cheaper, does not build
   (`BuildFailure`: recorded as "not built: <why>") or simulates with faults
   never replaces the incumbent, whose actual package, allocation and
   schedule stay.

No global restart, no retries with penalties; nothing is saved or resumed.

Parallel speculation.  With `cfg.jobs > 1` (a process pool of jobs − 1
workers that the optimizer owns for the call) or an `executor` passed in,
this process decides proposal i while the executor builds up to `in_flight`
(default jobs − 1) guesses of what will be evaluated next: while most
proposals so far were accepted, the later proposals' changes replayed on
proposal i (`plandiff.apply_change`: what the next round proposes if i is
accepted), otherwise the later proposals as they are.  Speculative results
are kept by plan until a decision needs that plan; a guess only changes the
timing, never a decision, so the result (final plan and package hash) is
identical to the serial run.  A worker process returns only the outcome
(cycles or why not): a complete build pickles slowly, so a speculative
proposal that is accepted is rebuilt here (`stats.speculative_rebuilt`); a
thread pool hands back the complete build.  A speculative build that no
decision consumes is cancelled or discarded and not counted as evaluated:
`history` holds evaluated proposals only, `stats.speculative_discarded`
counts the rest.

Why outcome-only results: a thread pool gains nothing (expand, allocate and
link are Python and hold the GIL), and shipping complete builds back from a
process costs more than the build (tens of MB of pickles each way).  An
accepted speculative result is rebuilt here, so speculation saves time only
on proposals that are rejected; experiments/bench_optimizer.py measures it.

Returns `(incumbent, history)`; `history` is one `Record` per evaluated
proposal.  `last_stats` holds counts and the cache counters of the last call.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from planner.decide.constraints import Pins
from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.lowering.expand import gc_paused
from planner.search.around import Proposal, pinned
from planner.search.context import Counters, PlanningContext
from planner.search.incumbent import Incumbent, PipelineConfig, pins_of
from planner.search.plandiff import apply_change
from planner.search.profile import Profile, step_profile
from planner.search.proposals import proposals
from planner.search.registry import OPTIMIZERS
from planner.search.trials import Trial, evaluate, evaluate_in_worker, init_worker
from simulator.device import Device
from simulator.package import Package
from simulator.run import run
from simulator.verify import verify


@dataclass(frozen=True)
class Record:
    """One evaluated proposal.  `cycles` is None when it did not build;
    `why` then says why.  `seconds` is the wall time of its build and
    simulation (in whichever process ran it)."""

    kind: str
    description: str
    estimated_gain: int
    built: bool
    why: str
    cycles: int | None
    accepted: bool
    seconds: float
    speculative: bool
    skipped: bool = False  # changes a pinned decision: not built, not a step

    def line(self) -> str:
        """One printable line: kind, description, built or why not, cycles, accepted."""
        if self.skipped:
            return f"[{self.kind}] {self.description}: {self.why}; not evaluated"
        if not self.built:
            state = f"not built: {self.why}"
        else:
            state = f"{self.cycles:,} cycles"
        verdict = "ACCEPTED" if self.accepted else "rejected"
        return f"[{self.kind}] {self.description}: {state}; {verdict} ({self.seconds:.2f} s)"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "description": self.description,
                "estimated_gain": self.estimated_gain, "built": self.built, "why": self.why,
                "cycles": self.cycles, "accepted": self.accepted, "seconds": self.seconds,
                "speculative": self.speculative}


def profile(inc: Incumbent) -> Profile:
    """Measured cycles per lowered step and per op of an incumbent (its
    simulated cycles per step, or a timing-only run when it kept none)."""
    per_step = inc.cycles_per_step
    if per_step is None:
        per_step = run(inc.built.package, numerics=False).cycles_per_step
    return step_profile(inc.built, per_step)


class LocalOptimizer:
    """The optimizer seam implementation (module docstring).

    `executor`: any `concurrent.futures.Executor` for speculative builds (the
    caller owns it); None → serial for `jobs == 1`, else a process pool of
    `jobs − 1` workers (this process is the jobs-th) created and shut down per
    call.  `kinds`: the proposal kinds to generate (None: every registered
    kind).  `max_in_flight`: speculative builds ahead of the proposal being
    decided (default `jobs − 1`, at least 1).  `on_record`: called with each
    `Record` the moment its proposal is decided (live progress; the CLI
    prints its line).  `accept` is the acceptance rule: a subclass may
    override it (experiments/custom_policy.py)."""

    __name__ = "local"

    def __init__(self, executor: Executor | None = None,
                 kinds: tuple[str, ...] | None = None,
                 max_in_flight: int | None = None,
                 on_record: Callable[[Record], None] | None = None) -> None:
        self.executor = executor
        self.kinds = kinds
        self.max_in_flight = max_in_flight
        self.on_record = on_record
        self.last_stats: dict[str, Any] = {}

    def accept(self, incumbent: Incumbent, trial: Trial) -> bool:
        """True if the built `trial` replaces `incumbent`: strictly fewer cycles."""
        return trial.cycles is not None and trial.cycles < incumbent.cycles

    def __call__(self, graph: Graph, device: Device, cfg: PipelineConfig,
                 baseline: Incumbent, ctx: PlanningContext | None = None
                 ) -> tuple[Incumbent, Sequence[Record]]:
        ctx = ctx if ctx is not None else PlanningContext()
        before = ctx.counters()
        executor, owned = self.executor, False
        if executor is None and cfg.jobs > 1:
            executor = ProcessPoolExecutor(cfg.jobs - 1,
                                           mp_context=multiprocessing.get_context("fork"),
                                           initializer=init_worker, initargs=(ctx,))
            owned = True
        run_ = _Run(graph, device, cfg, executor, self.kinds,
                    self.max_in_flight or max(1, cfg.jobs - 1), ctx, self.accept,
                    self.on_record)
        handoff = [baseline]  # not held by this frame: it goes once a proposal replaces it
        del baseline
        try:
            with gc_paused():  # trials allocate ~10⁶ acyclic objects each (expand.gc_paused)
                final = run_.optimize(handoff.pop())
        finally:
            for fut in run_.futures.values():
                fut.cancel()
            run_.checks.shutdown(wait=True)
            if owned and executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        counts = ctx.counters().minus(before)
        counts.add(run_.worker_counters)
        self.last_stats = {
            "proposals_evaluated": len(run_.history),
            "proposals_accepted": sum(1 for r in run_.history if r.accepted),
            "speculative_builds": run_.submitted,
            "speculative_discarded": run_.submitted - run_.consumed,
            "speculative_rebuilt": run_.rebuilt,
            "proposals_skipped_pinned": run_.skipped,
            "rounds": run_.rounds,
            "cache": counts.as_dict(),
        }
        return final, list(run_.history)


class _Run:
    """The state of one optimizer call."""

    def __init__(self, graph: Graph, device: Device, cfg: PipelineConfig,
                 executor: Executor | None, kinds: tuple[str, ...] | None, in_flight: int,
                 ctx: PlanningContext, accept: Callable[[Incumbent, Trial], bool],
                 on_record: Callable[[Record], None] | None = None) -> None:
        self.ctx = ctx
        self.accept = accept
        self.on_record = on_record
        self.graph = graph
        self.device = device
        self.cfg = cfg
        self.limit = cfg.operator_candidate_limit
        self.executor = executor
        self.kinds = kinds
        self.in_flight = in_flight
        self.history: list[Record] = []
        self.tried: set[Plan] = set()
        self.rejected: set[tuple[str, str]] = set()
        self.submitted = 0
        self.consumed = 0
        self.rebuilt = 0
        self.skipped = 0
        self.rounds = 0
        self.worker_counters = Counters()
        self.futures: dict[Plan, Future[tuple[Trial, Counters | None]]] = {}
        # the re-verification of each accepted package (`reverify`)
        self.checks = ThreadPoolExecutor(1, thread_name_prefix="tileplan-reverify")
        self.checking: Future[None] | None = None

    @property
    def budget(self) -> int:
        return self.cfg.optimization_steps - len(self.history)

    def optimize(self, inc: Incumbent) -> Incumbent:
        prof = profile(inc)
        pins = pins_of(self.cfg, self.graph, self.device, self.ctx)
        while self.budget > 0:
            self.rounds += 1
            base = pinned(self.graph, self.device, inc.plan, self.ctx)
            props = [p for p in proposals(self.graph, self.device, inc.plan, prof,
                                          self.limit, self.kinds, self.ctx)
                     if p.plan not in self.tried and p.plan != inc.plan
                     and (p.kind, p.description) not in self.rejected]
            if pins is not None:
                props = self.unpinned(props, pins)
            window = props[: self.budget]
            if not window:
                break
            better = self.round(inc, base, window)
            if better is None:
                break  # every proposal of this round evaluated, none cheaper
            inc, prof = better
        self.settle()  # the final incumbent is verified again before it is returned
        return inc

    def round(self, inc: Incumbent, base: Plan, window: list[Proposal]
              ) -> tuple[Incumbent, Profile] | None:
        """Evaluate `window` in order; the first strictly cheaper one (with its
        step profile), or None.  `base`: the pinned incumbent plan that every
        proposal of `window` changes."""
        for i, prop in enumerate(window):
            self.speculate(window, i, base)
            trial, speculative = self.trial(prop, self.futures.pop(prop.plan, None))
            self.tried.add(prop.plan)
            accepted = trial.cycles is not None and self.accept(inc, trial)
            self.history.append(Record(
                prop.kind, prop.description, prop.gain, trial.cycles is not None,
                trial.failure, trial.cycles, accepted, trial.seconds, speculative))
            if self.on_record is not None:
                self.on_record(self.history[-1])
            if accepted:
                if trial.incumbent is None:
                    trial = self.rebuild(prop, trial)
                assert trial.incumbent is not None and trial.profile is not None
                self.reverify(trial.incumbent.built.package)
                inc = trial.incumbent
                return replace(inc, built=inc.built.kept()), trial.profile
            self.rejected.add((prop.kind, prop.description))
            del trial  # a complete build (~0.4 GB at 27 layers): not alive during the next
        return None

    def reverify(self, pkg: Package) -> None:
        """Verify an accepted package again, on the checker thread while the
        next proposal builds here (verify's scans are jitted without the
        GIL: the two cores share the work); what the previous acceptance's
        check raised is raised first (`settle`)."""
        self.settle()
        self.checking = self.checks.submit(verify, pkg)

    def settle(self) -> None:
        """Wait for the last acceptance's re-verification; raise what it raised."""
        if self.checking is not None:
            checking, self.checking = self.checking, None
            checking.result()

    def unpinned(self, props: list[Proposal], pins: Pins) -> list[Proposal]:
        """`props` less those that change a pinned decision: each skipped change
        is said once in the run (its line, through `on_record`) and costs no
        step."""
        keep = []
        for p in props:
            why = pins.violation(p.plan)
            if why is None:
                keep.append(p)
                continue
            self.tried.add(p.plan)
            if (p.kind, p.description) in self.rejected:
                continue  # said around an earlier incumbent already
            self.rejected.add((p.kind, p.description))
            self.skipped += 1
            if self.on_record is not None:
                self.on_record(Record(p.kind, p.description, p.gain, False,
                                      f"skipped as pinned: {why}", None, False, 0.0, False,
                                      skipped=True))
        return keep

    def rebuild(self, prop: Proposal, trial: Trial) -> Trial:
        """The complete build of a proposal accepted from another process."""
        local = evaluate(self.ctx, self.graph, self.device, prop.plan, complete=True)
        self.rebuilt += 1
        assert local.incumbent is not None and local.cycles == trial.cycles, \
            f"{prop.description}: rebuilt {local.cycles} cycles, worker said {trial.cycles}"
        return local

    def guesses(self, window: list[Proposal], i: int, base: Plan) -> list[Plan]:
        """The plans likely to be evaluated after window[i], best guess first.
        While most proposals so far were accepted: the later proposals' changes
        replayed on window[i] (what the next round will propose if window[i]
        is accepted); otherwise window[i+1:] as they are."""
        accepted = sum(1 for r in self.history if r.accepted)
        later = [p.plan for p in window[i + 1:]]
        if 2 * (accepted + 1) > len(self.history) + 1:
            later = [apply_change(base, p, window[i].plan) for p in later]
        return [p for p in later if p not in self.tried]

    def speculate(self, window: list[Proposal], i: int, base: Plan) -> None:
        """Keep up to `in_flight` speculative builds running in the executor
        while this process evaluates window[i] (module docstring).  Which
        plans are guessed changes only the timing, never a decision."""
        if self.executor is None:
            return
        running = sum(1 for f in self.futures.values() if not f.done())
        budget = self.budget - 1  # window[i] itself is being decided
        for plan in self.guesses(window, i, base)[:max(0, budget)]:
            if running >= self.in_flight:
                break
            if plan in self.futures:
                continue
            # a thread of this process shares the context; another process makes its own
            shared = self.ctx if isinstance(self.executor, ThreadPoolExecutor) else None
            self.futures[plan] = self.executor.submit(
                evaluate_in_worker, self.graph, self.device, plan, os.getpid(),
                shared)
            self.submitted += 1
            running += 1

    def trial(self, prop: Proposal, fut: Future[tuple[Trial, Counters | None]] | None
              ) -> tuple[Trial, bool]:
        if fut is None:
            return evaluate(self.ctx, self.graph, self.device, prop.plan), False
        self.consumed += 1
        trial, counts = fut.result()
        if counts is not None:
            self.worker_counters.add(counts)
        return trial, True


@OPTIMIZERS.register("local")
def local_optimizer(cfg: PipelineConfig) -> LocalOptimizer:
    """Ordered proposals, each built and simulated; strictly cheaper ones accepted.

    The bounded local optimizer (module docstring) over `cfg.proposals`."""
    return LocalOptimizer(kinds=cfg.proposals or None)


@OPTIMIZERS.register("none")
def no_optimizer(cfg: PipelineConfig) -> Callable[..., tuple[Incumbent, Sequence[Record]]]:
    """The baseline as it is: nothing evaluated."""
    def keep(graph: Graph, device: Device, cfg: PipelineConfig, baseline: Incumbent,
             ctx: PlanningContext | None = None) -> tuple[Incumbent, Sequence[Record]]:
        return baseline, []
    keep.__name__ = "none"
    return keep


def format_optimizer(summary: dict[str, Any]) -> str:
    """The optimizer lines of a run summary: baseline → final cycles, the
    improvement, proposal counts and cache counters."""
    base, final = summary["baseline_cycles"], summary["cycles"]
    lines = [f"optimizer        baseline {base:,} -> final {final:,} cycles "
             f"({100 * summary.get('improvement', 0.0):.1f}% fewer); "
             f"{summary['proposals_evaluated']} evaluated, {summary['proposals_accepted']} "
             f"accepted, {summary.get('speculative_builds', 0)} speculative builds "
             f"({summary.get('speculative_discarded', 0)} discarded)"]
    cache = summary.get("cache") or {}
    if cache:
        parts = [f"{k} {v['hits']} hit / {v['misses']} miss" for k, v in cache.items()]
        lines.append(f"caches           {', '.join(parts)}")
    return "\n".join(lines)
