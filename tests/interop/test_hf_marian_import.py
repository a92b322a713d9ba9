"""`aiayn import hf`: a local MarianMT directory becomes an aiayn checkpoint computing the same."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

from aiayn.checkpoint.directory import load_checkpoint  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.config import DecodeConfig  # noqa: E402
from aiayn.errors import InteropError  # noqa: E402
from aiayn.inference.translator import Translator  # noqa: E402
from aiayn.interop.hf_export import export_hf  # noqa: E402
from aiayn.interop.hf_import import PAD_LOGIT_BIAS, import_hf  # noqa: E402
from aiayn.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer  # noqa: E402


def _marian_spm(texts: list[str], vocab_size: int, model_type: str) -> bytes:
    """A SentencePiece model as Marian/OPUS-MT train them: default ids (<unk> 0, <s> 1, </s> 2)."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size,
                                   model_type=model_type, hard_vocab_limit=False, minloglevel=2)
    return buf.getvalue()


def _marian_vocab(*protos: bytes, lang_tags: tuple[str, ...] = ()) -> dict[str, int]:
    """OPUS-MT's vocab.json layout: </s> 0, <unk> 1, a multilingual model's target-language
    tags, the pieces, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for tag in lang_tags:
        vocab[tag] = len(vocab)
    for proto in protos:
        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(proto)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def make_marian_dir(path: Path, src: list[str], tgt: list[str], *, activation: str = "swish",
                    separate: bool = False, seed: int = 0, lang_tags: tuple[str, ...] = ()) -> Path:
    """A random-initialised MarianMT with its tokenizer, saved as a user would have it on disk."""
    # HF uses the (target) pad id as padding_idx of the source embedding too: with separate
    # vocabularies the source one must be the larger.
    src_proto = _marian_spm(src, 60, "bpe")
    tgt_proto = _marian_spm(tgt, 44, "unigram")
    if separate:
        src_vocab, tgt_vocab = _marian_vocab(src_proto, lang_tags=lang_tags), _marian_vocab(tgt_proto)
    else:
        src_vocab = tgt_vocab = _marian_vocab(src_proto, tgt_proto, lang_tags=lang_tags)
    start = tgt_vocab["<pad>"]  # OPUS-MT: the decoder starts from <pad>
    cfg = transformers.MarianConfig(
        vocab_size=len(src_vocab), decoder_vocab_size=len(tgt_vocab), d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, activation_function=activation, max_position_embeddings=128,
        pad_token_id=start, decoder_start_token_id=start, eos_token_id=0, forced_eos_token_id=0,
        scale_embedding=True, share_encoder_decoder_embeddings=not separate, dropout=0.0,
        # Larger than the default 0.02, so that logits are spread out and greedy decoding does
        # not hinge on near-ties.
        init_std=0.2,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)  # a non-trivial final_logits_bias
    model.generation_config = transformers.GenerationConfig(
        num_beams=4, max_length=64, bad_words_ids=[[start]], decoder_start_token_id=start,
        pad_token_id=start, eos_token_id=0, forced_eos_token_id=0)
    model.save_pretrained(str(path))
    (path / "source.spm").write_bytes(src_proto)
    (path / "target.spm").write_bytes(tgt_proto)
    (path / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False), encoding="utf-8")
    extra = {}
    if separate:
        (path / "target_vocab.json").write_text(json.dumps(tgt_vocab, ensure_ascii=False), encoding="utf-8")
        extra = dict(target_vocab_file=str(path / "target_vocab.json"), separate_vocabs=True)
    tok = transformers.MarianTokenizer(str(path / "source.spm"), str(path / "target.spm"), str(path / "vocab.json"),
                                       source_lang="en", target_lang="de", **extra)
    tok.save_pretrained(str(path))
    return path


def _rows(tok: Tokenizer, hf_dir: Path, side: str) -> list[int]:
    """For each aiayn id, the Marian row it came from (-1 for the added PAD row), by name."""
    name = "target_vocab.json" if side == "tgt" and (hf_dir / "target_vocab.json").is_file() else "vocab.json"
    vocab = json.loads((hf_dir / name).read_text(encoding="utf-8"))
    n = tok.tgt_vocab_size if side == "tgt" else tok.src_vocab_size
    pieces = tok.tgt_pieces(range(n)) if side == "tgt" else tok.src_pieces(range(n))
    rows = [vocab[p] if p in vocab else -1 for p in pieces]
    rows[PAD_ID] = -1
    rows[BOS_ID] = vocab["<pad>"]  # Marian's decoder start
    return rows


@pytest.mark.parametrize("activation,separate", [("swish", False), ("gelu", True)])
def test_import_gives_same_logits_and_greedy_output(tmp_path: Path, helpers, activation: str,
                                                    separate: bool) -> None:
    src, tgt = helpers.toy_pairs(400, seed=11)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt, activation=activation, separate=separate)
    ckpt = import_hf(hf_dir, tmp_path / "imported")
    loaded = load_checkpoint(ckpt)  # what translate / serve / train --init-from do
    model, tok, cfg = loaded.model, loaded.tokenizer, loaded.config
    assert isinstance(tok, Tokenizer)
    assert cfg.model.activation == activation and cfg.model.sinusoid_layout == "concat"
    assert cfg.model.share_embeddings == ("decoder" if separate else "all")
    assert cfg.decode.beam == 4 and cfg.decode.lenpen_style == "fairseq"

    hf_model = transformers.MarianMTModel.from_pretrained(str(hf_dir)).eval()
    hf_tok = transformers.MarianTokenizer.from_pretrained(str(hf_dir))
    texts, refs = src[:12], tgt[:12]
    # The rewritten SentencePiece models segment exactly as Marian's tokenizer does.
    # (HF's convert_ids_to_tokens names ids by the target vocabulary: look source ids up here.)
    src_names = {i: p for p, i in json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8")).items()}
    for t in texts:
        assert tok.src_pieces(tok.encode_src(t)) == [src_names[i] for i in hf_tok(t).input_ids]
    marian_tgt = spm.SentencePieceProcessor(model_file=str(hf_dir / "target.spm"))
    for t in refs:
        assert tok.tokenize_tgt(t) == marian_tgt.encode(t, out_type=str)

    src_rows, tgt_rows = _rows(tok, hf_dir, "src"), _rows(tok, hf_dir, "tgt")
    start = hf_model.config.decoder_start_token_id
    ours_src = helpers.pad_batch([tok.encode_src(t) for t in texts])
    batch = hf_tok(texts, return_tensors="pt", padding=True)
    mapped = [[src_rows[i] for i in tok.encode_src(t)] for t in texts]
    assert [row[:len(m)] for row, m in zip(batch.input_ids.tolist(), mapped)] == mapped
    ours_tgt = [[BOS_ID] + tok.encode_tgt(t) for t in refs]
    hf_tgt = helpers.pad_batch([[start] + [tgt_rows[i] for i in ids[1:]] for ids in ours_tgt], pad=start)
    with torch.no_grad():
        a = model(ours_src, helpers.pad_batch(ours_tgt))
        h = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     decoder_input_ids=hf_tgt).logits
    real = [i for i, r in enumerate(tgt_rows) if r >= 0]
    assert len(real) == h.size(-1)  # every Marian row is an aiayn id
    assert (a[..., real] - h[..., [tgt_rows[i] for i in real]]).abs().max().item() <= 1e-4
    # The added PAD row is invisible: same log-probabilities over the Marian rows.
    assert (a[..., PAD_ID] <= PAD_LOGIT_BIAS + 1e-3).all()
    lp_a = torch.log_softmax(a, -1)[..., real]
    lp_h = torch.log_softmax(h, -1)[..., [tgt_rows[i] for i in real]]
    assert (lp_a - lp_h).abs().max().item() <= 1e-4

    # Greedy: the same tokens, with the same length limit (20 tokens, then EOS is forced).
    ours = helpers.aiayn_search(model, tok, texts, DecodeConfig(beam=1, max_len_a=0.0, max_len_b=20))
    with torch.no_grad():
        seq = hf_model.generate(**batch, num_beams=1, do_sample=False, max_length=22)
    theirs = helpers.hf_generated(seq, hf_model.config.eos_token_id)
    assert [[tgt_rows[i] for i in o] for o in ours] == theirs
    assert any(len(o) > 0 for o in ours)


def test_round_trip_export_then_import_is_exact(tmp_path: Path, trained, helpers) -> None:
    """aiayn -> HF -> aiayn keeps every id (HF pad 0 and decoder start 2 differ: no row added)."""
    hf_dir = export_hf(trained.checkpoint, tmp_path / "hf")
    loaded = load_checkpoint(import_hf(hf_dir, tmp_path / "back"))
    assert loaded.config.model.src_vocab_size == trained.config.model.src_vocab_size
    assert loaded.tokenizer.tokenize_src(trained.test_src[0]) == trained.tokenizer.tokenize_src(trained.test_src[0])
    texts, refs = trained.test_src[:16], trained.test_tgt[:16]
    src = helpers.pad_batch([trained.tokenizer.encode_src(t) for t in texts])
    assert torch.equal(src, helpers.pad_batch([loaded.tokenizer.encode_src(t) for t in texts]))
    tgt = helpers.pad_batch([[BOS_ID] + trained.tokenizer.encode_tgt(t) for t in refs])
    with torch.no_grad():
        diff = (trained.model(src, tgt) - loaded.model(src, tgt)).abs().max().item()
    assert diff <= 1e-4
    greedy = DecodeConfig(beam=1)
    assert (helpers.aiayn_search(loaded.model, loaded.tokenizer, texts, greedy)
            == helpers.aiayn_search(trained.model, trained.tokenizer, texts, greedy))


def test_cli_import(tmp_path: Path, helpers, capsys: pytest.CaptureFixture) -> None:
    src, tgt = helpers.toy_pairs(200, seed=12)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt)
    with pytest.raises(SystemExit) as exit_:
        main(["import", "hf", str(hf_dir), str(tmp_path / "ckpt")])
    assert exit_.value.code == 0
    assert "imported" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "ckpt").tokenizer.src_vocab_size > 4


def test_import_rejects_a_directory_that_is_not_marian(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(InteropError, match="not a Marian model .*model_type='bert'"):
        import_hf(bert, tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InteropError, match="no config.json"):
        import_hf(empty, tmp_path / "out")
    with pytest.raises(InteropError, match="no such directory"):
        import_hf(tmp_path / "missing", tmp_path / "out")
    # Through the CLI: one line, no traceback, non-zero exit, nothing written.
    with pytest.raises(SystemExit) as exit_:
        main(["import", "hf", str(bert), str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "aiayn import: error:" in err and "not a Marian model" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


class _RunsCode:
    """A pickle that would run a shell command when unpickled without restrictions."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("damage", ["truncated_safetensors", "pickle_with_code"])
def test_import_of_a_damaged_or_hostile_weights_file_is_one_line(tmp_path: Path, helpers, capsys, damage) -> None:
    """Regression: a truncated model.safetensors or a pickled pytorch_model.bin ended in a
    traceback. The pickle's code must not run either."""
    import pickle

    src, tgt = helpers.toy_pairs(200, seed=15)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt)
    weights = hf_dir / "model.safetensors"
    marker = tmp_path / "code-ran"
    # Each damaged file keeps the size of the weights (zeros after the damage): a smaller one
    # is refused before transformers sees it, for describing fewer bytes than config.json needs.
    size = weights.stat().st_size
    if damage == "truncated_safetensors":
        weights.write_bytes(weights.read_bytes()[:1000].ljust(size, b"\0"))
    else:
        weights.unlink()
        with open(hf_dir / "pytorch_model.bin", "wb") as f:
            pickle.dump({"model.shared.weight": _RunsCode(marker)}, f)
            f.write(b"\0" * size)
    capsys.readouterr()  # the fixture's own output
    with pytest.raises(SystemExit) as exit_:
        main(["import", "hf", str(hf_dir), str(tmp_path / "out")])
    err = capsys.readouterr().err
    expected = "transformers cannot load" if damage == "truncated_safetensors" else "pickled objects"
    assert exit_.value.code == 2 and expected in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_import_rejects_marian_without_tokenizer_files(tmp_path: Path, helpers) -> None:
    src, tgt = helpers.toy_pairs(200, seed=13)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt)
    (hf_dir / "target.spm").unlink()
    with pytest.raises(InteropError, match="tokenizer files missing: target.spm"):
        import_hf(hf_dir, tmp_path / "out")


def test_import_rejects_unsupported_activation(tmp_path: Path, helpers) -> None:
    src, tgt = helpers.toy_pairs(200, seed=14)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt, activation="gelu_new")
    with pytest.raises(InteropError, match="activation_function='gelu_new'"):
        import_hf(hf_dir, tmp_path / "out")


def test_eos_and_pad_ids_of_imported_tokenizer(tmp_path: Path, helpers) -> None:
    src, tgt = helpers.toy_pairs(200, seed=15)
    tok = load_checkpoint(import_hf(make_marian_dir(tmp_path / "m", src, tgt), tmp_path / "c")).tokenizer
    ids = tok.encode_src(src[0])
    assert ids[-1] == EOS_ID and PAD_ID not in ids and BOS_ID not in ids
    assert tok.decode_tgt(tok.encode_tgt(tgt[0])) == tgt[0]


def test_imported_checkpoint_translates_with_the_aiayn_translator(tmp_path: Path, helpers) -> None:
    """What `aiayn translate` and `aiayn serve` run: the same tokens as HF's greedy search."""
    src, tgt = helpers.toy_pairs(300, seed=16)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt)
    ckpt = import_hf(hf_dir, tmp_path / "ckpt")
    tr = Translator.from_checkpoint(ckpt)
    texts = src[:10]
    results = tr.translate_detailed(texts, beam=1, max_len_a=0.0, max_len_b=20)
    rows = _rows(tr.tokenizer, hf_dir, "tgt")
    hf_model = transformers.MarianMTModel.from_pretrained(str(hf_dir)).eval()
    hf_tok = transformers.MarianTokenizer.from_pretrained(str(hf_dir))
    with torch.no_grad():
        seq = hf_model.generate(**hf_tok(texts, return_tensors="pt", padding=True), num_beams=1,
                                do_sample=False, max_length=22)
    assert [[rows[i] for i in r.best.tokens] for r in results] == helpers.hf_generated(seq, 0)
    assert [r.best.text for r in results] == [tr.tokenizer.decode_tgt(r.best.tokens) for r in results]
    if importlib.util.find_spec("fastapi") is not None:  # the 'serve' extra
        from fastapi.testclient import TestClient

        from aiayn.serving.app import create_app

        with TestClient(create_app(tr)) as client:
            r = client.post("/v1/translate", json={"texts": texts, "beam": 1, "max_len_a": 0.0, "max_len_b": 20})
        assert r.status_code == 200 and r.json()["translations"] == [r.best.text for r in results]


def test_imported_model_fine_tunes_from_the_command_line(tmp_path: Path, helpers,
                                                         capsys: pytest.CaptureFixture) -> None:
    """import hf -> prepare with the checkpoint's tokenizer -> train --init-from -> translate."""
    from safetensors.torch import load_file

    src, tgt = helpers.toy_pairs(200, seed=21)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt, seed=3)
    ckpt = tmp_path / "opus"

    def run(argv: list[str]) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0, capsys.readouterr().err

    run(["import", "hf", str(hf_dir), str(ckpt)])
    data = tmp_path / "text"
    data.mkdir()
    files = {"train.en": src[:160], "train.de": tgt[:160], "valid.en": src[160:], "valid.de": tgt[160:]}
    for name, lines in files.items():
        (data / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepared = tmp_path / "bin"
    run(["prepare", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
         "--valid-src", str(data / "valid.en"), "--valid-tgt", str(data / "valid.de"),
         "--tokenizer-dir", str(ckpt / "tokenizer"), "--out", str(prepared), "--quiet"])
    # the prepared data use the imported tokenizer unchanged: same pieces, same ids
    imported_tok = load_checkpoint(ckpt).tokenizer
    assert Tokenizer.load(prepared).encode_src(src[0]) == imported_tok.encode_src(src[0])

    run_dir = tmp_path / "ft"
    run(["train", "--config", str(ckpt / "config.yaml"), "--run-dir", str(run_dir),
         "--init-from", str(ckpt), f"data.prepared_dir={prepared}", "train.max_steps=2", "train.lr=1e-4",
         "train.lr_schedule=constant", "train.save_every=2", "train.valid_every=2", "train.max_tokens=400",
         "train.device=cpu", "train.dtype=fp32"])
    before = load_file(ckpt / "model.safetensors")
    after_ckpt = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    after = load_file(after_ckpt / "model.safetensors")
    assert before.keys() == after.keys()
    moved = max((after[k] - before[k]).abs().max().item() for k in before)
    # two Adam steps of lr 1e-4 move each weight by at most ~2e-4: the run started from the
    # imported weights (a fresh initialisation would differ by ~0.1), and it did train
    assert 0.0 < moved < 1e-3
    out = tmp_path / "hyp.de"
    (data / "test.en").write_text("\n".join(src[:5]) + "\n", encoding="utf-8")
    run(["translate", "--checkpoint", str(after_ckpt), "--input", str(data / "test.en"), "--output", str(out),
         "--beam", "2"])
    assert len(out.read_text(encoding="utf-8").splitlines()) == 5


@pytest.mark.parametrize("separate", [False, True])
def test_multilingual_model_keeps_its_target_language_tags(tmp_path: Path, helpers, separate: bool) -> None:
    """An OPUS-MT model with >>xx<< tags: imported, the tag chosen by tgt_lang starts the
    source as MarianTokenizer puts it there, and greedy output is HF's; exported again, the
    tags are in the HF vocabulary and come back on import."""
    src, tgt = helpers.toy_pairs(300, seed=21)
    tags = (">>fra<<", ">>spa<<", ">>deu<<")
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt, separate=separate, lang_tags=tags)
    ckpt = import_hf(hf_dir, tmp_path / "ckpt")
    tr = Translator.from_checkpoint(ckpt)
    assert tr.config.data.tgt_lang_tag is True and tr.tokenizer.lang_tags() == list(tags)
    hf_model = transformers.MarianMTModel.from_pretrained(str(hf_dir)).eval()
    hf_tok = transformers.MarianTokenizer.from_pretrained(str(hf_dir))
    names = {i: p for p, i in json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8")).items()}
    texts = src[:6]
    rows = _rows(tr.tokenizer, hf_dir, "tgt")
    for lang in ("fra", "spa"):
        results = tr.translate_detailed(texts, tgt_lang=lang, beam=1, max_len_a=0.0, max_len_b=20)
        tagged = [f">>{lang}<< {t}" for t in texts]
        for r, t in zip(results, tagged):
            assert tr.tokenizer.src_pieces(r.src_tokens) == [names[i] for i in hf_tok(t).input_ids]
        with torch.no_grad():
            seq = hf_model.generate(**hf_tok(tagged, return_tensors="pt", padding=True), num_beams=1,
                                    do_sample=False, max_length=22)
        assert [[rows[i] for i in r.best.tokens] for r in results] == helpers.hf_generated(seq, 0)
    # The checkpoint's own target language ("de") has no tag: --tgt-lang is needed.
    with pytest.raises(Exception, match=r"no target-language tag >>de<< \(it has >>fra<<, >>spa<<, >>deu<<\)"):
        tr.translate(texts[:1])
    # Export: the tags are HF vocabulary entries at aiayn's ids; import again: kept.
    out = export_hf(ckpt, tmp_path / "hf")
    hf_back = transformers.MarianTokenizer.from_pretrained(str(out))
    ids = tr.tokenizer.tagged("spa").encode_src(texts[0])
    assert hf_back(f">>spa<< {texts[0]}").input_ids == ids
    back = load_checkpoint(import_hf(out, tmp_path / "back"))
    assert back.config.data.tgt_lang_tag is True and back.tokenizer.lang_tags() == list(tags)


def test_multilingual_model_on_ctranslate2(tmp_path: Path, helpers) -> None:
    """The CTranslate2 backend puts the same tag before the source as aiayn's translator."""
    pytest.importorskip("ctranslate2")
    from aiayn.interop.ct2_translator import CTranslate2Translator
    from aiayn.interop.ctranslate2 import export_ctranslate2

    src, tgt = helpers.toy_pairs(300, seed=22)
    hf_dir = make_marian_dir(tmp_path / "marian", src, tgt, lang_tags=(">>fra<<", ">>spa<<"))
    ckpt = import_hf(hf_dir, tmp_path / "ckpt")
    ours = Translator.from_checkpoint(ckpt)
    ct2 = CTranslate2Translator(export_ctranslate2(ckpt, tmp_path / "ct2"), threads=1)
    texts = src[:8]
    for lang in ("fra", "spa"):
        assert ct2.translate(texts, beam=1, tgt_lang=lang) == ours.translate(texts, beam=1, tgt_lang=lang)
    assert ct2.translate(texts, beam=1, tgt_lang="fra") != ct2.translate(texts, beam=1, tgt_lang="spa")
    with pytest.raises(Exception, match="no tag >>ita<<"):
        ct2.translate(texts[:1], tgt_lang="ita")
