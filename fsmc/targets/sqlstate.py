"""The SQLSTATE codes the generated PostgreSQL raises, shared by the SQL target and the
Python module's `transition()`. All are in class 23 (integrity constraint violation),
so psycopg raises them as `psycopg.errors.IntegrityError` subclasses.

| code  | raised when |
| ----- | ----------- |
| 23F01 | `<machine>_apply` / `_claim`: the current state has no transition on the event (terminal included), a choice without `to_state`, or a `to_state` the pair does not lead to |
| 23F02 | `<machine>_apply`: the event is not one the spec declares |
| 23F03 | `<machine>_apply` / `<machine>_heartbeat`: no row has that id |
| 23F04 | a direct write moves a row along an edge the spec lacks, out of a terminal, without bumping `state_version` by one, or changes a count other than by its event's +1; or inserts a row not in the initial state at version 0 with every count 0 |
| 23F05 | at COMMIT: a row's state (or version) changed without the matching event row, or an event row records a move its row did not make |
| 23F06 | UPDATE, DELETE or TRUNCATE on the append-only event log; DELETE of a row with history, or TRUNCATE of the table, but by `<machine>_purge` |
| 23F07 | `<machine>_apply` or a direct UPDATE: a capped event has fired its cap's worth in this row's life |
| 23F08 | `<machine>_apply`: a timed event (1.2's `after`) fired before its row is due |
| 23F09 | (1.2, `limits`) a move into a state that already holds its limit's worth of rows, by `<machine>_apply` (an `otherwise` included), `<machine>_reclaim` or a direct write, or an INSERT into such an initial state |

Other refusals keep PostgreSQL's own codes: an undeclared state is the state CHECK's
23514 (check_violation), as is an event row whose (from, event, to) is not one of
the spec's; NULL arguments to the functions are 22004 (null_value_not_allowed).

The messages of 23F01 name the state and the event as `state "S"` and `event "E"`,
and its DETAIL is `state=S event=E`, which `transition()` reads back. A version
conflict is not an error: `<machine>_apply` returns NULL.
"""

from dataclasses import dataclass

ILLEGAL_TRANSITION = "23F01"
UNKNOWN_EVENT = "23F02"
UNKNOWN_ID = "23F03"
BYPASS_WRITE = "23F04"
UNLOGGED_CHANGE = "23F05"
APPEND_ONLY = "23F06"
CAP_REACHED = "23F07"
NOT_DUE = "23F08"
LIMIT_REACHED = "23F09"


@dataclass(frozen=True)
class Codes:
    """The codes as every template takes them (`{{ codes.illegal }}`): the one way a
    SQLSTATE reaches generated text."""

    illegal: str = ILLEGAL_TRANSITION
    unknown_event: str = UNKNOWN_EVENT
    unknown_id: str = UNKNOWN_ID
    bypass: str = BYPASS_WRITE
    unlogged: str = UNLOGGED_CHANGE
    append_only: str = APPEND_ONLY
    cap_reached: str = CAP_REACHED
    not_due: str = NOT_DUE
    limit_reached: str = LIMIT_REACHED
