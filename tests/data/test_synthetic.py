"""Synthetic tasks: seeded, correct by construction, within the length bounds."""

from __future__ import annotations

import pytest

from aiayn.data.synthetic import TASKS, generate


@pytest.mark.parametrize("task", TASKS)
def test_seeded_and_bounded(task: str) -> None:
    a = generate(task, 200, seed=3, min_len=4, max_len=9, vocab=12)
    assert a == generate(task, 200, seed=3, min_len=4, max_len=9, vocab=12)
    assert a != generate(task, 200, seed=4, min_len=4, max_len=9, vocab=12)
    assert all(5 <= len(s.split()) <= 9 if task == "toy" else 4 <= len(s.split()) <= 9 for s, _ in a)


def test_copy_reverse_sort() -> None:
    for s, t in generate("copy", 50, seed=1, vocab=30):
        assert s == t
    for s, t in generate("reverse", 50, seed=1, vocab=30):
        assert t.split() == s.split()[::-1]
    for s, t in generate("sort", 50, seed=1, vocab=30):
        assert t.split() == sorted(s.split(), key=lambda w: int(w[1:]))
    symbols = {w for s, _ in generate("copy", 500, seed=1, vocab=7) for w in s.split()}
    assert symbols == {f"s{i}" for i in range(7)}


def test_toy_language_reorders_and_agrees() -> None:
    pairs = generate("toy", 300, seed=2, min_len=5, max_len=14)
    assert len({t for _, t in pairs}) > 250  # varied
    for src, tgt in pairs[:50]:
        s, t = src.split(), tgt.split()
        # Determiner + noun phrase: the target starts with an agreeing determiner.
        assert t[0] in {"lo", "la", "li", "le", "un", "una", "uni", "une"}
        # Definiteness is carried over from the source determiner.
        assert (s[0] == "the") == (t[0] in {"lo", "la", "li", "le"})
    # Local reordering: "the big dog" -> "lo god gibo" (adjective after the noun, agreeing).
    found = [(s, t) for s, t in pairs if s.startswith("the big dog ")]
    assert found and all(t.startswith("lo god gibo ") for _, t in found)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown synthetic task"):
        generate("translate", 1, 0)
    with pytest.raises(ValueError):
        generate("copy", 1, 0, min_len=5, max_len=2)
