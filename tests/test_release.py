"""The release files, as a user gets them: the sdist and the wheel built from it (what
`make dist` does, without build isolation), their metadata checked by twine, the wheel
holding every file of the package, and the wheel installed, not editable, into a fresh
virtual environment whose `aiayn` runs from a directory outside the source tree:
`--version`, a tiny `demo`, `translate` with the demo's model, and `serve` answering ``/``
with its page on loopback.

The fresh environment gets aiayn from the wheel alone; its dependencies (torch, FastAPI, ...)
are this environment's, reached through a ``.pth`` file naming its site-packages (a ``.pth``
line adds a folder to ``sys.path`` without running the ``.pth`` files inside it, so an
editable install of aiayn there stays inactive). No network is used. 20-40 s on 2 cores.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import threading
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "aiayn"
READY = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)")
# The demo, tiny: a few training steps on a small task; the accuracy is not the point here.
TINY_DEMO = ["train.max_steps=40", "train.valid_every=20", "train.save_every=20", "train.log_every=20",
             "data.synthetic_train_size=1000", "data.synthetic_valid_size=20", "data.synthetic_max_len=5",
             "train.progress_bar=false"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _project_version() -> str:
    found = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert found, "pyproject.toml has no version line"
    return found.group(1)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc


def _package_files() -> set[str]:
    """Every file of src/aiayn the wheel must hold (modules and data), as wheel paths."""
    return {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from the unpacked sdist, in a fresh folder."""
    pytest.importorskip("build", reason="the 'dev' extra's `build` is not installed")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)], cwd=out)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("aiayn-*.whl")
    return wheel


def test_the_release_files_carry_the_version_and_pass_twine(dist: Path) -> None:
    pytest.importorskip("twine", reason="the 'dev' extra's `twine` is not installed")
    version = _project_version()
    assert sorted(p.name for p in dist.iterdir()) == [f"aiayn-{version}-py3-none-any.whl", f"aiayn-{version}.tar.gz"]
    proc = _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))], cwd=dist)
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_the_wheel_holds_every_file_of_the_package(dist: Path) -> None:
    with zipfile.ZipFile(_wheel(dist)) as wheel:
        names = {n for n in wheel.namelist() if n.startswith("aiayn/")}
    missing = _package_files() - names
    assert not missing, f"files of src/aiayn missing from the wheel (declare them as package data): {sorted(missing)}"
    assert "aiayn/serving/static/index.html" in names


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed (not editable, no dependencies
    fetched) and this environment's site-packages after its own on ``sys.path``."""
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root)
    python = root / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index", "--no-deps",
          str(_wheel(dist))], cwd=root)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=root).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    assert str(REPO / "src") not in ours
    (site / "dependencies_of_the_test_environment.pth").write_text("\n".join(sorted(ours)) + "\n", encoding="utf-8")
    return root


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env.update({"AIAYN_NUM_THREADS": "1", "AIAYN_CACHE_DIR": str(tmp / "cache"), "AIAYN_OFFLINE": "1",
                "PYTHONDONTWRITEBYTECODE": "1"})
    return env


def test_the_installed_wheel_runs_outside_the_source_tree(venv: Path, tmp_path: Path) -> None:
    aiayn = str(venv / "bin" / "aiayn")
    env = _env(tmp_path)
    where = _run([str(venv / "bin" / "python"), "-c", "import aiayn; print(aiayn.__file__)"], tmp_path, env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's files, not src/
    assert _run([aiayn, "--version"], tmp_path, env).stdout == f"aiayn {_project_version()}\n"

    demo = _run([aiayn, "demo", "--out", "demo", *TINY_DEMO], tmp_path, env)
    assert re.search(r"^exact-match accuracy: \d+\.\d%$", demo.stdout, re.M), demo.stdout
    assert (tmp_path / "demo" / "attention.png").is_file()

    (tmp_path / "in.txt").write_text("s15 s9 s4 s7\ns3 s1 s18\n", encoding="utf-8")
    _run([aiayn, "translate", "--checkpoint", "demo", "--input", "in.txt", "--output", "out.txt"], tmp_path, env)
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 2

    page = _serve_page(aiayn, tmp_path, env)
    assert page == (PACKAGE / "serving" / "static" / "index.html").read_bytes()


def _serve_page(aiayn: str, cwd: Path, env: dict[str, str]) -> bytes:
    """`aiayn serve` of the demo's model on a free loopback port: the body of GET /."""
    proc = subprocess.Popen([aiayn, "serve", "--checkpoint", "demo", "--host", "127.0.0.1", "--port", "0"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def pump() -> None:  # read the log for the server's whole life, or its pipe fills
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            found = READY.search(line)
            if found and not url:
                url.append(found.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        ready.wait(120)
        assert url, "aiayn serve did not start:\n" + "".join(lines[-40:])
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
        with direct.open(url[0] + "/", timeout=30) as answer:
            assert answer.status == 200
            assert answer.headers.get_content_type() == "text/html"
            return answer.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
