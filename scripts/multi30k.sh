#!/usr/bin/env bash
# Multi30k end to end on this machine: prepare from a mirror folder, train MEMBERS models side
# by side (seeds SEED, SEED+1, ...: 1 and 2 by default; the CPU threads split between them),
# average the last checkpoints of each, translate test_2016_flickr with their ensemble and the
# config's decode options, score with sacreBLEU.
#
#   bash scripts/multi30k.sh                      # en -> de, 2 members
#   SRC=de TGT=en bash scripts/multi30k.sh        # de -> en (configs/multi30k_de_en.yaml)
#   CONFIG=configs/multi30k_de_en.yaml bash scripts/multi30k.sh   # the same: languages from the config
#   MEMBERS=1 bash scripts/multi30k.sh            # one model on all the threads, no ensemble
#   SEED=3 bash scripts/multi30k.sh               # members with seeds 3 and 4 instead of 1 and 2
#   DATA_DIR=/path/to/mirror RUN=runs/x bash scripts/multi30k.sh train.max_time_minutes=10
#   COMPILE=auto bash scripts/multi30k.sh         # test translation without building compiled steps
#   VARIANTS=none bash scripts/multi30k.sh        # the config as written, whatever the machine
#
# The corpus comes from the mirror folder DATA_DIR, else $AIAYN_DATA_MIRROR; with neither,
# `aiayn prepare` downloads it (into $AIAYN_CACHE_DIR, default ~/.cache/aiayn/datasets).
# Extra arguments are config overrides passed to `aiayn train` (with several members, each
# member's seed comes after them; with MEMBERS=1, SEED only if given). Why two members: on 2
# cores two 1-thread trainings make more updates between them than one 2-thread training, and
# on val the ensemble of two models scores above their mean (docs/results.md). The test
# translation runs with `--compile $COMPILE` (default on): it leaves each member's compiled
# decoding step in the compile cache, so later translations with these models on this machine
# start warm instead of decoding eagerly.
#
# Before training, `aiayn choose-recipe` times a few updates of the config on each member's
# threads and picks the variant of VARIANTS (default configs/variants/multi30k.yaml) that fits
# the updates this machine makes in train.max_time_minutes: the config as written where the CPU
# has bf16 units, a lighter model and schedule where it trains in fp32 (docs/results.md). The
# choice and its reason print here and land in RUN/recipe.json; a run bounded by
# train.max_steps keeps the config as written.
set -euo pipefail
cd "$(dirname "$0")/.."
# The config's data section (one "key: value" line each, as in configs/) names the languages.
config_lang() { sed -n "s/^ *$1: *\([A-Za-z_-]*\).*/\1/p" "$CONFIG" | head -n 1; }
if [ -z "${CONFIG:-}" ]; then
    SRC=${SRC:-en}
    TGT=${TGT:-de}
    CONFIG=configs/multi30k_${SRC}_${TGT}.yaml
fi
[ -f "$CONFIG" ] || { echo "multi30k.sh: no config $CONFIG" >&2; exit 2; }
SRC=$(config_lang src_lang)
TGT=$(config_lang tgt_lang)
SRC=${SRC:-en}  # DataConfig's defaults
TGT=${TGT:-de}
DATA_DIR=${DATA_DIR:-${AIAYN_DATA_MIRROR:-}}
DATA_ARGS=()
[ -z "$DATA_DIR" ] || DATA_ARGS=(--data-dir "$DATA_DIR")
PREPARED=${PREPARED:-data-bin/multi30k.${SRC}-${TGT}}
RUN=${RUN:-runs/multi30k.${SRC}-${TGT}}
SCRIPT=multi30k.sh
CHOICE=$(mktemp)
on_exit() { rm -f "$CHOICE" "$CHOICE.json"; }
on_run_dir() { [ ! -f "$CHOICE.json" ] || cp "$CHOICE.json" "$RUN/recipe.json"; }  # the choice, kept
# MEMBERS, SEED, AVERAGE, PER (threads per member), train_members, average_members.
source scripts/members.sh
VARIANTS=${VARIANTS:-configs/variants/multi30k.yaml}
[ "$VARIANTS" = none ] || [ -f "$VARIANTS" ] || { echo "multi30k.sh: VARIANTS=$VARIANTS: no such file (or none)" >&2; exit 2; }
COMPILE=${COMPILE:-on}
[[ "$COMPILE" =~ ^(on|off|auto)$ ]] || { echo "multi30k.sh: COMPILE=$COMPILE: give on, off or auto" >&2; exit 2; }
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn

echo "== prepare $SRC -> $TGT ($CONFIG, ${DATA_DIR:+mirror }${DATA_DIR:-downloaded corpus})"
$AIAYN prepare --config "$CONFIG" "${DATA_ARGS[@]}" --out "$PREPARED"

# The variant for this machine: its overrides come before the caller's, which win.
FIT=()
if [ "$VARIANTS" != none ]; then
    echo "== choose the recipe ($VARIANTS, $PER thread(s) per member)"
    PREVIOUS=()  # a run that resumes keeps the variant it started with
    [ ! -f "$RUN/recipe.json" ] || PREVIOUS=(--previous "$RUN/recipe.json")
    AIAYN_NUM_THREADS=$PER $AIAYN choose-recipe --config "$CONFIG" --variants "$VARIANTS" "${PREVIOUS[@]}" \
        "data.prepared_dir=$PREPARED" "$@" --json "$CHOICE.json" > "$CHOICE"
    mapfile -t FIT < "$CHOICE"
fi
train_members "${FIT[@]}" "$@"
average_members

echo "== translate test_2016_flickr (${#CHECKPOINTS[@]} model(s); the decode section of $CONFIG)"
$AIAYN translate --checkpoint "${CHECKPOINTS[@]}" "${ENSEMBLE[@]}" --input "$PREPARED/test.src.txt" \
    --output "$RUN/test.hyp.$TGT" --compile "$COMPILE"

echo "== score (sacreBLEU)"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" | tee "$RUN/test.score.txt"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" --json > "$RUN/test.score.json"
