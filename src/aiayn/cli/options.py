"""Command-line options shared by the subcommands, each declared once.

The decoding flags are generated from :class:`~aiayn.config.DecodeConfig`: one flag per
field (``--max-len-a`` for ``max_len_a``), typed as the field, with the help text of its
:class:`~aiayn.config.DecodeOption`. A decoding flag left out is None, which keeps the
checkpoint's value; :func:`decode_overrides` collects the ones given.
"""

from __future__ import annotations

import argparse
import sys
import typing
from typing import TYPE_CHECKING, Any

from aiayn.config import DecodeConfig, check_decode_bounds, decode_options
from aiayn.runtime.devices import resolve_device
from aiayn.runtime.precision import DTYPE_ENV, INFERENCE_PRECISIONS, DtypeChoice, resolve_inference_dtype

if TYPE_CHECKING:  # torch is imported lazily: `aiayn --help` should not load it
    import torch

# argparse.ArgumentParser, or a group of one.
Container = argparse._ActionsContainer

DECODE_TITLE = ("decoding (default: the checkpoint's decode section; paper: beam 4, lenpen 0.6, "
                "max length = 1 * source + 50)")
CHECKPOINT_HELP = "checkpoint directory, run directory (its last checkpoint) or last/best pointer"
DEVICE_HELP = "cpu | cuda | cuda:N | auto (default cpu)"
DTYPE_HELP = ("auto (default: the fastest precision of this device that keeps fp32's quality: on a CPU int8 "
              "with VNNI or AMX, else bf16 with AVX-512 BF16, else int8 with AVX2 (fbgemm), else fp32; on a GPU bf16 "
              f"from compute capability 8.0, else fp16; printed on stderr; ${DTYPE_ENV} pins it), fp32, bf16 (CPU "
              "or GPU), fp16 (GPU only) or int8 (CPU only: int8 weights and per-token int8 inputs for every linear "
              "layer); a precision that is slow on this device says so on stderr")

# The namespace attribute listing the decoding flags a subcommand has (see decode_overrides).
_DECODE_FLAGS = "decode_flags"


def add_decode_flags(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None, *,
                     title: str | None = DECODE_TITLE, notes: dict[str, str] | None = None) -> Container:
    """One flag per :class:`DecodeConfig` field that has one (``names``: only these), in
    declaration order, in a group titled ``title`` (None: on ``parser`` itself).

    ``notes``: per field, a parenthesis appended to the help text, for a subcommand whose
    defaults are not the checkpoint's (e.g. ``{"beam": "default 21"}``).
    """
    hints = typing.get_type_hints(DecodeConfig)
    target: Container = parser.add_argument_group(title) if title else parser
    added = []
    for f, opt in decode_options():
        if not opt.cli or (names is not None and f.name not in names):
            continue
        note = (notes or {}).get(f.name)
        kwargs: dict[str, Any] = {"dest": f.name, "help": f"{opt.help} ({note})" if note else opt.help,
                                  "default": f.default if opt.argument else None}
        if hints[f.name] is bool:
            kwargs["action"] = "store_true"  # default None: not given keeps the checkpoint's value
        else:
            kwargs.update(type=hints[f.name], choices=opt.choices)
        target.add_argument(opt.flag or "--" + f.name.replace("_", "-"), **kwargs)
        added.append(f.name)
    parser.set_defaults(**{_DECODE_FLAGS: tuple(added)})
    return target


def decode_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding flags given on the command line, as :meth:`DecodeConfig.with_overrides`
    takes them. Per-call arguments (``--nbest``) are left out: they are passed on their own.
    Every flag given is held to the bounds of the server's requests (one set of limits)."""
    argument = {f.name for f, opt in decode_options() if opt.argument}
    names = getattr(args, _DECODE_FLAGS, ())
    check_decode_bounds({n: getattr(args, n) for n in names})
    return {n: getattr(args, n) for n in names if n not in argument and getattr(args, n) is not None}


def add_checkpoint(container: Container, *, several: bool = True, required: bool = True,
                   purpose: str | None = None) -> None:
    """``--checkpoint PATH`` (``several``: one or more, their weights averaged, or with
    ``--ensemble`` their models ensembled; pass ``args.ensemble`` on to ``from_checkpoint``)."""
    text = f"{purpose}: {CHECKPOINT_HELP}" if purpose else CHECKPOINT_HELP
    if several:
        text += "; several paths: their weights are averaged (see --ensemble)"
    container.add_argument("--checkpoint", required=required, nargs="+" if several else None, metavar="PATH",
                           help=text)
    if several:
        container.add_argument("--ensemble", action="store_true",
                               help="decode with the ensemble of the --checkpoint models (the mean of their "
                                    "probabilities at each step; they must share one tokenizer) instead of "
                                    "averaging their weights: for models trained apart, e.g. other seeds")


def add_ctranslate2(container: Container) -> None:
    """``--ctranslate2 DIR``: a CTranslate2 export instead of a checkpoint."""
    container.add_argument("--ctranslate2", metavar="DIR",
                           help="a model exported with 'aiayn export ctranslate2' (needs the 'interop' extra)")


def add_device_flags(container: Container) -> None:
    """``--device`` (resolve it with :func:`device`), the inference ``--dtype`` and ``--threads``."""
    container.add_argument("--device", default="cpu", help=DEVICE_HELP)
    container.add_argument("--dtype", default="auto", choices=("auto", *INFERENCE_PRECISIONS), help=DTYPE_HELP)
    add_threads(container)


COMPILE_CHOICES = ("auto", "on", "off")


def add_compile(container: Container, auto: str) -> None:
    """``--compile [auto|on|off]``: decoding steps compiled ahead of time
    (aiayn.inference.compiled); ``--compile`` alone is ``on``. ``auto``: what auto does here."""
    container.add_argument("--compile", nargs="?", const="on", default="auto", choices=COMPILE_CHOICES,
                           help="compile the decoding step (on a CPU ahead of time: torch.export + AOTInductor, "
                                "tens of seconds of compiling first, faster steps after, the compiled step kept in "
                                "the compile cache ($AIAYN_CACHE_DIR/inductor) so that a later run of the same model "
                                "loads it in seconds; on a GPU: CUDA graphs, one per batch bucket and beam, recorded "
                                f"when first needed); on (--compile alone), off, or auto (default): {auto}")


def add_threads(container: Container) -> None:
    """``--threads N``; the `aiayn` command applies it (:func:`aiayn.runtime.process.set_threads`)
    before the subcommand runs, so every compute command honours it the same way."""
    container.add_argument("--threads", type=int, default=None, metavar="N",
                           help="CPU threads for torch (default: $AIAYN_NUM_THREADS, else one per core)")


def add_workers(container: Container) -> None:
    """``--workers auto|N``: decoding worker processes (:func:`aiayn.runtime.process.decode_workers`)."""
    container.add_argument("--workers", default="auto", metavar="N",
                           help="processes that decode batches side by side, sharing --threads (default auto: "
                                "one worker per thread, at most 8, on a CPU for a file of 64+ lines per "
                                "worker decoded eagerly; 1 decodes in this process, as a GPU, a stream or a "
                                "compiled step always does)")


def add_on_invalid_utf8(container: Container) -> None:
    container.add_argument("--on-invalid-utf8", choices=("error", "replace"), default="error",
                           help="invalid UTF-8 input: an error naming the line (default), or replace with U+FFFD")


def device(args: argparse.Namespace) -> torch.device:
    """The parsed ``--device``, resolved (``auto``: CUDA when there is a GPU); a device that
    does not exist here is a :class:`~aiayn.errors.ConfigError` naming ``--device``."""
    return resolve_device(args.device, field="--device")


def dtype(args: argparse.Namespace, device: torch.device | str) -> DtypeChoice:
    """The parsed ``--dtype``, resolved for ``device`` (:func:`aiayn.runtime.precision.resolve_inference_dtype`)
    before the model loads: pass ``.dtype`` on, and :func:`say_dtype` once the checks are done."""
    return resolve_inference_dtype(args.dtype, device)


def say_dtype(choice: DtypeChoice, quiet: bool = False) -> None:
    """For ``auto``: what it chose and why; for a precision given that is slow on this device:
    that it is; one line on stderr (unless ``quiet``). Said when the work starts, after every
    check, so that an error stays the only line."""
    if (choice.auto or choice.caveat) and not quiet:
        print(choice.describe(), file=sys.stderr)
