"""`--compile auto`: compile only where the input wins the warm-up back (a cheaper warm-up where
the compile cache holds the step's package); inductor's caches in the aiayn cache folder; a
server that switches to compiled steps once they are ready."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BASE_PARAMETERS = 60_000_000  # about the paper's base model
TINY_PARAMETERS = 500_000


@pytest.mark.parametrize("lines, parameters, device, warm, expected", [
    (None, BASE_PARAMETERS, "cpu", True, False),  # a stream: its length is unknown
    (10, BASE_PARAMETERS, "cpu", True, False),  # a handful of lines: never
    (999, 10**12, "cpu", True, False),
    (10_000, BASE_PARAMETERS, "cpu", False, False),  # the warm-up from an empty cache is not won back
    (10_000, BASE_PARAMETERS, "cpu", True, True),  # from a warm cache it is
    (100_000, BASE_PARAMETERS, "cpu", False, True),
    (100_000, TINY_PARAMETERS, "cpu", True, False),  # a tiny model: below the smallest that gains
    (10**7, 4_999_999, "cpu", True, False),
    (3_000, 7_600_000, "cpu", True, True),  # the Multi30k recipe's model, its package on disk
    (3_000, 7_600_000, "cpu", False, False),  # not worth building for 3,000 lines
    (100_000, 7_600_000, "cpu", False, True),  # for a server's estimate, it is
    (100_000, BASE_PARAMETERS, "cuda", True, False),  # no estimate off the CPU: eager
])
def test_compile_pays_for_long_inputs_and_large_models_only(lines, parameters, device, warm, expected) -> None:
    from aiayn.inference.compiled import compile_pays

    assert compile_pays(lines, parameters, device, warm=warm) is expected


def test_the_compile_cache_is_under_the_aiayn_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch._inductor.config as inductor_config

    from aiayn.runtime.compile_cache import compile_cache_dir, use_compile_cache

    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    folder = tmp_path / "inductor" / f"torch-{torch.__version__.replace('+', '-')}"
    assert compile_cache_dir() == folder
    assert use_compile_cache() == folder
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder) and inductor_config.fx_graph_cache is True
    # A folder the user chose is kept.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_compile_cache() == tmp_path / "mine"


class _Recorded:
    """Stands for CompiledDecoder: the eager step, counting its calls; its packages (where the
    compiled step's would be on disk) are a CompiledDecoder's."""

    made: list[_Recorded] = []

    def __init__(self, model) -> None:
        from aiayn.inference.adapters import IncrementalDecoder
        from aiayn.inference.compiled import CompiledDecoder

        self.inner = IncrementalDecoder(model)
        self.packages = CompiledDecoder(model).packages
        self.calls = 0
        self.compiled_ran = False
        _Recorded.made.append(self)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step(self, *args, **kwargs):
        self.calls += 1
        self.compiled_ran = True
        return self.inner.step(*args, **kwargs)


def test_use_compiled_switches_after_its_warm_up(tiny_checkpoint: Path, english: list[str],
                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from aiayn.inference import engine as engine_module
    from aiayn.inference.translator import Translator

    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(engine_module, "CompiledDecoder", _Recorded)
    _Recorded.made.clear()
    translator = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32")
    eager = translator.decoder
    expected = translator.translate(english)
    translator.use_compiled(warm_up=[english[:1], english[:2]])
    (compiled,) = _Recorded.made
    assert translator.compiled and translator.decoder is compiled and translator.decoder is not eager
    warm_up_calls = compiled.calls
    assert warm_up_calls > 0  # the warm-up ran the new steps before they were installed
    assert translator.translate(english) == expected and compiled.calls > warm_up_calls


def test_compile_pays_counts_on_a_warm_cache_when_the_beams_package_is_there(
        tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cheaper warm-up is counted on exactly when the compile cache holds the compiled step's
    package for these weights, this precision and the checkpoint's beam."""
    from aiayn.inference import compiled
    from aiayn.inference.translator import Translator

    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    # As if the tiny model were large enough to gain: 10,000 lines then win back the warm-up of
    # a warm cache, not that of an empty one.
    monkeypatch.setattr(compiled, "MIN_COMPILE_PARAMETERS", 1)
    lines = 10_000
    translator = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32")
    parameters = translator.parameters["parameters"]
    assert compiled.compile_pays(lines, parameters, "cpu", warm=True)
    assert not compiled.compile_pays(lines, parameters, "cpu", warm=False)
    beam = translator.config.decode.beam
    packages = translator.engine.compiled_decoder().packages
    package = packages.path(beam, translator.device)
    assert package.is_relative_to(tmp_path / "inductor") and not package.exists()
    assert not translator.compile_pays(lines)
    # Another beam's package: warm for that beam only.
    other = packages.path(beam + 1, translator.device)
    assert other != package
    other.parent.mkdir(parents=True, exist_ok=True)
    other.touch()
    assert translator.engine.compile_pays(lines, per_source=beam + 1)
    assert translator.compile_pays(lines, translator.decode_config(beam=beam + 1))  # the beam a command asks for
    assert not translator.compile_pays(lines)
    package.touch()
    assert translator.compile_pays(lines)
    # A later run with the same weights finds it; the int8 copy's package is another.
    assert Translator.from_checkpoint(tiny_checkpoint, dtype="fp32").compile_pays(lines)
    int8 = Translator.from_checkpoint(tiny_checkpoint, dtype="int8")
    assert int8.engine.compiled_decoder().packages.path(beam, int8.device) not in (package, other)
    assert not int8.compile_pays(lines)


def test_translate_compiles_only_when_it_pays(tiny_checkpoint: Path, english: list[str], run_cli,
                                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from aiayn.inference import compiled
    from aiayn.inference import engine as engine_module
    from aiayn.inference.translator import Translator

    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(engine_module, "CompiledDecoder", _Recorded)
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in english), encoding="utf-8")
    args = ["translate", "--checkpoint", str(tiny_checkpoint), "-i", str(src)]
    expected = Translator.from_checkpoint(tiny_checkpoint).translate(english)
    _Recorded.made.clear()
    code, out, err = run_cli(args)  # 12 lines: eager
    assert code == 0 and "compile" not in err and not _Recorded.made
    # As if the model were large enough for 12 lines to win the warm-up back.
    monkeypatch.setattr(compiled, "MIN_COMPILE_LINES", 1)
    monkeypatch.setattr(compiled, "MIN_COMPILE_PARAMETERS", 1)
    monkeypatch.setattr(compiled, "SAVED_S_PER_LINE_PER_PARAMETER", 1.0)
    code, out, err = run_cli([*args, "--compile", "off"])
    assert code == 0 and "compile" not in err and not _Recorded.made
    code, out, err = run_cli(args)
    assert code == 0 and f"compile auto -> on ({len(english)} lines win its warm-up back)" in err
    assert len(_Recorded.made) == 1 and out.decode("utf-8").splitlines() == expected


def test_serve_compiles_in_the_background_then_switches() -> None:
    from aiayn.cli import serve

    seen = []

    class Translator:
        def use_compiled(self, warm_up):
            seen.append(("use_compiled", warm_up))

    serve.compile_in_background(Translator()).join(timeout=60)  # type: ignore[arg-type]
    assert seen == [("use_compiled", serve.WARM_UP)]

    class Failing(Translator):
        def use_compiled(self, warm_up):
            raise RuntimeError("no C++ compiler")

    seen.clear()
    serve.compile_in_background(Failing()).join(timeout=60)  # type: ignore[arg-type]
    assert seen == []  # the eager steps keep serving


SECOND_RUN = """
import json, sys, torch
from aiayn.inference.translator import Translator
torch.set_num_threads(1)
t = Translator.from_checkpoint(sys.argv[1], dtype="fp32", compile=True)
out = t.translate(["a man is riding a bike", "the dog"])
packages = t.decoder.packages
print(json.dumps({"out": out, "built": [p.name for p in packages.built], "loaded": [p.name for p in packages.loaded],
                  "files": sorted(p.name for p in __import__("pathlib").Path(sys.argv[2]).rglob("*.pt2")),
                  "beams_package": packages.path(t.config.decode.beam, t.device).name}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)  # one process compiling: about a minute on 2 idle cores
def test_a_second_process_loads_the_compiled_step(tiny_checkpoint: Path, tmp_path: Path) -> None:
    import json

    env = {**os.environ, "AIAYN_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    folder = tmp_path / "inductor"

    def run() -> dict:
        proc = subprocess.run([sys.executable, "-c", SECOND_RUN, str(tiny_checkpoint), str(folder)], env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    first = run()
    assert first["built"] and first["loaded"] == [] and first["files"] == sorted(first["built"])
    assert first["beams_package"] in first["built"]  # the package that compile_pays looks for
    second = run()  # nothing compiled: the first run's package, loaded
    assert second["out"] == first["out"] and second["built"] == [] and second["loaded"] == first["built"]
    assert second["files"] == first["files"]
