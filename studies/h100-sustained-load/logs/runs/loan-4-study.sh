#!/usr/bin/env bash
# loan 4: vLLM's capacity under sustained load (config/studies/h100-sustained-load.yaml),
# on the card this machine has (on-h100.yaml's hardware on an H100)
set -u
extra=
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && extra=config/studies/on-h100.yaml
export STUDY=h200-real CAPACITY_SEARCH=1
export STUDY_CONFIG="config/studies/h200-real.yaml $extra config/studies/h100-sustained-load.yaml"
export WHILE_BUILDING="--config config=R_bf16_none"
bash scripts/run_gpu_study.sh --config config=R_bf16_none
