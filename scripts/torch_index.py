#!/usr/bin/env python3
"""Which package index `make` installs torch from, and whether the installed torch can use
this machine's NVIDIA GPU.

    python scripts/torch_index.py --torch torch==2.13.0   # prints the index URL ("" = PyPI)
    python scripts/torch_index.py --check                  # exit 1 with one line if a GPU is
                                                           # here and torch cannot use it

The index: $TORCH_INDEX when set (an explicit choice always wins); else, where `nvidia-smi`
works, the newest CUDA build of torch that the driver's CUDA version runs (``cu130`` for a
driver of CUDA 13.0 or later, ``cu126`` for 12.6 to 12.9); else none (PyPI's default
wheel). A driver older than every CUDA build exits 2 with one line saying what to do.

tests/conftest.py uses :func:`unusable_gpu` so that under CI=true a GPU that torch cannot use
(a CPU-only build, or a driver older than torch's CUDA) fails the CUDA tests instead of
skipping them as "platform: no CUDA device".
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

DOWNLOADS = "https://download.pytorch.org/whl/"
# The stable CUDA builds of the torch pin (Makefile's TORCH), newest first, as (major, minor)
# of CUDA -> the index's name: for torch 2.13, CUDA 13.0 and 12.6 (PyTorch's RELEASE.md; 12.8
# was dropped in 2.12, 13.2 is experimental). A driver runs a build of its CUDA version or older.
CUDA_BUILDS: tuple[tuple[tuple[int, int], str], ...] = (((13, 0), "cu130"), ((12, 6), "cu126"))
CPU_INDEX = DOWNLOADS + "cpu"


def driver_cuda() -> tuple[int, int] | None:
    """The CUDA version the NVIDIA driver supports, from `nvidia-smi`'s header; None where
    `nvidia-smi` is missing, fails or lists no GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out.stdout)
    if out.returncode != 0 or found is None:
        return None
    return int(found.group(1)), int(found.group(2))


def index_for(cuda: tuple[int, int] | None, torch_pin: str) -> str:
    """The index URL for a driver of this CUDA version (None: no GPU, PyPI's default, "");
    ValueError with what to do when the driver is older than every CUDA build."""
    if cuda is None:
        return ""
    for version, name in CUDA_BUILDS:
        if cuda >= version:
            return DOWNLOADS + name
    oldest = ".".join(map(str, CUDA_BUILDS[-1][0]))
    raise ValueError(f"the NVIDIA driver supports CUDA {cuda[0]}.{cuda[1]}, older than the oldest CUDA build of "
                     f"{torch_pin} ({oldest}): update the driver, or choose a build with "
                     f"TORCH_INDEX=URL (TORCH_INDEX={CPU_INDEX} for the CPU one)")


def unusable_gpu() -> str | None:
    """Where `nvidia-smi` sees a GPU that the installed torch cannot use: why, and how to
    install the build that can (one line); None where there is no GPU or torch uses it."""
    cuda = driver_cuda()
    if cuda is None:
        return None
    import torch

    if torch.cuda.is_available():
        return None
    driver = f"an NVIDIA GPU is here (driver CUDA {cuda[0]}.{cuda[1]})"
    if torch.version.cuda is None:
        return (f"{driver} but torch {torch.__version__} is a CPU-only build: `make clean test` "
                "installs the CUDA build (scripts/torch_index.py)")
    return (f"{driver} but torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use it "
            "(torch.cuda.is_available() is False): a driver older than that CUDA? `make clean test` "
            "installs the build the driver runs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", default="torch", help="the pinned requirement, for messages")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 with one line where a GPU is here and the installed torch cannot use it")
    args = parser.parse_args(argv)
    if args.check:
        problem = unusable_gpu()
        if problem:
            print(f"torch_index: {problem}", file=sys.stderr)
            return 1
        return 0
    explicit = os.environ.get("TORCH_INDEX", "").strip()
    if explicit:
        print(explicit)
        return 0
    try:
        print(index_for(driver_cuda(), args.torch))
    except ValueError as exc:
        print(f"torch_index: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
