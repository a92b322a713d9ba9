"""The compile cache folder: where inductor's caches and the compiled decoding steps are kept
between runs."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "AIAYN_CACHE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_dir() -> Path:
    """Where compiled artifacts are kept between runs: ``$TORCHINDUCTOR_CACHE_DIR`` if set,
    else ``inductor/torch-<version>`` under ``$AIAYN_CACHE_DIR`` (default ~/.cache/aiayn).
    It holds inductor's own caches (C++ kernels; FX graphs, keyed by the graph, the torch
    version and the CPU's instruction set) and, under ``aoti/``, the compiled decoding steps
    (:mod:`aiayn.inference.step_packages`); the folder per torch version lets an upgrade
    leave the old entries behind as a whole."""
    import torch

    given = os.environ.get(INDUCTOR_CACHE_ENV)
    if given and given != _inductor_default_cache_dir():  # inductor writes its default there too
        return Path(given)
    root = os.environ.get(CACHE_ENV)
    base = Path(root) if root else Path.home() / ".cache" / "aiayn"
    return base / "inductor" / f"torch-{torch.__version__.replace('+', '-')}"


def _inductor_default_cache_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch layout: take the variable as given
        return None
    return os.path.abspath(default_cache_dir())


def use_compile_cache() -> Path:
    """Point inductor's caches at :func:`compile_cache_dir` (it reads the variable when it
    compiles) and turn its FX graph cache on, so that a process compiling a graph some
    earlier run compiled loads it instead; returns the folder. Call before compiling."""
    import torch._inductor.config as inductor_config

    folder = compile_cache_dir()
    os.environ[INDUCTOR_CACHE_ENV] = str(folder)
    inductor_config.fx_graph_cache = True
    return folder
