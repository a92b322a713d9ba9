r"""Corpus BLEU and chrF with sacreBLEU, plus the paper's tokenized BLEU.

The numbers to report are sacreBLEU's (detokenized, cased, ``13a`` tokenization), given
with their signature so that others can reproduce them. The paper's figures (27.3 / 28.4
EN-DE) are *tokenized* BLEU, computed by tensor2tensor's ``get_ende_bleu.sh``:

1. Moses ``tokenizer.perl -l de`` on hypotheses and references (default XML escaping:
   ``&`` -> ``&amp;``, ``"`` -> ``&quot;``, ``'`` -> ``&apos;``, ...), here
   ``sacremoses.MosesTokenizer(lang)`` (which matches the tokenizer.perl of 2017, the
   paper's; since November 2018 tokenizer.perl also splits a sentence-final ``5.``);
2. compound splitting, ``perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'``, reproduced
   byte for byte (:func:`compound_split`);
3. ``multi-bleu.perl``: corpus BLEU over whitespace tokens, cased, no smoothing (0 when an
   n-gram precision is 0), closest reference length (the shorter on a tie); here sacreBLEU
   with ``tokenize="none"``, ``smooth_method="none"``, which computes the same statistics.

:func:`tokenized_bleu` does exactly that, with the tokenizer's language taken from the
target language; compound splitting is part of the EN-DE script and applies to German
only. It is labelled as such everywhere and is **not comparable to sacreBLEU** (usually
0.6-0.8 higher on the same output).

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

NOT_COMPARABLE = "NOT comparable to sacreBLEU"

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Perl
# reads the file as bytes there, so \S is any byte but ASCII whitespace ([ \t\n\v\f\r],
# as in a Python bytes pattern) and matches one byte of a multi-byte character. Matches do
# not overlap: ``a-b-c`` -> ``a ##AT##-##AT## b-c``, but ``a-ü-b`` (ü is two bytes) has its
# second hyphen split as well. Working on the UTF-8 bytes gives the same output.
_COMPOUND = re.compile(rb"(\S)-(\S)")


def compound_split(line: str) -> str:
    r"""``Haus-Tür`` -> ``Haus ##AT##-##AT## Tür``, byte for byte what tensor2tensor's
    ``perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`` prints for this line."""
    # The split points are next to an ASCII "-", so always between characters.
    return _COMPOUND.sub(rb"\1 ##AT##-##AT## \2", line.encode("utf-8")).decode("utf-8")


def _moses_lang(tgt_lang: str | None) -> str:
    lang = re.split(r"[-_]", (tgt_lang or "").strip().lower())[0]
    if not lang:
        raise DataError("tokenized BLEU needs the target language (it picks the Moses tokenizer's "
                        "rules and turns on compound splitting for German)")
    return lang


def tokenized_bleu_name(tgt_lang: str | None) -> str:
    """What :func:`tokenized_bleu` computes, in words, e.g. ``tokenized BLEU (tensor2tensor
    get_ende_bleu.sh: Moses tokenizer de, compound splitting, multi-bleu.perl)``."""
    lang = _moses_lang(tgt_lang)
    if lang == "de":
        return ("tokenized BLEU (tensor2tensor get_ende_bleu.sh: Moses tokenizer de, compound splitting, "
                "multi-bleu.perl)")
    return f"tokenized BLEU (Moses tokenizer {lang}, multi-bleu.perl)"


def paper_tokenize(lines: Sequence[str], tgt_lang: str | None) -> list[str]:
    """``lines`` as ``get_ende_bleu.sh`` hands them to ``multi-bleu.perl``: Moses-tokenized
    (``tokenizer.perl -l LANG``, escaping on), compound-split for German."""
    from sacremoses import MosesTokenizer

    lang = _moses_lang(tgt_lang)
    tok = MosesTokenizer(lang=lang)
    out = [tok.tokenize(line, return_str=True, escape=True) for line in lines]
    return [compound_split(line) for line in out] if lang == "de" else out


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
    also ``tokenized_bleu``, ``tokenized_bleu_signature``, ``tokenized_bleu_name`` (what it
    is, :func:`tokenized_bleu_name`) and ``tokenized_bleu_note`` (the name and a warning);
    ``tgt_lang`` is then required.
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
        name = tokenized_bleu_name(tgt_lang)
        out.update(tokenized_bleu=score, tokenized_bleu_signature=signature, tokenized_bleu_name=name,
                   tokenized_bleu_note=f"{name}; {NOT_COMPARABLE}")
    return out


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]] | Sequence[str],
                   tgt_lang: str | None) -> tuple[float, str]:
    """The paper's figure: tensor2tensor's ``get_ende_bleu.sh`` (Moses tokenizer for
    ``tgt_lang``, compound splitting for German, ``multi-bleu.perl``); see the module text.

    Returns (score, signature), the signature sacreBLEU's with ``tok:moses-de+atat`` (or
    ``tok:moses-LANG``) and the sacremoses version, e.g.
    ``nrefs:1|case:mixed|eff:no|tok:moses-de+atat|smooth:none|version:2.6.0|sacremoses:0.2.0``.
    """
    from importlib.metadata import version

    from sacrebleu.metrics import BLEU

    hyps = list(hyps)
    streams = _streams(hyps, refs)
    lang = _moses_lang(tgt_lang)
    # multi-bleu.perl: whitespace tokens, cased, no smoothing, closest (then shorter) ref length.
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(paper_tokenize(hyps, lang), [paper_tokenize(s, lang) for s in streams])
    tok = f"tok:moses-{lang}+atat" if lang == "de" else f"tok:moses-{lang}"
    signature = f"{str(bleu.get_signature()).replace('tok:none', tok)}|sacremoses:{version('sacremoses')}"
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
