#!/usr/bin/env bash
# The paper's WMT14 experiments end to end: download (or a mirror), prepare, train with
# torchrun over the GPUs present, average the last checkpoints by the paper's rule, translate
# newstest2014 and score it with sacreBLEU and the paper's tokenized BLEU; the time of each stage.
#
#   bash scripts/wmt14.sh                          # EN-DE, Transformer base (configs/wmt14_en_de_base.yaml)
#   MODEL=big bash scripts/wmt14.sh                # EN-DE, Transformer big
#   MODEL=big PAIR=en-fr bash scripts/wmt14.sh     # EN-FR, Transformer big (the paper trained no base on EN-FR)
#   DATA_DIR=/path/to/mirror bash scripts/wmt14.sh # the archives from a mirror folder, no download
#   MAX_STEPS=200 CONFIG_OVERRIDES="train.save_every=50" RUN=runs/x bash scripts/wmt14.sh
#
# Variables: MODEL (base | big), PAIR (en-de | en-fr), CONFIG (instead of the two), DATA_DIR
# (else $AIAYN_DATA_MIRROR; with neither, the archives are downloaded into $AIAYN_CACHE_DIR,
# default ~/.cache/aiayn/datasets, with curl where it is installed: an interrupted download
# continues where it stopped), PREPARED, RUN, GPUS (default: the count `nvidia-smi -L` lists),
# MAX_STEPS, CONFIG_OVERRIDES (space-separated config overrides), PREPARE_ARGS (space-separated
# `aiayn prepare` options, e.g. --vocab-size 8000), AVERAGE (checkpoints
# averaged: 5 for base, 20 for big, the paper's rule), AIAYN, TORCHRUN, PYTHON. Extra arguments
# are config overrides too, after CONFIG_OVERRIDES.
#
# Training keeps the paper's ~25,000 source and target tokens per update: the configs' batch is
# for 8 GPUs, so G GPUs train with train.update_freq 8/G (on CPU, as one GPU: 8).
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "wmt14.sh: $*" >&2; exit 2; }

MODEL=${MODEL:-base}
PAIR=${PAIR:-en-de}
case "$MODEL" in base|big) ;; *) fail "MODEL=$MODEL: choose base or big" ;; esac
case "$PAIR" in en-de|en-fr) ;; *) fail "PAIR=$PAIR: choose en-de or en-fr" ;; esac
SRC=${PAIR%-*}
TGT=${PAIR#*-}
CONFIG=${CONFIG:-configs/wmt14_${SRC}_${TGT}_${MODEL}.yaml}
[ -f "$CONFIG" ] || fail "no config $CONFIG (the paper trained only the big model on EN-FR: MODEL=big)"
DATASET=wmt14_${SRC}_${TGT}
AVERAGE=${AVERAGE:-$([ "$MODEL" = big ] && echo 20 || echo 5)}
[[ "$AVERAGE" =~ ^[1-9][0-9]*$ ]] || fail "AVERAGE=$AVERAGE: give a whole number of checkpoints, 1 or more"
[ -z "${MAX_STEPS:-}" ] || [[ "$MAX_STEPS" =~ ^[1-9][0-9]*$ ]] || fail "MAX_STEPS=$MAX_STEPS: give a whole number of updates, 1 or more"
PREPARED=${PREPARED:-data-bin/wmt14.${SRC}-${TGT}}
RUN=${RUN:-runs/wmt14.${SRC}-${TGT}.${MODEL}}
DATA_DIR=${DATA_DIR:-${AIAYN_DATA_MIRROR:-}}
CACHE=${AIAYN_CACHE_DIR:-$HOME/.cache/aiayn/datasets}
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
TORCHRUN=${TORCHRUN:-.venv/bin/torchrun}
[ -x "$TORCHRUN" ] || TORCHRUN=torchrun
if [ -z "${GPUS:-}" ]; then
    GPUS=0
    if command -v nvidia-smi > /dev/null 2>&1; then GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
fi
[[ "$GPUS" =~ ^[0-9]+$ ]] || fail "GPUS=$GPUS: give a whole number of GPUs, 0 for the CPU"
read -r -a OVERRIDES <<< "${CONFIG_OVERRIDES:-}"
[ -z "${MAX_STEPS:-}" ] || OVERRIDES=("train.max_steps=$MAX_STEPS" "${OVERRIDES[@]}")
OVERRIDES+=("$@")

declare -A TIMES=()
STAGES=()
stage_start=$(date +%s)
stage_end() {  # record the time of the stage just finished
    local now
    now=$(date +%s)
    TIMES[$1]=$(( now - stage_start ))
    STAGES+=("$1")
    stage_start=$now
}
t0=$stage_start

# ---------------------------------------------------------------- the archives
# name, URL, size and checksums of each archive, from the dataset table aiayn verifies against.
FILES=$("$PYTHON" - "$DATASET" <<'EOF'
import sys
from aiayn.data.datasets import files
for f in files(sys.argv[1]):
    print(f.name, f.url, f.size or 0, f.sha256 or "-", f.md5 or "-")
EOF
)
total=0
unknown=0
while read -r name url size _; do
    total=$(( total + size ))
    [ "$size" != 0 ] || unknown=$(( unknown + 1 ))
done <<< "$FILES"
gb() { awk -v b="$1" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }
note=""
(( unknown == 0 )) || note=" + $unknown of unpublished size"
echo "== $DATASET: $(wc -l <<< "$FILES") archives, $(gb "$total")$note"
while read -r name url size _; do echo "   $name  $([ "$size" = 0 ] && echo "size unknown" || gb "$size")"; done <<< "$FILES"
DATA_ARGS=()
if [ -n "$DATA_DIR" ]; then
    echo "== archives from the mirror $DATA_DIR (used in place; extracted text goes to $CACHE)"
    DATA_ARGS=(--data-dir "$DATA_DIR")
else
    mkdir -p "$CACHE"
    free=$(df -Pk "$CACHE" | awk 'NR == 2 { print $4 * 1024 }')
    echo "== download into $CACHE: $(gb "$total"), then extracted text and prepared data beside it;" \
         "$(gb "$free") free there (keep at least 3x the download free)"
    (( free >= 3 * total )) || echo "wmt14.sh: warning: less than 3x the download free in $CACHE" >&2
    if command -v curl > /dev/null 2>&1; then
        while read -r name url size _; do
            target="$CACHE/$name"
            if [ -f "$target" ]; then continue; fi
            mkdir -p "$(dirname "$target")"
            echo "   $url"
            # -C -: a partial file from an interrupted run is continued, not started over.
            curl -fL --retry 5 -C - -o "$target.part" "$url"
            mv "$target.part" "$target"
        done <<< "$FILES"
    fi
    # (without curl, `aiayn prepare` downloads each archive whole.) Checksums: aiayn prepare
    # verifies every archive against the table and fetches a mismatching one again.
    DATA_ARGS=(--download-dir "$CACHE")
fi
stage_end download

# ---------------------------------------------------------------- prepare
echo "== prepare $SRC -> $TGT into $PREPARED ($CONFIG)"
read -r -a PREPARE_EXTRA <<< "${PREPARE_ARGS:-}"
$AIAYN prepare --config "$CONFIG" "${DATA_ARGS[@]}" "${PREPARE_EXTRA[@]}" --out "$PREPARED"
stage_end prepare

# ---------------------------------------------------------------- train
if (( GPUS > 0 )); then
    FREQ=$(( GPUS >= 8 ? 1 : (8 + GPUS - 1) / GPUS ))
    (( GPUS * FREQ == 8 )) || echo "wmt14.sh: warning: $GPUS GPUs x update_freq $FREQ = $(( GPUS * FREQ ))" \
        "batches per update, not the paper's 8: tokens per update differ from ~25,000" >&2
    echo "== train on $GPUS GPU(s) with torchrun, train.update_freq=$FREQ ($RUN)"
    $TORCHRUN --standalone --nproc-per-node "$GPUS" -m aiayn train --config "$CONFIG" --run-dir "$RUN" \
        "data.prepared_dir=$PREPARED" train.device=cuda "train.update_freq=$FREQ" "${OVERRIDES[@]}"
    DEVICE=cuda
else
    echo "wmt14.sh: warning: no GPU found: training on the CPU, as one GPU with train.update_freq=8;" \
         "the paper's recipe takes days on 8 GPUs and far longer on a CPU (docs/reproducing.md)" >&2
    echo "== train on the CPU ($RUN)"
    $AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" train.device=cpu \
        train.update_freq=8 "${OVERRIDES[@]}"
    DEVICE=cpu
fi
stage_end train

# ---------------------------------------------------------------- average, translate, score
echo "== average the last $AVERAGE checkpoints of $RUN (the paper: 5 for base, 20 for big, written every 10 minutes)"
$AIAYN average "$RUN" --last "$AVERAGE" --out "$RUN/averaged" --force
stage_end average

HYP="$RUN/newstest2014.hyp.$TGT"
echo "== translate newstest2014 ($(wc -l < "$PREPARED/test.src.txt") sentences; the decode section of $CONFIG)"
$AIAYN translate --checkpoint "$RUN/averaged" --input "$PREPARED/test.src.txt" --output "$HYP" --device "$DEVICE" --quiet > /dev/null
stage_end translate

echo "== score newstest2014: sacreBLEU, and the paper's tokenized BLEU"
$AIAYN evaluate --hyp "$HYP" --ref "$PREPARED/test.tgt.txt" --tokenized-bleu --tgt "$TGT" | tee "$RUN/newstest2014.score.txt"
$AIAYN evaluate --hyp "$HYP" --ref "$PREPARED/test.tgt.txt" --tokenized-bleu --tgt "$TGT" --json > "$RUN/newstest2014.score.json"
stage_end score

line="== time:"
for s in "${STAGES[@]}"; do line+=" $s ${TIMES[$s]} s,"; done
line+=" total $(( $(date +%s) - t0 )) s"
echo "$line" | tee "$RUN/time.txt"
