"""Fingerprints of what the benchmark workloads compute, for before/after A/B of a refactor.

    python benchmarks/ab_fingerprint.py --workdir /tmp/decwd > before.json
    ... change the code ...
    python benchmarks/ab_fingerprint.py --workdir /tmp/decwd > after.json; diff before.json after.json

- decode: the decode benchmark's workload (random base model, 64 x 24 sources, beam 4,
  40 tokens) with fp32, int8 and bf16 weights: a SHA-256 of every hypothesis' tokens and
  score (exact float repr), so any change in the numbers shows.
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
    ap.add_argument("--dtypes", default="fp32,int8,bf16",
                    help="decoding precisions (bf16 takes long where it is emulated)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = {"decode": decode_fingerprints(root, args.dtypes.split(",")),
                  "train": train_fingerprint(Path(tmp) / "run")}
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
