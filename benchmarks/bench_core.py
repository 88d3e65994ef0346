"""How fast fsmc and its generated code are, as ratios measured side by side.

Run from anywhere: `python benchmarks/bench_core.py` (see benchmarks/README.md).
It uses this checkout's fsmc (not whichever one is installed), installs nothing,
and needs python-statemachine and transitions for section 3.

Every figure is a ratio of two things timed in the same run, interleaved round by
round, because the machines this runs on are shared and noisy: absolute times
drift, ratios of neighbours much less. A ratio is the median of the per-round
ratios; the range after it is the lowest and highest round. Each section prints
its target and PASS or MISS.

1. generated `apply(state, event)` against the bare `TRANSITIONS[(s, e)]` lookup, and
   `apply(state, event, to=...)` on a choice (specs/review.yaml) against the bare
   `CHOICES[(s, e)]` lookup;
2. generated `Job.apply` against the seed's hand-written `Job.apply` (seed_job.py),
   and the task machine's `Task.apply` firing its capped `retry` (specs/task.yaml)
   against the seed's `Job.apply` firing its (uncapped) `retry`;
3. both against python-statemachine and pytransitions driving the same machine;
4. `fsmc build` of a generated 2,000-state / 20,000-transition spec that uses the
   1.1 features (wildcards with `except`, choices, caps), in-process and
   whole-process, against `yaml.compose(text, Loader=yaml.CSafeLoader)` of the file;
5. `fsmc check specs/job.yaml`, whole process, against `python -c "import yaml, networkx"`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
for _path in (str(HERE), str(ROOT)):  # this checkout's fsmc and the seed helper first
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)

import seed_job as seed  # noqa: E402
import yaml  # noqa: E402

from fsmc import cli, pipeline, source  # noqa: E402
from fsmc.targets import generate  # noqa: E402

# An editable install of fsmc made in another checkout maps `fsmc.templates` to that
# checkout's templates/, which would mix its templates with this fsmc/. (Imported by
# name: only an install makes it a package, so a type checker cannot see it.)
_templates = importlib.import_module("fsmc.templates").__path__[0]
if Path(_templates).resolve() != (ROOT / "templates").resolve():
    raise SystemExit(
        f"fsmc.templates resolves to {_templates}, not {ROOT / 'templates'}: "
        "run `pip install -e .` in this checkout first"
    )

# The event sequence every engine is driven through, from `queued` back to `queued`,
# so one machine object can be driven round after round without a reset (a reset
# costs a library more than a transition, and would flatter fsmc). It takes 8 of
# the 11 transitions; the 3 into the final states end a run, so they are checked
# for agreement (with all 63 (state, event) pairs) but not timed.
CYCLE = (
    "claim", "reclaim", "claim", "start", "reclaim", "claim", "start",
    "pause", "resume", "error", "retry",
)  # fmt: skip

Timer = Callable[[int], float]  # runs n repetitions, returns seconds


# --- timing -----------------------------------------------------------------------


def calibrate(run: Timer, batch_s: float) -> int:
    """Repetitions for one batch of about `batch_s` seconds."""
    n = 1
    while True:
        took = run(n)
        if took >= batch_s / 4 or n >= 1 << 24:
            return max(1, int(n * batch_s / max(took, 1e-9)))
        n *= 4


def interleaved(
    timers: dict[str, tuple[Timer, int]], rounds: int, batch_s: float
) -> dict[str, list[float]]:
    """Seconds per operation for each timer, one batch each per round, order rotated;
    each timer comes with the operations one of its repetitions makes."""
    reps = {name: calibrate(run, batch_s) for name, (run, _ops) in timers.items()}
    names = list(timers)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            run, ops = timers[name]
            out[name].append(run(reps[name]) / (reps[name] * ops))
    return out


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def alternate(
    commands: dict[str, Callable[[], list[str]]], runs: int, env: dict[str, str]
) -> dict[str, list[float]]:
    """Wall seconds of each command line, run alternately `runs` times after one
    warm-up round; each callable gives the command line for one run."""
    out: dict[str, list[float]] = {name: [] for name in commands}
    for r in range(runs + 1):
        order = list(commands) if r % 2 == 0 else list(reversed(commands))
        for name in order:
            argv = commands[name]()
            t0 = time.perf_counter()
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
            took = time.perf_counter() - t0
            if done.returncode != 0:
                raise SystemExit(
                    f"{name} failed ({done.returncode}):\n{done.stderr.decode(errors='replace')}"
                )
            if r:  # the first round only warms the page and bytecode caches
                out[name].append(took)
    return out


# --- reporting --------------------------------------------------------------------

RESULTS: list[tuple[str, bool]] = []


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def times_line(label: str, samples: Sequence[float], per: str = "") -> None:
    print(
        f"    {label:<50} min {fmt_time(min(samples)):>9}  "
        f"median {fmt_time(statistics.median(samples)):>9}{per}"
    )


def verdict(
    label: str,
    rs: Sequence[float],
    *,
    at_most: float | None = None,
    at_least: float | None = None,
    unit: str = "x",
) -> None:
    """One target line: `rs` are per-round ratios (slower/faster or faster/slower)."""
    mid = statistics.median(rs)
    if at_most is not None:
        ok, target = mid <= at_most, f"target <= {at_most:g}{unit}"
    else:
        assert at_least is not None
        ok, target = mid >= at_least, f"target >= {at_least:g}{unit}"
    spread = f"[{min(rs):.3g}..{max(rs):.3g}]"
    print(f"  {label:<52} {mid:8.3g}{unit} {spread:<17} {target:<15} {'PASS' if ok else 'MISS'}")
    RESULTS.append((label, ok))


def info(label: str, rs: Sequence[float], unit: str = "x") -> None:
    spread = f"[{min(rs):.3g}..{max(rs):.3g}]"
    print(f"  {label:<52} {statistics.median(rs):8.3g}{unit} {spread:<17} (info)")


# --- the generated module ---------------------------------------------------------


def build_module(workdir: Path, name: str) -> ModuleType:
    """Generate specs/NAME.yaml with this checkout's fsmc and import the module."""
    result = pipeline.check(source.read(str(ROOT / "specs" / f"{name}.yaml")))
    if not result.ok(strict=True) or result.machine is None:
        raise SystemExit(f"specs/{name}.yaml does not check: {result.diagnostics}")
    files = generate(result.machine).files
    path = workdir / f"fsm_{name}.py"
    path.write_text(files[f"{name}/fsm_{name}.py"], encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"fsm_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"fsm_{name}"] = module
    spec.loader.exec_module(module)
    return module


# --- the same machine in python-statemachine and pytransitions --------------------


def edges(gen: ModuleType) -> list[tuple[str, str, str]]:
    return [(s.value, e.value, t.value) for (s, e), t in gen.TRANSITIONS.items()]


def statemachine_class(gen: ModuleType) -> type:
    """The job machine as a python-statemachine class, built from the generated table:
    one State per state (final for the terminals), one event per event name, joining
    that event's transitions with `|` as the library documents."""
    from statemachine import State, StateMachine  # type: ignore[import-not-found, unused-ignore]

    attrs: dict[str, Any] = {}
    for s in gen.State:
        attrs[s.value] = State(initial=s == gen.INITIAL, final=s in gen.TERMINAL)
    by_event: dict[str, Any] = {}
    for s, e, t in edges(gen):
        move = attrs[s].to(attrs[t])
        by_event[e] = move if e not in by_event else by_event[e] | move
    attrs.update(by_event)
    return type("JobMachine", (StateMachine,), attrs)


def transitions_machine(gen: ModuleType, initial: str) -> Any:
    """The job machine as a pytransitions `Machine` on a plain model object (no
    auto transitions, terminals marked final); returns the model."""
    from transitions import Machine  # type: ignore[import-not-found, unused-ignore]

    class Model:
        pass

    model = Model()
    states = [{"name": s.value, "final": s in gen.TERMINAL} for s in gen.State]
    table = [{"trigger": e, "source": s, "dest": t} for s, e, t in edges(gen)]
    Machine(model=model, states=states, transitions=table, initial=initial, auto_transitions=False)
    return model


def check_faithful(gen: ModuleType, sm_class: Any) -> None:
    """Every engine agrees with the generated table on all (state, event) pairs."""
    from statemachine.exceptions import TransitionNotAllowed  # type: ignore[import-not-found, unused-ignore]
    from transitions import MachineError  # type: ignore[import-not-found, unused-ignore]

    states = [s.value for s in gen.State]
    events = [e.value for e in gen.Event]
    assert len(states) == 7 and len(events) == 9 and len(gen.TRANSITIONS) == 11
    assert len(sm_class.states) == 7 and sum(len(s.transitions) for s in sm_class.states) == 11
    for s in states:
        for e in events:
            want = gen.TRANSITIONS.get((s, e))
            got: list[str | None] = []
            try:
                got.append(gen.apply(s, e).value)
            except gen.IllegalTransition:
                got.append(None)
            job = seed.Job(id="j", state=seed.State(s))
            try:
                got.append(job.apply(seed.Event(e)).state.value)
            except seed.IllegalTransition:
                got.append(None)
            sm = sm_class(start_value=s)
            try:
                sm.send(e)
                got.append(sm.current_state_value)
            except TransitionNotAllowed:
                got.append(None)
            model = transitions_machine(gen, s)
            try:
                model.trigger(e)
                got.append(model.state)
            except MachineError:
                got.append(None)
            expected = None if want is None else want.value
            if got != [expected] * 4:
                raise SystemExit(f"engines disagree on ({s}, {e}): {got}, table says {expected}")


def choice_triples(review: ModuleType) -> list[tuple[Any, Any, Any]]:
    """Every (state, event, to) of the review machine's choices, after checking that
    `apply(s, e, to=t)` accepts exactly the triples its tables name."""
    triples = [
        (s, e, t)
        for (s, e), targets in review.CHOICES.items()
        for t in review.State
        if t in targets
    ]
    assert triples, "specs/review.yaml has no choice"
    for s in review.State:
        for e in review.Event:
            for t in review.State:
                legal = t in review.CHOICES.get((s, e), ()) or review.TRANSITIONS.get((s, e)) == t
                try:
                    got = review.apply(s, e, to=t)
                except review.IllegalTransition:
                    got = None
                if got != (t if legal else None):
                    raise SystemExit(f"review: apply({s}, {e}, to={t}) gave {got}")
    return triples


def capped_tasks(task: ModuleType) -> list[Any]:
    """Tasks in `failed`, one at each retry count under the cap (0 to cap - 1), after
    checking that `retry` moves them to `new` counting, and that the cap + 1th is
    refused or (with an `otherwise`, specs/task.yaml since language 1.2) moves the
    task to `dead` without counting."""
    cap = task.CAPS[task.Event.RETRY]
    tasks = [task.Task("task-1", task.State.FAILED, k, k) for k in range(cap)]
    for k, t in enumerate(tasks):
        moved = t.apply(task.Event.RETRY)
        assert (moved.state, moved.retry_count, moved.version) == (task.State.NEW, k + 1, k + 1)
    try:
        spent = task.Task("task-1", task.State.FAILED, cap, cap).apply(task.Event.RETRY)
    except task.CapReached:
        pass
    else:
        if (spent.state, spent.retry_count) != (task.State.DEAD, cap):
            raise SystemExit(f"task: retry fired past its cap of {cap}")
    seed_failed = seed.Job(id="job-1", state=seed.State.FAILED)
    assert seed_failed.apply(seed.Event.RETRY).state == seed.State.QUEUED
    return tasks


# --- sections 1 to 3: the runtime -------------------------------------------------


def runtime(
    gen: ModuleType, review: ModuleType, task: ModuleType, rounds: int, batch_s: float
) -> None:
    sm_class = statemachine_class(gen)
    check_faithful(gen, sm_class)
    triples = choice_triples(review)
    tasks = capped_tasks(task)

    events = [gen.Event(e) for e in CYCLE]
    pairs = []
    state = gen.INITIAL
    for e in events:
        pairs.append((state, e))
        state = gen.TRANSITIONS[state, e]
    assert state == gen.INITIAL
    seed_events = [seed.Event(e) for e in CYCLE]
    ops = len(CYCLE)

    table = gen.TRANSITIONS
    plain = dict(gen.TRANSITIONS)
    apply = gen.apply
    initial = gen.INITIAL
    gen_job = gen.Job(uuid.UUID(int=1))
    seed_job = seed.Job(id="job-1", state=seed.State.QUEUED)
    sm = sm_class()
    model = transitions_machine(gen, initial.value)
    clock = time.perf_counter

    # The choice: review's (open, review) to each of its targets, by keyword.
    choices = review.CHOICES
    apply_to = review.apply
    # The capped event: task's `retry` from `failed` at every count under its cap,
    # against the seed's `retry` from `failed` (the same hop, with no count) and the
    # generated job's (uncapped) `retry`, as many times each.
    retry = task.Event.RETRY
    seed_failed = [seed.Job(id="job-1", state=seed.State.FAILED)] * len(tasks)
    seed_retry = seed.Event.RETRY
    gen_failed = [gen.Job(uuid.UUID(int=1), gen.State.FAILED)] * len(tasks)
    gen_retry = gen.Event.RETRY

    def t_lookup(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for s, e in pairs:
                table[s, e]
        return clock() - t0

    def t_dict(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for s, e in pairs:
                plain[s, e]
        return clock() - t0

    def t_apply(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for s, e in pairs:
                apply(s, e)
        return clock() - t0

    def t_apply_drive(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            s = initial
            for e in events:
                s = apply(s, e)
        return clock() - t0

    def t_gen_job(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            job = gen_job
            for e in events:
                job = job.apply(e)
        return clock() - t0

    def t_seed_job(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            job = seed_job
            for e in seed_events:
                job = job.apply(e)
        return clock() - t0

    def t_choice_lookup(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for s, e, _t in triples:
                choices[s, e]
        return clock() - t0

    def t_choice_member(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for s, e, t in triples:
                t in choices[s, e]  # noqa: B015 (the comparison is what is timed)
        return clock() - t0

    def t_apply_to(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for s, e, t in triples:
                apply_to(s, e, to=t)
        return clock() - t0

    def t_task_retry(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for tk in tasks:
                tk.apply(retry)
        return clock() - t0

    def t_seed_retry(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for job in seed_failed:
                job.apply(seed_retry)
        return clock() - t0

    def t_gen_retry(n: int) -> float:
        t0 = clock()
        for _ in range(n):
            for job in gen_failed:
                job.apply(gen_retry)
        return clock() - t0

    def t_statemachine(n: int) -> float:
        send = sm.send
        t0 = clock()
        for _ in range(n):
            for e in CYCLE:
                send(e)
        return clock() - t0

    def t_transitions(n: int) -> float:
        trigger = model.trigger
        t0 = clock()
        for _ in range(n):
            for e in CYCLE:
                trigger(e)
        return clock() - t0

    n_to, n_retry = len(triples), len(tasks)
    timers: dict[str, tuple[Timer, int]] = {
        "TRANSITIONS[(s, e)] (the read-only table)": (t_lookup, ops),
        "dict[(s, e)] (a plain dict of the table)": (t_dict, ops),
        "apply(s, e)": (t_apply, ops),
        "s = apply(s, e), driving the cycle": (t_apply_drive, ops),
        "generated Job.apply": (t_gen_job, ops),
        "seed's hand-written Job.apply": (t_seed_job, ops),
        "python-statemachine sm.send(e)": (t_statemachine, ops),
        "pytransitions model.trigger(e)": (t_transitions, ops),
        "review: CHOICES[(s, e)] (the read-only table)": (t_choice_lookup, n_to),
        "review: t in CHOICES[(s, e)]": (t_choice_member, n_to),
        "review: apply(s, e, to=t), a choice": (t_apply_to, n_to),
        "task: Task.apply(retry), capped, under the cap": (t_task_retry, n_retry),
        "seed's Job.apply(retry), no cap": (t_seed_retry, n_retry),
        "generated Job.apply(retry), no cap": (t_gen_retry, n_retry),
    }
    got = interleaved(timers, rounds, batch_s)
    assert sm.current_state_value == "queued" and model.state == "queued"
    k = list(got)
    lookup, plain_t, ap, drive, gjob, sjob, psm, ptr = (got[name] for name in k[:8])
    c_lookup, c_member, c_apply, t_retry, s_retry, g_retry = (got[name] for name in k[8:])

    print(f"\n[runtime] per transition; the cycle of {ops} events {' '.join(CYCLE)}")
    print(
        f"  review's choice: {' '.join(f'{s}-{e}->{t}' for s, e, t in triples)}; task's "
        f"retry from failed at counts 0..{n_retry - 1} (its cap is {n_retry})"
    )
    print(f"  {rounds} interleaved rounds of ~{batch_s * 1000:.0f} ms batches per engine")
    for name in k:
        times_line(name, got[name])

    print("\n1. generated apply() against the bare table lookup (same (s, e) pairs)")
    verdict("apply / TRANSITIONS[(s, e)]", ratios(ap, lookup), at_most=2)
    info("apply / plain dict[(s, e)]", ratios(ap, plain_t))
    verdict("apply(s, e, to=t) on a choice / CHOICES[(s, e)]", ratios(c_apply, c_lookup), at_most=2)
    info("apply(s, e, to=t) on a choice / t in CHOICES[(s, e)]", ratios(c_apply, c_member))

    print("\n2. generated Job.apply against the seed's hand-written Job.apply")
    verdict("generated Job.apply / seed Job.apply", ratios(gjob, sjob), at_most=1)
    verdict(
        "Task.apply(retry), capped / seed Job.apply(retry)", ratios(t_retry, s_retry), at_most=1
    )
    info("Task.apply(retry), capped / Job.apply(retry), not", ratios(t_retry, g_retry))

    print("\n3. speed-up over python-statemachine and pytransitions (same machine, same events)")
    verdict("python-statemachine / generated apply", ratios(psm, drive), at_least=100)
    verdict("python-statemachine / generated Job.apply", ratios(psm, gjob), at_least=100)
    verdict("pytransitions / generated apply", ratios(ptr, drive), at_least=15)
    verdict("pytransitions / generated Job.apply", ratios(ptr, gjob), at_least=15)
    info("python-statemachine / seed Job.apply", ratios(psm, sjob))
    info("pytransitions / seed Job.apply", ratios(ptr, sjob))


# --- section 4: a large build -----------------------------------------------------


def large_spec(
    n_states: int = 2000,
    n_transitions: int = 20000,
    n_events: int = 16,
    seed_value: int = 2000,
    n_except: int = 20,
    choice_share: float = 0.1,
    written_out: bool = False,
) -> str:
    """A valid spec using every 1.1 feature but never-ending machines: every state
    reachable from the initial one, the terminal reachable from every state, no dead
    end, no cap-trap, every event used, `n_transitions` (state, event) pairs once
    the wildcards are expanded. State i moves to i + 1 on e00 (the spine that
    guarantees all of that); the other transitions go to random states on distinct
    random events among e01..e13, about one in ten a choice of two targets
    (`to: [a, b]`). The last two events only come from wildcards, `from: "*"` with
    `except` naming `n_except` random states: e14 to the terminal, e15 back to the
    initial state. e01, e02 and e15 are capped. `written_out` writes the same machine
    with each wildcard's pairs as transitions of their own, as a 1.0 spec would."""
    rng = random.Random(seed_value)
    states = [f"s{i:04d}" for i in range(n_states)]
    events = [f"e{i:02d}" for i in range(n_events)]
    live = n_states - 1  # the last state is the only terminal
    wild = {events[-2]: states[-1], events[-1]: states[0]}  # event -> target
    excepts = {e: sorted(rng.sample(states[:live], n_except)) for e in wild}
    explicit = n_transitions - len(wild) * (live - n_except)
    per_state = [explicit // live] * live
    for i in range(explicit - sum(per_state)):
        per_state[i] += 1
    random_events = events[1 : -len(wild)]
    assert max(per_state) - 1 <= len(random_events)
    caps = {events[1]: 5, events[2]: 1000, events[-1]: 1}
    lines = [
        "# Generated by benchmarks/bench_core.py: a large valid machine for timing builds.",
        "fsmc: 1",
        "machine: bench_large",
        "description: A generated machine with many states, for the build benchmark.",
        f"initial: {states[0]}",
        "states:",
        *(f"  {s}: state number {i} of the generated machine" for i, s in enumerate(states)),
        f"terminals: [{states[-1]}]",
        "events:",
        *(f"  {e}: event number {i}" for i, e in enumerate(events)),
        "transitions:",
    ]
    for i in range(live):
        lines.append(f"  - {{from: {states[i]}, event: {events[0]}, to: {states[i + 1]}}}")
        for e in rng.sample(random_events, per_state[i] - 1):
            if rng.random() < choice_share:
                a, b = rng.sample(states, 2)
                lines.append(f"  - {{from: {states[i]}, event: {e}, to: [{a}, {b}]}}")
            else:
                target = states[rng.randrange(n_states)]
                lines.append(f"  - {{from: {states[i]}, event: {e}, to: {target}}}")
    for e, target in wild.items():
        if written_out:
            left = set(excepts[e])
            lines.extend(
                f"  - {{from: {s}, event: {e}, to: {target}}}"
                for s in states[:live]
                if s not in left
            )
        else:
            left_out = ", ".join(excepts[e])
            lines.append(f'  - {{from: "*", except: [{left_out}], event: {e}, to: {target}}}')
    lines.append("caps:")
    lines.extend(f"  {e}: {n}" for e, n in caps.items())
    return "\n".join(lines) + "\n"


def build_in_process(spec: Path, out: Path) -> None:
    """`fsmc build SPEC --out OUT` through the CLI entry point, in this process."""
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli.main(["build", str(spec), "--out", str(out)])
    if code != 0:
        raise SystemExit(f"fsmc build failed ({code}):\n{err.getvalue()}")


def in_process_rounds(spec: Path, workdir: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds of each of four in-process timings, interleaved, `rounds` of each."""
    text = spec.read_text(encoding="utf-8")
    outs = iter(range(10**6))

    def t_build() -> float:
        out = workdir / f"out{next(outs)}"  # a fresh directory: every file is written
        t0 = time.perf_counter()
        build_in_process(spec, out)
        return time.perf_counter() - t0

    def t_compose() -> float:
        t0 = time.perf_counter()
        yaml.compose(text, Loader=yaml.CSafeLoader)
        return time.perf_counter() - t0

    def without_gc(run: Callable[[], float]) -> Callable[[], float]:
        def timed() -> float:
            gc.collect()
            gc.disable()
            try:
                return run()
            finally:
                gc.enable()

        return timed

    timers = {
        "fsmc build (in-process, warm)": t_build,
        "yaml.compose(text, Loader=yaml.CSafeLoader)": t_compose,
        "fsmc build, gc disabled": without_gc(t_build),
        "yaml.compose, gc disabled": without_gc(t_compose),
    }
    t_build()  # warm: template compilation, schema validators, imports
    got: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    for r in range(rounds):
        for name in names[r % 4 :] + names[: r % 4]:
            got[name].append(timers[name]())
    return got


def large_build(workdir: Path, rounds: int, runs: int, env: dict[str, str]) -> None:
    text = large_spec()
    spec = workdir / "bench_large.yaml"
    spec.write_text(text, encoding="utf-8")

    # The spec must be valid, or the build would stop early and time nothing.
    checked = subprocess.run(
        [sys.executable, "-m", "fsmc", "check", "--strict", str(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if checked.returncode != 0 or checked.stderr.strip():
        raise SystemExit(f"fsmc check rejects the generated spec:\n{checked.stderr[:2000]}")
    machine = pipeline.check(source.read(str(spec))).machine
    assert machine is not None
    assert len(machine.state_names) == 2000 and len(machine.transitions) == 20000
    n_choices = sum(1 for t in machine.first.values() if t.is_choice)
    n_wild = sum(1 for t in machine.transitions if t.wildcard)
    assert n_choices and len(machine.wildcards) == 2 and len(machine.caps) == 3
    # The same machine with the wildcards written out, for the compose it would take:
    # a wildcard is one YAML node where fsmc still makes every pair it stands for.
    written = workdir / "bench_large_written_out.yaml"
    written.write_text(large_spec(written_out=True), encoding="utf-8")
    same = pipeline.check(source.read(str(written))).machine
    assert same is not None and same.targets == machine.targets and not same.wildcards

    # The in-process rounds run in a worker process of their own, so their heap (and
    # so the garbage collector's work) does not depend on which sections ran before.
    worker = subprocess.run(
        [sys.executable, __file__, "--in-process-build", str(spec), str(workdir / "inproc"),
         str(rounds)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if worker.returncode != 0:
        raise SystemExit(f"the in-process build worker failed:\n{worker.stderr}")
    got: dict[str, list[float]] = json.loads(worker.stdout)
    names = list(got)
    builds, composes, builds_nogc, composes_nogc = (got[name] for name in names)
    outs = iter(range(10**6))

    def fresh_out() -> Path:
        return workdir / f"out{next(outs)}"  # a fresh directory: every file is written

    size = len(text.encode())
    written_size = written.stat().st_size
    print(
        f"\n4. fsmc build of a 2,000-state / 20,000-transition spec ({size / 1024:.0f} KiB), "
        "against yaml.compose(text, Loader=yaml.CSafeLoader)"
    )
    print(
        f"  1.1 in use: {len(machine.wildcards)} wildcards with except ({n_wild} pairs), "
        f"{n_choices} choices of 2 targets, {len(machine.caps)} caps"
    )
    print(
        f"  in-process: {rounds} interleaved rounds (the CLI's build: pipeline, generation, "
        "writing to a fresh temp dir)"
    )
    for name in names:
        times_line(name, got[name])
    verdict("fsmc build / yaml.compose (in-process)", ratios(builds, composes), at_most=2)
    info("  the same, both with the gc disabled", ratios(builds_nogc, composes_nogc))
    info(
        "  yaml.compose: share of its time that is gc",
        ratios([c - n for c, n in zip(composes, composes_nogc, strict=True)], composes),
        unit="",
    )

    compose_cmd = (
        "import sys, yaml; "
        "yaml.compose(open(sys.argv[1], encoding='utf-8').read(), Loader=yaml.CSafeLoader)"
    )
    commands = {
        "build": lambda: [
            sys.executable,
            "-m",
            "fsmc",
            "build",
            str(spec),
            "--out",
            str(fresh_out()),
        ],
        "compose": lambda: [sys.executable, "-c", compose_cmd, str(spec)],
        "compose written out": lambda: [sys.executable, "-c", compose_cmd, str(written)],
    }
    walls = alternate(commands, runs, env)
    print(f"  whole process: {runs} alternating runs each, after a warm-up run")
    times_line("python -m fsmc build SPEC --out DIR", walls["build"])
    times_line("python -c 'import yaml; yaml.compose(...)'", walls["compose"])
    times_line(
        f"the same, wildcards written out ({written_size / 1024:.0f} KiB)",
        walls["compose written out"],
    )
    verdict(
        "fsmc build / yaml.compose (whole process)",
        ratios(walls["build"], walls["compose"]),
        at_most=2,
    )
    info(
        "  fsmc build / yaml.compose, wildcards written out",
        ratios(walls["build"], walls["compose written out"]),
    )


# --- section 5: fsmc check, whole process -----------------------------------------


def check_command(runs: int, env: dict[str, str]) -> None:
    commands = {
        "check": lambda: [sys.executable, "-m", "fsmc", "check", "specs/job.yaml"],
        "imports": lambda: [sys.executable, "-c", "import yaml, networkx"],
    }
    walls = alternate(commands, runs, env)
    print(f"\n5. fsmc check specs/job.yaml, whole process, {runs} alternating runs each")
    times_line("python -m fsmc check specs/job.yaml", walls["check"])
    times_line('python -c "import yaml, networkx"', walls["imports"])
    verdict(
        "fsmc check / import yaml, networkx", ratios(walls["check"], walls["imports"]), at_most=2
    )


def checkout() -> str:
    """The commit measured, and whether fsmc/ or templates/ differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            # Tracked files only: an untracked one (the `fsmc/templates` link some
            # checkouts keep) changes nothing that is imported.
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "fsmc", "templates"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" + uncommitted changes to fsmc/ or templates/" if dirty else "")


# --- main -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--only",
        default="runtime,build,check",
        help="comma-separated sections: runtime (1-3), build (4), check (5)",
    )
    p.add_argument("--quick", action="store_true", help="fewer rounds: a smoke test, not figures")
    p.add_argument("--in-process-build", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.in_process_build:  # the worker of section 4
        spec, out, rounds = args.in_process_build
        print(json.dumps(in_process_rounds(Path(spec), Path(out), int(rounds))))
        return 0
    only = set(args.only.split(","))
    quick = args.quick

    if not getattr(yaml, "__with_libyaml__", False):
        print("warning: PyYAML has no libyaml here; fsmc and the baseline both run slower")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # set on some dev boxes: then only fsmc,
    # a source checkout, would be compiled afresh in every process, while its
    # dependencies load their installed .pyc files
    print(
        f"fsmc benchmark: {checkout()}; Python {sys.version.split()[0]}, "
        f"PyYAML {yaml.__version__}, {os.cpu_count()} CPUs"
    )
    print("Ratios are the median of the per-round ratios, [lowest..highest round] after it.")

    with tempfile.TemporaryDirectory(prefix="fsmc-bench-") as tmp:
        workdir = Path(tmp)
        # Bytecode of every module, fsmc's and its dependencies', is cached in the
        # temp dir (not the checkout) by each section's warm-up run.
        env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
        if "runtime" in only:
            gen, review, task = (build_module(workdir, n) for n in ("job", "review", "task"))
            runtime(gen, review, task, rounds=5 if quick else 25, batch_s=0.01 if quick else 0.03)
        if "build" in only:
            large_build(workdir, rounds=2 if quick else 6, runs=1 if quick else 4, env=env)
        if "check" in only:
            check_command(runs=2 if quick else 10, env=env)

    missed = [label for label, ok in RESULTS if not ok]
    print(
        f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met"
        + (f"; missed: {', '.join(missed)}" if missed else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
