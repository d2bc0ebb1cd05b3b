# Loan 3 (2026-12-06, night), as sent: the speculation study on whichever card the machine has
# (the H200 overlay on an H200; it was an H100); the block drafters' overlay left for later.
# Extra arguments go to Snakemake; it ran as `BUDGET_S=440 bash loan-study.sh --until draft_train`.
extra=
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && extra=config/studies/speculation-on-h200.yaml
export STUDY=h100-speculation STUDY_CONFIG="config/studies/h100-speculation.yaml $extra" BUDGET_S=${BUDGET_S:-570}
bash scripts/run_gpu_study.sh "$@"
