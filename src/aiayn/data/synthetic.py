"""Synthetic translation tasks, generated from a seed: for the demo, tests and sanity checks.

Sentences are whitespace-separated symbols, tokenized with a SentencePiece *word* model so
that each symbol is exactly one token.

- ``copy``: the target is the source (``s3 s1 s7`` -> ``s3 s1 s7``);
- ``reverse``: the target is the source reversed (``s3 s1 s7`` -> ``s7 s1 s3``);
- ``sort``: the target is the source's symbols in ascending index order (``s7 s1 s3`` ->
  ``s1 s3 s7``): needs attention over the whole input;
- ``toy``: a small rule-based "language pair". English-like sentences
  ``DET ADJ* NOUN VERB DET ADJ* NOUN [PREP DET ADJ* NOUN]`` become a Romance-like language
  with *local reordering* (adjectives follow the noun) and *agreement* (determiners and
  adjectives agree with the noun's gender and number, the verb with the subject's number).
  Gender is a property of the target noun, invisible in the source, so the model must look
  at the noun to inflect the determiner that comes before it.
"""

from __future__ import annotations

import random

TASKS = ("copy", "reverse", "sort", "toy")


def generate(task: str, n: int, seed: int, min_len: int = 3, max_len: int = 12,
             vocab: int = 20) -> list[tuple[str, str]]:
    """``n`` (source, target) pairs of ``task``, the same for the same arguments.

    ``min_len``/``max_len``: source length in symbols (inclusive). ``vocab``: number of
    distinct symbols for copy/reverse/sort; for ``toy``, it scales the lexicon (nouns,
    adjectives and verbs in proportion, at least a few of each).
    """
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; choose from {', '.join(TASKS)}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    if vocab < 2:
        raise ValueError(f"vocab must be at least 2, got {vocab}")
    rng = random.Random(f"{task}:{seed}")  # a string seed: stable across Python versions
    if task == "toy":
        return [_toy_pair(rng, min_len, max_len, vocab) for _ in range(n)]
    out = []
    for _ in range(n):
        length = rng.randint(min_len, max_len)
        syms = [rng.randrange(vocab) for _ in range(length)]
        if task == "copy":
            tgt = syms
        elif task == "reverse":
            tgt = syms[::-1]
        else:
            tgt = sorted(syms)
        out.append((_symbols(syms), _symbols(tgt)))
    return out


def _symbols(ids: list[int]) -> str:
    return " ".join(f"s{i}" for i in ids)


# ------------------------------------------------------------------------- toy pair

_NOUNS = ("cat", "dog", "bird", "horse", "child", "woman", "man", "tree", "house", "car", "boat",
          "river", "book", "table", "apple", "garden", "city", "road", "flower", "teacher",
          "friend", "window", "door", "ball", "king", "queen", "song", "letter", "mountain", "hat")
_ADJS = ("big", "small", "red", "old", "young", "green", "happy", "tall", "dark", "quiet",
         "fast", "blue", "cold", "warm", "new")
_VERBS = ("see", "like", "find", "follow", "paint", "watch", "help", "carry", "hear", "visit",
          "draw", "call", "meet", "want", "love")
_PLURALS = {"man": "men", "woman": "women", "child": "children", "city": "cities"}
_PREPS = {"near": "pres", "behind": "dietro", "under": "sotto", "with": "kon"}

# Target determiners: (definite, gender, plural) -> word.
_DET = {(True, "m", False): "lo", (True, "f", False): "la", (True, "m", True): "li",
        (True, "f", True): "le", (False, "m", False): "un", (False, "f", False): "una",
        (False, "m", True): "uni", (False, "f", True): "une"}
_AGREE = {("m", False): "o", ("f", False): "a", ("m", True): "i", ("f", True): "e"}


def _stem(word: str) -> str:
    # An invented but regular lexicon: the English word reversed, e.g. "dog" -> "god".
    return word[::-1]


def _lexicon(vocab: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    n_nouns = max(4, min(len(_NOUNS), vocab // 2))
    n_adjs = max(2, min(len(_ADJS), vocab // 4))
    n_verbs = max(2, min(len(_VERBS), vocab // 4))
    return _NOUNS[:n_nouns], _ADJS[:n_adjs], _VERBS[:n_verbs]


def _gender(noun: str) -> str:
    # Fixed per noun (a hash that does not depend on PYTHONHASHSEED).
    return "f" if sum(map(ord, noun)) % 2 else "m"


def _noun_phrase(rng: random.Random, nouns: tuple[str, ...], adjs: tuple[str, ...],
                 n_adj: int) -> tuple[list[str], list[str], bool]:
    noun = rng.choice(nouns)
    plural = rng.random() < 0.35
    definite = rng.random() < 0.6
    chosen = rng.sample(adjs, n_adj)
    g = _gender(noun)
    src_det = "the" if definite else ("some" if plural else "a")
    src = [src_det, *chosen, _PLURALS.get(noun, noun + "s") if plural else noun]
    suffix = _AGREE[(g, plural)]
    tgt_noun = _stem(noun) + ("s" if plural else "")
    # Local reordering: adjectives after the noun, each agreeing with it.
    tgt = [_DET[(definite, g, plural)], tgt_noun, *(_stem(a) + suffix for a in chosen)]
    return src, tgt, plural


def _toy_pair(rng: random.Random, min_len: int, max_len: int, vocab: int) -> tuple[str, str]:
    nouns, adjs, verbs = _lexicon(vocab)
    best: tuple[list[str], list[str]] | None = None
    for _ in range(100):
        n_adj = [rng.choice((0, 0, 1, 1, 2)) for _ in range(3)]
        subj, subj_t, subj_pl = _noun_phrase(rng, nouns, adjs, min(n_adj[0], len(adjs)))
        obj, obj_t, _ = _noun_phrase(rng, nouns, adjs, min(n_adj[1], len(adjs)))
        verb = rng.choice(verbs)
        src = [*subj, verb if subj_pl else verb + "s", *obj]
        # Subject-verb agreement in the target: -t singular, -n plural.
        tgt = [*subj_t, _stem(verb) + ("n" if subj_pl else "t"), *obj_t]
        if rng.random() < 0.4:
            prep = rng.choice(sorted(_PREPS))
            pp, pp_t, _ = _noun_phrase(rng, nouns, adjs, min(n_adj[2], len(adjs)))
            src += [prep, *pp]
            tgt += [_PREPS[prep], *pp_t]
        if min_len <= len(src) <= max_len:
            return " ".join(src), " ".join(tgt)
        if best is None or abs(len(src) - max_len) < abs(len(best[0]) - max_len):
            best = (src, tgt)
    # A sentence needs at least 5 words; with a tighter range keep the closest found.
    assert best is not None
    return " ".join(best[0]), " ".join(best[1])
