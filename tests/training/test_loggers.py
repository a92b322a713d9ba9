"""train.loggers: which loggers run, the errors when one cannot, the tags every scalar gets,
and what TensorBoard and W&B (offline) really received."""

import dataclasses
import json
import struct
import sys
import types
from pathlib import Path

import pytest
import torch

from aiayn.cli.main import main
from aiayn.config import Config, TrainConfig, apply_overrides, config_from_dict, to_dict
from aiayn.data.batching import BatchIterator
from aiayn.errors import ConfigError
from aiayn.model import build_model
from aiayn.training.loggers import WANDB_ID_FILE, check_available, scalar_tags, selected
from aiayn.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]

TRAIN_TAGS = ["train/loss", "train/nll", "train/ppl", "train/lr", "train/grad_norm", "train/tokens_per_s",
              "train/src_tokens_per_update", "train/tgt_tokens_per_update", "train/pad_fraction"]
VALID_TAGS = ["valid/loss", "valid/nll", "valid/ppl"]


# ---------------------------------------------------------------------- selection and errors


def test_selection_jsonl_is_implied_and_the_old_flag_maps_to_tensorboard():
    assert selected(TrainConfig()) == []  # the default, [jsonl]
    assert selected(TrainConfig(loggers=())) == []  # metrics.jsonl is written all the same
    assert selected(TrainConfig(loggers=("jsonl", "tensorboard"))) == ["tensorboard"]
    assert selected(TrainConfig(loggers=("wandb", "jsonl", "wandb"))) == ["wandb"]
    assert selected(TrainConfig(tensorboard=True)) == ["tensorboard"]
    assert selected(TrainConfig(loggers=("wandb", "tensorboard"), tensorboard=True)) == ["wandb", "tensorboard"]


def test_an_old_config_with_the_tensorboard_flag_still_loads():
    """Every checkpoint written before train.loggers has ``tensorboard:`` in its config.yaml."""
    cfg = config_from_dict({"train": {"tensorboard": True}})
    assert cfg.train.loggers == ("jsonl",) and selected(cfg.train) == ["tensorboard"]


def test_unknown_logger_names_the_field():
    with pytest.raises(ConfigError) as exc:
        apply_overrides(Config(), ["train.loggers=[jsonl, mlflow]"])
    assert str(exc.value) == "train.loggers: 'mlflow' is not one of jsonl, tensorboard, wandb"


@pytest.mark.parametrize("tc, module, message", [
    (TrainConfig(loggers=("jsonl", "wandb")), "wandb",
     'train.loggers: wandb is not installed: pip install "aiayn[wandb]" (or leave wandb out of train.loggers)'),
    (TrainConfig(loggers=("tensorboard",)), "torch.utils.tensorboard",
     'train.loggers: tensorboard is not installed: pip install "aiayn[tensorboard]" '
     "(or leave tensorboard out of train.loggers)"),
    (TrainConfig(tensorboard=True), "torch.utils.tensorboard",
     'train.tensorboard: tensorboard is not installed: pip install "aiayn[tensorboard]" '
     "(or leave tensorboard out of train.loggers)"),
])
def test_a_missing_package_is_one_config_error(monkeypatch, tc, module, message):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ConfigError) as exc:
        check_available(tc)
    assert str(exc.value) == message
    check_available(TrainConfig())  # jsonl alone needs nothing


def test_a_missing_package_stops_aiayn_train_before_anything_is_written(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(REPO / "configs" / "tiny_synthetic.yaml"), "--run-dir", str(run),
              "train.loggers=[jsonl, wandb]"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("aiayn ")] == [
        'aiayn train: error: train.loggers: wandb is not installed: pip install "aiayn[wandb]" '
        "(or leave wandb out of train.loggers)"]
    assert not run.exists()


# ---------------------------------------------------------------------- tags


def test_every_scalar_is_tagged_by_split():
    train = {"split": "train", "step": 10, "epoch": 0.5, "loss": 2.5, "nll": 2.0, "ppl": 7.39, "lr": 1e-3,
             "grad_norm": 1.5, "tokens_per_s": 1000.0, "elapsed": 3.2, "src_tokens_per_update": 50.0,
             "tgt_tokens_per_update": 48.0, "pad_fraction": 0.1}
    assert scalar_tags(train) == {
        "train/loss": 2.5, "train/nll": 2.0, "train/ppl": 7.39, "train/lr": 1e-3, "train/grad_norm": 1.5,
        "train/tokens_per_s": 1000.0, "train/src_tokens_per_update": 50.0, "train/tgt_tokens_per_update": 48.0,
        "train/pad_fraction": 0.1}
    valid = {"split": "valid", "step": 10, "epoch": 0.5, "valid_loss": 2.1, "valid_nll": 1.9, "valid_ppl": 6.7,
             "valid_bleu": 12.5, "elapsed": 3.5}
    assert scalar_tags(valid) == {"valid/loss": 2.1, "valid/nll": 1.9, "valid/ppl": 6.7, "valid/bleu": 12.5}


def _trainer(cfg, run_dir, make_task):
    task = make_task(n=24)
    torch.manual_seed(0)
    return Trainer(cfg, build_model(cfg.model), run_dir,
                   train_batches=BatchIterator(task, cfg.train.max_tokens, seed=1),
                   valid_batches=[BatchIterator(task, 64, shuffle=False).make_batch([0, 1, 2])])


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _expected_scalars(run_dir):
    """(tag, step, value) of every scalar in metrics.jsonl, in the order written."""
    return [(tag, rec["step"], value) for rec in _records(run_dir) for tag, value in scalar_tags(rec).items()]


def _watched_cfg(make_cfg, **train):
    return make_cfg(max_steps=4, log_every=2, valid_every=2, **train)


def test_tensorboard_gets_the_tagged_scalars(make_cfg, make_task, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    _trainer(_watched_cfg(make_cfg, loggers=("jsonl", "tensorboard")), run, make_task).train()
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(TRAIN_TAGS + VALID_TAGS)
    seen = sorted((tag, e.step, e.value) for tag in events.Tags()["scalars"] for e in events.Scalars(tag))
    # Event files hold float32.
    expected = sorted((tag, step, float(torch.tensor(value, dtype=torch.float32))) for tag, step, value
                      in _expected_scalars(run))
    assert seen == expected
    assert [step for tag, step, _ in seen if tag == "valid/loss"] == [2, 4]


class _FakeWriter:
    """torch's SummaryWriter, recording what it is given."""

    made: list["_FakeWriter"] = []

    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.purge_step, self.calls, self.closed = log_dir, purge_step, [], False
        _FakeWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, step, value))

    def close(self):
        self.closed = True


def test_a_resumed_run_purges_what_tensorboard_got_after_its_checkpoint(make_cfg, make_task, tmp_path,
                                                                         monkeypatch):
    import torch.utils.tensorboard

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", _FakeWriter)
    monkeypatch.setattr(_FakeWriter, "made", [])
    run = tmp_path / "run"
    cfg = _watched_cfg(make_cfg, tensorboard=True)  # the deprecated spelling still works
    _trainer(cfg, run, make_task).train()
    first = _FakeWriter.made[0]
    assert (first.log_dir, first.purge_step, first.closed) == (str(run / "tensorboard"), None, True)
    assert first.calls == _expected_scalars(run)
    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=6))
    resumed = _trainer(longer, run, make_task)
    resumed.load(run)
    resumed.train()
    second = _FakeWriter.made[1]
    assert second.purge_step == 5 and [step for _, step, _ in second.calls] == [6] * len(TRAIN_TAGS + VALID_TAGS)


# ---------------------------------------------------------------------- Weights & Biases


class _FakeWandb(types.ModuleType):
    """The part of the wandb module the logger uses, recording calls."""

    def __init__(self):
        super().__init__("wandb")
        self.inits, self.logged, self.finished = [], [], 0
        self.errors = types.SimpleNamespace(Error=RuntimeError)

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self
        return types.SimpleNamespace(id=kwargs["id"] or "run0001",
                                     log=lambda scalars, step: fake.logged.append((scalars, step)),
                                     finish=lambda: setattr(fake, "finished", fake.finished + 1))


def test_wandb_run_named_after_the_run_dir_config_once_and_continued_on_resume(make_cfg, make_task, tmp_path,
                                                                              monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    run = tmp_path / "base-run"
    cfg = _watched_cfg(make_cfg, loggers=("jsonl", "wandb"))
    _trainer(cfg, run, make_task).train()
    assert fake.inits == [{"project": "aiayn", "id": None, "resume": "allow", "name": "base-run",
                           "config": to_dict(cfg), "dir": str(run)}]
    assert (run / WANDB_ID_FILE).read_text() == "run0001\n"
    by_step = [(step, sorted(scalars)) for scalars, step in fake.logged]
    assert by_step == [(2, sorted(TRAIN_TAGS)), (2, sorted(VALID_TAGS)), (4, sorted(TRAIN_TAGS)),
                       (4, sorted(VALID_TAGS))]
    assert [(tag, step, value) for scalars, step in fake.logged for tag, value in scalars.items()] == \
        _expected_scalars(run)
    assert fake.finished == 1

    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=6, wandb_project="mt",
                                                                wandb_run_name="named"))
    resumed = _trainer(longer, run, make_task)
    resumed.load(run)
    resumed.train()
    # The same run id; the configuration was logged when the run began.
    assert fake.inits[1] == {"project": "mt", "id": "run0001", "resume": "allow", "name": "named",
                             "dir": str(run)}
    assert [step for _, step in fake.logged[4:]] == [6, 6] and fake.finished == 2


def test_wandb_failing_to_start_is_one_config_error_and_closes_the_others(tmp_path, monkeypatch):
    import torch.utils.tensorboard

    from aiayn.training.loggers import open_loggers

    def refuse(**kwargs):
        raise RuntimeError("api_key not configured (no-tty)")

    fake = _FakeWandb()
    fake.init = refuse
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", _FakeWriter)
    monkeypatch.setattr(_FakeWriter, "made", [])
    with pytest.raises(ConfigError) as exc:
        open_loggers(TrainConfig(loggers=("tensorboard", "wandb")), tmp_path, {}, 0)
    assert str(exc.value) == ("train.loggers: wandb could not start a run (api_key not configured (no-tty)); "
                              "log in with `wandb login`, or set WANDB_MODE=offline")
    assert _FakeWriter.made[0].closed and not (tmp_path / WANDB_ID_FILE).exists()


def test_only_the_main_process_logs(make_cfg, make_task, tmp_path, monkeypatch):
    from aiayn.training.distributed import DistInfo

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = _watched_cfg(make_cfg, loggers=("wandb",))
    torch.manual_seed(0)
    tr = Trainer(cfg, build_model(cfg.model), tmp_path / "run", train_batches=BatchIterator(make_task(n=24), 64),
                 dist_info=DistInfo(rank=1, world_size=1))
    tr.train()
    assert fake.inits == [] and not (tmp_path / "run" / "metrics.jsonl").exists()


def _wandb_records(path: Path):
    """The protobuf records of a ``.wandb`` file: a 7-byte W&B header, then LevelDB's log
    format (32 KiB blocks of chunks, each with a 7-byte header: CRC, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first, else middle/last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _history(records):
    """(step, {tag: value}) of each history row; W&B stores "train/loss" as the nested key
    ("train", "loss") and adds keys of its own (_step, _runtime, ...)."""
    rows = []
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            rows.append((rec.history.step.num, {k: v for k, v in items.items() if not k.startswith("_")}))
    return rows


def test_wandb_offline_writes_the_run_and_its_history(make_cfg, make_task, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for name, sub in (("WANDB_DIR", "wandb"), ("WANDB_CONFIG_DIR", "wandb-config"),
                      ("WANDB_CACHE_DIR", "wandb-cache"), ("WANDB_DATA_DIR", "wandb-data")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "wmt-run"
    cfg = _watched_cfg(make_cfg, loggers=("jsonl", "wandb"))
    _trainer(cfg, run, make_task).train()
    wandb.teardown()  # run.finish() may return before W&B's own process has written everything
    run_id = (run / WANDB_ID_FILE).read_text().strip()
    files = sorted((tmp_path / "wandb").glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1
    records = _wandb_records(files[0])
    first = next(rec.run for rec in records if rec.WhichOneof("record_type") == "run")
    assert (first.run_id, first.display_name, first.project) == (run_id, "wmt-run", "aiayn")
    config = {u.key: json.loads(u.value_json) for u in first.config.update}
    assert config["train"]["max_steps"] == 4 and config["model"]["d_model"] == 32
    expected: dict[int, dict[str, float]] = {}
    for tag, step, value in _expected_scalars(run):
        expected.setdefault(step, {})[tag] = value
    assert _history(records) == [(2, pytest.approx(expected[2])), (4, pytest.approx(expected[4]))]

    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=6))
    resumed = _trainer(longer, run, make_task)
    resumed.load(run)
    resumed.train()
    wandb.teardown()
    # The resumed run logs to the same run id (offline: in a directory of its own, unless
    # it started within the same second).
    assert (run / WANDB_ID_FILE).read_text().strip() == run_id
    runs = [_wandb_records(f) for f in (tmp_path / "wandb").glob("wandb/offline-run-*/*.wandb")]
    assert {rec.run.run_id for records in runs for rec in records if rec.WhichOneof("record_type") == "run"} \
        == {run_id}
    assert [6] in [[step for step, _ in _history(records)] for records in runs]
