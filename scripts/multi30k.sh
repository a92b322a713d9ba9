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
AVERAGE=${AVERAGE:-5}
MEMBERS=${MEMBERS:-2}
[[ "$MEMBERS" =~ ^[1-9][0-9]*$ ]] || { echo "multi30k.sh: MEMBERS=$MEMBERS: give a whole number of models, 1 or more" >&2; exit 2; }
SEED_GIVEN=()
[ -z "${SEED:-}" ] || SEED_GIVEN=("train.seed=$SEED")
SEED=${SEED:-1}
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "multi30k.sh: SEED=$SEED: give a whole number, the first member's seed" >&2; exit 2; }
VARIANTS=${VARIANTS:-configs/variants/multi30k.yaml}
[ "$VARIANTS" = none ] || [ -f "$VARIANTS" ] || { echo "multi30k.sh: VARIANTS=$VARIANTS: no such file (or none)" >&2; exit 2; }
COMPILE=${COMPILE:-on}
[[ "$COMPILE" =~ ^(on|off|auto)$ ]] || { echo "multi30k.sh: COMPILE=$COMPILE: give on, off or auto" >&2; exit 2; }
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn

echo "== prepare $SRC -> $TGT ($CONFIG, ${DATA_DIR:+mirror }${DATA_DIR:-downloaded corpus})"
$AIAYN prepare --config "$CONFIG" "${DATA_ARGS[@]}" --out "$PREPARED"

# A member's run directory: RUN itself for one model, RUN/memberK for several.
member_dir() { if [ "$MEMBERS" = 1 ]; then echo "$RUN"; else echo "$RUN/member$1"; fi; }
THREADS=${AIAYN_NUM_THREADS:-$(nproc)}
PER=$(( THREADS / MEMBERS > 0 ? THREADS / MEMBERS : 1 ))

# The variant for this machine: its overrides come before the caller's, which win.
FIT=()
CHOICE=$(mktemp)
forget_choice() { rm -f "$CHOICE" "$CHOICE.json"; }
trap forget_choice EXIT
if [ "$VARIANTS" != none ]; then
    echo "== choose the recipe ($VARIANTS, $PER thread(s) per member)"
    PREVIOUS=()  # a run that resumes keeps the variant it started with
    [ ! -f "$RUN/recipe.json" ] || PREVIOUS=(--previous "$RUN/recipe.json")
    AIAYN_NUM_THREADS=$PER $AIAYN choose-recipe --config "$CONFIG" --variants "$VARIANTS" "${PREVIOUS[@]}" \
        "data.prepared_dir=$PREPARED" "$@" --json "$CHOICE.json" > "$CHOICE"
    mapfile -t FIT < "$CHOICE"
fi
# Written once the run directory is the run's (an empty RUN is refused as not a run before that).
keep_choice() { [ ! -f "$CHOICE.json" ] || cp "$CHOICE.json" "$RUN/recipe.json"; }

if [ "$MEMBERS" = 1 ]; then
    echo "== train ($RUN)"
    $AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" "${FIT[@]}" "$@" "${SEED_GIVEN[@]}"
    keep_choice
else
    # A mistake in the overrides: one message and exit 2 here, before any member starts.
    $AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" "${FIT[@]}" "$@" \
        --print-config > /dev/null
    mkdir -p "$RUN"
    keep_choice
    # An interrupted or failed run stops every member.
    trap 'kill $(jobs -p) 2>/dev/null || true; forget_choice' EXIT
    trap 'exit 130' INT TERM
    for k in $(seq 1 "$MEMBERS"); do
        log="$RUN/member$k.log"
        [ "$k" = 1 ] && log="this terminal"
        seed=$(( SEED + k - 1 ))
        echo "== train member $k of $MEMBERS ($(member_dir "$k"), $PER threads, train.seed=$seed; output: $log)"
        (
            [ "$k" = 1 ] || exec > "$log" 2>&1
            AIAYN_NUM_THREADS=$PER exec $AIAYN train --config "$CONFIG" --run-dir "$(member_dir "$k")" \
                "data.prepared_dir=$PREPARED" "${FIT[@]}" "$@" "train.seed=$seed"
        ) &
    done
    for _ in $(seq 1 "$MEMBERS"); do
        wait -n && continue
        status=$?
        echo "multi30k.sh: a member's training failed (exit $status): member 1 writes above," \
             "member K to $RUN/memberK.log" >&2
        exit "$status"
    done
    trap forget_choice EXIT
fi

CHECKPOINTS=()
for k in $(seq 1 "$MEMBERS"); do
    echo "== average the last $AVERAGE checkpoints of $(member_dir "$k")"
    $AIAYN average "$(member_dir "$k")" --last "$AVERAGE" --out "$(member_dir "$k")/averaged"
    CHECKPOINTS+=("$(member_dir "$k")/averaged")
done
ENSEMBLE=()
[ "$MEMBERS" = 1 ] || ENSEMBLE=(--ensemble)

echo "== translate test_2016_flickr (${#CHECKPOINTS[@]} model(s); the decode section of $CONFIG)"
$AIAYN translate --checkpoint "${CHECKPOINTS[@]}" "${ENSEMBLE[@]}" --input "$PREPARED/test.src.txt" \
    --output "$RUN/test.hyp.$TGT" --compile "$COMPILE"

echo "== score (sacreBLEU)"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" | tee "$RUN/test.score.txt"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" --json > "$RUN/test.score.json"
