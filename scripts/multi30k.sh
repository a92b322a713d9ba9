#!/usr/bin/env bash
# Multi30k end to end on this machine: prepare from a mirror folder, train, average the last
# checkpoints, translate test_2016_flickr with beam 4, score with sacreBLEU.
#
#   bash scripts/multi30k.sh                      # en -> de, mirror ../shared/data
#   SRC=de TGT=en bash scripts/multi30k.sh        # de -> en
#   DATA_DIR=/path/to/mirror RUN=runs/x bash scripts/multi30k.sh train.max_time_minutes=10
#
# Extra arguments are config overrides passed to `aiayn train`.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${SRC:-en}
TGT=${TGT:-de}
DATA_DIR=${DATA_DIR:-../shared/data}
CONFIG=${CONFIG:-configs/multi30k_${SRC}_${TGT}.yaml}
PREPARED=${PREPARED:-data-bin/multi30k.${SRC}-${TGT}}
RUN=${RUN:-runs/multi30k.${SRC}-${TGT}}
AVERAGE=${AVERAGE:-5}
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn

echo "== prepare ($CONFIG, mirror $DATA_DIR)"
$AIAYN prepare --config "$CONFIG" --data-dir "$DATA_DIR" --out "$PREPARED"

echo "== train ($RUN)"
$AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" "$@"

echo "== average the last $AVERAGE checkpoints"
$AIAYN average "$RUN" --last "$AVERAGE" --out "$RUN/averaged"

echo "== translate test_2016_flickr (beam 4, alpha 0.6)"
$AIAYN translate --checkpoint "$RUN/averaged" --input "$PREPARED/test.src.txt" \
    --output "$RUN/test.hyp.$TGT" --beam 4 --lenpen 0.6

echo "== score (sacreBLEU)"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" | tee "$RUN/test.score.txt"
$AIAYN evaluate --hyp "$RUN/test.hyp.$TGT" --ref "$PREPARED/test.tgt.txt" --json > "$RUN/test.score.json"
