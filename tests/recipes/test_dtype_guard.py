"""The `--dtype auto` quality guard that the slow recipe tests run on their trained models,
checked here on a tiny random model: it scores fp32 and every precision auto can choose."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def test_the_guard_scores_fp32_and_each_auto_precision(dtype_guard, tiny_checkpoints: Callable[..., Path],
                                                       tmp_path: Path) -> None:
    from aiayn.inference.translator import Translator

    # A BPE tokenizer trained on the same sentences on both sides.
    checkpoint = tiny_checkpoints("same-words", vocab_size=80, model_type="bpe", name="ckpt",
                                  decode={"beam": 2, "max_len_a": 1.0, "max_len_b": 3})
    sources = ["a man is riding a bike", "the dog in the park", "a red ball on the street"]
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    fp32 = Translator.from_checkpoint(checkpoint, dtype="fp32").translate(sources)
    (tmp_path / "ref.txt").write_text("".join(s + "\n" for s in fp32), encoding="utf-8")
    # A random model's near-ties may flip in another precision: the tolerance is wide here.
    scores = dtype_guard([checkpoint], tmp_path / "src.txt", tmp_path / "ref.txt", tolerance=100.0)
    assert list(scores) == ["fp32", "bf16", "int8"] and round(scores["fp32"], 6) == 100.0
