"""The fault matrix: every writing subcommand under a full disk, a read-only file system, a
second writer and hostile sizes.

Each row runs ``aiayn ARGS`` in-process with the fault injected and asserts: the exit code
(1 for the machine's faults, 2 for a second writer), one error line with the distinctive part
of its message, no traceback, the previous output byte-identical, and no temporary left
beside it. A full disk is injected where the bytes are written (the safetensors writer,
the staging files of a binarized split, ``os.fsync``) by raising what the kernel gives (ENOSPC); a read-only file
system by raising EROFS where the first file or directory is created; a second writer is
another process holding the output's lock; a hostile size is in a flag, a config file
(a YAML alias bomb) or an imported config.json, and must be refused (exit 2) in a line of
bounded length before anything is allocated. docs/bad-input.md lists the rows (keep them in step).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
from tests.tiny_world import sentences, snapshot, two_checkpoints

from aiayn import fileio
from aiayn.cli.main import main

SRC = Path(__file__).resolve().parents[1] / "src"
ENOSPC_SAFETENSORS = ('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                      'message: "No space left on device" })')


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Inputs every row may use: two checkpoints, a trained run, text, a config, a MarianMT dir."""
    root = tmp_path_factory.mktemp("faults")
    w: dict[str, Path] = {}
    w["ck"], w["ck2"] = two_checkpoints(root)
    w["good"] = root / "good.txt"
    w["good"].write_text("\n".join(sentences(4, 5)) + "\n", encoding="utf-8")
    w["ref"] = root / "ref.txt"
    w["ref"].write_text("\n".join(sentences(4, 6)) + "\n", encoding="utf-8")
    w["cfg"] = root / "tiny.yaml"
    w["cfg"].write_text("model: {d_model: 16, n_heads: 2, d_ff: 32, n_encoder_layers: 1, n_decoder_layers: 1}\n"
                        "data: {synthetic: copy, synthetic_train_size: 50}\ntrain: {max_steps: 1}\n",
                        encoding="utf-8")
    w["run"] = root / "run"
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(w["cfg"]), "--run-dir", str(w["run"])])
    assert exc.value.code == 0
    # A YAML alias bomb: 9 lists of 9 references each level, 9^7 strings once expanded.
    bomb = ["  - &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    bomb += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 7)]
    w["bomb"] = root / "bomb.yaml"
    w["bomb"].write_text("train:\n  max_steps:\n" + "\n".join(bomb) + "\n", encoding="utf-8")
    if _has("transformers"):
        import json

        from aiayn.interop.hf_export import export_hf

        w["marian"] = export_hf(w["ck"], root / "marian")
        for field, value in (("encoder_layers", 10**9), ("max_position_embeddings", 3 * 10**7),
                             ("vocab_size", 10**12), ("d_model", 2**20), ("decoder_layers", 200)):
            hostile = shutil.copytree(w["marian"], root / f"marian_{field}")
            config = json.loads((hostile / "config.json").read_text(encoding="utf-8"))
            config[field] = value
            (hostile / "config.json").write_text(json.dumps(config), encoding="utf-8")
            w[f"marian_{field}"] = hostile
    return w


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@contextmanager
def held_by_another_process(path: Path) -> Iterator[int]:
    """Another process holds the lock of the output ``path`` (as a running writer would)."""
    code = ("import sys\nfrom aiayn import fileio\nfileio.set_command('aiayn holder-command')\n"
            "with fileio.output_lock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
        yield proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


# ---------------------------------------------------------------------- injected faults


def _enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[1]) if len(args) > 1 else None)


def inject_disk_full_safetensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The safetensors writer fails as it does on a full disk (checkpoints, HF weights)."""
    import safetensors.torch
    from safetensors import SafetensorError

    def serialize_file(*args: object, **kwargs: object) -> None:
        raise SafetensorError(ENOSPC_SAFETENSORS)

    monkeypatch.setattr(safetensors.torch, "serialize_file", serialize_file)


def inject_disk_full_binarized(monkeypatch: pytest.MonkeyPatch) -> None:
    """Appending an encoded chunk to a binarized split's staging files fails (prepare)."""
    from aiayn.data import binarize

    def append(self: object, chunk: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory))  # type: ignore[attr-defined]

    monkeypatch.setattr(binarize._Staging, "append", append)


def inject_disk_full_second_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first fsync succeeds, the next ones fail (translate's second chunk)."""
    real = os.fsync
    calls = []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def inject_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating a file or a directory fails with EROFS."""
    def refuse(path: object, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(fileio, "_create_file", refuse)
    monkeypatch.setattr(os, "mkdir", refuse)


class Case(NamedTuple):
    id: str
    args: str  # formatted with the world's paths and {out}, then split on spaces
    fault: str  # disk-full-safetensors | disk-full-binarized | disk-full-chunk | read-only | second-writer | hostile
    expect: str  # a regular expression the error line matches
    out: str = "dir"  # the previous output: "dir" (a directory with a file), "file", "run" (a trained run), "none"
    needs: str = ""  # a module the row needs


LOCKED = r"is being written by another run \(pid \d+: aiayn holder-command\)"
FULL = r"no space left on device writing \S*out\S*; "
READ_ONLY = r"read-only file system writing \S*out; nothing was changed"

MATRIX: list[Case] = [
    Case("train/disk-full", "train --config {cfg} --run-dir {out} train.max_steps=2", "disk-full-safetensors",
         FULL + r".*the run keeps its last complete checkpoint \(step_000001\): the same command resumes", "run"),
    Case("train/read-only", "train --config {cfg} --run-dir {out}", "read-only", READ_ONLY, "none"),
    Case("train/second-writer", "train --config {cfg} --run-dir {out}", "second-writer", "--run-dir .*" + LOCKED,
         "none"),
    Case("translate/disk-full", "translate --checkpoint {ck} -i {good} -o {out} --chunk-size 1 --quiet",
         "disk-full-chunk", r"no space left on device writing \S*out.partial; \S*out is unchanged; "
         r"\S*out.partial keeps the first 1 lines; the same command with --resume continues it", "file"),
    Case("translate/read-only", "translate --checkpoint {ck} -i {good} -o {out}", "read-only",
         READ_ONLY, "file"),
    Case("translate/second-writer", "translate --checkpoint {ck} -i {good} -o {out}", "second-writer",
         "--output .*" + LOCKED, "file"),
    Case("average/disk-full", "average {ck} {ck2} --out {out} --force", "disk-full-safetensors",
         FULL + "the previous contents are unchanged"),
    Case("average/read-only", "average {ck} {ck2} --out {out}", "read-only", READ_ONLY, "none"),
    Case("average/second-writer", "average {ck} {ck2} --out {out} --force", "second-writer", "--out .*" + LOCKED),
    Case("export/disk-full", "export hf {ck} {out} --force", "disk-full-safetensors",
         FULL + "the previous contents are unchanged", needs="transformers"),
    Case("export/read-only", "export hf {ck} {out}", "read-only", READ_ONLY, "none", needs="transformers"),
    Case("export/second-writer", "export hf {ck} {out} --force", "second-writer", LOCKED, needs="transformers"),
    Case("import/disk-full", "import hf {marian} {out} --force", "disk-full-safetensors",
         FULL + "the previous contents are unchanged", needs="transformers"),
    Case("import/read-only", "import hf {marian} {out}", "read-only", READ_ONLY, "none", needs="transformers"),
    Case("import/second-writer", "import hf {marian} {out} --force", "second-writer", LOCKED, needs="transformers"),
    Case("prepare/disk-full", "prepare --synthetic copy --synthetic-train-size 50 --out {out} --force --quiet",
         "disk-full-binarized", FULL + "the previous contents are unchanged"),
    Case("prepare/read-only", "prepare --synthetic copy --out {out}", "read-only", READ_ONLY, "none"),
    Case("prepare/second-writer", "prepare --synthetic copy --out {out} --force", "second-writer", "--out .*" + LOCKED),
    Case("parse/read-only", "parse --checkpoint {ck} --input {good} --output {out}", "read-only",
         READ_ONLY, "file"),
    Case("parse/second-writer", "parse --checkpoint {ck} --input {good} --output {out}", "second-writer",
         "--output .*" + LOCKED, "file"),
    Case("evaluate/second-writer", "evaluate --checkpoint {ck} --input {good} --ref {ref} --output {out}",
         "second-writer", "--output .*" + LOCKED, "file"),
    Case("demo/second-writer", "demo --out {out}", "second-writer", "--out .*" + LOCKED, "none"),
    # hostile sizes: refused before anything is allocated, exit 2
    Case("train/alias-bomb", "train --config {bomb} --run-dir {out}", "hostile",
         r"train.max_steps: expected an integer, got \[.{1,210}$", "none"),
    Case("translate/huge-beam", "translate --checkpoint {ck} -i {good} -o {out} --beam 100000", "hostile",
         "decode.beam: must be at most 64, got 100000", "file"),
    Case("translate/huge-nbest", "translate --checkpoint {ck} -i {good} -o {out} --nbest 1000", "hostile",
         "decode.nbest: must be at most 64, got 1000", "file"),
    Case("parse/huge-beam", "parse --checkpoint {ck} --input {good} --output {out} --beam 100000", "hostile",
         "decode.beam: must be at most 64, got 100000", "file"),
    Case("tune-decoding/huge-beam", "tune-decoding --checkpoint {ck} --input {good} --ref {ref} --beams 4 100000",
         "hostile", "--beams: must be at most 64, got 100000", "none"),
    Case("import/huge-layers", "import hf {marian_encoder_layers} {out}", "hostile",
         r"config.json: encoder_layers=1000000000: out of range \(1 to 256\)$", "none", needs="transformers"),
    Case("import/huge-positions", "import hf {marian_max_position_embeddings} {out}", "hostile",
         r"config.json: max_position_embeddings=30000000: out of range \(1 to 65,536\)$", "none",
         needs="transformers"),
    Case("import/huge-vocabulary", "import hf {marian_vocab_size} {out}", "hostile",
         r"config.json: vocab_size=1000000000000: out of range \(1 to 4,000,000\)$", "none", needs="transformers"),
    Case("import/huge-d-model", "import hf {marian_d_model} {out}", "hostile",
         r"config.json: d_model=1048576: out of range \(1 to 65,536\)$", "none", needs="transformers"),
    Case("import/more-than-stored", "import hf {marian_decoder_layers} {out}", "hostile",
         r"config.json: its sizes .* describe [\d,]+ parameters, but the weight files hold [\d,]+ bytes$", "none",
         needs="transformers"),
]

INJECT: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "disk-full-safetensors": inject_disk_full_safetensors,
    "disk-full-binarized": inject_disk_full_binarized,
    "disk-full-chunk": inject_disk_full_second_chunk,
    "read-only": inject_read_only,
}


def _previous_output(kind: str, out: Path, world: dict[str, Path]) -> None:
    if kind == "dir":
        out.mkdir()
        (out / "previous.txt").write_text("the previous output\n", encoding="utf-8")
    elif kind == "file":
        out.write_text("the previous output\n", encoding="utf-8")
    elif kind == "run":
        shutil.copytree(world["run"], out)


def _state(out: Path, kind: str) -> object:
    """What must be unchanged: the whole previous output (a run: its checkpoints)."""
    if kind == "run":
        return snapshot(out / "checkpoints")
    if kind == "dir":
        return snapshot(out)
    if kind == "file":
        return out.read_bytes()
    return out.exists()


@pytest.mark.parametrize("case", MATRIX, ids=[c.id for c in MATRIX])
def test_fault(case: Case, world: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
               monkeypatch: pytest.MonkeyPatch) -> None:
    if case.needs:
        pytest.importorskip(case.needs, reason=f"the '{case.needs}' package is not installed")
    if case.fault == "second-writer":
        pytest.importorskip("fcntl", reason="platform: no fcntl (not POSIX)")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "out"
    _previous_output(case.out, out, world)
    before = _state(out, case.out)
    inputs_before = snapshot(world["ck"].parent)
    argv = case.args.format(out=out, **{k: str(v) for k, v in world.items()}).split()
    with contextlib.ExitStack() as stack:
        if case.fault == "second-writer":
            stack.enter_context(held_by_another_process(out))
        elif case.fault != "hostile":
            INJECT[case.fault](monkeypatch)
        with pytest.raises(SystemExit) as exc:
            main(argv)
        monkeypatch.undo()
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("aiayn ")]
    assert len(errors) == 1, captured.err
    assert exc.value.code == (2 if case.fault in ("second-writer", "hostile") else 1), captured.err
    assert re.search(case.expect, errors[0]), errors[0]
    assert _state(out, case.out) == before, "the previous output changed"
    assert snapshot(world["ck"].parent) == inputs_before, "an input changed"
    left = sorted(p.name for p in work.iterdir())
    expected = {"dir": ["out"], "run": ["out"], "none": [],
                "file": ["out", "out.partial", "out.partial.json"] if case.id == "translate/disk-full" else ["out"]}
    assert left == expected[case.out], left
    if case.out == "run":
        assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    if os.environ.get("AIAYN_FAULT_MESSAGES"):  # docs/bad-input.md's examples come from here
        with open(os.environ["AIAYN_FAULT_MESSAGES"], "a", encoding="utf-8") as f:
            f.write(f"{case.id}\t{errors[0].replace(str(work) + '/', '').replace(str(world['ck'].parent) + '/', '')}\n")


def test_the_documented_table_is_this_table() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "bad-input.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\| [a-z -]+ \| `([a-z0-9-]+/[a-z0-9-]+)` \|", doc, re.M)
    assert documented == [c.id for c in MATRIX]


# ---------------------------------------------------------------------- beyond the matrix


def test_a_second_train_into_the_same_new_run_directory_is_refused(world: dict[str, Path], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The first run holds the run directory (a lock held in this process stands for it):
    the second gets one line naming the holder, exit 2, and nothing of the run is touched."""
    run_dir = tmp_path / "run"
    fileio.set_command("aiayn train --config first.yaml")
    with fileio.output_lock(run_dir):
        with pytest.raises(SystemExit) as exc:
            main(["train", "--config", str(world["cfg"]), "--run-dir", str(run_dir)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"aiayn train: error: --run-dir {run_dir}: is being written by another run "
                   f"(pid {os.getpid()}: aiayn train --config first.yaml); wait for it to finish, or write elsewhere")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_export_refuses_to_replace_the_checkpoints_a_run_directory_names(world: dict[str, Path], tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``export hf --force RUN RUN/checkpoints`` would replace the checkpoint RUN stands for."""
    pytest.importorskip("transformers", reason="the 'interop' extra is not installed")
    run = shutil.copytree(world["run"], tmp_path / "run")
    before = snapshot(run)
    for target in (run / "checkpoints", run):
        with pytest.raises(SystemExit) as exc:
            main(["export", "hf", str(run), str(target), "--force"])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert f"would replace the input {run}" in err, err
    assert snapshot(run) == before


def test_a_symlink_to_a_checkpoint_is_what_it_names(world: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = shutil.copytree(world["run"], tmp_path / "run")
    link = tmp_path / "link"
    link.symlink_to(run / "checkpoints" / "step_000001")
    before = snapshot(run)
    with pytest.raises(SystemExit) as exc:
        main(["average", str(link), str(world["ck"]), "--out", str(run / "checkpoints"), "--force"])
    assert exc.value.code == 2
    assert "would replace the input" in capsys.readouterr().err
    assert snapshot(run) == before


def test_the_last_pointer_is_what_it_names(world: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = shutil.copytree(world["run"], tmp_path / "run")
    before = snapshot(run)
    with pytest.raises(SystemExit) as exc:
        main(["average", str(run / "checkpoints" / "last"), str(world["ck"]), "--out", str(run / "checkpoints"),
              "--force"])
    assert exc.value.code == 2
    assert "would replace the input" in capsys.readouterr().err
    assert snapshot(run) == before


def test_temporaries_of_a_killed_run_are_removed_by_the_next(world: dict[str, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A SIGKILL mid-write leaves ``.OUT.tmp-*`` beside the output; the next writer of that
    output removes them (and says so in the log)."""
    stale_dir = tmp_path / ".out.tmp-0badc0de"
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".out.tmp-old-12345").mkdir()
    (tmp_path / ".tmp-out-0badc0de").mkdir()  # a checkpoint's temporaries (average writes one)
    other = tmp_path / ".other.tmp-0badc0de"  # another output's: not this writer's to remove
    other.mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["average", str(world["ck"]), str(world["ck2"]), "--out", str(tmp_path / "out")])
    assert exc.value.code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-0badc0de", "out"]


@pytest.mark.parametrize("deleted", ["model.safetensors", "config.yaml", "checksums.sha256"])
def test_a_checkpoint_half_deleted_by_a_kill_is_removed_by_the_next_run(
        world: dict[str, Path], tmp_path: Path, deleted: str, caplog: pytest.LogCaptureFixture) -> None:
    """Pruning deletes an old checkpoint file by file: a kill midway leaves a step_N that no
    listing counts. The next run of the same directory removes it, and nothing else."""
    from aiayn.checkpoint.manager import CheckpointManager

    run = shutil.copytree(world["run"], tmp_path / "run")
    checkpoints = run / "checkpoints"
    half = shutil.copytree(checkpoints / "step_000001", checkpoints / "step_000000")
    (half / deleted).unlink()
    before = snapshot(checkpoints / "step_000001")
    assert CheckpointManager(run).remove_half_deleted() == [half]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best", "last", "step_000001"]
    assert snapshot(checkpoints / "step_000001") == before
    assert "a checkpoint whose deletion was interrupted" in caplog.text
    assert CheckpointManager(run).remove_half_deleted() == []  # a complete run is left alone


# ---------------------------------------------------------------- the compiled-step cache
# A package in the cache is used only for the weights it was built from, and a damaged one is
# built again; the eager decoder of the same weights is the reference. No C++ compiler:
# nothing can be built, which skips as a missing install (and fails under CI=true).

CXX = ("g++", "c++", "clang++")
PACKAGE_VOCAB = 40


def _optimized(seed: int) -> object:
    import torch

    from aiayn.config import ModelConfig
    from aiayn.inference.optimize import optimize_for_inference
    from aiayn.model import build_model

    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab_size=PACKAGE_VOCAB, tgt_vocab_size=PACKAGE_VOCAB, d_model=32, d_ff=64, n_heads=4,
                      n_encoder_layers=1, n_decoder_layers=1, max_positions=64)
    return optimize_for_inference(build_model(cfg).eval())


def _beam_tokens(decoder: object) -> list[list[list[int]]]:
    """Beam 2 over three sources that run to the same length (no step with a lone sentence)."""
    import torch

    from aiayn.config import DecodeConfig
    from aiayn.inference.search import search

    src = torch.randint(4, PACKAGE_VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))
    src[:, -1] = 3
    cfg = DecodeConfig(beam=2, lenpen=0.6, min_len=5, max_len_a=0.0, max_len_b=5, nbest=2)
    with torch.inference_mode():
        return [[h.tokens for h in sent] for sent in search(decoder, src, cfg)]  # type: ignore[arg-type]


def _compiled(optimized: object, folder: Path) -> object:
    from aiayn.inference.compiled import CompiledDecoder

    return CompiledDecoder(optimized, folder=folder)  # type: ignore[arg-type]


def _ran(decoder: object) -> None:
    if getattr(decoder, "compiled", None) is None:
        if not any(shutil.which(cxx) for cxx in CXX):
            pytest.skip("no C++ compiler (g++, c++ or clang++) for inductor: nothing can be compiled")
        pytest.fail("compiled decoding fell back to the eager step")


@pytest.fixture(scope="module")
def built_package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[list[int]]]]:
    """The package of the weights of seed 0 (built once), and that model's eager outputs."""
    from aiayn.inference.adapters import IncrementalDecoder

    optimized = _optimized(0)
    compiled = _compiled(optimized, tmp_path_factory.mktemp("packages"))
    want = _beam_tokens(IncrementalDecoder(optimized))  # type: ignore[arg-type]
    assert _beam_tokens(compiled) == want
    _ran(compiled)
    (path,) = compiled.packages.built  # type: ignore[attr-defined]
    return path, want


@pytest.mark.timeout(600)
@pytest.mark.slow  # builds compiled-step packages: minutes on 2 cores
def test_a_package_of_other_weights_under_this_name_is_built_again(built_package, tmp_path: Path) -> None:
    import torch

    from aiayn.inference.adapters import IncrementalDecoder
    from aiayn.inference.step_packages import record_path

    other_path, other_outputs = built_package
    optimized = _optimized(1)  # the same shapes, other values
    want = _beam_tokens(IncrementalDecoder(optimized))  # type: ignore[arg-type]
    assert want != other_outputs  # else the test could not tell the packages apart
    compiled = _compiled(optimized, tmp_path)
    path = compiled.packages.path(2, torch.device("cpu"))  # type: ignore[attr-defined]
    shutil.copyfile(other_path, path)  # the other model's package and record under this model's name
    shutil.copyfile(record_path(other_path), record_path(path))
    assert _beam_tokens(compiled) == want
    _ran(compiled)
    assert compiled.packages.built == [path] and compiled.packages.loaded == []  # type: ignore[attr-defined]


@pytest.mark.timeout(600)
@pytest.mark.slow  # builds compiled-step packages: minutes on 2 cores
def test_a_damaged_package_is_built_again_once(built_package, tmp_path: Path) -> None:
    from aiayn.inference.step_packages import record_path

    source, want = built_package
    path = tmp_path / source.name
    shutil.copyfile(record_path(source), record_path(path))
    path.write_bytes(source.read_bytes()[: source.stat().st_size // 2])  # truncated
    first = _compiled(_optimized(0), tmp_path)
    assert _beam_tokens(first) == want
    _ran(first)
    assert first.packages.built == [path]  # type: ignore[attr-defined]
    again = _compiled(_optimized(0), tmp_path)  # the next run loads what the last one rebuilt
    assert _beam_tokens(again) == want
    assert again.packages.loaded == [path] and again.packages.built == []  # type: ignore[attr-defined]


def test_a_package_is_used_only_as_its_record_vouches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Without building anything: what is loaded, what is built again, and the one warning."""
    import hashlib
    import json

    import torch

    from aiayn.inference import step_packages
    from aiayn.inference.step_packages import StepPackages, record_path

    packages = StepPackages(lambda *args: args[0], [], folder=tmp_path)
    cpu = torch.device("cpu")
    path, key = packages.path(2, cpu), json.loads(packages._key(2, cpu))
    builds: list[Path] = []
    loads: list[bytes] = []

    def build(self: StepPackages, args: tuple, per_source: int, at: Path, key: str) -> None:
        builds.append(at)
        at.write_bytes(b"built")
        record_path(at).write_text(json.dumps({"key": json.loads(key), "sha256": hashlib.sha256(b"built")
                                               .hexdigest()}), encoding="utf-8")

    def load(at: Path) -> object:
        loads.append(at.read_bytes())
        if at.read_bytes() == b"unloadable":
            raise RuntimeError("PytorchStreamReader failed reading zip archive")
        return lambda *args: args[0]

    monkeypatch.setattr(StepPackages, "_build", build)
    monkeypatch.setattr(step_packages, "_load", load)

    def call(package: bytes, record: dict | None) -> list[Path]:
        builds.clear()
        loads.clear()
        caplog.clear()
        path.write_bytes(package)
        record_path(path).unlink(missing_ok=True)
        if record is not None:
            record_path(path).write_text(json.dumps(record), encoding="utf-8")
        fresh = StepPackages(packages.step, [], folder=tmp_path)
        fresh._runner((torch.zeros(2, dtype=torch.long),), 2)
        return list(builds)

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    assert call(b"good", {"key": key, "sha256": sha(b"good")}) == [] and loads == [b"good"]
    for package, record, why in [
        (b"good", None, "no record of what it was built for"),
        (b"good", {"key": {**key, "weights": "0" * 64}, "sha256": sha(b"good")}, "built for other weights"),
        (b"goo", {"key": key, "sha256": sha(b"good")}, "its bytes are not those recorded"),
        (b"unloadable", {"key": key, "sha256": sha(b"unloadable")}, "it does not load (RuntimeError"),
    ]:
        assert call(package, record) == [path], why
        assert loads[-1] == b"built"  # what is run is what was built, never the refused package
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and why in warnings[0], warnings
