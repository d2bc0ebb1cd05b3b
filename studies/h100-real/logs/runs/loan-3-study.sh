#!/usr/bin/env bash
# one study command of this loan: the real-model study's load, capacity, bursty and session
# overlays on the card this machine has (H100 -> studies/h100-real, else studies/h200-real)
set -u
card=h200 extra=
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then card=h100 extra=config/studies/on-h100.yaml; fi
export STUDY=h200-real RESULTS_FROM=.loan/$card-real CAPACITY_SEARCH=1
export STUDY_CONFIG="config/studies/h200-real.yaml $extra config/studies/h200-real-quality-load.yaml config/studies/h200-real-capacity.yaml config/studies/h200-real-bursty.yaml config/studies/h200-real-sessions.yaml ${MORE:-}"
export WHILE_BUILDING="--config config=${FIRST:-R_bf16_none}"
echo "card $card; configs ${CONFIGS:-R_bf16_none,L_q4_1_none}"
bash scripts/run_gpu_study.sh --config "config=${CONFIGS:-R_bf16_none,L_q4_1_none}"
