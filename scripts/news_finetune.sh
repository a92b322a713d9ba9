#!/usr/bin/env bash
# Fine-tuning a finished Multi30k En->De run on WMT news text with an extended vocabulary,
# measured against its alternatives. Four arms, each scored with sacreBLEU on newstest2013:
#   base      the Multi30k checkpoint as it is (also scored on Multi30k test_2016_flickr)
#   finetune  newstest2012 (less HELDOUT pairs kept for validation), tokenizer = the base's plus
#             EXTEND pieces learned on it; train.init_from the base, train.init_vocab extend,
#             STEPS updates; averaged; also scored on test_2016_flickr (what it forgets)
#   mixed     the same, the training pairs joined by the first MIX Multi30k training pairs;
#             also scored on test_2016_flickr
#   scratch   finetune's data and vocabulary, no init_from: the Multi30k recipe, SCRATCH_STEPS
# OUT/summary.json gathers the scores and the vocabulary counts init_vocab reported.
#
#   make news-finetune RUN=runs/multi30k.en-de          # after `make multi30k`
#   RUN=runs/m30k PREPARED=data-bin/m30k OUT=runs/news STEPS=800 bash scripts/news_finetune.sh
#   bash scripts/news_finetune.sh train.max_tokens=4096  # extra arguments: overrides of every training
#
# RUN: a scripts/multi30k.sh run; its model is RUN/member1/averaged (RUN/averaged with MEMBERS=1),
# or BASE=<checkpoint>. PREPARED: that run's prepared dir (test_2016_flickr). The news and
# Multi30k text come from DATA_DIR, else $AIAYN_DATA_MIRROR (wmt-news/, multi30k/; README.md
# there). An arm whose scores exist is skipped on a re-run, an interrupted training resumes, and
# prepared data are reused: after changing EXTEND, HELDOUT or MIX, give a new OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "news_finetune.sh: $*" >&2; exit 2; }
# whole NAME WHAT: $NAME must be a whole number (then read as decimal: 08 is 8).
whole() { [[ "${!1}" =~ ^[0-9]+$ ]] || fail "$1=${!1}: give a whole number, $2"; printf -v "$1" %d "$((10#${!1}))"; }

CONFIG=${CONFIG:-configs/news_finetune_en_de.yaml}
SCRATCH_CONFIG=${SCRATCH_CONFIG:-configs/multi30k_en_de.yaml}
for c in "$CONFIG" "$SCRATCH_CONFIG"; do [ -f "$c" ] || fail "no config $c"; done
RUN=${RUN:-runs/multi30k.en-de}
PREPARED=${PREPARED:-data-bin/multi30k.en-de}
OUT=${OUT:-$RUN/news}
EXTEND=${EXTEND:-2000}
STEPS=${STEPS:-500}
SCRATCH_STEPS=${SCRATCH_STEPS:-2000}
HELDOUT=${HELDOUT:-200}
MIX=${MIX:-5000}       # Multi30k pairs average about half a news pair's words: 5000 ~ the news part
AVERAGE=${AVERAGE:-5}
whole EXTEND "the pieces to add to the base tokenizer"
whole MIX "the Multi30k training pairs of the mixed arm"
for v in HELDOUT STEPS SCRATCH_STEPS AVERAGE; do
    whole "$v" "1 or more"
    [ "${!v}" -ge 1 ] || fail "$v=${!v}: give a whole number, 1 or more"
done
if [ -z "${BASE:-}" ]; then
    BASE=$RUN/member1/averaged
    [ -f "$BASE/model.safetensors" ] || BASE=$RUN/averaged
fi
[ -f "$BASE/model.safetensors" ] || fail "RUN=$RUN has no averaged checkpoint (member1/averaged or averaged): run scripts/multi30k.sh first, or give BASE"
[ -d "$BASE/tokenizer" ] || fail "$BASE has no tokenizer/: the vocabulary cannot be extended"
for f in test.src.txt test.tgt.txt; do [ -f "$PREPARED/$f" ] || fail "PREPARED=$PREPARED has no $f (the Multi30k test set)"; done
DATA_DIR=${DATA_DIR:-${AIAYN_DATA_MIRROR:-}}
[ -n "$DATA_DIR" ] || fail "no data mirror: set DATA_DIR or AIAYN_DATA_MIRROR (a folder with wmt-news/ and multi30k/)"
NEWS=$DATA_DIR/wmt-news
for f in "$NEWS"/newstest2012.{en,de}.gz "$NEWS"/newstest2013.{en,de}.gz "$DATA_DIR"/multi30k/train.{en,de}.gz; do
    [ -f "$f" ] || fail "no $f"
done
TRAIN_LINES=$(( $(gzip -dc "$NEWS/newstest2012.en.gz" | wc -l) - HELDOUT ))
[ "$TRAIN_LINES" -ge 1 ] || fail "HELDOUT=$HELDOUT: newstest2012 has no pairs left to train on"
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn
PYTHON=${PYTHON:-python3}
SAVE_EVERY=$(( STEPS / 10 > 0 ? STEPS / 10 : 1 ))  # checkpoints: the last AVERAGE of them span
SCRATCH_SAVE_EVERY=$(( SCRATCH_STEPS / 10 > 0 ? SCRATCH_STEPS / 10 : 1 ))  # the run's last half
# A mistake in the overrides or the steps: one message and exit 2 here, before any work.
$AIAYN train --config "$CONFIG" --run-dir "$OUT/finetune" train.max_steps="$STEPS" train.max_time_minutes=0 \
    "$@" --print-config > /dev/null
$AIAYN train --config "$SCRATCH_CONFIG" --run-dir "$OUT/scratch" train.max_steps="$SCRATCH_STEPS" \
    train.max_time_minutes=0 "$@" --print-config > /dev/null

# write FILE COMMAND...: COMMAND's output into FILE, which appears only once complete.
write() { local target=$1; shift; "$@" > "$target.tmp" && mv "$target.tmp" "$target"; }
lines() { gzip -dc "$1" | awk -v first="$2" -v last="$3" 'NR >= first && NR <= last'; }
mixed_lines() { cat "$TEXT/news.train.$1"; lines "$DATA_DIR/multi30k/train.$1.gz" 1 "$MIX"; }
TEXT=$OUT/text
mkdir -p "$TEXT"
for lang in en de; do
    [ -f "$TEXT/news.train.$lang" ] || write "$TEXT/news.train.$lang" lines "$NEWS/newstest2012.$lang.gz" 1 "$TRAIN_LINES"
    [ -f "$TEXT/news.valid.$lang" ] || write "$TEXT/news.valid.$lang" lines "$NEWS/newstest2012.$lang.gz" \
        "$(( TRAIN_LINES + 1 ))" "$(( TRAIN_LINES + HELDOUT ))"
    [ -f "$TEXT/mixed.train.$lang" ] || write "$TEXT/mixed.train.$lang" mixed_lines "$lang"
done

# score ARM CHECKPOINT NAME SOURCE REFERENCE: OUT/ARM/NAME.hyp.de and NAME.score.json.
score() {
    local dir=$OUT/$1 ckpt=$2 name=$3 src=$4 ref=$5
    mkdir -p "$dir"
    [ -f "$dir/$name.score.json" ] || write "$dir/$name.score.json" $AIAYN evaluate --checkpoint "$ckpt" \
        --input "$src" --ref "$ref" --output "$dir/$name.hyp.de" --json --quiet
    echo "   $1 $name: BLEU $($PYTHON -c 'import json, sys; print(json.load(open(sys.argv[1]))["bleu"])' "$dir/$name.score.json")"
}
score_arm() {  # score_arm ARM CHECKPOINT [test2016]
    score "$1" "$2" newstest2013 "$NEWS/newstest2013.en.gz" "$NEWS/newstest2013.de.gz"
    [ "${3:-}" != test2016 ] || score "$1" "$2" test2016 "$PREPARED/test.src.txt" "$PREPARED/test.tgt.txt"
}
done_arm() {  # done_arm ARM FILE...: whether every score file of the arm exists (then it is skipped)
    local arm=$1; shift
    for f in "$@"; do [ -f "$OUT/$arm/$f.score.json" ] || return 1; done
    echo "== $arm: scored already ($OUT/$arm), skipped"
}
prepare() {  # prepare NAME TRAIN_PREFIX TOKENIZER_ARGS...: OUT/data-bin/NAME, validation = the held-out news
    local out=$OUT/data-bin/$1 train=$2; shift 2
    [ -f "$out/summary.json" ] || $AIAYN prepare --config "$CONFIG" --quiet \
        --train-src "$train.en" --train-tgt "$train.de" \
        --valid-src "$TEXT/news.valid.en" --valid-tgt "$TEXT/news.valid.de" "$@" --out "$out"
}
train_and_average() {  # train_and_average ARM CONFIG STEPS SAVE_EVERY ARGS...
    local run=$OUT/$1 config=$2 steps=$3 save=$4; shift 4
    if [ ! -f "$run/averaged/model.safetensors" ]; then
        $AIAYN train --config "$config" --run-dir "$run" train.max_steps="$steps" train.max_time_minutes=0 \
            train.save_every="$save" train.valid_every="$save" train.keep_last="$AVERAGE" "$@"
        $AIAYN average "$run" --last "$AVERAGE" --out "$run/averaged" --force
    fi
}

echo "== base: $BASE"
done_arm base newstest2013 test2016 || score_arm base "$BASE" test2016

echo "== finetune: newstest2012 ($TRAIN_LINES pairs; $HELDOUT held out), $EXTEND pieces added, $STEPS updates"
prepare news "$TEXT/news.train" --tokenizer-dir "$BASE/tokenizer" --extend-vocab "$EXTEND"
if ! done_arm finetune newstest2013 test2016; then
    train_and_average finetune "$CONFIG" "$STEPS" "$SAVE_EVERY" \
        data.prepared_dir="$OUT/data-bin/news" train.init_from="$BASE" train.init_vocab=extend "$@"
    score_arm finetune "$OUT/finetune/averaged" test2016
fi

echo "== mixed: the same joined by $MIX Multi30k training pairs, finetune's vocabulary"
prepare mixed "$TEXT/mixed.train" --tokenizer-dir "$OUT/data-bin/news"
if ! done_arm mixed newstest2013 test2016; then
    train_and_average mixed "$CONFIG" "$STEPS" "$SAVE_EVERY" \
        data.prepared_dir="$OUT/data-bin/mixed" train.init_from="$BASE" train.init_vocab=extend "$@"
    score_arm mixed "$OUT/mixed/averaged" test2016
fi

echo "== scratch: finetune's data and vocabulary, $SCRATCH_CONFIG from random weights, $SCRATCH_STEPS updates"
if ! done_arm scratch newstest2013; then
    train_and_average scratch "$SCRATCH_CONFIG" "$SCRATCH_STEPS" "$SCRATCH_SAVE_EVERY" \
        data.prepared_dir="$OUT/data-bin/news" "$@"
    score_arm scratch "$OUT/scratch/averaged"
fi

echo "== summary: $OUT/summary.json"
# init_vocab's counts: train_summary.json has them after a run that started fresh and ran
# through; a resumed run's are in the line train.log kept from its fresh start.
write "$OUT/summary.json" $PYTHON - "$OUT" "$BASE" "$EXTEND" "$STEPS" "$SCRATCH_STEPS" "$HELDOUT" "$MIX" <<'EOF'
import json, re, sys
from pathlib import Path
out, base = Path(sys.argv[1]), sys.argv[2]
settings = dict(zip(("extend", "steps", "scratch_steps", "heldout", "mix"), map(int, sys.argv[3:])))

def bleu(arm, name):
    return json.loads((out / arm / f"{name}.score.json").read_text())["bleu"]

def init_vocab(arm):
    summary = out / arm / "train_summary.json"
    if summary.is_file() and "init_vocab" in json.loads(summary.read_text()):
        return json.loads(summary.read_text())["init_vocab"]
    log = (out / arm / "train.log").read_text(encoding="utf-8")
    mode, sides = re.findall(r"init_vocab (\w+): (.*)", log)[-1]
    report = {"mode": mode}
    for side, old, new, kept, added in re.findall(r"(\w+) vocabulary (\d+) -> (\d+) pieces, (\d+) kept, (\d+) new", sides):
        report[side] = {"old": int(old), "new": int(new), "kept": int(kept), "added": int(added)}
    return report

news = {arm: bleu(arm, "newstest2013") for arm in ("base", "finetune", "mixed", "scratch")}
m30k = {arm: bleu(arm, "test2016") for arm in ("base", "finetune", "mixed")}
print(json.dumps({
    "base_checkpoint": base,
    "settings": settings,
    "bleu": {"newstest2013": news, "test2016": m30k},
    "differences": {
        "newstest2013 finetune - base": round(news["finetune"] - news["base"], 2),
        "newstest2013 finetune - scratch": round(news["finetune"] - news["scratch"], 2),
        "newstest2013 mixed - base": round(news["mixed"] - news["base"], 2),
        "newstest2013 mixed - scratch": round(news["mixed"] - news["scratch"], 2),
        "test2016 mixed - base": round(m30k["mixed"] - m30k["base"], 2),
    },
    "init_vocab": {arm: init_vocab(arm) for arm in ("finetune", "mixed")},
}, indent=1))
EOF
cat "$OUT/summary.json"
