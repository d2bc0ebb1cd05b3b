#!/usr/bin/env bash
# The H200 study in one command, on a GPU machine with nvcc, CMake and Ninja but no package
# registry (everything it lacks comes in the carry folder of scripts/prepare_device_carry.sh):
#   1. install the carried wheels into a private folder (PYTHONPATH), gridbench from src/;
#   2. build llama.cpp with CUDA, or reuse a build (carried, or left by an earlier run),
#      writing the F16 model meanwhile;
#   3. quantize the models (scripts/prepare_gpu_models.sh);
#   4. run the study through Snakemake, stopped in time to pack whatever happens;
#   5. pack results/, dataset/, graphs/, comparison.md and logs/ into $OUT.
# Every step's time goes to the log and to logs/gpu/timings.tsv.
#   usage: OUT=DIR bash scripts/run_gpu_study.sh [SNAKEMAKE_ARGS...]
#          (e.g. --config config=F16_none,Q4_0_none to run only those configs)
#   env:   CARRY         the carry folder (.device-carry)
#          STUDY_CONFIG  the study's config files, merged in order (config/studies/h200-llamacpp.yaml)
#          BUDGET_S      seconds this script may take in all (570); the sweep is stopped
#                        PACK_S (40) before that
# $OUT receives at most 8 files: run.log, study.tar.gz, dataset.csv, comparison.md and,
# when this run built llama.cpp, llamacpp-cuda-bin.tar.gz (split into .part-* pieces of
# 15 MiB when larger: 4 for the CUDA build) to carry next time instead of building again.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-$PWD/gpu-study-out}
carry=${CARRY:-.device-carry}
read -ra configs <<< "${STUDY_CONFIG:-config/studies/h200-llamacpp.yaml}"
budget=${BUDGET_S:-570}
pack_s=${PACK_S:-40}
site=${GRIDBENCH_SITE:-/tmp/gridbench-site}
llamacpp=resources/llamacpp-cuda
mkdir -p "$out" logs/gpu
exec > >(tee -a "$out/run.log") 2>&1
tee_pid=$!
timings=logs/gpu/timings.tsv
: > "$timings"

# timed NAME CMD...: run CMD, log and record its wall time and exit code
timed() {
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name ($(date +%T))"
    "$@"
    rc=$?
    printf '%s\t%d\t%d\n' "$name" $((SECONDS - start)) "$rc" >> "$timings"
    echo "== $name: $((SECONDS - start)) s, exit $rc"
    return "$rc"
}

machine() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    nvcc --version | tail -2
    cmake --version | head -1
    echo "ninja $(ninja --version)"
    python3 --version
    echo "$(nproc) cores, $(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo) GiB now, $(df -h --output=avail . | tail -1) free disk"
}

python_env() {
    if compgen -G "$carry/whl/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "$carry"/whl/*.whl || return 1
    fi
    # gridbench itself runs from this tree's src/ (no build tools needed), by the same
    # entry point its console script has
    mkdir -p "$site/bin"
    printf '#!%s\nimport sys\nfrom gridbench.cli import main\nsys.exit(main())\n' "$(command -v python3)" \
        > "$site/bin/gridbench"
    chmod +x "$site/bin/gridbench"
    use_python_env
    python3 -c 'import gridbench, snakemake, gguf, llama_benchy, jsonschema' &&
        snakemake --version && command -v gridbench llama-benchy
}

use_python_env() {
    export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
}

unpack_carried_build() {
    [ -x "$llamacpp/bin/llama-server" ] && return 0
    compgen -G "$carry/llamacpp-cuda-bin.tar.gz*" > /dev/null || return 0
    mkdir -p "$llamacpp"
    cat "$carry"/llamacpp-cuda-bin.tar.gz* | tar -xz -C "$llamacpp"
}

llama_cpp() {
    local src
    src=$(compgen -G "$carry/llama.cpp-src-*.tar.gz" | head -1)
    if [ -z "$src" ]; then # no sources: only a carried build will do
        "$llamacpp/bin/llama-server" --version
        return
    fi
    bash scripts/build_llamacpp_cuda.sh "$src" || return 1
    # a fresh build goes back with the results, to be carried next time
    if [ "$(cat "$llamacpp/bin/BUILD_STAMP")" != "$(cat "$llamacpp/bin/.carried" 2>/dev/null)" ]; then
        tar -czf "$out/llamacpp-cuda-bin.tar.gz" -C "$llamacpp" bin
        if [ "$(stat -c %s "$out/llamacpp-cuda-bin.tar.gz")" -gt $((15 * 1048576)) ]; then
            split -b 15M -d "$out/llamacpp-cuda-bin.tar.gz" "$out/llamacpp-cuda-bin.tar.gz.part-"
            rm "$out/llamacpp-cuda-bin.tar.gz"
        fi
        ls -l "$out"/llamacpp-cuda-bin.tar.gz*
    fi
}

sweep() {
    local left=$((budget - SECONDS - pack_s))
    if [ "$left" -lt 60 ]; then
        echo "only $left s left for the sweep: skipped"
        return 1
    fi
    echo "the sweep may take $left s"
    # SIGINT lets Snakemake stop its jobs and run its onerror handler (engines stopped)
    timeout --signal=INT --kill-after=20 "$left" \
        snakemake -j1 --scheduler greedy --configfile "${configs[@]}" "$@"
}

finish() {
    gridbench engine stop --all
    if [ ! -s dataset/dataset.csv ]; then
        # the sweep stopped early or cells failed: the dataset of what exists, by the
        # same command the workflow's build_dataset rule runs
        local grid
        grid=$(ls -t .gridbench/grid-*.json 2>/dev/null | head -1)
        [ -n "$grid" ] && gridbench dataset --grid "$grid" --csv dataset/dataset.csv \
            --json dataset/dataset.json --parquet dataset/dataset.parquet
    fi
    [ -s dataset/dataset.csv ] && python3 - << 'SUMMARY'
import pandas as pd

frame = pd.read_csv("dataset/dataset.csv")
wanted = ["config", "context_tokens", "status", "decode_tps", "ttft_ms", "prefill_tps",
          "acceptance_rate", "mean_acceptance_length", "engine_startup_s"]
print(frame[[c for c in wanted if c in frame.columns]].to_string(index=False))
SUMMARY
}

pack() {
    local paths=()
    for path in results dataset graphs comparison.md report.html logs .gridbench/grid-*.json \
        resources/models/h200/weight_gb.tsv resources/models/h200/SHAPE resources/models/h200/quantize-*.log \
        "$llamacpp"/cmake-*.log "$llamacpp"/bin/BUILD_STAMP; do
        [ -e "$path" ] && paths+=("$path")
    done
    tar -czf "$out/study.tar.gz" "${paths[@]}"
    [ -s dataset/dataset.csv ] && cp dataset/dataset.csv "$out/"
    [ -s comparison.md ] && cp comparison.md "$out/"
    ls -l "$out"
}

echo "gridbench GPU study: ${configs[*]}, budget $budget s, carry $carry, out $out"
timed machine machine
if timed python_env python_env; then # (its PATH and PYTHONPATH stay set)
    timed unpack_carried_build unpack_carried_build
    [ -f "$llamacpp/bin/BUILD_STAMP" ] && cp "$llamacpp/bin/BUILD_STAMP" "$llamacpp/bin/.carried"
    # the F16 model needs no llama.cpp: write it while llama.cpp builds
    timed model_f16 bash scripts/prepare_gpu_models.sh --f16-only > logs/gpu/model_f16.log 2>&1 &
    f16_pid=$!
    timed llama_cpp llama_cpp
    built=$?
    wait "$f16_pid"
    cat logs/gpu/model_f16.log
    if [ "$built" -eq 0 ] && timed models bash scripts/prepare_gpu_models.sh; then
        timed sweep sweep "$@"
    fi
    timed finish finish
fi
timed pack pack
echo "done in $SECONDS s"
exec >&- 2>&-
wait "$tee_pid" # run.log complete before the command returns
