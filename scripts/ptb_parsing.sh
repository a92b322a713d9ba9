#!/usr/bin/env bash
# Constituency parsing on the Penn Treebank sample, end to end (paper, section 6.2): prepare
# (train wsj_0001-0159, every phrase of 3+ words of its trees, and a variant of each with
# words replaced by others of the same POS tag; valid wsj_0160-0179, test wsj_0180-0199; the
# target tree spells its words), train for 60 minutes (the rate held, then decayed over the
# last 12; a slower machine makes fewer steps: docs/results.md), average the last 5
# checkpoints, parse valid and test with beam 21, alpha LENPEN (the paper's 0.3 by default),
# max length = input + 300, under the tree grammar (every output a tree over exactly its
# words), and score with EVALB (COLLINS.prm). MEMBERS=2 trains two models side by side
# instead (seeds SEED and SEED+1, one thread each on 2 cores) and parses with their
# ensemble. Results in docs/results.md; the guide is docs/parsing.md.
#
#   AIAYN_DATA_MIRROR=/path/to/mirror bash scripts/ptb_parsing.sh   # its ptb-sample/ folder
#   PTB_DIR=/path/to/treebank bash scripts/ptb_parsing.sh           # a folder of .mrg files
#   RUN=runs/ptb2 bash scripts/ptb_parsing.sh train.max_steps=3000
#   MEMBERS=2 LENPEN=2.0 bash scripts/ptb_parsing.sh  # two 1-thread models, their ensemble
#   AIAYN_NUM_THREADS=1 bash scripts/ptb_parsing.sh   # a 2-core machine busy with other work
#
# Extra arguments are config overrides passed to `aiayn train` (each member's seed comes after
# them). A run directory that already holds checkpoints is resumed, not restarted: use a new
# RUN for a fresh run. Member 1 writes to this terminal, member K to RUN/memberK.log.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-${AIAYN_DATA_MIRROR:-}}
PTB_DIR=${PTB_DIR:-${DATA_DIR:+$DATA_DIR/ptb-sample}}
[ -n "$PTB_DIR" ] || { echo "ptb_parsing.sh: no treebank: set PTB_DIR to a folder of .mrg files, or DATA_DIR" \
    "(or AIAYN_DATA_MIRROR) to a mirror folder holding ptb-sample/" >&2; exit 2; }
CONFIG=${CONFIG:-configs/ptb_parsing.yaml}
PREPARED=${PREPARED:-data-bin/ptb_parsing}
RUN=${RUN:-runs/ptb_parsing}
AIAYN=${AIAYN:-.venv/bin/aiayn}
[ -x "$AIAYN" ] || AIAYN=aiayn
SCRIPT=ptb_parsing.sh
# The recipe is sized for two CPU cores.
export AIAYN_NUM_THREADS=${AIAYN_NUM_THREADS:-2}
MEMBERS=${MEMBERS:-1}
LENPEN=${LENPEN:-0.3}
[[ "$LENPEN" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "ptb_parsing.sh: LENPEN=$LENPEN: give a number >= 0, the length penalty's alpha" >&2; exit 2; }
# MEMBERS, SEED, AVERAGE, PER (threads per member), train_members, average_members.
source scripts/members.sh

echo "== prepare ($PTB_DIR -> $PREPARED)"
$AIAYN prepare --task parsing --config "$CONFIG" --ptb-dir "$PTB_DIR" --out "$PREPARED" --quiet

train_members "$@"
average_members

# Decoding uses the torch threads too; the checkpoint's batch_tokens keeps beam 21 in memory.
for split in valid test; do
    echo "== parse and score $split (beam 21, alpha $LENPEN, max length = input + 300)"
    $AIAYN parse --checkpoint "${CHECKPOINTS[@]}" "${ENSEMBLE[@]}" --prepared "$PREPARED" --split "$split" \
        --lenpen "$LENPEN" --output "$RUN/$split.trees.txt" --json --quiet > "$RUN/$split.scores.json"
    python3 - "$RUN/$split.scores.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['split']}: F1 {s['f1']:.2f} (P {s['precision']:.2f}, R {s['recall']:.2f}), exact match "
      f"{s['exact_match']:.2f}, {s['repaired']} of {s['parsed']} predictions repaired, {s['seconds']:.0f} s")
EOF
done
for k in $(seq 1 "$MEMBERS"); do
    grep -o "training [0-9,]* parameters.*" "$(member_dir "$k")/train.log" | tail -1
    python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"trained {s['step']} steps, \
{s['epoch']:.1f} epochs in {s['elapsed'] / 60:.1f} min ({s['stop_reason']})\")" "$(member_dir "$k")/train_summary.json"
done
