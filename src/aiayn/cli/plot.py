"""`aiayn plot`: training curves and attention heatmaps as PNG files."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from aiayn import fileio
from aiayn.cli import options
from aiayn.errors import AiaynError


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or int(m.group(1)) < 50 or int(m.group(2)) < 50:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels (each >= 50), e.g. 1200x800; got {text!r}")
    return int(m.group(1)), int(m.group(2))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot training curves or attention heads to PNG",
                       description="Static plots with matplotlib (no display needed).")
    kinds = p.add_subparsers(dest="plot_kind", metavar="KIND")
    kinds.required = True

    c = kinds.add_parser("curves", help="loss, validation loss/BLEU/perplexity and learning rate against steps",
                         description="Read RUN_DIR/metrics.jsonl (several runs overlay) and draw one panel per "
                                     "quantity present.")
    c.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directory (or a metrics.jsonl file)")
    c.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png of the first run)")
    c.add_argument("--size", type=_size, default=(1200, 800), help="WIDTHxHEIGHT in pixels (default 1200x800)")
    c.add_argument("--title", default=None)
    c.set_defaults(func=run_curves)

    a = kinds.add_parser("attention", help="cross-attention heads of one decoder layer for one sentence",
                         description="Translate --text and draw a grid with one heatmap per head of the chosen "
                                     "decoder layer (rows: target tokens, columns: source tokens).")
    options.add_checkpoint(a, several=False)
    a.add_argument("--text", required=True, help="the source sentence")
    a.add_argument("--layer", type=int, default=-1,
                   help="decoder layer, 1..N, or -1 for the last (default); 0 draws every layer, one file each")
    a.add_argument("--average", action="store_true", help="one heatmap averaged over the heads instead of a grid")
    a.add_argument("--out", default="attention.png",
                   help="PNG path (default attention.png; with --layer 0, _layerN is added before .png)")
    a.add_argument("--size", type=_size, default=None, help="WIDTHxHEIGHT in pixels (default: from the lengths)")
    options.add_decode_flags(a, ("beam",), title=None, notes={"beam": "default: the checkpoint's"})
    options.add_device_flags(a)
    a.set_defaults(func=run_attention)


def run_curves(args: argparse.Namespace) -> int:
    from aiayn.viz.curves import METRICS_FILE, plot_curves

    first = Path(args.runs[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "curves.png"
    if out.suffix.lower() != ".png":
        raise AiaynError(f"--out {out}: the output is a PNG file; use a .png name")
    # What is read is each run's metrics file: the default --out lies in the first run's directory.
    fileio.check_not_input(out, [Path(r) / METRICS_FILE if Path(r).is_dir() else r for r in args.runs], "--out")
    plot_curves(args.runs, out, size=args.size, title=args.title)
    print(f"wrote {out} (from {', '.join(str(Path(r) / METRICS_FILE if Path(r).is_dir() else r) for r in args.runs)})")
    return 0


def run_attention(args: argparse.Namespace) -> int:
    from aiayn.inference.translator import Translator
    from aiayn.viz.attention import as_array, plot_attention, plot_heads

    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise AiaynError(f"--out {out}: the output is a PNG file; use a .png name")
    if not args.text.strip():
        raise AiaynError("--text: empty sentence")
    fileio.check_not_input(out, [args.checkpoint], "--out")  # --layer 0's files are beside it
    device = options.device(args)
    dtype = options.dtype(args, device)
    translator = Translator.from_checkpoint(args.checkpoint, device=device, dtype=dtype)
    options.say_dtype(dtype)
    overrides = options.decode_overrides(args)
    result = translator.translate_detailed([args.text], nbest=1, attention=True, **overrides)[0]
    hyp = result.hypotheses[0]
    if hyp.attention is None:
        raise AiaynError("the translator returned no attention for this checkpoint")
    attn = as_array(hyp.attention)  # (L, H, T, S)
    n_layers = attn.shape[0]
    if args.layer == 0:
        layers = list(range(n_layers))
    elif args.layer == -1:
        layers = [n_layers - 1]
    elif 1 <= args.layer <= n_layers:
        layers = [args.layer - 1]
    else:
        raise AiaynError(f"--layer: {args.layer} is out of range; the decoder has {n_layers} layers (1..{n_layers})")
    print(f"translation: {hyp.text}")
    for layer in layers:
        path = out if len(layers) == 1 else out.with_name(f"{out.stem}_layer{layer + 1}{out.suffix}")
        if args.average:
            plot_attention(attn[layer].mean(axis=0), hyp.src_pieces, hyp.tgt_pieces, path, size=args.size,
                           title=f"decoder layer {layer + 1}: cross-attention, average over heads")
        else:
            plot_heads(attn[layer], hyp.src_pieces, hyp.tgt_pieces, path, layer=layer, size=args.size)
        print(f"wrote {path}")
    return 0
