#!/usr/bin/env bash
# Cells measured on another machine (a GPU loan that ended, another node, a committed
# study) brought into this working directory, so that the next Snakemake run measures only
# the cells still missing.
#
# Snakemake reruns a cell whose inputs are newer than its result, or are made by a job of
# this run; on a new machine the models, the corpus and the engine checks are all new. So
# this machine's own checks and assets are made first (`--until check_engine`: every
# engine is checked here, as it must be), then the results are copied and given the time of
# now: newer than every input, and without Snakemake metadata, they are kept. A cell this
# machine measured itself is never overwritten. Failure records are not brought: a cell
# that failed elsewhere runs again. Run it again after more of the study's inputs exist
# (a later engine's build): it checks that engine too and dates the brought cells anew.
#   usage: scripts/restore_results.sh FROM SNAKEMAKE_ARGS...
#          FROM: a folder holding results/ of every cell kind (e.g. studies/h200-vllm)
#          SNAKEMAKE_ARGS: the study's, e.g. --configfile config/studies/h200-vllm.yaml
set -euo pipefail

from=${1:?usage: $0 FROM SNAKEMAKE_ARGS...}
shift
[ -d "$from/results" ] || { echo "no results/ in $from" >&2; exit 1; }
snakemake -j1 --quiet rules --until check_engine "$@" ||
    echo "an engine check failed: its cells will not run (see logs/preflight/)" >&2
# every cell kind's folder (results/raw, results/natural, results/load, ...), as the kinds
# name them (gridbench.cells.kinds.result_folders)
read -ra folders <<< "$(python3 -c 'from gridbench.cells.kinds import result_folders; print(*result_folders())')"
[ ${#folders[@]} -gt 0 ] || { echo "gridbench named no result folders" >&2; exit 1; }
for folder in "${folders[@]}"; do
    [ -d "$from/$folder" ] || continue
    mkdir -p "$folder"
    cp -rn "$from/$folder/." "$folder/"
    (cd "$from" && find "$folder" -type f) | while read -r file; do
        touch "$file"
    done
done
kept=$(find "${folders[@]}" -name '*.json' ! -name '*.provenance.json' 2> /dev/null | wc -l || true)
echo "$kept cells are measured already (brought from $from or measured here)"
