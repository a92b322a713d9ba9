#!/usr/bin/env bash
# Sequence-level knowledge distillation (Kim & Rush, 2016) of a finished Multi30k run: the
# ensemble of scripts/multi30k.sh translates the training sources (the config's decode
# options), one student learns from those translations with the teacher's tokenizer, and is
# then averaged, scored on test_2016_flickr and timed against the ensemble.
#
#   bash scripts/multi30k_distill.sh                   # after `make multi30k`: the en -> de run
#   SRC=de TGT=en bash scripts/multi30k_distill.sh     # after the de -> en run
#   MIX=1 bash scripts/multi30k_distill.sh             # original and distilled pairs together
#   STUDENT="model.d_model=128 model.d_ff=512" bash scripts/multi30k_distill.sh   # a smaller student
#   RUN=runs/x bash scripts/multi30k_distill.sh train.max_steps=3950 train.max_time_minutes=0
#
# CONFIG, SRC, TGT, DATA_DIR, PREPARED, RUN, AVERAGE, MEMBERS, SEED and AIAYN mean what they
# mean to scripts/multi30k.sh, with its defaults: give the values the teacher run had. Extra
# arguments, then the words of STUDENT, are config overrides of the student's `aiayn train`
# (SEED sets its train.seed if given). The training text is read from the mirror folder
# DATA_DIR (else $AIAYN_DATA_MIRROR), else from the download cache `aiayn prepare` filled.
#
# Writes RUN/distill/train.hyp.TGT (the ensemble's translation of the training sources; kept,
# and a rerun continues or skips it), the prepared data PREPARED.distill (MIX=1:
# PREPARED.distill-mix), the student's run RUN/student (MIX=1: RUN/student-mix) with its
# averaged/ checkpoint, test.hyp.TGT and test.score.txt/.json, and RUN/distill.json
# (MIX=1: RUN/distill-mix.json): the BLEU of student and ensemble, and the wall seconds of
# each one's `aiayn translate` of the test set (loading included) with their ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
# The config's data section (one "key: value" line each, as in configs/) names the languages.
config_lang() { sed -n "s/^ *$1: *\([A-Za-z_-]*\).*/\1/p" "$CONFIG" | head -n 1; }
fail() { echo "multi30k_distill.sh: $*" >&2; exit 2; }
if [ -z "${CONFIG:-}" ]; then
    SRC=${SRC:-en}
    TGT=${TGT:-de}
    CONFIG=configs/multi30k_${SRC}_${TGT}.yaml
fi
[ -f "$CONFIG" ] || fail "no config $CONFIG"
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
[[ "$AVERAGE" =~ ^[1-9][0-9]*$ ]] || fail "AVERAGE=$AVERAGE: give a whole number of checkpoints, 1 or more"
MEMBERS=${MEMBERS:-2}
[[ "$MEMBERS" =~ ^[1-9][0-9]*$ ]] || fail "MEMBERS=$MEMBERS: give a whole number of models, 1 or more"
SEED_GIVEN=()
[ -z "${SEED:-}" ] || SEED_GIVEN=("train.seed=$SEED")
[[ "${SEED:-1}" =~ ^[0-9]+$ ]] || fail "SEED=$SEED: give a whole number, the student's seed"
MIX=${MIX:-0}
[[ "$MIX" =~ ^[01]$ ]] || fail "MIX=$MIX: give 0 (distilled pairs only) or 1 (original and distilled pairs)"
read -r -a STUDENT_ARGS <<< "${STUDENT:-}"
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn

NAME=distill STUDENT_RUN=$RUN/student
[ "$MIX" = 0 ] || NAME=distill-mix STUDENT_RUN=$RUN/student-mix
DISTILLED=$PREPARED.$NAME
WORK=$RUN/distill
TRAIN_HYP=$WORK/train.hyp.$TGT

# The teacher: what scripts/multi30k.sh left (a member's run directory as it names them).
member_dir() { if [ "$MEMBERS" = 1 ]; then echo "$RUN"; else echo "$RUN/member$1"; fi; }
[ -f "$PREPARED/summary.json" ] \
    || fail "$PREPARED: not a prepared directory; run scripts/multi30k.sh first (same PREPARED)"
TEACHERS=()
for k in $(seq 1 "$MEMBERS"); do
    [ -d "$(member_dir "$k")/averaged" ] \
        || fail "no $(member_dir "$k")/averaged: run scripts/multi30k.sh to its end first (same RUN and MEMBERS)"
    TEACHERS+=("$(member_dir "$k")/averaged")
done
# The BLEU of an `aiayn evaluate --json` file (one "key": value line each).
bleu() { [ ! -f "$1" ] || sed -n 's/^ *"bleu": *\([0-9.]*\).*/\1/p' "$1" | head -n 1; }
ENSEMBLE_BLEU=$(bleu "$RUN/test.score.json")
[ -n "$ENSEMBLE_BLEU" ] || fail "no $RUN/test.score.json with a BLEU: run scripts/multi30k.sh to its end first (same RUN)"
ENSEMBLE=()
[ "$MEMBERS" = 1 ] || ENSEMBLE=(--ensemble)

# A training file of the corpus: where `aiayn prepare` found it (mirror folder, else cache).
train_file() {
    local cache=${AIAYN_CACHE_DIR:-$HOME/.cache/aiayn/datasets} candidate candidates=()
    [ -z "$DATA_DIR" ] || candidates=("$DATA_DIR/multi30k/train.$1.gz" "$DATA_DIR/train.$1.gz")
    for candidate in "${candidates[@]}" "$cache/multi30k/train.$1.gz"; do
        [ -f "$candidate" ] && { echo "$candidate"; return; }
    done
    fail "no multi30k/train.$1.gz in ${DATA_DIR:+the mirror $DATA_DIR or }the download cache $cache: set DATA_DIR"
}
TRAIN_SRC=$(train_file "$SRC")
[ "$MIX" = 0 ] || TRAIN_TGT=$(train_file "$TGT")
lines() { gzip -cdf "$1" | awk 'END { print NR }'; }

# A mistake in the student's overrides: one message and exit 2 here, before any translating.
STUDENT_OVERRIDES=("data.prepared_dir=$DISTILLED" "$@" "${STUDENT_ARGS[@]}" "${SEED_GIVEN[@]}")
$AIAYN train --config "$CONFIG" --run-dir "$STUDENT_RUN" "${STUDENT_OVERRIDES[@]}" --print-config > /dev/null

mkdir -p "$WORK"
if [ -f "$TRAIN_HYP" ] && [ "$(lines "$TRAIN_HYP")" = "$(lines "$TRAIN_SRC")" ]; then
    echo "== the training sources are translated already ($TRAIN_HYP)"
else
    echo "== translate the training sources $TRAIN_SRC (${#TEACHERS[@]} model(s); the decode section of $CONFIG)"
    # --resume continues what an interrupted translation left in $TRAIN_HYP.partial.
    $AIAYN translate --checkpoint "${TEACHERS[@]}" "${ENSEMBLE[@]}" --input "$TRAIN_SRC" \
        --output "$TRAIN_HYP" --resume
fi

if [ "$MIX" = 1 ]; then
    echo "== pair the training sources with their original and their distilled targets"
    { gzip -cdf "$TRAIN_SRC"; gzip -cdf "$TRAIN_SRC"; } > "$WORK/train.mix.$SRC"
    { gzip -cdf "$TRAIN_TGT"; cat "$TRAIN_HYP"; } > "$WORK/train.mix.$TGT"
    PAIRS=("$WORK/train.mix.$SRC" "$WORK/train.mix.$TGT")
else
    PAIRS=("$TRAIN_SRC" "$TRAIN_HYP")
fi

echo "== prepare $DISTILLED (the tokenizer of $PREPARED; valid and test as there)"
$AIAYN prepare --config "$CONFIG" "${DATA_ARGS[@]}" --tokenizer-dir "$PREPARED" \
    --train-src "${PAIRS[0]}" --train-tgt "${PAIRS[1]}" --out "$DISTILLED"

echo "== train the student ($STUDENT_RUN)"
$AIAYN train --config "$CONFIG" --run-dir "$STUDENT_RUN" "${STUDENT_OVERRIDES[@]}"

echo "== average the last $AVERAGE checkpoints of $STUDENT_RUN"
$AIAYN average "$STUDENT_RUN" --last "$AVERAGE" --out "$STUDENT_RUN/averaged" --force

# The wall seconds of a command, printed once it has run (its own output goes to stderr).
now() { date +%s.%N; }
timed() {
    local start
    start=$(now)
    "$@" >&2 || return
    awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'
}

echo "== translate test_2016_flickr with the ensemble and with the student, each timed"
ENSEMBLE_S=$(timed $AIAYN translate --checkpoint "${TEACHERS[@]}" "${ENSEMBLE[@]}" \
    --input "$PREPARED/test.src.txt" --output "$WORK/test.ensemble.hyp.$TGT")
STUDENT_S=$(timed $AIAYN translate --checkpoint "$STUDENT_RUN/averaged" \
    --input "$PREPARED/test.src.txt" --output "$STUDENT_RUN/test.hyp.$TGT")

echo "== score the student (sacreBLEU)"
$AIAYN evaluate --hyp "$STUDENT_RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" \
    | tee "$STUDENT_RUN/test.score.txt"
$AIAYN evaluate --hyp "$STUDENT_RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" --json \
    > "$STUDENT_RUN/test.score.json"

awk -v student="$(bleu "$STUDENT_RUN/test.score.json")" -v ensemble="$ENSEMBLE_BLEU" \
    -v student_s="$STUDENT_S" -v ensemble_s="$ENSEMBLE_S" -v members="${#TEACHERS[@]}" -v mix="$MIX" 'BEGIN {
    printf "{\n  \"bleu_student\": %s,\n  \"bleu_ensemble\": %s,\n", student, ensemble
    printf "  \"decode_s_student\": %s,\n  \"decode_s_ensemble\": %s,\n", student_s, ensemble_s
    printf "  \"speedup\": %.3f,\n  \"members\": %d,\n  \"mix\": %d\n}\n", ensemble_s / student_s, members, mix
}' > "$RUN/$NAME.json"
echo "== $RUN/$NAME.json"
cat "$RUN/$NAME.json"
