"""Training-step speed on this CPU: aiayn against torch.nn.Transformer and HF MarianMTModel.

Workload (see workloads.py): Transformer base, vocabulary 32,000, 128 pairs x 32 tokens per
side, forward + backward + Adam update, 2 threads. Each system runs in its own process so that
its peak RSS is its own; ratios come from this run only.

    python benchmarks/cpu_train.py [--quick] [--json [FILE]] [--systems aiayn,nn,hf]

``--json`` alone writes benchmarks/results/train.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

SYSTEMS = [("aiayn", "fp32"), ("aiayn", "bf16"), ("aiayn", "bf16+compile"), ("nn.Transformer", "fp32"),
           ("nn.Transformer", "bf16"), ("hf", "fp32")]


def _loss(logits: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt_out.reshape(-1),
                           ignore_index=W.PAD, label_smoothing=0.1, reduction="sum")


def build_aiayn(dtype: str):
    from aiayn.config import TrainConfig, model_preset
    from aiayn.model import build_model
    from aiayn.training.loss import projected_label_smoothed_loss  # the trainer's own loss and optimizer
    from aiayn.training.optim import build_optimizer

    model = build_model(model_preset("base", src_vocab_size=W.VOCAB, tgt_vocab_size=W.VOCAB)).train()
    opt = build_optimizer(model, TrainConfig(lr=1e-4))
    if dtype.endswith("+compile"):  # regional compilation: each layer compiled (one graph for the 6 alike)
        for layer in [*model.encoder_layers, *model.decoder_layers]:
            layer.compile()

    def step(src, tgt_in, tgt_out):  # as Trainer.train_step: projection fused with the loss
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype.startswith("bf16")):
            states = model(src, tgt_in, project=False)
            loss = projected_label_smoothed_loss(states, model.output_weight, model.output_bias, tgt_out,
                                                 0.1, W.PAD)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def build_nn(dtype: str):
    class NNModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(W.VOCAB, W.D_MODEL, padding_idx=W.PAD)
            self.core = torch.nn.Transformer(W.D_MODEL, W.HEADS, W.LAYERS, W.LAYERS, W.D_FF, dropout=0.1,
                                             batch_first=True)
            pos = torch.arange(512)[:, None] / torch.pow(10000, torch.arange(0, W.D_MODEL, 2) / W.D_MODEL)
            pe = torch.zeros(512, W.D_MODEL)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
            self.register_buffer("pe", pe)

        def forward(self, src, tgt_in):
            def emb(x):
                return self.embed(x) * W.D_MODEL**0.5 + self.pe[: x.size(1)]
            mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1))
            h = self.core(emb(src), emb(tgt_in), tgt_mask=mask, tgt_is_causal=True,
                          src_key_padding_mask=src == W.PAD, memory_key_padding_mask=src == W.PAD)
            return F.linear(h, self.embed.weight)

    model = NNModel().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(src, tgt_in, tgt_out):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(src, tgt_in)
        loss = _loss(logits, tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def build_hf(dtype: str):
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(vocab_size=W.VOCAB, d_model=W.D_MODEL, encoder_layers=W.LAYERS, decoder_layers=W.LAYERS,
                       encoder_attention_heads=W.HEADS, decoder_attention_heads=W.HEADS,
                       encoder_ffn_dim=W.D_FF, decoder_ffn_dim=W.D_FF, activation_function="relu",
                       dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
                       pad_token_id=W.PAD, eos_token_id=W.EOS, decoder_start_token_id=W.BOS,
                       max_position_embeddings=512)
    model = MarianMTModel(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(src, tgt_in, tgt_out):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(input_ids=src, attention_mask=src != W.PAD, decoder_input_ids=tgt_in).logits
        loss = _loss(logits, tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


BUILDERS = {"aiayn": build_aiayn, "nn.Transformer": build_nn, "hf": build_hf}


def run_one(system: str, dtype: str, runs: int) -> dict:
    W.setup_process(system)
    torch.manual_seed(W.SEED)
    step = BUILDERS[system](dtype)
    src, tgt_in, tgt_out = W.train_batch()
    tokens = int((tgt_out != W.PAD).sum())
    first: list[float] = []
    seconds = W.time_runs(lambda: step(src, tgt_in, tgt_out), runs=runs, warmup=1, warmup_seconds=first)
    t = W.Timing(system, dtype, tokens, seconds)
    return {"system": system, "dtype": dtype, "tokens_per_s": t.tokens_per_s,
            "best_tokens_per_s": t.best_tokens_per_s, "seconds": seconds, "peak_rss_mb": W.peak_rss_mb(),
            "first_call_s": first[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    W.add_common_args(ap, "train.json")
    ap.add_argument("--systems", default="aiayn,nn.Transformer,hf")
    ap.add_argument("--one", nargs=2, metavar=("SYSTEM", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    runs = W.apply_common_args(args)
    if args.one:
        print(json.dumps(run_one(*args.one, runs)))
        return
    W.setup_threads()
    wanted = set(args.systems.split(","))
    rows = []
    for system, dtype in SYSTEMS:
        if system not in wanted:
            continue
        if skip := W.emulated(dtype, args.emulated):
            rows.append({"system": system, "dtype": dtype, "skipped": skip})
            print(f"  {system} {dtype}: skipped: {skip}", file=sys.stderr)
            continue
        row = W.run_isolated(__file__, ["--one", system, dtype, "--runs", str(runs)])
        rows.append({"system": system, "dtype": dtype, **row})
        print(f"  {system} {dtype}: {row.get('tokens_per_s', 0):.1f} tok/s {row.get('skipped', '')}",
              file=sys.stderr)
    ok = {(r["system"], r["dtype"]): r["tokens_per_s"] for r in rows if not r.get("skipped")}
    reference = {"nn bf16": ok.get(("nn.Transformer", "bf16"), 0.0), "hf fp32": ok.get(("hf", "fp32"), 0.0)}
    W.print_table("training step, base, 4,096 target tokens, 2 threads", rows, reference)
    print("first (warm-up) step, compiling included: " + ", ".join(
        f"{r['system']} {r['dtype']} {r['first_call_s']:.1f} s" for r in rows if r.get("first_call_s") is not None))
    # training step cost per target token of the base model (FLOPs of the matmuls)
    W.report_ceiling(ok, rows, flop_per_token=366e6, json_path=args.json)

if __name__ == "__main__":
    main()
