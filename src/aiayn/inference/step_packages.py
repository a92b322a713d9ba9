"""Compiled decoding steps kept on disk as AOTInductor packages, built once per set of weights.

``torch.compile`` keeps little of a decoding step between processes once its weights are
frozen into the graph: its FX graph cache cannot hold oneDNN's packed weights, so every run
traces and lowers the step again, and only the C++ kernels' builds are reused. Here the step
(:func:`aiayn.inference.compiled.static_step`) is exported once with ``torch.export`` (the
sizes that vary between calls as symbolic dimensions) and compiled ahead of time by
AOTInductor, weights frozen in, into one ``.pt2`` package; a later process with the same
weights loads the package instead of compiling.

A package depends on everything its code was built from, and its file name is a SHA-256 of
all of it: the values of every tensor the step reads, the precision, the beam's rows per
source (the step reshapes by it), the torch version, the device kind and the CPU's
instruction sets. Packages live under ``aoti/`` in the compile cache folder
(:func:`aiayn.runtime.compile_cache.compile_cache_dir`) and are written under a temporary name, then renamed.

A package is verified before it is used: beside it, ``NAME.json`` records the weights'
fingerprint and key it was built for and the SHA-256 of the package's bytes. A package
whose record is missing, names other weights, or whose bytes differ (another model's package
under this name, a damaged or truncated file), or one that does not load, is built again (once
per process; if that fails too, the caller decodes eagerly with one warning).

int8: oneDNN's packed weight is an opaque tensor that ``torch.export`` cannot trace. The
exported copy's int8 layers compute with ``torch._int_mm`` over the same int8 weights
(:meth:`~aiayn.inference.quantize.Int8Linear.with_int_mm`), the same integer products.

A call with a one-token source or fewer than two cache positions or buffer rows (sizes torch
specialises) is refused by :meth:`StepPackages.fits`, and the caller runs its eager step
instead; one sentence (one source group) is within a package's sizes.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.inference.quantize import Int8Linear
from aiayn.runtime.compile_cache import compile_cache_dir, use_compile_cache
from aiayn.runtime.cpu import cpu_flags

log = logging.getLogger(__name__)

Step = Callable[..., Tensor]
FORMAT = 4  # bumped when the step's signature, the key's contents or the record's change
# The devices packages are built for. On CUDA, loading a package of this step crashed the
# process (a segmentation fault, with torch's loader and its public function alike: no
# fallback can catch that; docs/gpu.md), so a call there is refused before anything is built,
# and the caller decodes eagerly.
PACKAGE_DEVICES = ("cpu",)


def _named_tensors(module: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Every tensor ``module`` and its sub-modules hold: parameters, buffers and plain tensor
    attributes (the inference copy keeps rearranged weights as attributes)."""
    for prefix, m in module.named_modules():
        attributes = ((k, v) for k, v in vars(m).items() if isinstance(v, Tensor))
        for name, t in itertools.chain(m._parameters.items(), m._buffers.items(), attributes):
            if t is not None:
                yield f"{prefix}.{name}", t


def weights_fingerprint(modules: Iterable[nn.Module]) -> str:
    """SHA-256 of the names, dtypes, shapes and values of every tensor in ``modules``, and of
    the input range of their int8 layers."""
    digest = hashlib.sha256()
    for i, module in enumerate(modules):
        for name, m in module.named_modules():  # int8 layers: their inputs' range too
            if isinstance(m, Int8Linear):
                digest.update(f"{i}:{name}:input_qmax={m.input_qmax};".encode())
        for name, t in _named_tensors(module):
            if t.layout == torch._mkldnn:  # type: ignore[attr-defined]  # oneDNN's packed layout
                t = t.to_dense()
            digest.update(f"{i}:{name}:{t.dtype}:{tuple(t.shape)};".encode())
            digest.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().data)  # no copy
    return digest.hexdigest()


def exportable(module: nn.Module) -> nn.Module:
    """A structural copy of ``module`` that ``torch.export`` can trace: its tensors shared,
    its int8 layers computing with ``torch._int_mm``."""
    memo: dict[int, Any] = {id(t): t for _, t in _named_tensors(module)}
    twin = copy.deepcopy(module, memo)
    for parent in [twin, *twin.modules()]:
        for name, child in list(parent.named_children()):
            if isinstance(child, Int8Linear):
                setattr(parent, name, child.with_int_mm())
    return twin


def _step_sizes(args: tuple[Any, ...]) -> dict[str, int]:
    tokens, _pos, rows, self_k, _self_v, cross_k, _cross_v, _mask = args
    return {"rows": tokens.size(0), "groups": cross_k[0].size(0), "positions": rows.size(0),
            "buffer_rows": self_k[0].size(0), "source_length": cross_k[0].size(2)}


class StepPackages:
    """The compiled packages of one decoding step, one per rows-per-source count (the beam).

    ``step(tokens, pos, rows, self_k, self_v, cross_k, cross_v, src_mask)`` (see
    :func:`~aiayn.inference.compiled.static_step`) over ``modules`` (the weights it reads,
    already made :func:`exportable`): the weights' names, dtypes and values are all the
    compiled code depends on besides the step's code, torch and the CPU, and all are in its key.
    """

    def __init__(self, step: Step, modules: list[nn.Module], folder: Path | None = None) -> None:
        self.step = step
        self.modules = modules
        self.folder = folder
        self._fingerprint: str | None = None
        self.runners: dict[int, Step] = {}
        self.built: list[Path] = []  # packages this object compiled
        self.loaded: list[Path] = []  # packages it found on disk

    @staticmethod
    def fits(args: tuple[Any, ...]) -> bool:
        """Whether a package can run a call with these arguments (else: the eager step)."""
        s = _step_sizes(args)
        return (s["source_length"] >= 2 and s["positions"] >= 2 and s["buffer_rows"] >= 2
                and s["rows"] % s["groups"] == 0 and s["buffer_rows"] >= s["rows"])

    def __call__(self, *args: Any) -> Tensor:
        s = _step_sizes(args)
        per_source = s["rows"] // s["groups"]
        runner = self.runners.get(per_source)
        if runner is None:
            runner = self.runners[per_source] = self._runner(args, per_source)
        return runner(*args)

    def _key(self, per_source: int, device: torch.device) -> str:
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.modules)
        return json.dumps({"format": FORMAT, "weights": self._fingerprint, "per_source": per_source,
                           "torch": torch.__version__, "device": device.type, "cpu": sorted(cpu_flags())},
                          sort_keys=True)

    def path(self, per_source: int, device: torch.device) -> Path:
        """The package's file for ``per_source`` rows per source on ``device``."""
        folder = self.folder if self.folder is not None else compile_cache_dir() / "aoti"
        return folder / (hashlib.sha256(self._key(per_source, device).encode()).hexdigest()[:40] + ".pt2")

    def _runner(self, args: tuple[Any, ...], per_source: int) -> Step:
        device = args[0].device
        if device.type not in PACKAGE_DEVICES:
            raise RuntimeError(f"compiled decoding steps are built for the CPU only, not {device.type} "
                               "(loading a CUDA package of the step crashed the process)")
        path = self.path(per_source, device)
        key = self._key(per_source, device)
        if path.is_file():
            problem = _unverified(path, key)
            if problem is None:
                try:
                    runner = _load(path)
                except Exception as exc:  # noqa: BLE001 - torch's loader raises several kinds
                    problem = f"it does not load ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]})"
                else:
                    self.loaded.append(path)
                    return runner
            log.warning("compiled step %s: %s; building it again", path, problem)
        self._build(args, per_source, path, key)
        self.built.append(path)
        return _load(path)

    def _build(self, args: tuple[Any, ...], per_source: int, path: Path, key: str) -> None:
        """Export the step with ``args`` as the example and compile it into ``path``, its
        record (``key`` and the package's SHA-256) beside it."""
        from torch.export import Dim

        use_compile_cache()  # inductor's kernels too: a model of the same shapes builds faster
        # Outside inference mode: export writes into the example's cache buffers.
        with torch.inference_mode(False), torch.no_grad():
            example = _example(args)
            groups = Dim("groups", min=1)
            rows = groups if per_source == 1 else per_source * groups
            positions, buffer_rows, source = Dim("positions", min=2), Dim("buffer_rows", min=2), Dim("source", min=2)
            layers = len(example[3])
            buffers = [{0: buffer_rows, 2: positions}] * layers
            cross = [{0: groups, 2: source}] * layers
            shapes = ({0: rows}, None, {0: positions, 1: rows}, buffers, buffers, cross, cross, {0: groups, 3: source})
            # Sizes equal by chance in the example stay separate symbols.
            with torch.fx.experimental._config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
                program = torch.export.export(_Module(self.step), example, dynamic_shapes=shapes, strict=False)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.pt2")
            partial_record = partial.with_suffix(".json")
            try:
                with torch._inductor.config.patch(freezing=True):
                    torch._inductor.aoti_compile_and_package(program, package_path=str(partial))
                # The record first: a package never stands beside a record that vouches for other bytes.
                record = {"key": json.loads(key), "sha256": _file_sha256(partial)}
                partial_record.write_text(json.dumps(record, sort_keys=True) + "\n", encoding="utf-8")
                os.replace(partial_record, record_path(path))
                os.replace(partial, path)
            finally:
                for leftover in (partial, partial_record):
                    with contextlib.suppress(FileNotFoundError):
                        leftover.unlink()
        log.info("compiled the decoding step into %s", path)


def record_path(package: Path) -> Path:
    """The record beside a package: what it was built for, and its bytes' SHA-256."""
    return package.with_suffix(".json")


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _unverified(package: Path, key: str) -> str | None:
    """Why the package at ``package`` may not serve the step whose key is ``key`` (None: it may)."""
    try:
        record = json.loads(record_path(package).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no record of what it was built for"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"its record is unreadable ({type(exc).__name__})"
    if not isinstance(record, dict) or record.get("key") != json.loads(key):
        return "built for other weights or settings"
    try:
        sha = _file_sha256(package)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if record.get("sha256") != sha:
        return "its bytes are not those recorded (damaged or replaced)"
    return None


def _load(path: Path) -> Step:
    """The package at ``path`` as a function of the step's arguments.

    ``torch._inductor.aoti_load_package`` first imports inductor and probes the CPU's vector
    instruction sets by compiling test programs (once per process); the C++ loader it wraps
    does neither, and the CPU was already checked: its flags are part of the package's name.
    torch's function is the fallback where that loader is not where this torch version keeps
    it."""
    loader_type = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader_type is None:
        runner: Step = torch._inductor.aoti_load_package(str(path))
        return runner
    loader = loader_type(str(path), "model", False, 1, -1)  # model name, single-threaded, runners, device index

    def run(*args: Any) -> Tensor:
        flat = [t for a in args for t in (a if isinstance(a, list) else [a])]  # the step's tensors, in order
        out: Tensor = loader.boxed_run(flat)[0]
        return out

    return run


class _Module(nn.Module):
    """``step`` as the module ``torch.export`` takes, its arguments named."""

    def __init__(self, step: Step) -> None:
        super().__init__()
        self.step = step

    def forward(self, tokens: Tensor, pos: Tensor, rows: Tensor, self_k: list[Tensor], self_v: list[Tensor],
                cross_k: list[Tensor], cross_v: list[Tensor], src_mask: Tensor) -> Tensor:
        return self.step(tokens, pos, rows, self_k, self_v, cross_k, cross_v, src_mask)


def _example(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Copies of a call's arguments to trace with. One source group is doubled (a second copy of
    the sentence, its hypotheses reading their own buffer rows): export would fix a size of 1
    as a constant. The cache buffers get one row more than the call has, so that buffer rows
    and rows are never equal in the example."""
    def clone(x: Any) -> Any:
        return [clone(t) for t in x] if isinstance(x, list) else x.clone()

    tokens, pos, rows, self_k, self_v, cross_k, cross_v, mask = (clone(a) for a in args)
    if cross_k[0].size(0) == 1:
        rows = torch.cat([rows, rows + self_k[0].size(0)], dim=1)
        tokens, mask = torch.cat([tokens, tokens]), torch.cat([mask, mask])
        self_k, self_v, cross_k, cross_v = ([torch.cat([t, t]) for t in group]
                                            for group in (self_k, self_v, cross_k, cross_v))
    if self_k[0].size(0) == tokens.size(0):
        self_k, self_v = ([torch.cat([b, b[:1]]) for b in bufs] for bufs in (self_k, self_v))
    return tokens, pos, rows, self_k, self_v, cross_k, cross_v, mask
