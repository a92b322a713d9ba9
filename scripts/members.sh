# Training several models side by side on one machine, for the recipe scripts (sourced, not
# run): MEMBERS models, seeds SEED, SEED+1, ..., the CPU threads split between them; then the
# last AVERAGE checkpoints of each averaged. On 2 cores two 1-thread trainings make more
# updates between them than one 2-thread training, and an ensemble of two models scores above
# their mean (docs/results.md).
#
# The sourcing script sets SCRIPT (its name, for messages), CONFIG, RUN, PREPARED and AIAYN,
# and may define on_exit (run when the script exits, also after an interrupt) and on_run_dir
# (run once RUN is the run's directory: before the members start, or after the one model's
# training, as `aiayn train` refuses a RUN that holds files but no run). Reads MEMBERS
# (default 2), SEED (default 1) and AIAYN_NUM_THREADS (default: every CPU).

MEMBERS=${MEMBERS:-2}
[[ "$MEMBERS" =~ ^[1-9][0-9]*$ ]] || { echo "$SCRIPT: MEMBERS=$MEMBERS: give a whole number of models, 1 or more" >&2; exit 2; }
SEED_GIVEN=()
[ -z "${SEED:-}" ] || SEED_GIVEN=("train.seed=$SEED")
SEED=${SEED:-1}
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "$SCRIPT: SEED=$SEED: give a whole number, the first member's seed" >&2; exit 2; }
AVERAGE=${AVERAGE:-5}
THREADS=${AIAYN_NUM_THREADS:-$(nproc)}
PER=$(( THREADS / MEMBERS > 0 ? THREADS / MEMBERS : 1 ))
declare -F on_exit > /dev/null || on_exit() { :; }
declare -F on_run_dir > /dev/null || on_run_dir() { :; }
trap on_exit EXIT

# A member's run directory: RUN itself for one model, RUN/memberK for several.
member_dir() { if [ "$MEMBERS" = 1 ]; then echo "$RUN"; else echo "$RUN/member$1"; fi; }

# train_members OVERRIDES...: `aiayn train` of CONFIG for every member, each with its seed
# last (with one member, SEED only if given); returns once all have finished, and stops them
# all when one fails or the script is interrupted.
train_members() {
    if [ "$MEMBERS" = 1 ]; then
        echo "== train ($RUN, $PER threads)"
        $AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" "$@" "${SEED_GIVEN[@]}"
        on_run_dir
        return
    fi
    # A mistake in the overrides: one message and exit 2 here, before any member starts.
    $AIAYN train --config "$CONFIG" --run-dir "$RUN" "data.prepared_dir=$PREPARED" "$@" --print-config > /dev/null
    mkdir -p "$RUN"
    on_run_dir
    trap 'kill $(jobs -p) 2>/dev/null || true; on_exit' EXIT
    trap 'exit 130' INT TERM
    local k log seed status
    for k in $(seq 1 "$MEMBERS"); do
        log="$RUN/member$k.log"
        [ "$k" = 1 ] && log="this terminal"
        seed=$(( SEED + k - 1 ))
        echo "== train member $k of $MEMBERS ($(member_dir "$k"), $PER threads, train.seed=$seed; output: $log)"
        (
            [ "$k" = 1 ] || exec > "$log" 2>&1
            AIAYN_NUM_THREADS=$PER exec $AIAYN train --config "$CONFIG" --run-dir "$(member_dir "$k")" \
                "data.prepared_dir=$PREPARED" "$@" "train.seed=$seed"
        ) &
    done
    for _ in $(seq 1 "$MEMBERS"); do
        wait -n && continue
        status=$?
        echo "$SCRIPT: a member's training failed (exit $status): member 1 writes above," \
             "member K to $RUN/memberK.log" >&2
        exit "$status"
    done
    trap on_exit EXIT
}

# average_members: each member's last AVERAGE checkpoints into MEMBER/averaged; sets
# CHECKPOINTS (the averaged models) and ENSEMBLE (--ensemble with several members).
average_members() {
    local k
    CHECKPOINTS=()
    for k in $(seq 1 "$MEMBERS"); do
        echo "== average the last $AVERAGE checkpoints of $(member_dir "$k")"
        $AIAYN average "$(member_dir "$k")" --last "$AVERAGE" --out "$(member_dir "$k")/averaged" --force
        CHECKPOINTS+=("$(member_dir "$k")/averaged")
    done
    ENSEMBLE=()
    [ "$MEMBERS" = 1 ] || ENSEMBLE=(--ensemble)
}
