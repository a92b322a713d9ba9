"""Target-language tags (data.tgt_lang_tag, --tgt-lang, tgt_lang in HTTP): the source
starts with >>xx<<, one control piece of the source vocabulary."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from aiayn.config import Config, DataConfig, ModelConfig
from aiayn.data.prepare import load_split, load_tokenizer, prepare_data
from aiayn.errors import ConfigError, DataError
from aiayn.inference.translator import Translator
from aiayn.model import build_model
from aiayn.text.tokenizer import EOS_ID, train_tokenizer

SRC = ["a small dog runs", "the red house", "two men play football in the park", "hello there"] * 10
TGT = ["ein kleiner hund rennt", "das rote haus", "zwei männer spielen fußball im park", "hallo da"] * 10


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(SRC, TGT, tmp_path_factory.mktemp("tags"), 60,
                           src_control_symbols=[">>de<<", ">>fr<<"])


def test_tagged_tokenizer_prepends_the_tag_id(tok):
    assert tok.lang_tags() == [">>de<<", ">>fr<<"]
    de, fr = tok.src_pieces(range(tok.src_vocab_size)).index(">>de<<"), tok.src_pieces(
        range(tok.src_vocab_size)).index(">>fr<<")
    plain = tok.encode_src("the red house")
    assert tok.tagged("de").encode_src("the red house") == [de] + plain
    assert tok.tagged("fr").encode_src_batch(["the red house"]) == [[fr] + plain]
    assert tok.tagged("de").tagged(None).encode_src("the red house") == plain
    assert tok.decode_src(tok.tagged("de").encode_src("the red house")) == "the red house"
    # A text may start with its own tag (as Marian's tokenizer reads it): it wins over the
    # tokenizer's; elsewhere, or a tag the vocabulary lacks, it is text.
    assert tok.encode_src(">>de<< the red house") == [de] + plain
    assert tok.tagged("fr").encode_src_batch(["  >>de<<  the red house", "the red house"]) == [
        [de] + plain, [fr] + plain]
    assert de not in tok.encode_src("the >>de<< red house")
    assert tok.encode_src(">>it<< the red house")[:-1] != plain
    assert pickle.loads(pickle.dumps(tok.tagged("fr"))).encode_src("the red house") == [fr] + plain
    with pytest.raises(DataError, match=r"no target-language tag >>it<< \(it has >>de<<, >>fr<<\)"):
        tok.tagged("it")


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_prepare_tags_every_source_and_adds_a_missing_tag_to_a_given_tokenizer(tmp_path):
    cfg = DataConfig(train_src=write(tmp_path / "t.en", SRC), train_tgt=write(tmp_path / "t.de", TGT),
                     valid_src=str(tmp_path / "t.en"), valid_tgt=str(tmp_path / "t.de"), vocab_size=60,
                     tgt_lang="de", tgt_lang_tag=True)
    prepare_data(cfg, tmp_path / "tagged", progress=False)
    tagged = load_tokenizer(tmp_path / "tagged")
    tag_id = tagged.src_pieces(range(tagged.src_vocab_size)).index(">>de<<")
    for role in ("train", "valid"):
        split = load_split(tmp_path / "tagged", role)
        assert all(int(split[i][0][0]) == tag_id and int(split[i][0][-1]) == EOS_ID for i in range(len(split)))
    # A tokenizer without the tag (e.g. an earlier checkpoint's) gets it appended: ids kept.
    prepare_data(DataConfig(train_src=cfg.train_src, train_tgt=cfg.train_tgt, vocab_size=60), tmp_path / "plain",
                 progress=False)
    plain = load_tokenizer(tmp_path / "plain")
    n = plain.src_vocab_size
    fr = DataConfig(train_src=cfg.train_src, train_tgt=cfg.train_tgt, tgt_lang="fr", tgt_lang_tag=True,
                    tokenizer_dir=str(tmp_path / "plain"))
    summary = prepare_data(fr, tmp_path / "fr", progress=False)
    grown = load_tokenizer(tmp_path / "fr")
    assert summary["reused"]["tokenizer"] is False and grown.src_vocab_size == n + 1
    assert grown.src_pieces(range(n + 1)) == plain.src_pieces(range(n)) + [">>fr<<"]
    assert int(load_split(tmp_path / "fr", "train")[0][0][0]) == n


def test_prepare_a_corpus_whose_sources_carry_their_own_tags(tmp_path):
    """Mixed target languages in one corpus (OPUS-MT's training data): each source line
    starts with its tag; the lines without one get data.tgt_lang's."""
    src = [f">>fr<< {s}" if k % 2 else s for k, s in enumerate(SRC)]
    cfg = DataConfig(train_src=write(tmp_path / "t.en", src), train_tgt=write(tmp_path / "t.de", TGT),
                     vocab_size=60, tgt_lang="de", tgt_lang_tag=True)
    prepare_data(cfg, tmp_path / "mixed", progress=False)
    tok = load_tokenizer(tmp_path / "mixed")
    assert tok.lang_tags() == [">>de<<", ">>fr<<"]
    pieces = tok.src_pieces(range(tok.src_vocab_size))
    assert not any(">>" in p or "<<" in p for p in pieces if p not in (">>de<<", ">>fr<<"))  # tags are not text
    split = load_split(tmp_path / "mixed", "train")
    firsts = [pieces[int(split[i][0][0])] for i in range(len(split))]
    assert firsts == [">>fr<<" if k % 2 else ">>de<<" for k in range(len(SRC))]


def _translator(tok, **data) -> Translator:
    model = build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                                    src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    max_positions=64))
    return Translator(model, tok, Config(data=DataConfig(**data)))


def test_translator_tags_the_sources_by_tgt_lang(tok):
    pieces = tok.src_pieces(range(tok.src_vocab_size))
    de, fr = pieces.index(">>de<<"), pieces.index(">>fr<<")
    plain = tok.encode_src("the red house")
    tagged = _translator(tok, tgt_lang="de", tgt_lang_tag=True)
    src = lambda tr, **kw: tr.translate_detailed(["the red house"], max_len_b=3, **kw)[0].src_tokens  # noqa: E731
    assert src(tagged) == [de] + plain
    # The length a command line or the server checks is the tagged one (the tag is a token).
    assert tagged.source_lengths(["the red house"]) == [len(plain) + 1]
    assert src(tagged, tgt_lang="fr") == [fr] + plain
    untagged = _translator(tok)
    assert untagged.source_lengths(["the red house"], untagged.decode_config(tgt_lang="fr")) == [len(plain) + 1]
    assert src(untagged) == plain and src(untagged, tgt_lang="fr") == [fr] + plain
    # A line's own tag wins (translate input as Marian's: ">>fr<< text").
    assert tagged.translate_detailed([">>fr<< the red house"], max_len_b=3)[0].src_tokens == [fr] + plain
    no_tag = r"^decode.tgt_lang: the source vocabulary has no target-language tag >>it<< \(it has >>de<<, >>fr<<\)"
    with pytest.raises(ConfigError, match=no_tag):
        untagged.translate(["the red house"], tgt_lang="it")
    with pytest.raises(ConfigError, match="decode.tgt_lang: a language code"):
        untagged.translate(["x"], tgt_lang="de fr")


def test_http_request_carries_tgt_lang():
    from aiayn.serving.schemas import TranslateRequest

    req = TranslateRequest(texts=["a"], tgt_lang="fr")
    assert req.decode_overrides() == {"tgt_lang": "fr"}
    assert TranslateRequest(texts=["a"]).decode_overrides() == {}
