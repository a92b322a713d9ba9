"""Under CI=true a missing prerequisite fails the run; locally it skips with its reason.

Each case runs the project's own conftest.py in an inner pytest (pytester) over a small file
that skips the ways the suite does: a fixture's skip (the data mirror), importorskip at module
level (an extra), a skipif mark (perl), and a platform skip CI accepts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CONFTEST = Path(__file__).with_name("conftest.py")

SKIPPING_TESTS = '''
import pytest

@pytest.fixture
def mirror():
    pytest.skip("data mirror not found at /nowhere")

def test_needs_the_mirror(mirror):
    pass

@pytest.mark.skipif(True, reason="perl is not installed")
def test_needs_perl():
    pass

def test_platform_feature():
    pytest.skip("platform: oneDNN's int8 linear is not in this torch build")

@pytest.mark.xfail(reason="a known failure is not a skip")
def test_expected_failure():
    assert False

def test_runs():
    pass
'''

MISSING_EXTRA = '''
import pytest
pytest.importorskip("a_package_that_is_not_installed_anywhere")

def test_never_collected():
    pass
'''


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_skips=SKIPPING_TESTS)
    return pytester


def test_locally_missing_prerequisites_skip_with_their_reason(inner: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = inner.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    result.stdout.fnmatch_lines(["*data mirror not found at /nowhere*", "*perl is not installed*"])


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_in_ci_they_fail_naming_what_is_missing(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                value: str) -> None:
    monkeypatch.setenv("CI", value)
    result = inner.runpytest("-p", "no:cacheprovider")
    # Both skips happen in setup (a fixture, a skipif mark), so both are errors.
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, errors=2)
    result.stdout.fnmatch_lines([
        "*CI=true and a prerequisite is missing (locally this skips): data mirror not found at /nowhere*",
        "*CI=true and a prerequisite is missing (locally this skips): perl is not installed*",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_in_ci_a_missing_extra_stops_collection(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_extra=MISSING_EXTRA)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*CI=true and a prerequisite is missing*a_package_that_is_not_installed_anywhere*"])
    monkeypatch.setenv("CI", "false")
    assert pytester.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.NO_TESTS_COLLECTED


# --- torch's build on a GPU machine (scripts/torch_index.py, Makefile, tests/conftest.py) ---

REPO = CONFTEST.parents[1]
TORCH_INDEX = REPO / "scripts" / "torch_index.py"
NVIDIA_SMI_HEADER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
|   0  NVIDIA H200                    On  |   00000000:19:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+
"""


def _torch_index():
    import torch_index

    return torch_index


def fake_nvidia_smi(folder: Path, cuda: str | None, exit_code: int = 0) -> Path:
    """A folder holding an `nvidia-smi` that prints the header of a driver of this CUDA
    version (None: no `nvidia-smi` at all) and exits with exit_code."""
    folder.mkdir(parents=True, exist_ok=True)
    if cuda is not None:
        script = folder / "nvidia-smi"
        script.write_text(f"#!/bin/sh\ncat <<'END'\n{NVIDIA_SMI_HEADER.format(cuda=cuda)}END\nexit {exit_code}\n")
        script.chmod(0o755)
    return folder


def _path_with(folder: Path) -> str:
    """PATH with folder first and without any real nvidia-smi."""
    rest = [p for p in os.environ["PATH"].split(os.pathsep) if p and not (Path(p) / "nvidia-smi").exists()]
    return os.pathsep.join([str(folder), *rest])


@pytest.mark.parametrize(("cuda", "index"), [
    ((13, 0), "cu130"), ((13, 2), "cu130"), ((14, 1), "cu130"),
    ((12, 9), "cu126"), ((12, 8), "cu126"), ((12, 6), "cu126"),
])
def test_the_newest_cuda_build_the_driver_runs(cuda, index) -> None:
    assert _torch_index().index_for(cuda, "torch==2.13.0") == "https://download.pytorch.org/whl/" + index


def test_no_gpu_keeps_the_default_index_and_an_old_driver_says_what_to_do() -> None:
    module = _torch_index()
    assert module.index_for(None, "torch==2.13.0") == ""
    with pytest.raises(ValueError) as old:
        module.index_for((12, 4), "torch==2.13.0")
    message = str(old.value)
    assert "\n" not in message
    assert "CUDA 12.4, older than the oldest CUDA build of torch==2.13.0 (12.6)" in message
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in message


@pytest.mark.parametrize(("cuda", "exit_code", "found"), [
    ("13.0", 0, (13, 0)), ("12.8", 0, (12, 8)),
    ("13.0", 9, None),  # nvidia-smi fails: no usable driver
    (None, 0, None),    # no nvidia-smi
])
def test_the_driver_version_comes_from_nvidia_smi(tmp_path, monkeypatch, cuda, exit_code, found) -> None:
    monkeypatch.setenv("PATH", _path_with(fake_nvidia_smi(tmp_path / "bin", cuda, exit_code)))
    assert _torch_index().driver_cuda() == found


def _run_torch_index(tmp_path: Path, cuda: str | None, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PATH": _path_with(fake_nvidia_smi(tmp_path / f"bin-{cuda}", cuda))}
    environ.pop("TORCH_INDEX", None)
    environ.update(env)
    return subprocess.run([sys.executable, str(TORCH_INDEX), "--torch", "torch==2.13.0", *args],
                          capture_output=True, text=True, env=environ, timeout=120)


def test_the_command_prints_the_index_and_an_explicit_choice_wins(tmp_path) -> None:
    assert _run_torch_index(tmp_path, "12.8").stdout == "https://download.pytorch.org/whl/cu126\n"
    assert _run_torch_index(tmp_path, None).stdout == "\n"
    explicit = _run_torch_index(tmp_path, "12.8", TORCH_INDEX="https://download.pytorch.org/whl/cpu")
    assert explicit.stdout == "https://download.pytorch.org/whl/cpu\n"
    old = _run_torch_index(tmp_path, "11.8")
    assert old.returncode == 2 and old.stdout == ""
    assert old.stderr.count("\n") == 1 and old.stderr.startswith("torch_index: the NVIDIA driver supports CUDA 11.8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="platform: torch uses this machine's GPU")
def test_check_fails_in_one_line_where_torch_cannot_use_the_gpu(tmp_path) -> None:
    on_gpu = _run_torch_index(tmp_path, "13.0", "--check")
    assert on_gpu.returncode == 1 and on_gpu.stderr.count("\n") == 1
    cpu_build = torch.version.cuda is None
    expected = "is a CPU-only build: `make clean test` installs the CUDA build" if cpu_build else "cannot use it"
    assert expected in on_gpu.stderr
    assert _run_torch_index(tmp_path, None, "--check").returncode == 0


def _fake_python(folder: Path, log: Path) -> Path:
    """A `python3` for the Makefile's venv recipe: `-m venv DIR` makes DIR/bin/pip, which logs
    its arguments; anything else (scripts/torch_index.py) runs in the real interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python3"
    python.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/sh\\necho "$*" >> {log}\\n' > "$3/bin/pip"
  chmod +x "$3/bin/pip"
  exit 0
fi
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    return python


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(("cuda", "index"), [
    ("13.0", "--index-url https://download.pytorch.org/whl/cu130"),
    (None, ""),
])
def test_make_installs_the_torch_build_the_driver_runs(tmp_path, cuda, index) -> None:
    log = tmp_path / "pip.log"
    python = _fake_python(tmp_path / "py", log)
    venv = tmp_path / "venv"
    environ = {**os.environ, "PATH": _path_with(fake_nvidia_smi(tmp_path / "bin", cuda))}
    environ.pop("TORCH_INDEX", None)
    done = subprocess.run(["make", "-C", str(REPO), f"PY={python}", f"VENV={venv}", f"{venv}/bin/activate"],
                          capture_output=True, text=True, env=environ, timeout=120)
    assert done.returncode == 0, done.stderr
    torch_pin = re.search(r"^TORCH := (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert torch_pin is not None
    assert log.read_text().splitlines() == ["install -q --upgrade pip", f"install -q {torch_pin[1]} {index}".strip()]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_stops_before_the_venv_when_no_build_fits_the_driver(tmp_path) -> None:
    python = _fake_python(tmp_path / "py", tmp_path / "pip.log")
    venv = tmp_path / "venv"
    environ = {**os.environ, "PATH": _path_with(fake_nvidia_smi(tmp_path / "bin", "11.8"))}
    environ.pop("TORCH_INDEX", None)
    done = subprocess.run(["make", "-C", str(REPO), f"PY={python}", f"VENV={venv}", f"{venv}/bin/activate"],
                          capture_output=True, text=True, env=environ, timeout=120)
    assert done.returncode != 0 and not venv.exists()
    assert "torch_index: the NVIDIA driver supports CUDA 11.8" in done.stderr


NO_CUDA_TESTS = '''
import pytest

@pytest.mark.skipif(True, reason="platform: no CUDA device")
def test_on_the_gpu():
    pass
'''


@pytest.fixture
def gpu_layout(pytester: pytest.Pytester) -> pytest.Pytester:
    """The repository's layout in the inner pytest: tests/conftest.py beside scripts/torch_index.py."""
    (pytester.path / "tests").mkdir()
    (pytester.path / "scripts").mkdir()
    (pytester.path / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    (pytester.path / "scripts" / "torch_index.py").write_text(TORCH_INDEX.read_text())
    (pytester.path / "tests" / "test_gpu.py").write_text(NO_CUDA_TESTS)
    return pytester


@pytest.mark.skipif(torch.cuda.is_available(), reason="platform: torch uses this machine's GPU")
def test_in_ci_a_gpu_that_torch_cannot_use_fails_the_cuda_tests(gpu_layout, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PATH", _path_with(fake_nvidia_smi(tmp_path / "bin", "13.0")))
    result = gpu_layout.runpytest("tests", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*CI=true and a prerequisite is missing*an NVIDIA GPU is here (driver CUDA 13.0)*"])


@pytest.mark.parametrize(("ci", "cuda"), [("true", None), ("false", "13.0")])
def test_no_gpu_in_ci_or_any_gpu_locally_skips_the_cuda_tests(gpu_layout, monkeypatch, tmp_path, ci, cuda) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PATH", _path_with(fake_nvidia_smi(tmp_path / "bin", cuda)))
    result = gpu_layout.runpytest("tests", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)


# --- .ci/run ---

def _fake_make(folder: Path, log: Path, failing: str = "", code: int = 2) -> Path:
    """`make` that logs each target with the CI variable it saw, and exits with code for
    the target named failing; `chromium` so that nothing is installed."""
    folder.mkdir(parents=True, exist_ok=True)
    make = folder / "make"
    make.write_text(f'#!/bin/sh\necho "$1 CI=${{CI:-}}" >> {log}\n[ "$1" = "{failing}" ] && exit {code}\nexit 0\n')
    make.chmod(0o755)
    chromium = folder / "chromium"
    chromium.write_text("#!/bin/sh\nexit 0\n")
    chromium.chmod(0o755)
    return folder


def _ci_run(tmp_path: Path, failing: str = "", code: int = 2) -> tuple[subprocess.CompletedProcess, list[str]]:
    log = tmp_path / "make.log"
    fakes = _fake_make(tmp_path / "bin", log, failing, code)
    environ = {**os.environ, "PATH": f"{fakes}{os.pathsep}{os.environ['PATH']}", "AIAYN_DATA_MIRROR": str(tmp_path)}
    environ.pop("CI", None)
    done = subprocess.run(["bash", str(REPO / ".ci" / "run")], capture_output=True, text=True, env=environ, timeout=60)
    return done, log.read_text().splitlines()


def test_ci_run_sets_ci_itself_and_runs_every_stage(tmp_path) -> None:
    done, targets = _ci_run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert targets == ["lint CI=true", "mutation-check CI=true", "test-slow CI=true", "test CI=true"]


@pytest.mark.parametrize("stage", ["lint", "mutation-check", "test-slow", "test"])
def test_ci_run_fails_with_the_failing_stage(tmp_path, stage) -> None:
    """make exits 2 for any failing recipe."""
    done, targets = _ci_run(tmp_path, failing=stage)
    assert done.returncode == 2
    assert targets[-1] == f"{stage} CI=true"


@pytest.mark.parametrize("code, expected", [(0, 0), (5, 0), (1, 2), (2, 2), (4, 2)])
def test_make_test_passes_pytest_s_no_tests_collected_and_fails_the_rest(tmp_path, code, expected) -> None:
    """The Makefile's NO_TESTS_OK, as `make test` and `make test-slow` append it to pytest."""
    line = next(x for x in (REPO / "Makefile").read_text().splitlines() if x.startswith("NO_TESTS_OK ="))
    assert "$(NO_TESTS_OK)" in (REPO / "Makefile").read_text().split("\ntest:")[1].split("\n\n")[0]
    (tmp_path / "Makefile").write_text(f"{line}\nrun:\n\tsh -c 'exit {code}' $(NO_TESTS_OK)\n")
    done = subprocess.run(["make", "-s", "-C", str(tmp_path), "run"], capture_output=True, text=True, timeout=30)
    assert done.returncode == expected
    assert ("pytest: no tests collected (exit 5)" in done.stdout) == (code == 5)
