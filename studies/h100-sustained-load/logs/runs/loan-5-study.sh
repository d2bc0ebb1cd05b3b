#!/usr/bin/env bash
# loan 5: vLLM's capacity under sustained load (config/studies/h100-sustained-load.yaml),
# the levels past saturation measured again now that each request records its accept wait;
# the others are loan 4's (RESULTS_FROM); on-h100.yaml's hardware on an H100
set -u
extra=
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && extra=config/studies/on-h100.yaml
export STUDY=h200-real CAPACITY_SEARCH=1 RESULTS_FROM=.loan/h100-load
export STUDY_CONFIG="config/studies/h200-real.yaml $extra config/studies/h100-sustained-load.yaml"
export WHILE_BUILDING="--config config=R_bf16_none"
bash scripts/run_gpu_study.sh --config config=R_bf16_none
