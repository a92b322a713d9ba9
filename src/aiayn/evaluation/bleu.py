"""Corpus BLEU and chrF with sacreBLEU, plus the paper-style tokenized BLEU.

The numbers to report are sacreBLEU's (detokenized, cased, ``13a`` tokenization), given
with their signature so that others can reproduce them. The paper's figures (27.3 / 28.4
EN-DE) are *tokenized* BLEU with German compound splitting (tensor2tensor's
``get_ende_bleu.sh``), usually 0.6-0.8 higher than sacreBLEU on the same output; for
comparison with the paper :func:`tokenized_bleu` computes a figure in that style:
sacreBLEU's ``intl`` tokenization, case kept, then ``a-b`` -> ``a ##AT##-##AT## b`` for
German. It is labelled as such everywhere and is **not comparable to sacreBLEU**.

Lines are compared as sacreBLEU's command line reads them (trailing whitespace removed),
so ``aiayn evaluate`` and ``sacrebleu`` print the same numbers for the same files. A
hypothesis/reference line-count mismatch is an error, never a truncation.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any, cast

from aiayn.errors import DataError
from aiayn.fileio import iter_text_lines

log = logging.getLogger(__name__)

TOKENIZED_BLEU_NOTE = ("paper-style tokenized BLEU (intl tokenization, case kept, compound splitting "
                       "for German); NOT comparable to sacreBLEU")

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """``Haus-Tür`` -> ``Haus ##AT##-##AT## Tür``, exactly as tensor2tensor's evaluation
    script does (one non-overlapping pass, like perl's ``s///g``: ``a-b-c`` becomes
    ``a ##AT##-##AT## b-c``)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def _streams(hyps: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str]) -> list[list[str]]:
    """Reference streams (one list per reference set), checked against the hypotheses."""
    if isinstance(refs, (str, bytes)):
        raise TypeError("refs: expected a list of reference lines or a list of reference streams")
    if len(refs) == 0:
        raise DataError("no references given")
    streams: list[list[str]]
    if isinstance(refs[0], str):
        # One reference set: its first line tells the shapes apart, which mypy cannot see.
        streams = [cast("list[str]", list(refs))]
    else:
        streams = [list(r) for r in refs]
    for k, stream in enumerate(streams, 1):
        if len(stream) != len(hyps):
            raise DataError(f"reference set {k} has {len(stream)} lines but there are {len(hyps)} "
                            "hypotheses; the line counts must match")
    return streams


def corpus_scores(hyps: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str],
                  tokenized: bool = False, tgt_lang: str | None = None) -> dict[str, Any]:
    """sacreBLEU BLEU and chrF of ``hyps`` against ``refs``.

    ``refs``: one reference per hypothesis (``list[str]``), or several reference streams
    (``list[list[str]]``, each as long as ``hyps``; sacreBLEU's convention). ``tgt_lang``
    lets sacreBLEU pick its tokenizer for zh/ja/ko (13a otherwise).

    Returns ``bleu`` and ``chrf`` (floats, full precision), ``signature`` (the BLEU
    signature, the one papers quote), ``bleu_signature``, ``chrf_signature``, ``bleu_verbose``
    (n-gram precisions, brevity penalty, lengths) and ``n_sentences``; with ``tokenized``
    also ``tokenized_bleu``, ``tokenized_bleu_signature`` and ``tokenized_bleu_note``.
    """
    from sacrebleu.metrics import BLEU, CHRF

    hyps = list(hyps)
    streams = _streams(hyps, refs)
    bleu = BLEU(trg_lang=tgt_lang or "")
    chrf = CHRF()
    b = bleu.corpus_score(hyps, streams)
    c = chrf.corpus_score(hyps, streams)
    out: dict[str, Any] = {
        "bleu": float(b.score),
        "chrf": float(c.score),
        "signature": str(bleu.get_signature()),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        # "92.9/66.7/40.0/25.0 (BP = 0.867 ratio = 0.875 hyp_len = 14 ref_len = 16)"
        "bleu_verbose": f"{b.prec_str} (BP = {b.bp:.3f} ratio = {b.sys_len / max(b.ref_len, 1):.3f} "
                        f"hyp_len = {b.sys_len:d} ref_len = {b.ref_len:d})",
        "n_sentences": len(hyps),
    }
    if tokenized:
        score, signature = tokenized_bleu(hyps, streams, tgt_lang)
        out.update(tokenized_bleu=score, tokenized_bleu_signature=signature,
                   tokenized_bleu_note=TOKENIZED_BLEU_NOTE)
    return out


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str],
                   tgt_lang: str | None = None) -> tuple[float, str]:
    """The paper-style figure: intl-tokenized, cased, compound-split for German.

    Returns (score, signature); the signature says ``tok:intl+compound`` (or ``tok:intl``).
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

    hyps = list(hyps)
    streams = _streams(hyps, refs)
    tok = TokenizerV14International()
    german = (tgt_lang or "").lower() == "de"

    def prep(line: str) -> str:
        line = tok(line.rstrip())
        return compound_split(line) if german else line

    bleu = BLEU(tokenize="none", force=True)
    score = bleu.corpus_score([prep(h) for h in hyps], [[prep(r) for r in s] for s in streams])
    signature = str(bleu.get_signature()).replace("tok:none", "tok:intl+compound" if german else "tok:intl")
    return float(score.score), signature


def corpus_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str]) -> float:
    """sacreBLEU BLEU only (e.g. the trainer's validation BLEU)."""
    from sacrebleu.metrics import BLEU

    hyps = list(hyps)
    return float(BLEU().corpus_score(hyps, _streams(hyps, refs)).score)


def read_lines(path: str | os.PathLike, on_invalid_utf8: str = "error") -> list[str]:
    """Lines of a (possibly gzipped) UTF-8 file as sacreBLEU's command line reads them:
    split at ``\\n`` only, trailing whitespace removed. Invalid UTF-8 is an error naming the
    line unless ``on_invalid_utf8="replace"``."""
    mode = "replace" if on_invalid_utf8 == "replace" else "error"
    # No line is None: that happens only under "skip".
    return [line for line in iter_text_lines(path, mode, strip="trailing") if line is not None]
