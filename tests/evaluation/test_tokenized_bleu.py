"""The paper's tokenized BLEU, as tensor2tensor's get_ende_bleu.sh computes it: Moses
tokenizer (sacremoses, escaping on), perl compound splitting, multi-bleu.perl (here
sacreBLEU with tokenize none / smooth none).

The golden tokenizations below were produced by Moses' tokenizer.perl -l de (the 2017
version, as the paper used; commit d2b558728) and ``perl -ple
's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``; the scores were checked against multi-bleu.perl.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import subprocess

import pytest
import sacrebleu

from aiayn.errors import DataError
from aiayn.evaluation.bleu import (
    compound_split,
    corpus_scores,
    paper_tokenize,
    tokenized_bleu,
    tokenized_bleu_name,
)

# (input line, tokenizer.perl -l de, then compound-split)
GOLDEN_DE = [
    ("Die Haus-Tür ist offen.",
     "Die Haus-Tür ist offen .",
     "Die Haus ##AT##-##AT## Tür ist offen ."),
    # Chained hyphens: perl's s///g does not overlap, so a-b-c keeps its second hyphen; but
    # perl reads bytes, and after a-ü (ü is two bytes) the match resumes inside the ü.
    ("Das Ost-West-Verhältnis, a-b-c und a-ü-b.",
     "Das Ost-West-Verhältnis , a-b-c und a-ü-b .",
     "Das Ost ##AT##-##AT## West ##AT##-##AT## Verhältnis , a ##AT##-##AT## b-c und "
     "a ##AT##-##AT## ü ##AT##-##AT## b ."),
    ("Der 1.-Mai-Feiertag, E-Mail-Adresse, d--e, a---b.",
     "Der 1.-Mai-Feiertag , E-Mail-Adresse , d--e , a---b .",
     "Der 1. ##AT##-##AT## Mai ##AT##-##AT## Feiertag , E ##AT##-##AT## Mail ##AT##-##AT## Adresse , "
     "d ##AT##-##AT## -e , a ##AT##-##AT## --b ."),
    # Hyphens next to punctuation: the punctuation is split off first, so no compound.
    ('Er kam (Haus-)Tür-zu-Tür - nicht -so- oder "Haus-"Tür.',
     "Er kam ( Haus- ) Tür-zu-Tür - nicht -so- oder &quot; Haus- &quot; Tür .",
     "Er kam ( Haus- ) Tür ##AT##-##AT## zu ##AT##-##AT## Tür - nicht -so- oder &quot; Haus- &quot; Tür ."),
    ("Haus-\"Tür\" und 'Haus'-Tür, Nord-/Südkorea, A-&B, 50-%-Grenze.",
     "Haus- &quot; Tür &quot; und &apos; Haus &apos; -Tür , Nord- / Südkorea , A- &amp; B , 50- % -Grenze .",
     "Haus- &quot; Tür &quot; und &apos; Haus &apos; -Tür , Nord- / Südkorea , A- &amp; B , 50- % -Grenze ."),
    # Numbers: commas and dots inside numbers stay, a range is a compound.
    ("Die Zahl 1,000.5 und 3-4 Tage, 5,300 Euro, 10.000 Kinder.",
     "Die Zahl 1,000.5 und 3-4 Tage , 5,300 Euro , 10.000 Kinder .",
     "Die Zahl 1,000.5 und 3 ##AT##-##AT## 4 Tage , 5,300 Euro , 10.000 Kinder ."),
    # Quotes: straight ones escaped, German ones split off as they are.
    ('Er sagte "Hallo" und „Guten Tag“ zu ihr.',
     "Er sagte &quot; Hallo &quot; und „ Guten Tag “ zu ihr .",
     "Er sagte &quot; Hallo &quot; und „ Guten Tag “ zu ihr ."),
    ("Sein Vater rief: »Komm her!« – und sie kam.",
     "Sein Vater rief : » Komm her ! « – und sie kam .",
     "Sein Vater rief : » Komm her ! « – und sie kam ."),
    # Apostrophes: split on both sides for German, and escaped.
    ("Peter's Auto, 's ist gut, rock 'n' roll.",
     "Peter &apos; s Auto , &apos; s ist gut , rock &apos; n &apos; roll .",
     "Peter &apos; s Auto , &apos; s ist gut , rock &apos; n &apos; roll ."),
    # Moses' default escaping (tokenizer.perl without -no-escape).
    ("Müller & Söhne GmbH | <b> [x]",
     "Müller &amp; Söhne GmbH &#124; &lt; b &gt; &#91; x &#93;",
     "Müller &amp; Söhne GmbH &#124; &lt; b &gt; &#91; x &#93;"),
    # Non-breaking prefixes (German ordinals, abbreviations).
    ("Er wurde am 3. Oktober geboren, d.h. z.B. im Jahr 1990.",
     "Er wurde am 3. Oktober geboren , d.h. z.B. im Jahr 1990 .",
     "Er wurde am 3. Oktober geboren , d.h. z.B. im Jahr 1990 ."),
    ("So ist es... Was?! Nein.",
     "So ist es ... Was ? ! Nein .",
     "So ist es ... Was ? ! Nein ."),
]


@pytest.mark.parametrize(("raw", "moses", "atat"), GOLDEN_DE)
def test_golden_tokenization(raw: str, moses: str, atat: str) -> None:
    assert paper_tokenize([raw], "de") == [atat]
    assert compound_split(moses) == atat
    # Other languages: Moses rules for that language, no compound splitting.
    assert "##AT##" not in paper_tokenize([raw], "fr")[0]


def test_english_moses_rules() -> None:
    assert paper_tokenize(["Peter's car isn't the 1990's \"best\" one-off & co."], "en") == [
        "Peter &apos;s car isn &apos;t the 1990 &apos;s &quot; best &quot; one-off &amp; co ."]
    assert paper_tokenize(["a-b  ", "", "   "], "EN") == ["a-b", "", ""]


CHAINS = ["a-b-c", "a-b-c-d", "a-ü-b", "x-äö-y", "ü-ü-ü-ü", "- a -b c- d--e a---b", "3-4 x - y -z",
          "„Haus-Tür“-Schild", "ab-\u00a0c", "日-本-語", "a-\u2028-b"]


def test_compound_split_chains() -> None:
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert compound_split("a-b-c-d") == "a ##AT##-##AT## b-c ##AT##-##AT## d"
    assert compound_split("a-ü-b") == "a ##AT##-##AT## ü ##AT##-##AT## b"
    # perl's \S on bytes: a no-break space (two bytes) is not whitespace there.
    assert compound_split("ab-\u00a0c") == "ab ##AT##-##AT## \u00a0c"


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl is not installed")
def test_compound_split_equals_perl() -> None:
    lines = [moses for _, moses, _ in GOLDEN_DE] + CHAINS
    proc = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"],
                          input="\n".join(lines).encode() + b"\n", capture_output=True, check=True, timeout=60)
    assert proc.stdout.decode("utf-8").split("\n")[:-1] == [compound_split(line) for line in lines]


WORDS = ("Ein Mann fährt mit dem Fahrrad über die Haus-Tür, ein Hund läuft im Park. Zwei Frauen spielen "
         "Fußball auf der Straße! „Hallo“ 3-4 10.000 1,000.5 Kinder \"so\" Peter's a-ü-b Ost-West-Achse "
         "Müller & Söhne z.B. Dr. 5. (Haus-)Tür <b> [1] | Tür-zu-Tür -- a---b").split()


def _corpus(seed: int) -> tuple[list[str], list[str], list[str]]:
    rng = random.Random(seed)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) for _ in range(80)]
    hyps = [" ".join(w for w in r.split() if rng.random() > 0.25) for r in refs]
    ref2 = [" ".join(rng.sample(r.split(), len(r.split()))) for r in refs]
    return hyps, refs, ref2


@pytest.mark.parametrize("lang", ["de", "en"])
def test_score_is_multi_bleu_over_the_tokenized_text(lang: str) -> None:
    hyps, refs, ref2 = _corpus(7)
    hyps_tok, refs_tok, ref2_tok = (paper_tokenize(x, lang) for x in (hyps, refs, ref2))
    score, signature = tokenized_bleu(hyps, refs, lang)
    expected = sacrebleu.corpus_bleu(hyps_tok, [refs_tok], tokenize="none", smooth_method="none", force=True)
    assert score == expected.score
    two, _ = tokenized_bleu(hyps, [refs, ref2], lang)
    assert two == sacrebleu.corpus_bleu(hyps_tok, [refs_tok, ref2_tok], tokenize="none", smooth_method="none",
                                        force=True).score
    tok = "tok:moses-de+atat" if lang == "de" else "tok:moses-en"
    assert f"|{tok}|smooth:none|" in signature and "|sacremoses:" in signature
    assert "case:mixed" in signature and "tok:none" not in signature and "intl" not in signature


def test_no_smoothing() -> None:
    # multi-bleu.perl: no smoothing, so no 4-gram match at all gives 0 ...
    assert tokenized_bleu(["Die Haus-Tür ."], ["Die Haus-Tür ."], "de")[0] == pytest.approx(100.0)
    assert tokenized_bleu(["Die Tür ."], ["Die Tür ."], "de")[0] == 0.0
    assert tokenized_bleu(["a b c d", "x y"], ["a b c e", "x y"], "de")[0] == 0.0
    # ... and the exponential smoothing of sacreBLEU's default would not.
    assert sacrebleu.corpus_bleu(["a b c d", "x y"], [["a b c e", "x y"]], tokenize="none").score > 0


def test_differs_from_the_old_intl_figure() -> None:
    """sacreBLEU's intl tokenizer (the old implementation) split every hyphen, so compound
    splitting never fired and "Haus - Tür" matched "Haus-Tür": 100.0 here. With Moses, the
    reference's compound is split with ##AT## markers and the hypothesis' loose hyphen is not."""
    hyps = ["Die Haus - Tür ist seit dem 3. Oktober offen .", "Ein Ost-West-Verhältnis , sagte er ."]
    refs = ["Die Haus-Tür ist seit dem 3. Oktober offen.", "Ein Ost-West-Verhältnis, sagte er."]
    score, _ = tokenized_bleu(hyps, refs, "de")
    # multi-bleu.perl: BLEU = 86.56, 95.2/89.5/82.4/80.0 (BP=1.000, ratio=1.000, hyp_len=21, ref_len=21)
    assert score == pytest.approx(86.56030552541704, abs=1e-9)
    old_intl_score = 100.0
    assert abs(score - old_intl_score) > 10


def test_names_and_language() -> None:
    assert tokenized_bleu_name("de") == ("tokenized BLEU (tensor2tensor get_ende_bleu.sh: Moses tokenizer de, "
                                         "compound splitting, multi-bleu.perl)")
    assert tokenized_bleu_name("de-AT") == tokenized_bleu_name("DE")
    assert tokenized_bleu_name("fr") == "tokenized BLEU (Moses tokenizer fr, multi-bleu.perl)"
    scores = corpus_scores(["Die Haus-Tür ."], ["Die Haus-Tür ."], tokenized=True, tgt_lang="de")
    assert scores["tokenized_bleu_name"] == tokenized_bleu_name("de")
    assert scores["tokenized_bleu_note"] == tokenized_bleu_name("de") + "; NOT comparable to sacreBLEU"
    assert "tok:moses-de+atat" in scores["tokenized_bleu_signature"]
    with pytest.raises(DataError, match="target language"):
        corpus_scores(["a"], ["a"], tokenized=True)


@pytest.mark.parametrize("lang", [None, "", " ", "_de"])
def test_tokenized_bleu_needs_the_target_language(lang: str | None) -> None:
    message = ("tokenized BLEU needs the target language (it picks the Moses tokenizer's rules and turns on "
               "compound splitting for German)")
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        tokenized_bleu(["a"], ["a"], lang)


def test_tokenized_bleu_does_not_warn_about_tokenized_input(caplog: pytest.LogCaptureFixture) -> None:
    # The text is tokenized on purpose: sacreBLEU's "100 lines that end in a tokenized
    # period" warning must not fire.
    lines = ["Das Haus ist alt.", "Der Hund schläft."] * 60
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        score, _ = tokenized_bleu(lines, lines, "de")
    assert score == pytest.approx(100.0)
    assert caplog.records == []
