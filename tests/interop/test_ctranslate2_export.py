"""`aiayn export ctranslate2`: the converted model translates as aiayn does."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")
spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

from aiayn.cli.main import main  # noqa: E402
from aiayn.config import DecodeConfig  # noqa: E402
from aiayn.errors import InteropError  # noqa: E402
from aiayn.interop.ctranslate2 import export_ctranslate2  # noqa: E402


@pytest.fixture(scope="module")
def ct2_dir(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_ctranslate2(trained.checkpoint, tmp_path_factory.mktemp("ct2") / "model")


def _translate(model_dir: Path, texts: list[str], **options) -> list[list[str]]:
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", inter_threads=1, intra_threads=1)
    batch = [sp.encode(t, out_type=str) + ["</s>"] for t in texts]
    return [r.hypotheses[0] for r in translator.translate_batch(batch, **options)]


def test_files(ct2_dir: Path) -> None:
    names = {p.name for p in ct2_dir.iterdir()}
    assert {"model.bin", "config.json", "source.spm", "target.spm"} <= names


def test_greedy_equal_to_aiayn_float32(ct2_dir: Path, trained, helpers) -> None:
    texts = trained.test_src
    ours = helpers.aiayn_search(trained.model, trained.tokenizer, texts, DecodeConfig(beam=1))
    theirs = _translate(ct2_dir, texts, beam_size=1, min_decoding_length=0, max_decoding_length=64)
    assert theirs == [trained.tokenizer.tgt_pieces(t) for t in ours]
    # Detokenized with the exported target model: the same text as aiayn's.
    sp = spm.SentencePieceProcessor(model_file=str(ct2_dir / "target.spm"))
    assert [sp.decode(p) for p in theirs] == [trained.tokenizer.decode_tgt(t) for t in ours]


def test_cli_export_int8(tmp_path: Path, trained, helpers) -> None:
    out = tmp_path / "int8"
    with pytest.raises(SystemExit) as exit_:
        main(["export", "ctranslate2", str(trained.checkpoint), str(out), "--quantization", "int8"])
    assert exit_.value.code == 0
    texts = trained.test_src[:20]
    theirs = _translate(out, texts, beam_size=1)
    ours = helpers.aiayn_search(trained.model, trained.tokenizer, texts, DecodeConfig(beam=1))
    # int8 weights are approximate, so this is no equality test; most outputs still agree.
    same = sum(a == trained.tokenizer.tgt_pieces(b) for a, b in zip(theirs, ours))
    assert same >= 15, f"{same}/20"


def test_bad_quantization_is_an_error(tmp_path: Path, trained) -> None:
    with pytest.raises(InteropError, match="quantization 'int3'"):
        export_ctranslate2(trained.checkpoint, tmp_path / "x", quantization="int3")


def test_d_k_other_than_d_model_over_heads_is_refused(tmp_path: Path) -> None:
    """CTranslate2 (like HF Marian, which the export goes through) has d_k = d_v = d_model /
    n_heads: a Table 3 row (B) model is refused, naming the field, and nothing is written."""
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, model_preset
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sees a dog", "a small bird runs"] * 20,
                          ["der katze sieht ein hund", "ein klein vogel rennt"] * 20, tmp_path / "tok", vocab_size=40)
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    d_k=8, d_v=16))
    ckpt = save_checkpoint(tmp_path / "ckpt", build_model(cfg.model), cfg, tokenizer=tok)
    with pytest.raises(InteropError) as err:
        export_ctranslate2(ckpt, tmp_path / "ct2")
    assert "cannot be exported to CTranslate2" in str(err.value)
    assert "model.d_k=8" in str(err.value)
    assert "model.d_v" not in str(err.value)  # d_v = 16 = d_model / n_heads is fine
    assert not (tmp_path / "ct2").exists()
