"""The PostgreSQL target's builder without a database: what `build` derives from a
machine, and what it refuses to guess."""

from __future__ import annotations

from fsmc import facts, pipeline, source
from fsmc.escape import sql_ident
from fsmc.model import Machine
from fsmc.targets import generate
from fsmc.targets.postgres.build import build

# `working` leaves by the reclaim event `fail` to a choice of two states.
RECLAIM_CHOICE = """\
fsmc: 1
machine: task
initial: new
states: [new, acquired, working, failed, done]
terminals: [done]
events: [acquire, begin, complete, fail, retry]
transitions:
  - {from: new, event: acquire, to: acquired}
  - {from: acquired, event: begin, to: working}
  - {from: acquired, event: fail, to: failed}
  - {from: working, event: fail, to: [failed, new]}
  - {from: working, event: complete, to: done}
  - {from: failed, event: retry, to: new}
lease:
  states: [acquired, working]
  reclaim: fail
"""


def reclaim_choice() -> Machine:
    """The check refuses the spec (lease-reclaim); the builder must not guess either."""
    checked = pipeline.check(source.Source("spec.yaml", "spec.yaml", RECLAIM_CHOICE.encode()))
    assert [d.code for d in checked.diagnostics] == ["lease-reclaim"] and checked.machine is not None
    return checked.machine


def test_a_reclaim_choice_is_not_silently_given_its_first_target() -> None:
    m = reclaim_choice()
    assert facts.reclaim_moves(m) == [("acquired", "failed", facts.Change.LEAVE)]
    assert facts.reclaim_choices(m) == [("working", ("failed", "new"))]
    pg = build(m)
    assert pg.body.lease is not None and pg.body.lease.moves == [("acquired", "failed", "leave")]
    reclaim = next(f for f in pg.schema.functions if f.name == pg.names.sql.reclaim)
    assert "('working'," not in reclaim.body and "('acquired', 'failed', 'leave')" in reclaim.body
    assert len(pg.warnings) == 1 and "'working'" in pg.warnings[0] and "failed, new" in pg.warnings[0]
    assert generate(m).warnings == list(pg.warnings)  # the CLI prints them


def test_the_pin_covers_every_function_the_schema_creates_and_the_writers() -> None:
    pg = build(reclaim_choice())
    assert [sql_ident(f) for f in pg.functions[:-1]] == [f.name for f in pg.schema.functions]
    assert pg.functions[-1] == pg.names.writer  # made by the file's first block, outside the model
