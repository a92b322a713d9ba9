"""scripts/build_term_set.py: the noun-phrase heuristic that builds the terminology test set."""

from __future__ import annotations

import build_term_set
import pytest


@pytest.mark.parametrize("reference,expected", [
    ("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", ["Mann", "orangefarbenen Hut"]),
    ("Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
     ["saftig-grünes Gras", "weißen Zaun"]),
    ("Zwei Hunde spielen im Schnee.", ["Hunde", "Schnee"]),
    ("Sie halten die Statuen.", ["Statuen"]),  # "die" is an article, not an adjective
    ("ein kleines kind", []),  # no capitalised noun
])
def test_noun_phrases(reference: str, expected: list[str]) -> None:
    picked = build_term_set.pick(build_term_set.noun_phrases(reference))
    assert picked == expected
    assert all(p in reference for p in picked)


def test_pick_keeps_the_longest_without_overlap_in_reference_order() -> None:
    phrases = [(0, "roten Ball"), (6, "Ball"), (20, "Hund"), (30, "Katzenfutter")]
    assert build_term_set.pick(phrases) == ["roten Ball", "Katzenfutter"]
