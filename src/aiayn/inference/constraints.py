"""Constrained decoding: a per-hypothesis state that restricts the next token.

The searches (:mod:`aiayn.inference.search`) take a :class:`Constraint` and drive one
:class:`ConstraintState` per search: :meth:`~ConstraintState.mask` sets every illegal
next token of every live row to -inf (vectorised over rows), :meth:`~ConstraintState.select`
follows the rows when beams are reordered or finished rows leave, and
:meth:`~ConstraintState.advance` takes each row's chosen token. The search knows nothing
of what is constrained; a constraint knows nothing of the model. A state that also
implements :class:`AllocatingState` has beam search divide its beam into banks by
constraint progress (dynamic beam allocation).

The constraints:

- :class:`aiayn.inference.tree_grammar.TreeGrammar`, the parsing grammar;
- :class:`aiayn.inference.phrase_constraints.PhraseConstraint`, terminology as target
  token phrases.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

NEG_INF = float("-inf")


class ConstraintState(Protocol):
    def mask(self, lprobs: Tensor, t: int) -> None:
        """Set the illegal next tokens of ``lprobs`` (R, V) to -inf, in place, at step ``t``."""

    def select(self, index: Tensor) -> None:
        """Keep rows ``index`` (R',), in that order."""

    def advance(self, tokens: Tensor) -> None:
        """Each row's chosen token (R,)."""


@runtime_checkable
class AllocatingState(ConstraintState, Protocol):
    """A state whose rows beam search divides into banks (dynamic beam allocation): by the
    number of constraint tokens each one has met, from 0 to :meth:`total_tokens`."""

    def total_tokens(self) -> Tensor:
        """(R,) the constraint tokens each row must meet."""

    def met_tokens(self) -> Tensor:
        """(R,) the constraint tokens each row has met (its bank)."""

    def next_tokens(self) -> Tensor:
        """(R, N) tokens that would bring each row further (-1: none), tried as candidates."""

    def met_after(self, rows: Tensor, tokens: Tensor) -> Tensor:
        """(N,) the constraint tokens met by row ``rows[i]`` extended by ``tokens[i]``."""


class Constraint(Protocol):
    def start(self, sent: Tensor, max_len: Tensor) -> ConstraintState:
        """The state of rows whose sentences (in the batch) are ``sent`` (R,), each allowed
        ``max_len`` (R,) tokens before EOS."""
