"""Fingerprints of what the benchmark workloads compute, for before/after A/B of a refactor.

    python benchmarks/ab_fingerprint.py --workdir /tmp/decwd > before.json
    ... change the code ...
    python benchmarks/ab_fingerprint.py --workdir /tmp/decwd > after.json; diff before.json after.json

- decode: the decode benchmark's workload (random base model, 64 x 24 sources, beam 4,
  40 tokens) with fp32, int8 and bf16 weights: a SHA-256 of every hypothesis' tokens and
  score (exact float repr), so any change in the numbers shows.
- translate: the Python API's whole path over tiny random-weight checkpoints (the tests'
  tests/tiny_world.py): fp32/int8/bf16, greedy, sampling, n-best with attention, prefixes,
  terminology constraints, a vocabulary shortlist (per sentence and per batch), averaging,
  an ensemble and the compiled step: a SHA-256 per case of every hypothesis' tokens, score
  and attention sum.
- train: the demo's synthetic task through the training recipe (seeded, one thread,
  60 updates, validation with beam-search BLEU every 20): the metrics log's losses and
  validation figures, and a SHA-256 of the final weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_decode  # noqa: E402


def _sha(items: object) -> str:
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


def decode_fingerprints(root: Path, dtypes: list[str]) -> dict[str, str]:
    cpu_decode.build_models(root)
    out = {}
    for dtype in dtypes:
        _, hyps, _ = cpu_decode.run_aiayn(root, dtype, runs=1)
        out[dtype] = _sha([[(h.tokens, float(h.score).hex()) for h in sent] for sent in hyps])
    return out


def translation_fingerprints(root: Path) -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.tiny_world import TRANSLATOR, WORDS, WORDS_DE, sentences, tiny_checkpoint

    from aiayn.inference.translator import Translator
    from aiayn.text.shortlist import Shortlist

    first = root / "ckpt"
    if not first.is_dir():
        tiny_checkpoint(root, **TRANSLATOR)
    second = root / "ckpt2"
    if not second.is_dir():
        tiny_checkpoint(root, decode=TRANSLATOR["decode"], seed=1, step=2, name="ckpt2",
                        tokenizer=first / "tokenizer")
    texts = sentences(20, 7, WORDS, 12) + [""]
    terms = [{"include": [WORDS_DE[i % 17]], "exclude": [WORDS_DE[(i + 5) % 17]]} if i % 3 == 0 else None
             for i in range(len(texts))]
    prefixes = [WORDS_DE[i % 17] if i % 4 == 1 else None for i in range(len(texts))]

    def with_shortlist(tr: Translator) -> Translator:
        gen = torch.Generator().manual_seed(3)
        v_src, v_tgt = tr.tokenizer.src_vocab_size, tr.tokenizer.tgt_vocab_size
        table = torch.randint(4, v_tgt, (v_src, 6), generator=gen)
        tr.tokenizer.shortlist = Shortlist(table, torch.arange(4, 14))
        return tr

    def digest(results: list) -> str:
        return _sha([[(h.tokens, float(h.score).hex(),
                       None if h.attention is None else float(h.attention.double().sum()).hex())
                      for h in r.hypotheses] for r in results])

    out = {}
    for dtype in ("fp32", "int8", "bf16"):
        tr = Translator.from_checkpoint(first, dtype=dtype)
        out[f"{dtype} beam"] = digest(tr.translate_detailed(texts, nbest=2))
        out[f"{dtype} constraints"] = digest(tr.translate_detailed(texts, constraints=terms,
                                                                   constraints_best_effort=True))
        tr = with_shortlist(tr)
        out[f"{dtype} shortlist"] = digest(tr.translate_detailed(texts, shortlist=True))
        out[f"{dtype} shortlist constraints"] = digest(tr.translate_detailed(
            texts, shortlist=True, constraints=terms, constraints_best_effort=True))
    tr = Translator.from_checkpoint(first, dtype="fp32")
    out["greedy"] = digest(tr.translate_detailed(texts, beam=1))
    out["sampling"] = digest(tr.translate_detailed(texts, nbest=2, sampling=True, beam=3, seed=5))
    out["attention"] = digest(tr.translate_detailed(texts, nbest=2, attention=True, prefixes=prefixes))
    out["lengths"] = digest(tr.translate_detailed(texts, beam=5, lenpen=1.2, min_len=2, no_repeat_ngram_size=2,
                                                  max_len_a=0.5, max_len_b=3, lenpen_style="fairseq"))
    out["averaged"] = digest(Translator.from_checkpoint([first, second], dtype="fp32").translate_detailed(texts))
    ens = Translator.from_checkpoint([first, second], dtype="fp32", ensemble=True)
    out["ensemble"] = digest(ens.translate_detailed(texts, nbest=2, attention=True))
    out["ensemble shortlist"] = digest(with_shortlist(ens).translate_detailed(texts, shortlist=True))
    out["ensemble constraints"] = digest(ens.translate_detailed(texts, constraints=terms,
                                                                constraints_best_effort=True))
    for dtype in ("fp32", "int8"):
        tr = Translator.from_checkpoint(first, dtype=dtype, compile=True)
        out[f"{dtype} compiled"] = digest(tr.translate_detailed(texts * 3, nbest=2))
        out[f"{dtype} compiled shortlist"] = digest(with_shortlist(tr).translate_detailed(texts, shortlist=True))
    return out


def train_fingerprint(run_dir: Path) -> dict[str, object]:
    from aiayn.checkpoint.directory import resolve_checkpoint
    from aiayn.checkpoint.weights import read_model_weights
    from aiayn.recipes.demo import synthetic_config
    from aiayn.recipes.train import run_training

    cfg = synthetic_config()
    cfg.data.synthetic_train_size = 2000
    cfg.train.max_steps, cfg.train.valid_every, cfg.train.save_every, cfg.train.log_every = 60, 20, 20, 10
    run_training(cfg, run_dir)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keep = ("step", "loss", "valid_loss", "valid_bleu", "valid_ppl", "lr", "grad_norm")
    logged = [{k: m[k] for k in keep if k in m} for m in metrics]
    weights = read_model_weights(resolve_checkpoint(run_dir) / "model.safetensors")
    wsha = _sha([(k, v.numpy().tobytes().hex()[:64], float(v.double().sum())) for k, v in sorted(weights.items())])
    return {"metrics": _sha(logged), "weights": wsha, "last": logged[-3:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="where the decode benchmark's models are kept")
    ap.add_argument("--only", choices=["decode", "translate", "train"], help="one part only")
    ap.add_argument("--dtypes", default="fp32,int8,bf16",
                    help="decoding precisions (bf16 takes long where it is emulated)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        parts = {"decode": lambda: decode_fingerprints(root, args.dtypes.split(",")),
                 "translate": lambda: translation_fingerprints(root / "tiny"),
                 "train": lambda: train_fingerprint(Path(tmp) / "run")}
        result = {name: make() for name, make in parts.items() if args.only in (None, name)}
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
