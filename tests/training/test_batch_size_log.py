"""The batch size as it really was: real source/target tokens per update and the padding
share, in metrics.jsonl and the log line, equal to a count over the batches themselves."""

import json
import logging

import torch

from aiayn.data.batching import BatchIterator
from aiayn.model import build_model
from aiayn.training.trainer import Trainer
from aiayn.vocab import PAD_ID


def test_logged_real_tokens_equal_a_direct_count(tmp_path, make_cfg, make_task, caplog):
    cfg = make_cfg(update_freq=2, log_every=1, max_steps=5, max_tokens_mode="real")
    task = make_task(n=40, max_len=9)
    torch.manual_seed(0)
    trainer = Trainer(cfg, build_model(cfg.model), tmp_path,
                      train_batches=BatchIterator(task, cfg.train.max_tokens, seed=1, mode="real"))
    seen: list[tuple[int, int, int]] = []  # per update: src, tgt real tokens; tensor positions
    real_step = trainer.train_step

    def counting_step(batches):
        seen.append((sum(int(b.src.ne(PAD_ID).sum()) for b in batches),
                     sum(int(b.tgt_out.ne(PAD_ID).sum()) for b in batches),
                     sum(b.src.numel() + b.tgt_out.numel() for b in batches)))
        return real_step(batches)

    trainer.train_step = counting_step
    with caplog.at_level(logging.INFO, logger="aiayn"):
        trainer.train()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5] and len(seen) == 5
    for rec, (src, tgt, positions) in zip(train, seen):
        assert rec["src_tokens_per_update"] == src and rec["tgt_tokens_per_update"] == tgt
        assert rec["pad_fraction"] == 1.0 - (src + tgt) / positions
        assert {"loss", "nll", "ppl", "lr", "grad_norm", "tokens_per_s", "elapsed"} <= rec.keys()
    assert any(f"{seen[0][0]} src + {seen[0][1]} tgt tok/update" in m for m in caplog.messages)


def test_interval_record_averages_over_its_updates(make_cfg, make_task):
    cfg = make_cfg(log_every=2, max_steps=4)
    task = make_task(n=24)
    trainer = Trainer(cfg, build_model(cfg.model), None,
                      train_batches=BatchIterator(task, cfg.train.max_tokens, seed=1))
    records = []
    trainer.metrics.write = records.append
    real_step = trainer.train_step
    src_counts = []

    def counting_step(batches):
        src_counts.append(sum(int(b.n_src_tokens) for b in batches))
        return real_step(batches)

    trainer.train_step = counting_step
    trainer.train()
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4]
    assert train[0]["src_tokens_per_update"] == (src_counts[0] + src_counts[1]) / 2
    assert train[1]["src_tokens_per_update"] == (src_counts[2] + src_counts[3]) / 2
    assert 0.0 <= train[0]["pad_fraction"] < 1.0
