"""Typos: which declared name a word looks like a mistyped copy of, if any.

The one rule behind every "did you mean" fsmc prints: an unknown state or event
(`validate`), an unknown key of the spec (`shape`), an unknown command (`cli`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def typo_of(word: str, choices: Iterable[str]) -> str | None:
    """The declared name `word` looks like a typo of, if any: the closest one at most
    a third of `word`'s length (at least one) of edits away, counting a swap of two
    neighbouring letters as one edit, as rustc and clap judge typos. Mere similarity
    is not enough: for `processed`, `being_processed` is another state that contains
    the word, and naming it would send the author to the wrong state.

    difflib ranks a few similar names cheaply (its quick ratios reject most of a
    long list at once); only those are measured."""
    limit = max(1, len(word) // 3)
    ranked = difflib.get_close_matches(word, list(choices), n=5, cutoff=0.5)
    measured = [(_edits(word, c, limit), i, c) for i, c in enumerate(ranked)]
    typos = [m for m in measured if m[0] <= limit]
    return min(typos)[2] if typos else None


def _edits(a: str, b: str, limit: int) -> int:
    """The optimal string alignment distance of `a` and `b` (insertions, deletions,
    substitutions and swaps of neighbours), or `limit + 1` once it must exceed `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        previous, row = row, [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], before[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        before = previous
    return min(row[-1], limit + 1)
