#!/usr/bin/env bash
# one GPU loan: three passes of scripts/run_gpu_study.sh, detached; DEADLINE_S from now in all
start=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $gpu in
*H100*) extra=config/studies/on-h100.yaml from=studies/h100-real ;;
*) extra= from=studies/h200-real ;;
esac
base="config/studies/h200-real.yaml $extra"
ql="config/studies/h200-real.yaml config/studies/h200-real-quality-load.yaml $extra"
new=config=R_fp8_none,G_q4_k_m_none,G_bf16_none,G_q4_k_m_ngram8
echo "gpu: $gpu; results from $from"
pass() { # pass N BUDGET CONFIGS [ARGS]
    local n=$1 budget=$2 cfgs=$3
    shift 3
    mkdir -p /tmp/gout$n
    echo "== pass $n at $((SECONDS - start)) s, budget $budget s"
    STUDY=h200-real STUDY_CONFIG="$cfgs" RESULTS_FROM=$from BUDGET_S=$budget OUT=/tmp/gout$n \
        bash scripts/run_gpu_study.sh "$@" > /tmp/gout$n/console.log 2>&1
    echo "== pass $n exit $? at $((SECONDS - start)) s"
}
pass 1 "$P1_S" "$base" --config "$new"
pass 2 "$P2_S" "$ql" --config "$new"
left=$((DEADLINE_S - (SECONDS - start)))
[ "$left" -gt 120 ] && pass 3 "$left" "$ql"
echo "== done at $((SECONDS - start)) s"
touch /tmp/gout.done
