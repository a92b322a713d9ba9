"""README.md's tour runs as written: its ```bash blocks in order (the server started in the
background, asked with the README's own curl, then stopped), then its Python API block, in a
fresh directory, on Multi30k from the data mirror, with the changes of ``quick`` that make
training take seconds."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from aiayn.config import load_config, save_config

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CONFIG = "configs/multi30k_en_de.yaml"
# The tour's configuration, small and short: 10 steps, a checkpoint every 2 (so that
# `average --last 5` has its 5), outputs of at most half the source length + 5.
TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "train.max_time_minutes=0", "train.max_steps=10", "train.save_every=2",
        "train.valid_every=10", "train.log_every=5", "train.warmup_steps=5", "train.max_tokens=1024",
        "train.dtype=fp32", "train.device=cpu", "decode.max_len_a=0.5", "decode.max_len_b=5"]
SERVE = "aiayn serve --checkpoint runs/m30k/avg"
READY = re.compile(r"Uvicorn running on (http://\S+?:\d+)")


def quick(tmp: Path) -> dict[str, str]:
    """Text of the README -> what the test runs instead. Each must be in the README, so that
    a change there fails here rather than silently testing something else."""
    config = tmp / "quick.yaml"
    save_config(load_config(REPO / CONFIG, TINY), config)
    return {
        ". .venv/bin/activate\n": "",  # the test's interpreter is the environment's
        f"--config {CONFIG}": f"--config {config}",
        "--beams 4 8 --lenpens 1.0 2.0": "--beams 1 --lenpens 1.0",
        SERVE: f"{SERVE} --port 0",  # a free port; the curl block is pointed at it below
    }


def tour(replace: dict[str, str]) -> tuple[list[str], str]:
    """The bash blocks of "A short tour" and the python block of "Python API"."""
    text = README.read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old in text, f"README.md no longer has {old!r}: update quick() in {__file__}"
        text = text.replace(old, new)
    tour_part = text.split("\n## A short tour\n", 1)[1].split("\n## ", 1)[0]
    api_part = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    fence = r"^```{}\n(.*?)^```$"
    bash = re.findall(fence.format("bash"), tour_part, flags=re.MULTILINE | re.DOTALL)
    python = re.findall(fence.format("python"), api_part, flags=re.MULTILINE | re.DOTALL)
    assert len(python) == 1
    return bash, python[0]


def environment(tmp: Path, mirror: Path) -> dict[str, str]:
    """As the reader runs it: the environment's `aiayn` first on PATH; Multi30k from the
    mirror, never downloaded; caches inside the test's directory."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIAYN_NUM_THREADS": os.environ.get("AIAYN_TEST_THREADS", "2"), "AIAYN_DATA_MIRROR": str(mirror),
            "AIAYN_CACHE_DIR": str(tmp / "cache"), "AIAYN_OFFLINE": "1"}


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{script}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"failed:\n{script}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


class Server:
    """The README's serve block, run in the background until it listens."""

    def __init__(self, block: str, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(["bash", "-c", block], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def pump() -> None:  # read the log for the server's whole life, or its pipe fills
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                found = READY.search(line)
                if found and not self.url:
                    self.url = found.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        ready.wait(120)
        assert self.url, "aiayn serve did not start:\n" + "".join(self.lines[-40:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def test_every_tour_block_is_run() -> None:
    text = README.read_text(encoding="utf-8")
    assert set(re.findall(r"^```(\w*)$", text, flags=re.MULTILINE)) <= {"bash", "python", ""}
    bash_blocks, _ = tour({})
    assert len(bash_blocks) == 4
    assert [SERVE in block for block in bash_blocks] == [False, True, False, False]
    assert "curl" in bash_blocks[2]
    for config in set(re.findall(r"configs/\w+\.yaml", text)):
        assert (REPO / config).is_file(), config


def test_the_readme_points_at_no_folder_outside_the_repository() -> None:
    assert "../shared" not in README.read_text(encoding="utf-8")


def test_the_tour(tmp_path: Path, mirror: Path) -> None:
    env = environment(tmp_path, mirror)
    (commands, serve, ask, export), python = tour(quick(tmp_path))
    proc = bash(commands, tmp_path, env)
    assert "preset base: 63,082,496 parameters" in proc.stdout
    assert "prepared multi30k en-de -> data-bin/multi30k.en-de" in proc.stdout
    assert "done (max_steps): step 10" in proc.stderr
    assert "averaged 5 checkpoints -> " in proc.stdout
    hyps = (tmp_path / "runs/m30k/test.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 1000
    assert re.search(r"^BLEU = \d+\.\d ", proc.stdout, flags=re.MULTILINE)
    assert re.search(r"^best: --beam 1 --lenpen 1", proc.stdout, flags=re.MULTILINE)

    server = Server(serve, tmp_path, env)
    try:
        answer = bash(ask.replace("localhost:8000", server.url.removeprefix("http://")), tmp_path, env)
    finally:
        server.stop()
    served = json.loads(answer.stdout)["translations"]
    assert len(served) == 1 and isinstance(served[0], str)

    bash(export, tmp_path, env)
    assert (tmp_path / "hf-model/config.json").is_file()
    assert (tmp_path / "ct2-model/model.bin").is_file()

    # The Python API block: translate() returns one string per input.
    check = "\nassert isinstance(translations, list) and all(isinstance(t, str) for t in translations)\n"
    (tmp_path / "api.py").write_text(python + check, encoding="utf-8")
    api = subprocess.run([sys.executable, "api.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert api.returncode == 0, api.stderr[-4000:]
    assert api.stdout == served[0] + "\n"  # the server and the API translate alike
