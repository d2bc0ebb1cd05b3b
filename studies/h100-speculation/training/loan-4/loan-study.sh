# Prepared for loan 4 (2026-12-07), sent but not run (too little device time was left): the
# speculation study on whichever card the machine has (the H200 overlay on an H200). Extra
# arguments go to Snakemake. With HEAD_PIECES="00 01 …", the trained EAGLE-3 draft
# (resources/drafts/smollm2_eagle3 less its hidden states: both heads, prompts, answers, step
# records, metrics; `gridbench draft export`) goes back too, as those 15 MiB pieces of its
# .tar.gz, to be carried to the next loan instead of training again: after the study (before
# it with PIECES_FIRST=1; alone with PIECES_ONLY=1). With BLOCK_DRAFTS=1 the block drafters'
# overlay (config/studies/speculation-block-drafts.yaml) is merged last: their heads and configs.
extra=
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && extra=config/studies/speculation-on-h200.yaml
[ -n "${BLOCK_DRAFTS:-}" ] && extra="$extra config/studies/speculation-block-drafts.yaml"
export STUDY=h100-speculation STUDY_CONFIG="config/studies/h100-speculation.yaml $extra" BUDGET_S=${BUDGET_S:-570}
pieces=/tmp/draft-pieces
draft_pieces() {
    [ -n "${HEAD_PIECES:-}" ] && [ -f resources/drafts/smollm2_eagle3/RECIPE.json ] || return 0
    if [ ! -f $pieces/done ]; then
        mkdir -p $pieces
        PYTHONPATH="$PWD/src:/tmp/gridbench-site" python3 -m gridbench.cli draft export \
            --recipe .gridbench/drafts/smollm2_eagle3.json --out $pieces/draft-smollm2_eagle3.tar.gz &&
            split -b 15M -d $pieces/draft-smollm2_eagle3.tar.gz $pieces/draft-smollm2_eagle3.tar.gz.part- &&
            rm $pieces/draft-smollm2_eagle3.tar.gz && touch $pieces/done
        (cd $pieces && sha256sum draft-* > SHA256SUMS)
    fi
    mkdir -p "$OUT"
    cp $pieces/SHA256SUMS "$OUT/draft-SHA256SUMS"
    for piece in $HEAD_PIECES; do
        cp $pieces/draft-smollm2_eagle3.tar.gz.part-"$piece" "$OUT/" 2> /dev/null || true
    done
}
[ -n "${PIECES_ONLY:-}" ] && { draft_pieces; ls -l "$OUT"; exit 0; }
[ -n "${PIECES_FIRST:-}" ] && draft_pieces
bash scripts/run_gpu_study.sh "$@"
rc=$?
[ -z "${PIECES_FIRST:-}" ] && draft_pieces
ls -l "$OUT"
exit $rc
