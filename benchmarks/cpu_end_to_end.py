"""End to end on this CPU: the `aiayn` command with its defaults against CTranslate2, each in a
fresh process, from the command to its last output line.

For each line count N (``--lines``; the input cycled to N lines):

- ``aiayn translate --checkpoint CK -i FILE -o OUT`` and nothing else (``--dtype auto``,
  ``--compile auto``), run twice: first with an empty compile cache, then again with the
  cache the first run left (``$AIAYN_CACHE_DIR``, one fresh folder per timed pair). Seconds
  run to the process's exit; the first output line is noticed when ``OUT.partial`` first
  grows (the command writes it a chunk of 10,000 lines at a time, so below that it is the
  whole output), the last when ``OUT`` is renamed into place. A third run starts from a
  cache where one earlier ``aiayn translate --compile on`` (untimed, on the first lines of
  the input) built the model's compiled decoding step: what every run after a compiling one
  (a server's start, a large file) finds; with ``--quick`` it passes ``--compile on`` (a tiny
  model never wins the warm-up back under auto), so that the smoke check runs the compiled
  step. Each aiayn row says whether a compiled step ran in its runs (the translator rewrote
  its marker in the compile cache), how many decoding worker processes ``--workers auto``
  started (1: none) and the SHA-256 of its output.
- CTranslate2 on the same weights (``aiayn export ctranslate2``, float32), in a fresh Python
  process that imports ctranslate2 and sentencepiece, reads the file, encodes it with the
  export's SentencePiece model, runs ``Translator.translate_batch``, decodes and writes:
  once with CTranslate2's default compute type, once with ``int8``. Beam, length penalty,
  minimum length and the per-sentence bound a * |x| + b of the checkpoint's decode section
  (sentences of one bound share the calls), batches of ``decode.batch_tokens`` tokens; the
  JSON lists where CTranslate2 cannot do what aiayn does.

Both use the same threads (``--threads``, default $AIAYN_NUM_THREADS, else 2: aiayn's
``AIAYN_NUM_THREADS``, CTranslate2's ``intra_threads``). Figures: median seconds of
``--runs`` runs, lines/s, and each aiayn run's seconds over CTranslate2 int8's.

``--serve``: ``aiayn serve --checkpoint CK`` (default options; the model's compiled step on
disk, as the third file run has it) and ``aiayn serve --ctranslate2 EXPORT --compute-type
int8`` in turn on loopback: seconds to the first
answer of ``/health``, p50 latency of one-sentence requests sent one after the other, and
requests/s of 16 concurrent clients (benchmarks/serve_load.py's client).

``--startup``: where a one-line ``aiayn translate`` spends its time: the interpreter,
importing the command, torch and the inference modules, the checkpoint's checks and load,
the inference copy (quantized or cast), the first decode; against the command's wall time.
``python -X importtime`` names the slowest imports.

Without ``--checkpoint``: the random Transformer base of cpu_decode.py (its word-level
32,000 vocabulary reads Multi30k as unknown words and a random model rarely ends a
sentence, so every output runs to its bound, the same work on both sides); ``--quick``: a
tiny random model and its own sentences, small N, one run (a smoke check, no figures).
Without ``--input``: Multi30k's test_2016_flickr English source from the data mirror
($AIAYN_DATA_MIRROR) or the download cache.

    python benchmarks/cpu_end_to_end.py [--checkpoint CK] [--input FILE] [--lines 10,1000,3000]
        [--runs 3] [--serve] [--startup] [--workdir DIR] [--json [FILE]] [--quick]

``--json`` alone writes benchmarks/results/end_to_end.json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

QUICK_LINES = "10,40"
QUICK_SERVE = (10, 40)  # sequential requests, requests under load
SERVE_SEQUENTIAL, SERVE_LOAD, SERVE_CLIENTS = 100, 400, 16
POLL_S = 0.01
COMPILE_SAMPLE_LINES = 200  # the untimed `--compile on` run that builds the compiled step
BUILT_VARIANT = "the model's compiled step on disk"
# What a user's environment could set that would change the command's defaults.
PINNING_ENV = ("AIAYN_DTYPE", "TORCHINDUCTOR_CACHE_DIR")

# CTranslate2 end to end, in a fresh interpreter: argv[1] is a JSON of the settings; prints
# a JSON line of the seconds it spent in each part.
CT2_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import ctranslate2, sentencepiece
s = json.loads(sys.argv[1])
t1 = time.perf_counter()
tr = ctranslate2.Translator(s["model"], device="cpu", compute_type=s["compute_type"], inter_threads=1,
                            intra_threads=s["threads"])
sp_src = sentencepiece.SentencePieceProcessor(model_file=s["model"] + "/source.spm")
sp_tgt = sentencepiece.SentencePieceProcessor(model_file=s["model"] + "/target.spm")
t2 = time.perf_counter()
with open(s["input"], encoding="utf-8") as f:
    lines = f.read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
pieces = {i: sp_src.encode(t, out_type=str) + ["</s>"] for i, t in enumerate(lines) if t.strip()}
groups = {}
for i, p in pieces.items():  # aiayn's bound a * |x| + b is per sentence; CTranslate2's per call
    bound = min(int(s["max_len_a"] * len(p) + s["max_len_b"]), s["max_steps"])
    groups.setdefault(bound, []).append(i)
out = [""] * len(lines)
for bound, rows in groups.items():
    res = tr.translate_batch([pieces[i] for i in rows], beam_size=s["beam"], length_penalty=s["lenpen"],
                             min_decoding_length=s["min_len"], max_decoding_length=max(bound, 1),
                             max_batch_size=s["batch_tokens"], batch_type="tokens", max_input_length=0)
    for i, r in zip(rows, res):
        out[i] = sp_tgt.decode(r.hypotheses[0]).replace("\n", " ")
with open(s["output"], "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in out))
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "translate_s": t3 - t2,
                  "compute_type": tr.compute_type if hasattr(tr, "compute_type") else s["compute_type"]}))
"""

# The stages of a one-line `aiayn translate`, timed inside one fresh process in the order
# the command runs them (aiayn.cli.translate); argv: checkpoint, input file, threads.
STARTUP_PROBE = r"""
import json, sys, time
t = [time.perf_counter()]
from aiayn.cli.main import build_parser
args = build_parser().parse_args(["translate", "--checkpoint", sys.argv[1], "-i", sys.argv[2]])
t.append(time.perf_counter())
from aiayn.runtime.process import set_threads
set_threads(int(sys.argv[3]))  # imports torch, as the command does before the subcommand runs
t.append(time.perf_counter())
from aiayn.checkpoint.directory import load_checkpoint, resolve_checkpoint, verify_checkpoint
from aiayn.inference.translator import Translator
from aiayn.runtime.precision import resolve_inference_dtype
t.append(time.perf_counter())
ckpt = resolve_checkpoint(sys.argv[1])
verify_checkpoint(ckpt)
t.append(time.perf_counter())
loaded = load_checkpoint(ckpt, verify=False)
t.append(time.perf_counter())
dtype = resolve_inference_dtype("auto", "cpu").dtype
tr = Translator(loaded.model, loaded.tokenizer, loaded.config, dtype=dtype)
t.append(time.perf_counter())
line = open(sys.argv[2], encoding="utf-8").read().splitlines()[0]
tr.translate([line])
t.append(time.perf_counter())
tr.translate([line])
t.append(time.perf_counter())
names = ["import aiayn.cli + parse", "import torch", "import the inference modules", "checkpoint checksums",
         "checkpoint load (model, weights, tokenizer)", "inference copy (" + dtype + ")", "first decode",
         "second decode (same line)"]
print(json.dumps({"dtype": dtype, "stages": dict(zip(names, (b - a for a, b in zip(t, t[1:]))))}))
"""


# --------------------------------------------------------------------------- setup


def python() -> str:
    return sys.executable


def machine_info(threads: int) -> dict[str, Any]:
    """CPU model, the flags that decide the int8 and bf16 paths, versions."""
    import torch

    from aiayn.runtime.cpu import cpu_flags, cpu_kind

    cpu = ""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import ctranslate2
        ct2_version: str | None = ctranslate2.__version__
    except ImportError:
        ct2_version = None
    flags = sorted(f for f in cpu_flags() if f.startswith("amx") or f in ("avx512_bf16", "avx512_vnni", "avx_vnni"))
    return {"label": W.machine().replace(f"{W.THREADS} threads", f"{threads} threads"), "cpu": cpu,
            "kind": cpu_kind(),
            "cores": os.cpu_count(), "threads": threads, "flags": flags, "torch": torch.__version__,
            "ctranslate2": ct2_version, "python": sys.version.split()[0]}


def command_env(threads: int, cache_dir: Path | None = None) -> dict[str, str]:
    """The environment of a measured process: the thread count, nothing that pins a default,
    and (aiayn) its own compile cache folder."""
    env = {k: v for k, v in os.environ.items() if k not in PINNING_ENV}
    env["AIAYN_NUM_THREADS"] = str(threads)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    if cache_dir is not None:
        env["AIAYN_CACHE_DIR"] = str(cache_dir)
    return env


def build_checkpoint(root: Path, quick: bool) -> tuple[Path, Path | None]:
    """The default model: (checkpoint, its sentences or None)."""
    if quick:
        import serve_load

        tiny = root / "tiny"
        if not (tiny / "checkpoint").is_dir():
            serve_load.make_tiny_checkpoint(tiny)
        return tiny / "checkpoint", tiny / "sentences.txt"
    import cpu_decode

    cpu_decode.build_models(root)
    return root / "aiayn", None


def checkpoint_key(checkpoint: Path) -> str:
    from aiayn.checkpoint.directory import resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    return hashlib.sha256((ckpt / "checksums.sha256").read_bytes()).hexdigest()[:16]


def export_ct2(checkpoint: Path, root: Path, threads: int) -> Path:
    """`aiayn export ctranslate2` (float32) of the checkpoint, kept in ``root`` by its checksums."""
    out = root / f"ct2-{checkpoint_key(checkpoint)}"
    if (out / "model.bin").is_file():
        return out
    proc = subprocess.run([python(), "-m", "aiayn", "export", "ctranslate2", str(checkpoint), str(out), "--force"],
                          env=command_env(threads), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"aiayn export ctranslate2 failed:\n{proc.stderr[-3000:]}")
    return out


def source_lines(args: argparse.Namespace, sentences: Path | None) -> tuple[list[str], str]:
    """The lines to cycle and where they come from."""
    if args.input:
        path = Path(args.input)
    elif sentences is not None:
        path = sentences
    else:
        import cpu_latency

        path = cpu_latency.multi30k_test_dir() / "test_2016_flickr.en.gz"
    from aiayn.data.corpus import read_lines

    lines = [s for s in read_lines(path) if s.strip()]
    if not lines:
        raise SystemExit(f"{path}: no non-empty line")
    return lines, portable(path)


def portable(path: str | Path) -> str:
    """``path`` as the report records it, free of this machine's folders: under the data
    mirror ``$AIAYN_DATA_MIRROR/...``, under the working directory relative to it, else its
    last two parts (``.../member1/averaged``)."""
    path = Path(path).absolute()
    mirror = os.environ.get("AIAYN_DATA_MIRROR")
    for root, label in ((mirror, "$AIAYN_DATA_MIRROR"), (os.getcwd(), "")):
        if root and path.is_relative_to(Path(root).absolute()):
            rel = path.relative_to(Path(root).absolute()).as_posix()
            return f"{label}/{rel}" if label else rel
    return ".../" + "/".join(path.parts[-2:])


def write_input(lines: list[str], n: int, path: Path) -> Path:
    path.write_text("".join(s + "\n" for s in itertools.islice(itertools.cycle(lines), n)), encoding="utf-8")
    return path


def decode_settings(checkpoint: Path) -> dict[str, Any]:
    from aiayn.checkpoint.directory import load_checkpoint_config, resolve_checkpoint

    cfg = load_checkpoint_config(resolve_checkpoint(checkpoint))
    d = cfg.decode
    return {"beam": d.beam, "lenpen": d.lenpen, "lenpen_style": d.lenpen_style, "max_len_a": d.max_len_a,
            "max_len_b": d.max_len_b, "min_len": d.min_len, "batch_tokens": d.batch_tokens,
            "no_repeat_ngram_size": d.no_repeat_ngram_size, "max_positions": cfg.model.max_positions,
            "tgt_lang_tag": cfg.data.tgt_lang_tag}


def ct2_differences(dec: dict[str, Any]) -> list[str]:
    out = ["aiayn forces EOS after a * |x| + b tokens; CTranslate2 stops there (max_decoding_length)",
           "aiayn sorts and batches sentences within each chunk of 10,000 lines; CTranslate2 gets the sentences "
           "of one bound per call and sorts them itself"]
    if dec["lenpen_style"] == "gnmt" and dec["lenpen"]:
        out.append("length penalty: aiayn ((5+|Y|)/6)^alpha (gnmt); CTranslate2 |Y|^alpha, same alpha")
    if dec["no_repeat_ngram_size"]:
        out.append("no_repeat_ngram_size not passed to CTranslate2")
    if dec["tgt_lang_tag"]:
        out.append("the target-language tag is not added on the CTranslate2 side")
    return out


# ----------------------------------------------------------------------- measuring


def _wait(proc: subprocess.Popen, partial: Path, done: Path, start: float) -> tuple[float, float | None, float | None]:
    """Seconds from ``start`` to the process's exit, to ``partial`` first having bytes, and to
    ``done`` existing (the output renamed into place: every line written)."""
    first = last = None
    while proc.poll() is None:
        now = time.perf_counter() - start
        if first is None:
            with contextlib.suppress(OSError):
                if partial.stat().st_size > 0:
                    first = now
        if last is None and done.exists():
            last = now
        time.sleep(POLL_S)
    return time.perf_counter() - start, first, last


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


# What `aiayn translate` says where compiling was asked for but the eager steps decode: the
# compiled step failed to build, or int8 steps on a CPU without VNNI or AMX.
EAGER_FALLBACKS = ("compiled decoding is unavailable", "decoding with the eager steps")


def compiled_ran(stderr: str, compile_on: bool) -> bool:
    """Whether a run decoded with the compiled step, from what `aiayn translate` said: compiling
    chosen (``--compile on``, or auto's "compile auto -> on") and no fallback to eager steps."""
    chosen = compile_on or "compile auto -> on" in stderr
    return chosen and not any(fallback in stderr for fallback in EAGER_FALLBACKS)


def run_aiayn(checkpoint: Path, src: Path, out: Path, threads: int, cache: Path,
              compile_on: bool = False) -> dict[str, Any]:
    """One `aiayn translate` with no option but its input and output (and ``--compile on``
    with ``compile_on``)."""
    for p in (out, out.with_name(out.name + ".partial")):
        p.unlink(missing_ok=True)
    log = out.with_name(out.name + ".log")
    extra = ["--compile", "on"] if compile_on else []
    with open(log, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([python(), "-m", "aiayn", "translate", "--checkpoint", str(checkpoint), "-i", str(src),
                                 "-o", str(out), *extra], stdout=subprocess.DEVNULL, stderr=err,
                                env=command_env(threads, cache))
        seconds, first, last = _wait(proc, out.with_name(out.name + ".partial"), out, start)
    text = log.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"aiayn translate failed ({proc.returncode}):\n{text[-3000:]}")
    dtype = re.search(r"dtype auto -> (\S+)", text)
    workers = re.search(r"workers auto -> (\d+) processes", text)
    done = re.search(r"translated (\d+) lines in ([\d.]+)s", text)
    last = last if last is not None else seconds
    return {"seconds": seconds, "first_output_s": first if first is not None else last, "last_output_s": last,
            "dtype": dtype.group(1) if dtype else None, "compiled": compiled_ran(text, compile_on),
            "workers": int(workers.group(1)) if workers else 1,
            "compile": "on" if compile_on else "auto", "translate_s": float(done.group(2)) if done else None,
            "output_lines": count_lines(out), "output_sha256": hashlib.sha256(out.read_bytes()).hexdigest()}


def build_compiled_step(checkpoint: Path, sample: Path, work: Path, threads: int, cache: Path) -> None:
    """One untimed `aiayn translate --compile on` over ``sample``: the model's compiled
    decoding step into ``cache``."""
    proc = subprocess.run([python(), "-m", "aiayn", "translate", "--checkpoint", str(checkpoint), "-i", str(sample),
                           "-o", str(work / "compile-sample.out"), "--compile", "on"], capture_output=True, text=True,
                          env=command_env(threads, cache))
    if proc.returncode != 0:
        raise SystemExit(f"aiayn translate --compile on failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def run_ct2(model: Path, src: Path, out: Path, threads: int, compute_type: str, dec: dict[str, Any]) -> dict[str, Any]:
    out.unlink(missing_ok=True)
    settings = {"model": str(model), "compute_type": compute_type, "threads": threads, "input": str(src),
                "output": str(out), "beam": dec["beam"], "lenpen": dec["lenpen"], "min_len": dec["min_len"],
                "max_len_a": dec["max_len_a"], "max_len_b": dec["max_len_b"], "batch_tokens": dec["batch_tokens"],
                # aiayn's search keeps one of the model's positions for EOS
                "max_steps": (dec["max_positions"] or 10**9) - 1}
    start = time.perf_counter()
    proc = subprocess.run([python(), "-c", CT2_SCRIPT, json.dumps(settings)], capture_output=True, text=True,
                          env=command_env(threads))
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"CTranslate2 ({compute_type}) failed:\n{proc.stderr[-3000:]}")
    parts = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"seconds": seconds, **parts, "output_lines": count_lines(out),
            "output_sha256": hashlib.sha256(out.read_bytes()).hexdigest()}


def _row(system: str, variant: str, n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [r["seconds"] for r in runs]
    med = statistics.median(seconds)
    row: dict[str, Any] = {"lines": n, "system": system, "variant": variant, "seconds": seconds,
                           "median_s": med, "lines_per_s": n / med, "output_lines": runs[-1]["output_lines"]}
    for key in ("first_output_s", "last_output_s", "translate_s", "import_s", "load_s"):
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            row[f"median_{key}"] = statistics.median(values)
    for key in ("dtype", "compile", "workers", "compute_type", "output_sha256"):
        if key in runs[-1]:
            row[key] = runs[-1][key]
    if "compiled" in runs[-1]:
        row["compiled"] = all(r["compiled"] for r in runs)
    return row


def measure_files(args: argparse.Namespace, checkpoint: Path, ct2: Path | None, lines: list[str], work: Path,
                  dec: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    rows, ratios = [], []
    built = work / "cache-built"  # the compiled step of the model, built once
    shutil.rmtree(built, ignore_errors=True)
    build_compiled_step(checkpoint, write_input(lines, COMPILE_SAMPLE_LINES, work / "input-sample.txt"), work,
                        args.threads, built)
    for n in args.line_counts:
        src = write_input(lines, n, work / f"input-{n}.txt")
        got: dict[str, list[dict[str, Any]]] = {}
        for k in range(args.runs):  # the systems alternate: a slow spell of the machine hits all of them
            cache = work / f"cache-{n}-{k}"
            shutil.rmtree(cache, ignore_errors=True)
            got.setdefault("first", []).append(run_aiayn(checkpoint, src, work / "out-aiayn.txt", args.threads, cache))
            got.setdefault("second", []).append(run_aiayn(checkpoint, src, work / "out-aiayn.txt", args.threads,
                                                          cache))
            shutil.rmtree(cache, ignore_errors=True)
            got.setdefault("built", []).append(run_aiayn(checkpoint, src, work / "out-aiayn.txt", args.threads, built,
                                                         compile_on=args.quick))
            if ct2 is not None:
                for ct in ("default", "int8"):
                    got.setdefault(ct, []).append(run_ct2(ct2, src, work / "out-ct2.txt", args.threads, ct, dec))
            print(f"  {n} lines, run {k + 1}: " + ", ".join(f"{v} {r[-1]['seconds']:.1f} s" for v, r in got.items()),
                  file=sys.stderr)
        first = _row("aiayn", "first run (empty compile cache)", n, got["first"])
        second = _row("aiayn", "second run (the first run's compile cache)", n, got["second"])
        warm = _row("aiayn", BUILT_VARIANT, n, got["built"])
        rows += [first, second, warm]
        ratio: dict[str, Any] = {"lines": n}
        if ct2 is not None:
            default = _row("ctranslate2", "default", n, got["default"])
            int8 = _row("ctranslate2", "int8", n, got["int8"])
            rows += [default, int8]
            ratio["aiayn_first_over_ct2_int8"] = first["median_s"] / int8["median_s"]
            ratio["aiayn_second_over_ct2_int8"] = second["median_s"] / int8["median_s"]
            ratio["aiayn_built_over_ct2_int8"] = warm["median_s"] / int8["median_s"]
        if first.get("compiled"):
            ratio["compile_cache_saved_s"] = first["median_s"] - second["median_s"]
        ratios.append(ratio)
    return rows, ratios


# --------------------------------------------------------------------------- serving


def launch(model_args: list[str], threads: int, cache: Path, timeout: float = 600.0) -> tuple[Any, float, list]:
    """`aiayn serve MODEL_ARGS` on a free loopback port: (server, seconds to its first /health
    answer, (seconds, line) of its log)."""
    import httpx

    import serve_load

    cmd = [python(), "-m", "aiayn", "serve", *model_args, "--host", "127.0.0.1", "--port", "0"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=command_env(threads, cache))
    server = serve_load.ServerProcess(proc, "")
    timed: list[tuple[float, str]] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.lines.append(line)
            timed.append((time.perf_counter() - start, line.rstrip()))
            m = serve_load.READY_RE.search(line)
            if m and not server.url:
                server.url = m.group(1)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(timeout)
    while server.url and time.perf_counter() - start < timeout:
        try:
            if httpx.get(f"{server.url}/health", timeout=5).status_code == 200:
                return server, time.perf_counter() - start, timed
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    server.stop(5)
    raise SystemExit(f"aiayn serve did not start:\n{server.log()}")


def sequential_latency(url: str, sentences: list[str], n: int) -> dict[str, float]:
    import httpx

    ms = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for k in range(n + 3):
            start = time.perf_counter()
            r = client.post("/v1/translate", json={"texts": [sentences[k % len(sentences)]]})
            r.raise_for_status()
            if k >= 3:  # three warm-up requests
                ms.append(1e3 * (time.perf_counter() - start))
    return {"requests": n, "p50_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms)}


def measure_serving(args: argparse.Namespace, checkpoint: Path, ct2: Path | None, lines: list[str],
                    work: Path) -> list[dict[str, Any]]:
    from dataclasses import asdict

    import serve_load

    sequential, load = QUICK_SERVE if args.quick else (SERVE_SEQUENTIAL, SERVE_LOAD)
    servers = [("aiayn serve", ["--checkpoint", str(checkpoint)])]
    if ct2 is not None:
        servers.append(("aiayn serve --ctranslate2 (int8)", ["--ctranslate2", str(ct2), "--compute-type", "int8"]))
    out = []
    for label, model_args in servers:
        # aiayn's server starts where the files' runs left the model's compiled step (BUILT_VARIANT)
        cache = work / ("cache-built" if label == "aiayn serve" else "serve-cache")
        if label != "aiayn serve":
            shutil.rmtree(cache, ignore_errors=True)
        server, ready_s, log = launch(model_args, args.threads, cache)
        try:
            before = time.perf_counter()
            latency = sequential_latency(server.url, lines, sequential)
            result = serve_load.run_load(server.url, lines, requests=load, clients=SERVE_CLIENTS, label=label)
            measured_s = time.perf_counter() - before
        finally:
            server.stop()
        compiled = next((t for t, line in log if "compiled the decoding step in the background" in line), None)
        out.append({"server": label, "ready_s": ready_s, "sequential": latency, "load": asdict(result),
                    "dtype": next((line.split("-> ", 1)[1] for _, line in log if "dtype auto -> " in line), None),
                    # a background compile that ended while the requests ran shares the CPU with them
                    "background_compile_done_s": compiled, "measured_from_s": ready_s,
                    "measured_until_s": ready_s + measured_s})
        print(f"  {label}: ready {ready_s:.1f} s, p50 {latency['p50_ms']:.1f} ms, "
              f"{result.throughput_rps:.1f} req/s", file=sys.stderr)
    return out


# --------------------------------------------------------------------------- startup


def import_top(checkpoint: Path, src: Path, threads: int, work: Path, top: int = 12) -> list[dict[str, Any]]:
    """The slowest top-level imports of a one-line `aiayn translate` (python -X importtime)."""
    proc = subprocess.run([python(), "-X", "importtime", "-m", "aiayn", "translate", "--checkpoint", str(checkpoint),
                           "-i", str(src), "-o", str(work / "out-importtime.txt"), "--quiet"],
                          capture_output=True, text=True, env=command_env(threads, work / "startup-cache"))
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)", line)
        if m and len(m.group(3)) <= 2:  # top-level modules and their direct imports
            rows.append({"module": m.group(4), "cumulative_s": int(m.group(2)) / 1e6, "depth": len(m.group(3)) // 2})
    return sorted(rows, key=lambda r: -r["cumulative_s"])[:top]


INTERPRETER = "interpreter (python -c pass)"


def measure_startup(args: argparse.Namespace, checkpoint: Path, lines: list[str], work: Path) -> dict[str, Any]:
    src = write_input(lines, 1, work / "input-startup.txt")
    env = command_env(args.threads, work / "startup-cache")
    interpreter, probes, commands = [], [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run([python(), "-c", "pass"], check=True, env=env)
        interpreter.append(time.perf_counter() - start)
        start = time.perf_counter()
        proc = subprocess.run([python(), "-c", STARTUP_PROBE, str(checkpoint), str(src), str(args.threads)],
                              capture_output=True, text=True, env=env)
        probe_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"start-up probe failed:\n{proc.stderr[-3000:]}")
        probes.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": probe_s})
        commands.append(run_aiayn(checkpoint, src, work / "out-startup.txt", args.threads, work / "startup-cache"))
    names = list(probes[0]["stages"])
    stages = {INTERPRETER: statistics.median(interpreter)}
    stages.update({name: statistics.median(p["stages"][name] for p in probes) for name in names})
    command_s = statistics.median(c["seconds"] for c in commands)
    counted = sum(v for k, v in stages.items() if not k.startswith("second"))
    # The probe's wall time beyond its interpreter start and its stages: the interpreter's exit.
    exit_s = statistics.median(p["wall_s"] - sum(p["stages"].values()) for p in probes) - stages[INTERPRETER]
    return {"dtype": probes[0]["dtype"], "stages_s": stages, "exit_s": exit_s,
            "probe_wall_s": statistics.median(p["wall_s"] for p in probes), "command_s": command_s,
            "command_first_output_s": statistics.median(c["first_output_s"] for c in commands),
            "command_minus_stages_s": command_s - counted,
            "slowest_imports": import_top(checkpoint, src, args.threads, work)}


# ------------------------------------------------------------------------------ report


def print_report(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(f"\nend to end, fresh processes, {m['threads']} threads\nmachine: {m['label']}; "
          f"flags: {' '.join(m['flags']) or '-'}; ctranslate2 {m['ctranslate2']}")
    print(f"checkpoint: {report['checkpoint']}; input: {report['input']['source']}")
    print(f"{'lines':>7}  {'system':<12}{'run':<44}{'median s':>10}{'first line s':>14}{'lines/s':>10}  note")
    for r in report["rows"]:
        compiled = "compiled" if r.get("compiled") else None
        note = " ".join(filter(None, [r.get("dtype"), compiled, r.get("compute_type")]))
        first = f"{r['median_first_output_s']:.2f}" if "median_first_output_s" in r else "-"
        print(f"{r['lines']:>7}  {r['system']:<12}{r['variant']:<44}{r['median_s']:>10.2f}{first:>14}"
              f"{r['lines_per_s']:>10.1f}  {note}")
    for r in report["ratios"]:
        if "aiayn_first_over_ct2_int8" in r:
            print(f"{r['lines']:>7} lines: aiayn / CTranslate2 int8 = {r['aiayn_first_over_ct2_int8']:.2f} "
                  f"(first run), {r['aiayn_second_over_ct2_int8']:.2f} (second run), "
                  f"{r['aiayn_built_over_ct2_int8']:.2f} ({BUILT_VARIANT})")
    for s in report.get("serve") or []:
        print(f"{s['server']}: ready in {s['ready_s']:.1f} s; one sentence at a time p50 "
              f"{s['sequential']['p50_ms']:.1f} ms; {s['load']['clients']} clients {s['load']['throughput_rps']:.1f} "
              f"req/s (p50 {s['load']['p50_ms']} ms)")
    st = report.get("startup")
    if st:
        print(f"\none-line `aiayn translate` ({st['dtype']}): {st['command_s']:.2f} s")
        for name, s in st["stages_s"].items():
            print(f"  {name:<48}{s:>7.2f} s")
        print(f"  {'exit (the probe: wall - interpreter - stages)':<48}{st['exit_s']:>7.2f} s")
        print(f"  {'the command beyond them (its exit included)':<48}{st['command_minus_stages_s']:>7.2f} s")
        top = st["slowest_imports"][:6]
        print("slowest imports: " + ", ".join(f"{i['module']} {i['cumulative_s']:.2f} s" for i in top))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", help="the checkpoint to translate with (default: see above)")
    ap.add_argument("--input", help="source sentences, one a line, cycled to each line count (plain or .gz)")
    ap.add_argument("--lines", help="line counts, comma-separated (default 10,1000,3000; --quick 10,40)")
    ap.add_argument("--runs", type=int, default=3, help="runs per system and line count; figures are medians")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("AIAYN_NUM_THREADS") or W.THREADS))
    ap.add_argument("--systems", default="aiayn,ctranslate2", help="aiayn alone, or aiayn,ctranslate2 (default)")
    ap.add_argument("--serve", action="store_true", help="also measure `aiayn serve` and `aiayn serve --ctranslate2`")
    ap.add_argument("--startup", action="store_true", help="also break a one-line translation's start-up down")
    ap.add_argument("--workdir", help="keeps the built model and the CTranslate2 export (default: a temporary dir)")
    ap.add_argument("--quick", action="store_true", help="a tiny model, small line counts, one run (smoke check)")
    W.add_json_arg(ap, "end_to_end.json")
    ap.add_argument("--json-out", dest="json", metavar="FILE", help="the same as --json FILE")
    args = ap.parse_args(argv)
    args.line_counts = [int(x) for x in (args.lines or ("10,1000,3000" if not args.quick else QUICK_LINES)).split(",")]
    if args.quick:
        args.runs = 1
    if args.runs < 1 or args.threads < 1 or any(n < 1 for n in args.line_counts):
        ap.error("--runs, --threads and every --lines count must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall = time.perf_counter()
    with W.model_root(args.workdir) as root, tempfile.TemporaryDirectory(prefix="aiayn-e2e-") as tmp:
        work = Path(tmp)
        sentences = None
        checkpoint = Path(args.checkpoint) if args.checkpoint else None
        if checkpoint is None:
            checkpoint, sentences = build_checkpoint(root, args.quick)
        lines, source = source_lines(args, sentences)
        dec = decode_settings(checkpoint)
        ct2 = export_ct2(checkpoint, root, args.threads) if "ctranslate2" in args.systems.split(",") else None
        rows, ratios = measure_files(args, checkpoint, ct2, lines, work, dec)
        report: dict[str, Any] = {
            "machine": machine_info(args.threads), "quick": args.quick, "runs": args.runs,
            "checkpoint": portable(checkpoint) if args.checkpoint else ("tiny random (--quick)" if args.quick
                                                                     else "random Transformer base (cpu_decode.py)"),
            "input": {"source": source, "distinct_lines": len(lines)},
            "aiayn_command": "aiayn translate --checkpoint CK -i FILE -o OUT",
            "ctranslate2": None if ct2 is None else {
                "model": "aiayn export ctranslate2 (float32)", "compute_types": ["default", "int8"],
                "intra_threads": args.threads, "decode": dec, "differences": ct2_differences(dec)},
            "rows": rows, "ratios": ratios,
            "serve": measure_serving(args, checkpoint, ct2, lines, work) if args.serve else None,
            "startup": measure_startup(args, checkpoint, lines, work) if args.startup else None,
        }
    report["seconds"] = time.perf_counter() - wall
    print_report(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
