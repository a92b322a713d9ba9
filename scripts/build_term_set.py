"""Build a terminology test set from Multi30k test2016: per sentence, one or two noun
phrases of its German reference, to be given as constraints.

    python scripts/build_term_set.py --data $AIAYN_DATA_MIRROR/multi30k --out runs/term_set
    python scripts/build_term_set.py --data $AIAYN_DATA_MIRROR/multi30k --split val --out runs/term_set_val

``--split val`` builds the same from the validation set, to choose decoding options on.

Writes ``OUT/test.en`` (the sources), ``OUT/test.de`` (the references) and
``OUT/constraints.jsonl`` (one JSON list of phrases per line, the format of ``aiayn translate
--constraints``), plus ``OUT/summary.json``.

The heuristic (no tagger needed): German capitalises its nouns, so a noun is a capitalised
word of the reference other than its first word (punctuation stripped; hyphenated compounds
kept whole); its phrase is the noun with the word before it when that word is an inflected
adjective (lowercase, ending in -e/-en/-er/-es/-em, not an article, pronoun, preposition or
conjunction): "einem orangefarbenen Hut" -> "orangefarbenen Hut". A sentence's phrases are
the two longest (in characters; the earlier one on a tie), in reference order, that do not
overlap; a sentence without a noun gets none (an empty list). Every phrase occurs verbatim
in its reference, so a translation that matches the reference meets it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

FUNCTION_WORDS = set("""
der die das den dem des ein eine einen einem einer eines kein keine keinen keinem keiner
und oder aber sondern denn als wie wenn weil dass ob
mit in im auf an am zu zum zur von vom bei beim für über unter vor hinter neben zwischen
durch gegen ohne um aus nach seit während entlang
sein seine seinen seinem seiner seines ihr ihre ihren ihrem ihrer ihres mein meine unser unsere
diese dieser diesen diesem dieses jede jeder jeden jedem jedes einige einigen viele vielen
andere anderen anderer anderem anderes welche welcher welchen alle allen beide beiden mehrere
sie er es wir ihm ihn ihnen man sich etwas nicht sehr ganz
""".split())
ADJECTIVE_ENDINGS = ("e", "en", "er", "es", "em")
WORD = re.compile(r"[\w-]+")


def _read(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def noun_phrases(reference: str) -> list[tuple[int, str]]:
    """(character offset, phrase) of every noun phrase the heuristic finds, in order."""
    words = [(m.start(), m.group(0)) for m in WORD.finditer(reference)]
    found = []
    for k, (start, word) in enumerate(words):
        if k == 0 or not word[0].isupper() or word.isupper() or len(word) < 3:
            continue
        phrase_start = start
        if k > 1:
            prev_start, prev = words[k - 1]
            between = reference[prev_start + len(prev):start]
            if (prev.islower() and prev not in FUNCTION_WORDS and prev.endswith(ADJECTIVE_ENDINGS)
                    and between == " "):
                phrase_start = prev_start
        found.append((phrase_start, reference[phrase_start:start + len(word)]))
    return found


def pick(phrases: list[tuple[int, str]], n: int = 2) -> list[str]:
    """The ``n`` longest non-overlapping phrases, in reference order."""
    chosen: list[tuple[int, str]] = []
    for start, phrase in sorted(phrases, key=lambda p: (-len(p[1]), p[0])):
        end = start + len(phrase)
        if all(end <= s or start >= s + len(p) for s, p in chosen):
            chosen.append((start, phrase))
        if len(chosen) == n:
            break
    return [p for _, p in sorted(chosen)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="the Multi30k directory of a data mirror (SPLIT.{en,de}.gz)")
    ap.add_argument("--split", default="test_2016_flickr", help="the Multi30k split (default test_2016_flickr)")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--per-sentence", type=int, default=2, help="phrases per sentence at most (default 2)")
    args = ap.parse_args()
    src = _read(args.data / f"{args.split}.en.gz")
    ref = _read(args.data / f"{args.split}.de.gz")
    if len(src) != len(ref):
        raise SystemExit(f"{args.data}: {len(src)} English and {len(ref)} German lines")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [pick(noun_phrases(r), args.per_sentence) for r in ref]
    assert all(p in r for r, phrases in zip(ref, rows) for p in phrases)
    (args.out / "test.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (args.out / "test.de").write_text("".join(r + "\n" for r in ref), encoding="utf-8")
    (args.out / "constraints.jsonl").write_text(
        "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in rows), encoding="utf-8")
    summary = {"sentences": len(rows), "constraints": sum(len(p) for p in rows),
               "without": sum(not p for p in rows), "multiword": sum(" " in x for p in rows for x in p)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
