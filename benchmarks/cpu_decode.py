"""Beam-4 decoding speed on this CPU: aiayn against HF `generate` and CTranslate2.

Workload (see workloads.py): Transformer base, vocabulary 32,000, random weights, 64 source
sentences of 24 tokens (23 random ids + EOS), beam 4, exactly 40 generated tokens each
(EOS blocked before, forced after), all 64 in one call, 2 threads; figure = 64 x 40 / s.

All systems run the *same* weights: the aiayn model is exported with `aiayn export hf`
(MarianMTModel) and converted from there with CTranslate2's own converter (float32 and
int8). Each system runs in its own process, so its peak RSS is its own. The compile cache is
a new empty folder; each compiled row runs twice, the second process starting from what the
first left in it ("second run's first call": loading the compiled step instead of building it).

    python benchmarks/cpu_decode.py [--quick] [--json [FILE]] [--systems aiayn,hf,ctranslate2]

``--json`` alone writes benchmarks/results/decode.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

SYSTEMS = [("aiayn", "fp32"), ("aiayn", "bf16"), ("aiayn", "int8"),
           ("aiayn", "fp32+compile"), ("aiayn", "bf16+compile"), ("aiayn", "int8+compile"), ("hf", "fp32"),
           ("ctranslate2", "float32"), ("ctranslate2", "int8")]


def build_models(root: Path) -> None:
    """Random base model + a 32,000-word tokenizer -> aiayn checkpoint, HF dir, CTranslate2 dirs."""
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, model_preset
    from aiayn.interop.ctranslate2 import convert_hf_dir
    from aiayn.interop.hf_export import save_hf_dir
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    if (root / "done").exists():
        return
    # A word-level SentencePiece model: every one of the 31,996 words is one piece.
    words = [f"w{i}" for i in range(W.VOCAB - 4)]
    lines = [" ".join(words[i:i + 20]) for i in range(0, len(words), 20)]
    tok = train_tokenizer(lines, lines, root / "spm", W.VOCAB, model_type="word", input_sentence_size=0)
    assert tok.src_vocab_size == W.VOCAB, tok.src_vocab_size
    torch.manual_seed(W.SEED)
    cfg = Config(model=model_preset("base", src_vocab_size=W.VOCAB, tgt_vocab_size=W.VOCAB))
    model = build_model(cfg.model).eval()
    save_checkpoint(root / "aiayn", model, cfg, tok)
    save_hf_dir(model, cfg, tok, root / "hf", warn_generation=False)
    convert_hf_dir(root / "hf", root / "ct2-float32")
    convert_hf_dir(root / "hf", root / "ct2-int8", quantization="int8")
    (root / "done").write_text("ok")


def run_aiayn(root: Path, dtype: str, runs: int) -> tuple[list[float], list[list[int]], float]:
    """Timed runs' seconds, the outputs, and the first (warm-up) call's seconds."""
    from aiayn.config import DecodeConfig
    from aiayn.inference.search import search

    tr = W.aiayn_translator(root, dtype)
    src = W.decode_sources()
    cfg = DecodeConfig(beam=W.BEAM, lenpen=0.6, min_len=W.DECODE_NEW, max_len_a=0.0, max_len_b=W.DECODE_NEW)
    out: list = []

    def once() -> None:
        with torch.inference_mode():  # what Translator.translate runs, minus text in and out
            out[:] = search(tr.decoder, src.to(tr.device), cfg)

    first: list[float] = []
    seconds = W.time_runs(once, runs, warmup_seconds=first)
    return seconds, out, first[0]


def run_hf(root: Path, runs: int) -> tuple[list[float], list[list[int]]]:
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(root / "hf").eval()
    src = W.decode_sources()
    out: list = []

    def once() -> None:
        with torch.inference_mode():
            ids = model.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=W.BEAM,
                                 min_new_tokens=W.DECODE_NEW + 1, max_new_tokens=W.DECODE_NEW + 1,
                                 length_penalty=0.6, early_stopping=True, do_sample=False)
        out[:] = ids.tolist()

    seconds = W.time_runs(once, runs)
    return seconds, out


def ct2_translator(root: Path, quant: str) -> tuple[Any, dict[int, str]]:
    """The converted model's CTranslate2 translator (2 threads) and its id -> piece map."""
    import ctranslate2

    translator = ctranslate2.Translator(str(root / f"ct2-{quant}"), device="cpu", inter_threads=1,
                                        intra_threads=W.THREADS)
    vocab = json.loads((root / "hf" / "vocab.json").read_text())
    return translator, {i: p for p, i in vocab.items()}


def run_ct2(root: Path, quant: str, runs: int) -> tuple[list[float], list[list[int]]]:
    translator, pieces = ct2_translator(root, quant)
    batch = [[pieces[i] for i in row] for row in W.decode_sources().tolist()]
    out: list = []

    def once() -> None:
        res = translator.translate_batch(batch, beam_size=W.BEAM, length_penalty=0.6,
                                         min_decoding_length=W.DECODE_NEW, max_decoding_length=W.DECODE_NEW,
                                         max_batch_size=len(batch))
        out[:] = [r.hypotheses[0] for r in res]

    seconds = W.time_runs(once, runs)
    return seconds, out


def run_one(root: Path, system: str, dtype: str, runs: int) -> dict:
    W.setup_process(system)
    first = None
    if system == "aiayn":
        seconds, out, first = run_aiayn(root, dtype, runs)
    elif system == "hf":
        seconds, out = run_hf(root, runs)
    else:
        seconds, out = run_ct2(root, dtype, runs)
    tokens = W.DECODE_SENTS * W.DECODE_NEW
    t = W.Timing(system, dtype, tokens, seconds)
    return {"system": system, "dtype": dtype, "tokens_per_s": t.tokens_per_s,
            "best_tokens_per_s": t.best_tokens_per_s, "seconds": seconds, "peak_rss_mb": W.peak_rss_mb(),
            "outputs": len(out), "first_call_s": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    W.add_common_args(ap, "decode.json")
    W.add_decode_args(ap, "aiayn,hf,ctranslate2")
    args = ap.parse_args()
    runs = W.apply_common_args(args)
    if args.one:
        root, system, dtype = args.one
        print(json.dumps(run_one(Path(root), system, dtype, runs)))
        return
    W.setup_threads()
    wanted = set(args.systems.split(","))
    with W.model_root(args.workdir) as root, tempfile.TemporaryDirectory(prefix="aiayn-cache-") as cache:
        os.environ["AIAYN_CACHE_DIR"] = cache  # read by the processes below: cold, then warm
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        try:
            build_models(root)
        except ImportError as exc:  # transformers / ctranslate2 missing: aiayn alone
            print(f"peers unavailable ({exc}); measuring aiayn only", file=sys.stderr)
            wanted = {"aiayn"}
            if not (root / "aiayn").exists():
                raise
        rows = []
        for system, dtype in SYSTEMS:
            if system not in wanted:
                rows.append({"system": system, "dtype": dtype, "skipped": "not selected"})
                continue
            if skip := W.emulated(dtype, args.emulated):
                rows.append({"system": system, "dtype": dtype, "skipped": skip})
                print(f"  {system} {dtype}: skipped: {skip}", file=sys.stderr)
                continue
            row = W.run_isolated(__file__, ["--one", str(root), system, dtype, "--runs", str(runs)])
            if "compile" in dtype and not row.get("skipped"):
                again = W.run_isolated(__file__, ["--one", str(root), system, dtype, "--runs", "1"])
                row["second_run_first_call_s"] = again.get("first_call_s")
            rows.append({"system": system, "dtype": dtype, **row})
            print(f"  {system} {dtype}: {row.get('tokens_per_s', 0):.1f} tok/s {row.get('skipped', '')}",
                  file=sys.stderr)
    ok = {(r["system"], r["dtype"]): r["tokens_per_s"] for r in rows if not r.get("skipped")}
    reference = {"hf fp32": ok.get(("hf", "fp32"), 0.0), "ct2 f32": ok.get(("ctranslate2", "float32"), 0.0),
                 "ct2 int8": ok.get(("ctranslate2", "int8"), 0.0)}
    W.print_table("beam-4 decoding, base, 64 x 40 generated tokens, 2 threads", rows, reference)
    print("first (warm-up) call, compiling included: " + ", ".join(
        f"{r['dtype']} {r['first_call_s']:.1f} s" for r in rows if r.get("first_call_s") is not None))
    print("second run's first call (the first run's compiled step on disk): " + ", ".join(
        f"{r['dtype']} {r['second_run_first_call_s']:.1f} s" for r in rows if r.get("second_run_first_call_s")))
    # decoding cost per generated token of the base model (FLOPs of the matmuls)
    W.report_ceiling(ok, rows, flop_per_token=330e6, json_path=args.json)

if __name__ == "__main__":
    main()
