"""The CPU image of `aiayn serve` (Dockerfile, .dockerignore at the repository root).

Checked statically everywhere: what it installs and in which order, that it runs as a
user other than root, that its command line is one `aiayn serve` accepts (parsed by
aiayn's own parser), that the health check and the exposed port agree with it, and that
every version it installs is pinned (docker/constraints.txt). Built, run, and probed on
/health and /v1/translate in the slow suite where a container runtime (podman or docker)
works and reaches a registry; otherwise that test skips naming what was missing. A registry
that answered and refused the pull (an unknown image, a rate limit, a denied access) is a
failure, not a skip."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiayn.cli.main import build_parser

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CONSTRAINTS = REPO / "docker" / "constraints.txt"
PYPROJECT = REPO / "pyproject.toml"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_PIN = "torch==2.13.0"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends in a continuation line"
    return out


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text(encoding="utf-8"))


def one(steps: list[tuple[str, str]], keyword: str) -> str:
    found = [args for k, args in steps if k == keyword]
    assert len(found) == 1, f"{keyword}: {found}"
    return found[0]


def index(steps: list[tuple[str, str]], keyword: str, needle: str) -> int:
    hits = [i for i, (k, args) in enumerate(steps) if k == keyword and needle in args]
    assert hits, f"no {keyword} with {needle!r}"
    return hits[0]


def command_line(steps: list[tuple[str, str]]) -> list[str]:
    """ENTRYPOINT + CMD, as `docker run IMAGE` runs them (both must be in JSON form: the
    shell form would run under /bin/sh, which would receive SIGTERM instead of uvicorn)."""
    return json.loads(one(steps, "ENTRYPOINT")) + json.loads(one(steps, "CMD"))


def test_base_image_and_install_order(steps: list[tuple[str, str]]) -> None:
    assert one(steps, "FROM") == "python:3.11-slim"
    torch = index(steps, "RUN", TORCH_PIN)
    run = steps[torch][1]
    assert f"--index-url {TORCH_INDEX}" in run
    serve = index(steps, "RUN", '".[serve]"')
    # torch before the package: otherwise pip would pull the CUDA build from PyPI.
    assert torch < serve
    assert index(steps, "COPY", "pyproject.toml") < serve and index(steps, "COPY", "src") < serve


def constraint_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"docker/constraints.txt: {line!r} is not name==version"
            pins[name] = version
    return pins


def test_every_install_is_pinned_by_the_constraints(steps: list[tuple[str, str]]) -> None:
    copied = index(steps, "COPY", "docker/constraints.txt")
    installs = [i for i, (k, args) in enumerate(steps) if k == "RUN" and "pip install" in args]
    assert installs and all(copied < i and "-c /constraints.txt" in steps[i][1] for i in installs)
    pins = constraint_pins()
    assert pins["torch"] == TORCH_PIN.split("==")[1]
    # Every dependency of aiayn[serve] has its version there, and it satisfies pyproject.toml.
    from packaging.requirements import Requirement

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    for text in project["dependencies"] + project["optional-dependencies"]["serve"]:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"docker/constraints.txt does not pin {name}"
        assert req.specifier.contains(pins[name]), f"docker/constraints.txt: {name}=={pins[name]} is not {text}"


def test_copied_files_exist_and_reach_the_build_context(steps: list[tuple[str, str]]) -> None:
    patterns = [p.strip() for p in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
                if p.strip() and not p.startswith("#")]
    for _, args in (s for s in steps if s[0] == "COPY"):
        for source in shlex.split(args)[:-1]:
            assert (REPO / source).exists(), source
            assert not ignored(source, patterns), f"{source} is excluded by .dockerignore"
    for heavy in (".venv", ".git", "runs", "data-bin", "src/aiayn/__pycache__/x.pyc", ".env"):
        assert ignored(heavy, patterns), f".dockerignore lets {heavy} into the build context"
    assert not ignored("src/aiayn/serving/static/app.js", patterns)


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides
    (``!`` re-includes); ``**`` matches any number of directories."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        if any(_match(p, body) for p in prefixes):
            verdict = not negate
    return verdict


def _match(path: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        return any(fnmatch.fnmatchcase("/".join(path.split("/")[i:]), pattern[3:])
                   for i in range(len(path.split("/"))))
    return fnmatch.fnmatchcase(path, pattern) and path.count("/") == pattern.count("/")


def test_runs_as_a_user_other_than_root(steps: list[tuple[str, str]]) -> None:
    user = one(steps, "USER")
    assert user.split(":")[0] not in ("root", "0")
    keywords = [k for k, _ in steps]
    installs = [i for i, (k, args) in enumerate(steps) if k == "RUN" and "pip install" in args]
    assert max(installs) < keywords.index("USER") < keywords.index("ENTRYPOINT")


def test_the_command_line_is_one_aiayn_serve_accepts(steps: list[tuple[str, str]]) -> None:
    argv = command_line(steps)
    assert argv[:2] == ["aiayn", "serve"]
    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse has printed which flag it did not know
        pytest.fail(f"aiayn does not accept the image's command line {argv}: exit {exc.code}")
    assert args.command == "serve"
    assert args.host == "0.0.0.0"  # reachable through the container's published port
    # The checkpoint is a volume, mounted at run time.
    volumes = json.loads(one(steps, "VOLUME"))
    assert args.checkpoint in volumes
    assert one(steps, "EXPOSE") == str(args.port)
    health = one(steps, "HEALTHCHECK")
    assert f"http://127.0.0.1:{args.port}/health" in health
    assert health.split(" CMD ", 1)[1].startswith("[")  # exec form: no shell in the image is needed


RUNTIMES = ("podman", "docker")


def _first_error_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return (errors or lines or ["no output"])[0]


# What a runtime prints when no registry can be reached from this machine (no network, no
# DNS, a firewall), as opposed to what a registry that answered says (manifest unknown,
# unauthorized, toomanyrequests, a 5xx status).
UNREACHABLE = re.compile(
    r"no such host|name resolution|could not resolve|network is unreachable|no route to host"
    r"|connection refused|connection reset|i/o timeout|dial tcp|tls handshake timeout"
    r"|context deadline exceeded|timeout exceeded while awaiting headers", re.IGNORECASE)


def no_registry_here(pull_output: str) -> bool:
    """Whether a failed pull's output says no registry could be reached (a platform skip)
    rather than that a registry answered and refused (a failure)."""
    return UNREACHABLE.search(pull_output) is not None


def container_runtime() -> tuple[str | None, str]:
    """(the runtime that can build the image here, "") or (None, the reason naming which
    runtime was missing or why it could not run). A reason starting ``platform: `` is a
    feature of the machine (no runtime, no daemon, no registry reachable); any other is a
    failure (a registry answered and refused the pull)."""
    found = [name for name in RUNTIMES if shutil.which(name)]
    if not found:
        return None, f"platform: no container runtime ({', '.join(RUNTIMES)}) on PATH"
    base = one(instructions(DOCKERFILE.read_text(encoding="utf-8")), "FROM")
    reasons, refused = [], []
    for name in found:
        try:
            info = subprocess.run([name, "info"], capture_output=True, text=True, timeout=60)
            if info.returncode != 0:
                reasons.append(f"{name} does not run here (`{name} info`: {_first_error_line(info.stderr)})")
                continue
            # The build starts from the base image: where it cannot be pulled, nothing builds.
            pull = subprocess.run([name, "pull", base], capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired as exc:
            reasons.append(f"`{' '.join(map(str, exc.cmd))}` did not answer within {exc.timeout:.0f} s")
            continue
        if pull.returncode != 0:
            output = pull.stderr + pull.stdout
            if no_registry_here(output):
                reasons.append(f"{name} reaches no registry here: {_first_error_line(output)}")
            else:
                refused.append(f"`{name} pull {base}` failed at a registry that answered: {_first_error_line(output)}")
            continue
        return name, ""
    if refused:
        return None, "; ".join(refused)
    return None, "platform: " + "; ".join(reasons)


def runtime_cmd(runtime: str, *args: str, timeout: float = 120) -> str:
    r = subprocess.run([runtime, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{runtime} {' '.join(args)}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[str, str]]:
    runtime, reason = container_runtime()
    if runtime is None:
        if not reason.startswith("platform: "):
            pytest.fail(reason)
        pytest.skip(reason)
    tag = f"aiayn-serve-test:{uuid.uuid4().hex[:8]}"
    # podman keeps HEALTHCHECK only in Docker's image format.
    fmt = ["--format", "docker"] if runtime == "podman" else []
    runtime_cmd(runtime, "build", *fmt, "-t", tag, str(REPO), timeout=1800)
    try:
        yield runtime, tag
    finally:
        subprocess.run([runtime, "rmi", "-f", tag], capture_output=True, timeout=120)


def healthy(runtime: str, cid: str) -> bool:
    """The image's own HEALTHCHECK: Docker's daemon runs it; podman runs it on request."""
    if runtime == "podman":
        return subprocess.run(["podman", "healthcheck", "run", cid], capture_output=True, timeout=60).returncode == 0
    status = runtime_cmd(runtime, "inspect", "--format", "{{.State.Health.Status}}", cid)
    assert status in ("starting", "healthy"), runtime_cmd(runtime, "logs", cid)
    return status == "healthy"


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the image's build (its fixture) may take up to 30 minutes
def test_the_image_serves_a_mounted_checkpoint(image: tuple[str, str], tiny_checkpoint: Path) -> None:
    httpx = pytest.importorskip("httpx")
    runtime, tag = image
    cid = runtime_cmd(runtime, "run", "-d", "-p", "127.0.0.1::8000", "--health-interval", "1s",
                      "--health-start-period", "120s", "-v", f"{tiny_checkpoint}:/model:ro", tag,
                      "--checkpoint", "/model", "--threads", "1")
    try:
        url = "http://" + runtime_cmd(runtime, "port", cid, "8000").splitlines()[0].replace("0.0.0.0", "127.0.0.1")
        deadline = time.monotonic() + 300
        while not healthy(runtime, cid):
            assert time.monotonic() < deadline, runtime_cmd(runtime, "logs", cid)
            time.sleep(1)
        assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
        r = httpx.post(f"{url}/v1/translate", json={"texts": ["a b c"]}, timeout=120)
        assert r.status_code == 200 and len(r.json()["translations"]) == 1
        assert runtime_cmd(runtime, "exec", cid, "id", "-u") != "0"
    finally:
        subprocess.run([runtime, "rm", "-f", cid], capture_output=True, timeout=120)


@pytest.mark.parametrize(("output", "unreachable"), [
    ('Error: initializing source docker://python:3.12-slim: pinging container registry registry-1.docker.io: '
     'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no such host', True),
    ("Error response from daemon: Get \"https://registry-1.docker.io/v2/\": net/http: request canceled while "
     "waiting for connection (Client.Timeout exceeded while awaiting headers)", True),
    ('Error: copying system image from manifest list: Get "https://registry-1.docker.io/v2/": dial tcp '
     "54.236.113.205:443: connect: network is unreachable", True),
    ("Error response from daemon: manifest for python:3.12-nonexistent not found: manifest unknown", False),
    ("Error response from daemon: toomanyrequests: You have reached your pull rate limit.", False),
    ("Error: initializing source docker://private/image:1: reading manifest 1 in docker.io/private/image: "
     "requested access to the resource is denied", False),
    ("Error response from daemon: received unexpected HTTP status: 503 Service Unavailable", False),
])
def test_a_registry_that_answered_is_told_from_no_registry(output: str, unreachable: bool) -> None:
    """No registry reachable is a platform skip; a refusal from one that answered fails."""
    assert no_registry_here(output) is unreachable
