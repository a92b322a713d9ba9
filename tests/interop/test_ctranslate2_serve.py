"""`aiayn serve --ctranslate2`: a CTranslate2 export behind aiayn's translator interface and
HTTP API. The export's float32 model must translate as aiayn does."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
pytest.importorskip("fastapi")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

from fastapi.testclient import TestClient  # noqa: E402

from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import ConfigError  # noqa: E402
from aiayn.inference.protocol import TranslatorProtocol  # noqa: E402
from aiayn.inference.translator import Translator  # noqa: E402
from aiayn.interop.ct2_translator import CTranslate2Translator  # noqa: E402
from aiayn.interop.ctranslate2 import export_ctranslate2  # noqa: E402
from aiayn.serving.app import create_app  # noqa: E402


@pytest.fixture(scope="module")
def ct2_dir(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_ctranslate2(trained.checkpoint, tmp_path_factory.mktemp("ct2serve") / "model")


@pytest.fixture(scope="module")
def ct2(ct2_dir: Path) -> CTranslate2Translator:
    return CTranslate2Translator(ct2_dir, threads=1)


def test_export_carries_the_checkpoint_config(ct2: CTranslate2Translator, trained) -> None:
    assert ct2.config is not None and ct2.decode == trained.config.decode
    assert ct2.config.model.max_positions == trained.config.model.max_positions


def test_ct2_satisfies_the_translator_protocol(ct2: CTranslate2Translator, trained) -> None:
    assert isinstance(ct2, TranslatorProtocol)
    assert ct2.max_src_len == trained.config.model.max_positions
    texts = trained.test_src[:5]
    assert ct2.source_lengths(texts) == [len(trained.tokenizer.encode_src(t)) for t in texts]
    assert list(ct2.describe()) == ["config", "languages", "vocabulary"]
    assert ct2.decode_config(beam=2, lenpen=None).beam == 2
    with pytest.raises(ConfigError, match=r"decode\.beem: unknown decoding option"):
        ct2.decode_config(beem=2)
    with pytest.raises(ConfigError, match="decode.sampling"):
        ct2.decode_config(sampling=True)


def test_translations_equal_aiayn(ct2: CTranslate2Translator, trained) -> None:
    ours = Translator(trained.model, trained.tokenizer, trained.config)
    texts = trained.test_src[:60]
    assert ct2.translate(texts, beam=1) == ours.translate(texts, beam=1)
    # Beam 4 with the checkpoint's |Y|^alpha penalty, CTranslate2's own formula.
    beam_ours, beam_ct2 = ours.translate(texts), ct2.translate(texts)
    same = sum(a == b for a, b in zip(beam_ours, beam_ct2))
    assert same >= 59, f"{same}/60"
    # Empty input: one empty hypothesis, as aiayn's translator gives.
    assert ct2.translate(["", "  "]) == ["", ""]


def test_http_api_on_ctranslate2(ct2: CTranslate2Translator, trained) -> None:
    texts = trained.test_src[:3]
    expected = Translator(trained.model, trained.tokenizer, trained.config).translate(texts, beam=1)
    with TestClient(create_app(ct2)) as client:
        r = client.post("/v1/translate", json={"texts": texts, "beam": 1})
        assert r.status_code == 200 and r.json()["translations"] == expected
        r = client.post("/v1/translate", json={"texts": texts[:1], "beam": 3, "nbest": 3, "attention": True})
        assert r.status_code == 200
        body = r.json()
        scores = [c["score"] for c in body["nbest"][0]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
        att = body["attention"][0]
        assert (att["layers"], att["heads"]) == (1, 1)
        rows = att["weights"][0][0]
        assert len(rows) == len(att["tgt_tokens"]) and all(len(r) == len(att["src_tokens"]) for r in rows)
        assert att["src_tokens"][-1] == "</s>" and att["tgt_tokens"][-1] == "</s>"
        assert all(abs(sum(r) - 1.0) < 1e-3 for r in rows)
        bad = client.post("/v1/translate", json={"texts": texts[:1], "beam": 2, "nbest": 3})
        assert bad.status_code == 422 and "nbest" in bad.json()["message"]
        info = client.get("/v1/model").json()
        assert info["languages"] == {"source": trained.config.data.src_lang, "target": trained.config.data.tgt_lang}
        assert info["vocabulary"]["source"] == trained.tokenizer.src_vocab_size


def test_not_a_ctranslate2_dir_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "x").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--ctranslate2", str(tmp_path / "x")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "missing model.bin, source.spm, target.spm" in err and "Traceback" not in err
