"""Constituency parsing on the PTB sample: the parsing table of docs/results.md.

Every row is scored by the project's EVALB (COLLINS.prm, :mod:`aiayn.evaluation.evalb`) on
the prepared split's gold trees:

- baselines that need no model: one flat ``S`` over the words, and the right-branching
  binary tree (root ``S``, every other bracket ``NP``: :func:`aiayn.data.trees.right_branching_tree`),
  scored labelled and unlabelled (COLLINS.prm with ``LABELED 0``);
- with ``--checkpoint``: the model greedy (beam 1) and with the paper's beam 21, each free
  (malformed outputs repaired) and constrained (:class:`~aiayn.inference.tree_grammar.TreeGrammar`),
  with the decoding time; with ``--ensemble``, the ensemble of the checkpoints, and each
  of them alone at beam 21, constrained;
- ``--runs N``: the cost of the constraint at beam 21 on the first split, timed N times with
  the modes alternated (medians): the free search, the same search with the constraint's
  whole per-step work done but not applied (the same hypotheses, so the difference is the
  constraint's own cost; its mask works on a copy of the scores, so this is an upper bound),
  and constrained end to end (different outputs: a constrained tree holds every word).

    python benchmarks/parsing.py --prepared data-bin/ptb_parsing [--checkpoint RUN/averaged]
        [--splits valid test] [--runs 3] [--threads 2] [--json [FILE]]
    python benchmarks/parsing.py --prepared data-bin/ptb_parsing \
        --checkpoint RUN/member1/averaged RUN/member2/averaged --ensemble --json

``--json`` alone writes benchmarks/results/parsing.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aiayn.data.trees import flat_tree, right_branching_tree
from aiayn.evaluation.evalb import EvalbParams, evalb
from aiayn.inference.parser import Parser, parse_prepared_split, read_gold
from aiayn.inference.request import TranslationRequest

# Where `--json` without a file name writes (docs/results.md quotes it).
RESULTS = Path(__file__).resolve().parent / "results"
UNLABELED = dataclasses.replace(EvalbParams.collins(), labeled=False)
BASELINES: dict[str, tuple[Callable[[list[str]], Any], EvalbParams]] = {
    "one flat S over the words": (flat_tree, EvalbParams.collins()),
    "right-branching, binary, labelled S (root) / NP": (right_branching_tree, EvalbParams.collins()),
    "right-branching, binary, unlabelled (LABELED 0)": (right_branching_tree, UNLABELED),
}


def baseline_rows(prepared: Path, splits: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name, (build, params) in BASELINES.items():
        row: dict[str, Any] = {"system": name}
        for split in splits:
            gold = read_gold(prepared / f"{split}.gold.txt")
            row[split] = evalb(gold, [build(t.leaves()) for t in gold], params=params)
        rows.append(row)
    return rows


def model_rows(parser: Parser, prepared: Path, splits: list[str], name: str = "model",
               settings: tuple[tuple[int, bool], ...] = ((1, False), (1, True), (21, False), (21, True)),
               ) -> list[dict[str, Any]]:
    """A row per (beam, constrained) of ``settings``: the parser's scores on each split."""
    rows = []
    for beam, constrained in settings:
        row: dict[str, Any] = {"system": f"{name}, beam {beam}, {'constrained' if constrained else 'free'}"}
        for split in splits:
            row[split], _ = parse_prepared_split(parser, prepared, split, beam=beam, constrained=constrained)
        rows.append(row)
    return rows


class _Shadow:
    """A constraint state that does all of ``inner``'s work on every step and applies none."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def mask(self, lprobs: torch.Tensor, t: int) -> None:
        self.inner.mask(lprobs.clone(), t)

    def select(self, index: torch.Tensor) -> None:
        self.inner.select(index)

    def advance(self, tokens: torch.Tensor) -> None:
        self.inner.advance(tokens)


class _ShadowConstraint:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def start(self, sent: torch.Tensor, max_len: torch.Tensor) -> _Shadow:
        return _Shadow(self.inner.start(sent, max_len))


def constraint_cost(parser: Parser, prepared: Path, split: str, runs: int) -> dict[str, Any]:
    """Median seconds of beam-21 decoding of ``split``: free, free + the constraint's work,
    constrained; the modes alternated, the order flipped every run."""
    words = [t.leaves() for t in read_gold(prepared / f"{split}.gold.txt")]
    texts = [" ".join(w) for w in words]
    settings = parser.decode_settings()
    factory = parser.tree_constraint(words)

    def translate(constraint_for: Any) -> list[str]:
        decode = parser.translator.decode_config(**{**settings, "nbest": 1})
        out = parser.translator.run(TranslationRequest(texts, decode, grammar=constraint_for))
        return [r.hypotheses[0].text for r in out]

    modes: dict[str, Callable[[], Any]] = {
        "free": lambda: translate(None),
        "free + the constraint's work, not applied": lambda: translate(lambda b: _ShadowConstraint(factory(b))),
        "constrained": lambda: translate(factory),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    outputs: dict[str, Any] = {}
    for run in range(runs):
        for mode in list(modes) if run % 2 == 0 else list(modes)[::-1]:
            t0 = time.perf_counter()
            outputs[mode] = modes[mode]()
            times[mode].append(time.perf_counter() - t0)
    assert outputs["free"] == outputs["free + the constraint's work, not applied"], "the shadow changed the search"
    medians = {m: statistics.median(v) for m, v in times.items()}
    return {"split": split, "sentences": len(texts), "runs": runs, "seconds": times, "median": medians,
            "tokens": {m: sum(len(t.split()) for t in outputs[m]) for m in modes}}


def _print_table(rows: list[dict[str, Any]], splits: list[str]) -> None:
    head = " | ".join(f"{s} F1 | {s} P / R | {s} repaired | {s} s" for s in splits)
    print(f"| system | {head} |")
    print("|---|" + "---:|" * (4 * len(splits)))
    for row in rows:
        cells = []
        for s in splits:
            r = row[s]
            cells.append(f"{r['f1']:.2f} | {r['precision']:.2f} / {r['recall']:.2f} | {r.get('repaired', '')} | "
                         f"{r.get('seconds', '')}")
        print(f"| {row['system']} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepared", type=Path, required=True, help="written by `aiayn prepare --task parsing`")
    ap.add_argument("--checkpoint", nargs="+", help="a trained parsing checkpoint (several: averaged)")
    ap.add_argument("--ensemble", action="store_true",
                    help="several --checkpoint: their ensemble (and each alone at beam 21, constrained)")
    ap.add_argument("--splits", nargs="+", default=["valid", "test"])
    ap.add_argument("--runs", type=int, default=0, help="time the constraint's cost this many times (0: no)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", nargs="?", const=str(RESULTS / "parsing.json"), metavar="FILE",
                    help="also write every figure as JSON to FILE (no FILE: benchmarks/results/parsing.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = baseline_rows(args.prepared, args.splits)
    cost = None
    if args.checkpoint:
        ensemble = args.ensemble and len(args.checkpoint) > 1
        parser = Parser.from_checkpoint(args.checkpoint, ensemble=ensemble)
        rows += model_rows(parser, args.prepared, args.splits, name="ensemble" if ensemble else "model")
        if ensemble:
            for k, path in enumerate(args.checkpoint, start=1):
                rows += model_rows(Parser.from_checkpoint(path), args.prepared, args.splits,
                                   name=f"member {k} alone", settings=((21, True),))
        if args.runs:
            cost = constraint_cost(parser, args.prepared, args.splits[0], args.runs)
    _print_table(rows, args.splits)
    if cost is not None:
        med = cost["median"]
        print(f"\nbeam 21 over {cost['split']} ({cost['sentences']} sentences), medians of {cost['runs']} runs:")
        for mode, seconds in med.items():
            print(f"- {mode}: {seconds:.2f} s ({100 * (seconds / med['free'] - 1):+.1f}%), "
                  f"{cost['tokens'][mode]:,} output tokens")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": rows, "constraint_cost": cost}, indent=1) + "\n")


if __name__ == "__main__":
    main()
