#!/usr/bin/env bash
# Constituency parsing on the Penn Treebank sample, end to end (paper, section 6.2): prepare
# (train wsj_0001-0159, every phrase of 3+ words of its trees, and a variant of each with
# words replaced by others of the same POS tag; valid wsj_0160-0179, test wsj_0180-0199; the
# target tree spells its words), train 16,000 steps (a slower machine stops at the
# 60-minute cap; timings in docs/results.md), average the last 5 checkpoints, parse valid
# and test with beam 21, alpha 0.3, max length = input + 300, under
# the tree grammar (every output a tree over exactly its words), and score with EVALB
# (COLLINS.prm). Results in docs/results.md; the guide is docs/parsing.md.
#
#   AIAYN_DATA_MIRROR=/path/to/mirror bash scripts/ptb_parsing.sh   # its ptb-sample/ folder
#   PTB_DIR=/path/to/treebank bash scripts/ptb_parsing.sh           # a folder of .mrg files
#   RUN=runs/ptb2 bash scripts/ptb_parsing.sh train.max_steps=3000
#   AIAYN_NUM_THREADS=1 bash scripts/ptb_parsing.sh   # a 2-core machine busy with other work
#
# Extra arguments are config overrides passed to `aiayn train`. A run directory that already
# holds checkpoints is resumed, not restarted: use a new RUN for a fresh run.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-${AIAYN_DATA_MIRROR:-}}
PTB_DIR=${PTB_DIR:-${DATA_DIR:+$DATA_DIR/ptb-sample}}
[ -n "$PTB_DIR" ] || { echo "ptb_parsing.sh: no treebank: set PTB_DIR to a folder of .mrg files, or DATA_DIR" \
    "(or AIAYN_DATA_MIRROR) to a mirror folder holding ptb-sample/" >&2; exit 2; }
CONFIG=${CONFIG:-configs/ptb_parsing.yaml}
PREPARED=${PREPARED:-data-bin/ptb_parsing}
RUN=${RUN:-runs/ptb_parsing}
AVERAGE=${AVERAGE:-5}
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn
# The recipe is sized for two CPU cores.
export AIAYN_NUM_THREADS=${AIAYN_NUM_THREADS:-2}

echo "== prepare ($PTB_DIR -> $PREPARED)"
$AIAYN prepare --task parsing --config "$CONFIG" --ptb-dir "$PTB_DIR" --out "$PREPARED" --quiet

echo "== train ($RUN, $AIAYN_NUM_THREADS threads)"
$AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" "$@"

echo "== average the last $AVERAGE checkpoints"
$AIAYN average "$RUN" --last "$AVERAGE" --out "$RUN/averaged" --force

# Decoding uses the torch threads too; the checkpoint's batch_tokens keeps beam 21 in memory.
for split in valid test; do
    echo "== parse and score $split (beam 21, alpha 0.3, max length = input + 300)"
    $AIAYN parse --checkpoint "$RUN/averaged" --prepared "$PREPARED" --split "$split" \
        --output "$RUN/$split.trees.txt" --json --quiet > "$RUN/$split.scores.json"
    python3 - "$RUN/$split.scores.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['split']}: F1 {s['f1']:.2f} (P {s['precision']:.2f}, R {s['recall']:.2f}), exact match "
      f"{s['exact_match']:.2f}, {s['repaired']} of {s['parsed']} predictions repaired, {s['seconds']:.0f} s")
EOF
done
grep -o "training [0-9,]* parameters.*" "$RUN/train.log" | tail -1
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"trained {s['step']} steps, \
{s['epoch']:.1f} epochs in {s['elapsed'] / 60:.1f} min ({s['stop_reason']})\")" "$RUN/train_summary.json"
