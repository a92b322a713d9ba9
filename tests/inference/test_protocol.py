"""Both translator backends implement TranslatorProtocol, the interface serving is typed against."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from aiayn.config import DecodeConfig
from aiayn.errors import ConfigError
from aiayn.inference.protocol import TranslatorProtocol
from aiayn.inference.translator import Translator
from aiayn.interop.ct2_translator import CTranslate2Translator

MEMBERS = sorted(n for n in vars(TranslatorProtocol) if not n.startswith("_"))
PROPERTIES = sorted(n for n in MEMBERS if isinstance(vars(TranslatorProtocol)[n], property))
METHODS = sorted(set(MEMBERS) - set(PROPERTIES))


def test_protocol_declares_what_serving_and_the_cli_use() -> None:
    assert PROPERTIES == ["config", "max_src_len"]
    assert METHODS == ["decode_config", "describe", "encode_sources", "run", "source_lengths", "translate",
                       "translate_detailed"]


@pytest.mark.parametrize("cls", [Translator, CTranslate2Translator])
def test_class_has_the_protocol_shape(cls: type) -> None:
    """Statically (no instance): each method exists and takes the protocol's parameters,
    with the same defaults; each attribute is set by __init__."""
    for name in METHODS:
        wanted = inspect.signature(getattr(TranslatorProtocol, name)).parameters
        got = inspect.signature(getattr(cls, name)).parameters
        for pname, param in wanted.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in got.values()), f"{cls.__name__}.{name}"
                continue
            assert pname in got, f"{cls.__name__}.{name}({pname})"
            assert got[pname].default == param.default, f"{cls.__name__}.{name}({pname})"
    init = inspect.getsource(cls.__init__)
    for name in PROPERTIES:
        assert f"self.{name}" in init, f"{cls.__name__}.{name}"


def test_translator_satisfies_the_protocol(tiny_checkpoint: Path, english: list[str]) -> None:
    tr = Translator.from_checkpoint(tiny_checkpoint)
    assert isinstance(tr, TranslatorProtocol)
    assert tr.max_src_len == tr.config.model.max_positions == 64
    assert tr.source_lengths(english) == [len(tr.tokenizer.encode_src(t)) for t in english]
    info = tr.describe()
    assert list(info) == ["config", "languages", "vocabulary", "parameters"]
    assert info["config"]["decode"]["beam"] == 4
    assert info["vocabulary"] == {"source": tr.tokenizer.src_vocab_size, "target": tr.tokenizer.tgt_vocab_size,
                                  "joint": True}
    assert info["parameters"]["parameters"] > 0
    assert tr.decode_config(beam=2, lenpen=None) == DecodeConfig(beam=2, lenpen=0.6, max_len_a=1.0, max_len_b=5)
    with pytest.raises(ConfigError, match=r"decode\.beem: unknown decoding option"):
        tr.decode_config(beem=2)


def test_a_class_without_the_members_is_not_a_translator() -> None:
    class Partial:
        config = None
        max_src_len = None

        def translate(self, texts, **overrides):  # noqa: ANN001, ANN003, ANN201
            return list(texts)

    assert not isinstance(Partial(), TranslatorProtocol)
