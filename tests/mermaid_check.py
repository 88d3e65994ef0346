"""Real Mermaid, from Python: parse many diagrams in one Node process.

`parse_all(texts)` hands every text to `tests/mermaid/parse.mjs` at once and returns
one `Result` per text. One `parse.mjs --serve` answers every call of this process (an
xdist worker): starting Node with jsdom and Mermaid costs about two seconds of CPU,
parsing a diagram milliseconds, and five tests parse diagrams. A process that exits
or does not answer in time fails the calling test and is started afresh next time.
The npm packages are pinned in `tests/mermaid/package-lock.json`; `tests/run.sh`
installs them. When they are missing, `parse_all` fails the calling test with the
command to run: this check never skips, in CI or anywhere else.
"""

from __future__ import annotations

import atexit
import json
import re
import select
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fsmc.model import Machine

HERE = Path(__file__).resolve().parent / "mermaid"
SCRIPT = HERE / "parse.mjs"
INSTALL = "npm ci --prefix tests/mermaid"
START, END = "[*]", "[*]"  # how Result.edges names the start and end pseudo-states


@dataclass(frozen=True)
class Node:
    id: str
    label: str
    shape: str


@dataclass(frozen=True)
class Result:
    """What real Mermaid made of one diagram text."""

    ok: bool
    type: str = ""
    error: str = ""
    nodes: tuple[Node, ...] = ()
    edges: tuple[tuple[str, str, str], ...] = ()  # (source label, target label, edge label)
    notes: tuple[tuple[str, str], ...] = ()  # (state label, note text): a limited state's note (1.2)
    length: int = 0
    raw: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_state_diagram(self) -> bool:
        return self.ok and self.type.startswith("stateDiagram")

    @property
    def state_labels(self) -> list[str]:
        """Labels of the drawn states, in Mermaid's order, without the [*] pseudo-states."""
        return [n.label for n in self.nodes if n.shape == "rect"]


def from_raw(raw: dict[str, object]) -> Result:
    """The Result of one entry of parse.mjs's report."""
    if not raw.get("ok"):
        return Result(ok=False, error=str(raw.get("error", "")), raw=raw)
    nodes = tuple(
        Node(str(n["id"]), str(n["label"]), str(n["shape"]))
        for n in raw.get("nodes", [])  # type: ignore[attr-defined]
    )
    by_id = {n.id: n for n in nodes}

    def name(node_id: str) -> str:
        node = by_id.get(node_id)
        if node is None:
            return "?" + node_id
        if node.shape == "stateStart":
            return START
        if node.shape == "stateEnd":
            return END
        return node.label

    def is_note(node_id: str) -> bool:
        node = by_id.get(node_id)
        return node is not None and node.shape == "note"

    edges = tuple(
        (name(str(e["start"])), name(str(e["end"])), str(e.get("label", "")))
        for e in raw.get("edges", [])  # type: ignore[attr-defined]
        if not is_note(str(e["end"]))  # a note hangs off its state by an edge of its own
    )
    notes = tuple(
        (name(str(e["start"])), name(str(e["end"])))
        for e in raw.get("edges", [])  # type: ignore[attr-defined]
        if is_note(str(e["end"]))
    )
    return Result(
        ok=True,
        type=str(raw.get("type", "")),
        nodes=nodes,
        edges=edges,
        notes=notes,
        length=int(raw.get("length", 0)),  # type: ignore[call-overload]
        raw=raw,
    )


def require_mermaid() -> None:
    """Fail (never skip) the calling test when Node or the npm packages are missing."""
    if shutil.which("node") is None:
        pytest.fail("node is not on PATH: the Mermaid check needs Node.js >= 20.19", pytrace=False)
    if (
        not (HERE / "node_modules" / "mermaid" / "package.json").is_file()
        or not (HERE / "node_modules" / "jsdom" / "package.json").is_file()
    ):
        pytest.fail(
            f"tests/mermaid/node_modules is missing: run `{INSTALL}` "
            "(tests/run.sh does it for you); the Mermaid check never skips",
            pytrace=False,
        )


def parse_all(texts: Sequence[str], timeout: float = 120) -> list[Result]:
    """Parse every text with real Mermaid, in this process's Node process."""
    require_mermaid()
    if not texts:
        return []
    server = _Server.running()
    line = server.ask(json.dumps(list(texts)), timeout)
    if not line:
        pytest.fail(f"parse.mjs gave no answer within {timeout} s or exited:\n{server.stop()}", pytrace=False)
    raws = json.loads(line)
    assert len(raws) == len(texts), "parse.mjs must answer once per diagram"
    return [from_raw(raw) for raw in raws]


class _Server:
    """`node parse.mjs --serve`: one JSON array of texts a line in, one line of results
    out. Its stderr goes to a file (a pipe nobody reads could fill and stall it)."""

    current: _Server | None = None

    def __init__(self) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            ["node", str(SCRIPT), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=HERE,
        )  # fmt: skip

    @classmethod
    def running(cls) -> _Server:
        if cls.current is None or cls.current.proc.poll() is not None:
            if cls.current is not None:
                cls.current.stop()
            cls.current = cls()
        return cls.current

    def ask(self, request: str, timeout: float) -> str:
        """The answer line to one request line ("" when none came in `timeout` s)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return ""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else ""

    def stop(self) -> str:
        """End the process (its stdin closed, then killed if it lingers); what it said on
        stderr."""
        if _Server.current is self:
            _Server.current = None
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.seek(0)
        said = self.stderr.read()
        self.stderr.close()
        return f"exit status {self.proc.returncode}\n{said}"


@atexit.register
def _stop_server() -> None:
    if _Server.current is not None:
        _Server.current.stop()


def parse(text: str) -> Result:
    return parse_all([text])[0]


_FENCE = re.compile(r"^```mermaid\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def mermaid_blocks(markdown: str) -> list[str]:
    """The bodies of the ```mermaid fenced blocks of a Markdown text."""
    return _FENCE.findall(markdown)


def drawn_arrows(machine: Machine) -> list[tuple[str, str, str]]:
    """(from, label, to) of every arrow a correct drawing of `machine` has between
    states: one per transition target, labelled with its event, a capped event's
    limit (`retry (max 5)`, `fetch (max 25 per row)`) and the budgets it gives back
    (`revive (resets fetch)`); and (1.2) one per `otherwise`, saying whose spent
    budget leads there. Written here from the contract, not from fsmc's code."""
    m = machine

    def label(s: str, e: str) -> str:
        when = m.timers[s, e].describe() if (s, e) in m.timers else None
        notes = [] if when is None else ["at due_at" if when == "due_at" else f"after {when}"]
        notes += [f"max {m.cap_limits[e]}{' per row' if e in m.per_row_caps else ''}"] if e in m.cap_limits else []
        notes += [f"resets {', '.join(m.resets[s, e])}"] if (s, e) in m.resets else []
        return f"{e} ({', '.join(notes)})" if notes else e

    arrows = [(s, label(s, e), t) for s, e, t in m.edges]
    return arrows + [(s, f"{e} (otherwise, {b} spent)", o) for (s, e), (o, b) in m.otherwise.items()]
