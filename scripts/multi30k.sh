#!/usr/bin/env bash
# Multi30k end to end on this machine: prepare from a mirror folder, train, average the last
# checkpoints, translate test_2016_flickr with the config's decode options, score with sacreBLEU.
#
#   bash scripts/multi30k.sh                      # en -> de, mirror ../shared/data
#   SRC=de TGT=en bash scripts/multi30k.sh        # de -> en (configs/multi30k_de_en.yaml)
#   CONFIG=configs/multi30k_de_en.yaml bash scripts/multi30k.sh   # the same: languages from the config
#   DATA_DIR=/path/to/mirror RUN=runs/x bash scripts/multi30k.sh train.max_time_minutes=10
#
# Extra arguments are config overrides passed to `aiayn train`.
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
DATA_DIR=${DATA_DIR:-../shared/data}
PREPARED=${PREPARED:-data-bin/multi30k.${SRC}-${TGT}}
RUN=${RUN:-runs/multi30k.${SRC}-${TGT}}
AVERAGE=${AVERAGE:-5}
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn

echo "== prepare $SRC -> $TGT ($CONFIG, mirror $DATA_DIR)"
$AIAYN prepare --config "$CONFIG" --data-dir "$DATA_DIR" --out "$PREPARED"

echo "== train ($RUN)"
$AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" "$@"

echo "== average the last $AVERAGE checkpoints"
$AIAYN average "$RUN" --last "$AVERAGE" --out "$RUN/averaged"

echo "== translate test_2016_flickr (the decode section of $CONFIG)"
$AIAYN translate --checkpoint "$RUN/averaged" --input "$PREPARED/test.src.txt" \
    --output "$RUN/test.hyp.$TGT"

echo "== score (sacreBLEU)"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" | tee "$RUN/test.score.txt"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" --json > "$RUN/test.score.json"
