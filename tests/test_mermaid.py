"""Generated Mermaid, parsed by real Mermaid (contract 4.3).

Every diagram this module checks is parsed in one Node process (the `parsed`
fixture), so the suite pays Mermaid's start-up once per xdist worker. Without
`tests/mermaid/node_modules` these tests fail, telling you to run
`npm ci --prefix tests/mermaid`: the check never skips.

A diagram "draws" a machine when Mermaid parses it as a stateDiagram-v2 and the
data its renderer is given has exactly the spec's states, each labelled with its
own name, and exactly the spec's arrows, each labelled with its event, plus the
`[*]` arrows. Checking the data, not only the parse, matters: some names parse
and are silently mis-drawn (`root_start` merges with the start circle, `root` is
never drawn, a `state` line eats its arrow, `...direction` + `tb...` eats two lines).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fsmc import cli, pipeline, source
from fsmc.targets import mermaid
from tests import mermaid_check
from tests.mermaid_check import END, START, Result, drawn_arrows, mermaid_blocks, parse_all

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"

# Mermaid keywords, words its lexer matches, ids its state db uses, and names that
# merely start like them (which must stay plain).
KEYWORDS = """end state note default direction class classdef style click href as left right of
over fork join choice concurrent acctitle accdescr scale statediagram hide_empty_description
tb bt lr rl graph flowchart linkstyle root root_start root_end start""".split()
PREFIXED = """ending notes statement classified default_x asleep offline state_x note_x class_x
classdef_x style_x click_x href_x scale_x acctitle_x accdescr_x statediagram_v2 root_x rootx
root_start_x end_note direction_x x_direction redirection tbd lr_x""".split()
NAMES = KEYWORDS + PREFIXED


@dataclass(frozen=True)
class Spec:
    name: str
    initial: str
    states: tuple[str, ...]
    terminals: tuple[str, ...]
    transitions: tuple[tuple[str, str, str], ...]  # (from, event, to)
    more_initials: tuple[str, ...] = ()  # 1.2: the other states a row may be born in

    def yaml(self) -> str:  # JSON is YAML, and quotes every name
        events = list(dict.fromkeys(e for _, e, _ in self.transitions))
        doc = {
            "fsmc": 1,
            "machine": self.name,
            "initial": [self.initial, *self.more_initials] if self.more_initials else self.initial,
            "states": list(self.states),
            "terminals": list(self.terminals),
            "events": events,
            "transitions": [{"from": s, "event": e, "to": t} for s, e, t in self.transitions],
        }
        return json.dumps(doc, indent=1) + "\n"

    def edges(self) -> Counter[tuple[str, str, str]]:
        """The arrows a correct drawing has: (source label, target label, edge label)."""
        arrows = [(START, s, "") for s in (self.initial, *self.more_initials)]
        arrows += [(s, t, e) for s, e, t in self.transitions]
        arrows += [(t, END, "") for t in self.terminals]
        return Counter(arrows)


def as_initial(n: str) -> Spec:
    """`n` as the initial state, a source and a target, and as an event."""
    return Spec(
        f"m1_{n}", n, (n, "idle", "halted"), ("halted",),
        ((n, n, "idle"), ("idle", "go", n), ("idle", "stop", "halted")),
    )  # fmt: skip


def as_terminals(names: Sequence[str]) -> Spec:
    """Every name as a target, a terminal state and the event leading there."""
    return Spec(
        "all_terminal", "idle", ("idle", *names), tuple(names), tuple(("idle", n, n) for n in names)
    )


DIRECTION_SPECS = [
    # Lines end in events ending in `direction`; the next lines start with tb/lr/bt/rl.
    Spec(
        "dir_events", "idle", ("idle", "tbd", "lr_x", "btn", "rlock", "halted"), ("halted",),
        (("idle", "change_direction", "tbd"), ("tbd", "redirection", "lr_x"),
         ("lr_x", "direction", "btn"), ("btn", "direction", "rlock"),
         ("rlock", "stop", "halted")),
    ),
    # `[*] --> redirection` is followed by the first arrow, from `tbx`.
    Spec(
        "dir_initial", "redirection", ("redirection", "tbx", "halted"), ("halted",),
        (("tbx", "stop", "halted"), ("redirection", "go", "tbx")),
    ),
]  # fmt: skip
# The same tb/lr/bt/rl names with no `direction` around: they keep their plain ids.
PLAIN_DIRECTIONS = Spec(
    "dir_plain", "idle", ("idle", "tbd", "lr_x", "btn", "rlock", "halted"), ("halted",),
    (("idle", "a", "tbd"), ("tbd", "b", "lr_x"), ("lr_x", "c", "btn"), ("btn", "d", "rlock"),
     ("rlock", "stop", "halted")),
)  # fmt: skip


# A spec with errors (two states on no arrow, unreachable), for `fsmc graph`.
LONELY = Spec(
    "lonely",
    "idle",
    ("idle", "halted", "stray", "note"),
    ("halted",),
    (("idle", "stop", "halted"),),
)


def big_spec() -> Spec:
    """Long names, 19 x 18 arrows: a diagram past Mermaid's 50,000-character limit."""
    states = [f"s{i:02d}_" + "x" * 44 for i in range(20)]
    events = [f"e{j:02d}_" + "y" * 44 for j in range(18)]
    arrows = [
        (states[i], events[j], states[19] if j == 17 else states[(i + j + 1) % 19])
        for i in range(19)
        for j in range(18)
    ]
    return Spec("big", states[0], tuple(states), (states[19],), tuple(arrows))


def build(specs: Sequence[Spec], folder: Path) -> tuple[int, str]:
    """`fsmc build` of `specs` into folder/out: the exit status and stderr."""
    paths = []
    for spec in specs:
        path = folder / f"{spec.name}.yaml"
        path.write_text(spec.yaml(), encoding="utf-8")
        paths.append(str(path))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["build", *paths, "--out", str(folder / "out")])
    return code, err.getvalue()


@dataclass(frozen=True)
class Parsed:
    results: dict[str, Result]
    texts: dict[str, str]
    build_stderr: dict[str, str]


@pytest.fixture(scope="session")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> Parsed:
    """Every diagram under test, parsed once per test run.

    Under xdist the first worker to get here builds and parses; the others wait for
    its report, in the run's shared temporary folder, instead of paying again.
    """
    mermaid_check.require_mermaid()
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        report = _parse_everything(tmp_path_factory)
    else:
        shared = tmp_path_factory.getbasetemp().parent  # this run's, common to its workers
        with open(shared / "mermaid.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cache = shared / "mermaid.json"
            if cache.is_file():
                report = json.loads(cache.read_text(encoding="utf-8"))
            else:
                report = _parse_everything(tmp_path_factory)
                cache.write_text(json.dumps(report), encoding="utf-8")
    return Parsed(
        results={k: mermaid_check.from_raw(raw) for k, raw in report["results"].items()},
        texts=report["texts"],
        build_stderr=report["stderr"],
    )


def _parse_everything(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Builds every machine under test, then parses every diagram in one Node call."""
    texts: dict[str, str] = {}
    for mmd in sorted(GENERATED.glob("*/*.mmd")):
        texts[f"generated/{mmd.parent.name}/{mmd.name}"] = mmd.read_text(encoding="utf-8")
    for readme in sorted(GENERATED.glob("*/README.md")):
        blocks = mermaid_blocks(readme.read_text(encoding="utf-8"))
        for i, block in enumerate(blocks):
            texts[f"generated/{readme.parent.name}/README.md#{i}"] = block

    stderr: dict[str, str] = {}
    groups = {
        "names": [*map(as_initial, NAMES), as_terminals(NAMES)],
        "direction": [*DIRECTION_SPECS, PLAIN_DIRECTIONS],
        "big": [big_spec()],
    }
    for group, specs in groups.items():
        folder = tmp_path_factory.mktemp(group)
        code, err = build(specs, folder)
        assert code == 0, f"fsmc build failed for {group}:\n{err}"
        stderr[group] = err
        for spec in specs:
            out = folder / "out" / spec.name
            texts[spec.name] = (out / f"{spec.name}.mmd").read_text(encoding="utf-8")
            readme = (out / "README.md").read_text(encoding="utf-8")
            texts[spec.name + "/README"] = "\n".join(mermaid_blocks(readme))

    # `fsmc graph` draws a spec with errors too (and exits 1), states on no arrow included.
    folder = tmp_path_factory.mktemp("graph")
    path = folder / f"{LONELY.name}.yaml"
    path.write_text(LONELY.yaml(), encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["graph", str(path)]) == 1
    texts["graph/" + LONELY.name] = out.getvalue()

    # Controls: the same machines drawn with every name as its plain id.
    for spec in [*map(as_initial, sorted(mermaid.RESERVED)), *DIRECTION_SPECS]:
        texts["naive/" + spec.name] = naive_diagram(spec)

    keys = [k for k in texts if not k.endswith("/README")]  # README bodies: compared, not parsed
    results = parse_all([texts[k] for k in keys])
    return {
        "results": {k: r.raw for k, r in zip(keys, results, strict=True)},
        "texts": texts,
        "stderr": stderr,
    }


def naive_diagram(spec: Spec) -> str:
    """`spec` drawn by fsmc with no name aliased at all."""
    lines = ["stateDiagram-v2", f"    [*] --> {spec.initial}"]
    lines += [f"    {s} --> {t}: {e}" for s, e, t in spec.transitions]
    lines += [f"    {t} --> [*]" for t in spec.terminals]
    return "\n".join(lines) + "\n"


def problems(result: Result, spec: Spec) -> Iterator[str]:
    """How `result` fails to draw `spec` (nothing when it draws it)."""
    if not result.ok:
        yield "does not parse: " + result.error.splitlines()[0] if result.error else "fails"
        return
    if result.type != "stateDiagram":
        yield f"parses as {result.type!r}, not a stateDiagram-v2"
    states = Counter(result.state_labels)
    if states != Counter(spec.states):
        yield f"draws states {sorted(states.elements())}, not {sorted(spec.states)}"
    edges = Counter(result.edges)
    if edges != spec.edges():
        missing = sorted((spec.edges() - edges).elements())
        extra = sorted((edges - spec.edges()).elements())
        yield f"arrows missing {missing}, unexpected {extra}"


def draws(parsed: Parsed, spec: Spec) -> list[str]:
    return [f"{spec.name}: {p}" for p in problems(parsed.results[spec.name], spec)]


# --- the check itself -----------------------------------------------------------


@pytest.mark.slow
def test_mermaid_is_installed() -> None:
    mermaid_check.require_mermaid()


def test_missing_node_modules_fails_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(mermaid_check, "HERE", tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"npm ci --prefix tests/mermaid"):
        mermaid_check.parse_all(["stateDiagram-v2\n    [*] --> a\n"])


@pytest.mark.slow
def test_the_checker_sees_parse_errors_and_misdrawn_names(parsed: Parsed) -> None:
    """Each alias fsmc makes is needed: unaliased, real Mermaid rejects or mis-draws."""
    for spec in [*map(as_initial, sorted(mermaid.RESERVED)), *DIRECTION_SPECS]:
        found = list(problems(parsed.results["naive/" + spec.name], spec))
        assert found, f"{spec.name}: needs no alias with this Mermaid (see mermaid.RESERVED)"


# --- the checked-in output --------------------------------------------------------


@pytest.mark.slow
def test_generated_diagrams_parse_as_state_diagrams(parsed: Parsed) -> None:
    checked = [k for k in parsed.results if k.startswith("generated/")]
    assert len([k for k in checked if k.endswith(".mmd")]) >= 3, checked
    assert len([k for k in checked if "README" in k]) >= 3, checked
    bad = {
        k: r.error or r.type
        for k, r in parsed.results.items()
        if k.startswith("generated/") and not (r.ok and r.type == "stateDiagram")
    }
    assert not bad


@pytest.mark.slow
def test_generated_diagrams_draw_their_specs(parsed: Parsed) -> None:
    for mmd in sorted(GENERATED.glob("*/*.mmd")):
        checked = pipeline.check(source.read(str(ROOT / "specs" / f"{mmd.parent.name}.yaml")))
        m = checked.machine
        assert m is not None and m.initial is not None
        # A capped event's arrow says its limit (`retry (max 5)`), and the budgets a move
        # gives back; a spent budget's otherwise is an arrow of its own.
        spec = Spec(str(m.name), str(m.initial), m.state_names, tuple(sorted(m.terminal_names)),
                    tuple(drawn_arrows(m)), m.initial_names[1:])  # fmt: skip
        result = parsed.results[f"generated/{mmd.parent.name}/{mmd.name}"]
        assert not list(problems(result, spec))
        # A limited state (1.2) carries a note saying its limit.
        assert result.notes == tuple((s, f"at most {most} rows at once") for s, most in m.state_limits.items())
        readme = parsed.results[f"generated/{mmd.parent.name}/README.md#0"]
        assert (readme.nodes, readme.edges) == (result.nodes, result.edges)


# --- names ------------------------------------------------------------------------


@pytest.mark.slow
def test_keyword_names_draw_with_their_own_labels(parsed: Parsed) -> None:
    found = [
        p for spec in [*map(as_initial, NAMES), as_terminals(NAMES)] for p in draws(parsed, spec)
    ]
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_only_names_mermaid_misreads_are_aliased(parsed: Parsed) -> None:
    for n in NAMES:
        text = parsed.texts[as_initial(n).name]
        aliased = f'    state "{n}" as S_{n}\n' in text
        assert aliased == (n in mermaid.RESERVED), n
        plain = f"    [*] --> {n}\n" in text
        assert plain != aliased, text


@pytest.mark.slow
def test_direction_lines_cannot_swallow_the_next(parsed: Parsed) -> None:
    found = [p for spec in DIRECTION_SPECS for p in draws(parsed, spec)]
    assert not found, "\n".join(found)
    assert '    state "tbd" as S_tbd\n' in parsed.texts["dir_events"]
    assert "    [*] --> redirection\n    S_tbx --> halted: stop\n" in parsed.texts["dir_initial"]


@pytest.mark.slow
def test_tb_lr_names_stay_plain_without_direction(parsed: Parsed) -> None:
    assert not draws(parsed, PLAIN_DIRECTIONS)
    text = parsed.texts["dir_plain"]
    assert " as " not in text
    assert "    tbd --> lr_x: b\n" in text


@pytest.mark.slow
def test_readme_embeds_the_same_diagram(parsed: Parsed) -> None:
    for spec in [as_initial("note"), as_terminals(NAMES), *DIRECTION_SPECS, big_spec()]:
        mmd = parsed.texts[spec.name]
        body = mmd[mmd.index("stateDiagram-v2") :]
        assert parsed.texts[spec.name + "/README"] == body, spec.name


@pytest.mark.slow
def test_graph_draws_states_on_no_arrow(parsed: Parsed) -> None:
    assert not list(problems(parsed.results["graph/lonely"], LONELY))


# --- size -------------------------------------------------------------------------


@pytest.mark.slow
def test_big_machine_warns_and_still_parses(parsed: Parsed) -> None:
    text = parsed.texts["big"]
    assert len(text) > mermaid.MAX_TEXT
    assert "big/big.mmd" in parsed.build_stderr["big"]
    assert "maxTextSize" in parsed.build_stderr["big"]
    result = parsed.results["big"]
    assert result.length > 50_000  # what Mermaid was handed, comments and all
    assert not draws(parsed, big_spec())


def test_the_limit_is_measured_as_mermaid_measures_it() -> None:
    """Mermaid's render drops `%%` comment lines, then refuses text over maxTextSize
    (checked against 11.17 by rendering under jsdom: 100 with maxTextSize 100 draws,
    101 shows "Maximum text size in diagram exceeded", comments never count)."""
    machine = pipeline.check(source.read(str(ROOT / "specs" / "task.yaml"))).machine
    assert machine is not None
    header = "%% Code generated by fsmc from x.yaml. DO NOT EDIT.\n%% spec sha256: 0\n"
    start = "stateDiagram-v2\n    [*] --> a\n    a --> [*]\n    a --> b: "
    for size in (mermaid.MAX_TEXT, mermaid.MAX_TEXT + 1):
        body = start + "x" * (size - len(start) - 1) + "\n"
        assert mermaid.measured(header + body) == len(body) == size
        warned = mermaid.warnings(machine, header + body, "m/m.mmd")
        assert bool(warned) == (size > mermaid.MAX_TEXT), warned


@pytest.mark.slow
def test_small_machines_do_not_warn(parsed: Parsed) -> None:
    assert parsed.build_stderr["names"] == ""
    assert parsed.build_stderr["direction"] == ""
