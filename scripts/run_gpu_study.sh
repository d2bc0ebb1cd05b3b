#!/usr/bin/env bash
# A GPU study in one command, on a GPU machine with nvcc, CMake and Ninja but no package
# registry (everything it lacks comes in the carry folder of scripts/prepare_device_carry.sh):
#   0. reassemble the carry folder from its stashed pieces, if scripts/device_carry.sh
#      stashed some (pieces of a carry sent in several transfers);
#   1. install the carried wheels into a private folder (PYTHONPATH), vllm too when carried,
#      gridbench from src/;
#   2. build llama.cpp with CUDA, or reuse a build (carried, or left by an earlier run);
#   3. write the study's models (scripts/prepare_gpu_models.sh --study STUDY);
#   4. bring back trained drafts (draft-*.tar.gz in the carry) and results (RESULTS_FROM) an
#      earlier run made, so only missing cells run and no head is trained again;
#   5. run the study through Snakemake, stopped in time to pack whatever happens;
#   6. build the dataset and report of every cell measured so far, pack them into $OUT.
# What a warm machine already holds (the install, the build, the models) is reused.
# Every step's time goes to the log and to logs/gpu/timings.tsv.
#   usage: OUT=DIR bash scripts/run_gpu_study.sh [SNAKEMAKE_ARGS...]
#          (e.g. --config config=F16_none,Q4_0_none to run only those configs)
#   env:   STUDY         config/studies/$STUDY.yaml and its models (h200-llamacpp)
#          STUDY_CONFIG  config files merged in order, instead of STUDY's alone
#          CARRY         the carry folder (.device-carry)
#          RESULTS_FROM  a folder with results/ of an earlier run of the study (e.g. the
#                        committed studies/$STUDY); its cells are kept, not measured again
#                        (scripts/restore_results.sh)
#          WHILE_BUILDING  Snakemake arguments of a first pass that runs while llama.cpp
#                        builds in the background (configs that need no llama.cpp, e.g.
#                        "--config config=V_bf16_none,V_bf16_self4"); unset, the build
#                        comes first
#          BUDGET_S      seconds this script may take in all (570); the sweep is stopped
#                        PACK_S (40) before that, and begins no engine start that would not
#                        be ready by then (GRIDBENCH_DEADLINE, gridbench.engines.deadline)
#          CAPACITY_SEARCH  1: after the sweep, `gridbench load-search` bisects each config's
#                        capacity under the study's SLO (its probes are load cells, each
#                        an engine lease of its own), then the sweep renders them
# Exits non-zero, after packing what there is, when a step failed or no cell was measured.
# $OUT receives at most 8 files: run.log, study.tar.gz, dataset.csv, comparison.md and,
# when this run built llama.cpp, llamacpp-cuda-bin.tar.gz (split into .part-* pieces of
# 15 MiB when larger: 4 for the CUDA build) to carry next time instead of building again;
# where room is left, engine-cache.tar.gz (the engines' compile caches, .part-* pieces too),
# which a later run finds in the carry folder and unpacks.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-$PWD/gpu-study-out}
carry=${CARRY:-.device-carry}
study=${STUDY:-h200-llamacpp}
read -ra configs <<< "${STUDY_CONFIG:-config/studies/$study.yaml}"
budget=${BUDGET_S:-570}
pack_s=${PACK_S:-40}
site=${GRIDBENCH_SITE:-/tmp/gridbench-site}
llamacpp=resources/llamacpp-cuda
engine_cache=resources/engine-cache
mkdir -p "$out" logs/gpu
exec > >(tee -a "$out/run.log") 2>&1
tee_pid=$!
timings=logs/gpu/timings.tsv
touch "$timings"
first_timing=$(($(wc -l < "$timings") + 1)) # the file keeps earlier runs' rows

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

# informational, so it always succeeds (its last command is an echo): a missing nvidia-smi
# or nvcc shows here, and fails the steps that need them
machine() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    nvcc --version | tail -2
    cmake --version | head -1
    echo "ninja $(ninja --version)"
    python3 --version
    echo "$(nproc) cores, $(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo) GiB now, $(df -h --output=avail . | tail -1) free disk"
}

carried() {
    [ -f "${CARRY_STASH:-/tmp/gridbench-carry}/MANIFEST" ] || return 0
    bash scripts/device_carry.sh unpack "$carry" "${CARRY_STASH:-/tmp/gridbench-carry}"
}

# wrapper NAME MODULE: a console script in $site/bin that runs MODULE's main() with this python
wrapper() {
    # the __main__ guard: vLLM's engine core is a spawned process, which imports this again
    printf '#!%s\nimport sys\nfrom %s import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
        "$(command -v python3)" "$2" > "$site/bin/$1"
    chmod +x "$site/bin/$1"
}

python_env() {
    local wheels_stamp vllm_tarball
    mkdir -p "$site/bin"
    wheels_stamp=$(ls "$carry"/whl/*.whl 2> /dev/null | xargs -r -n1 basename | sha256sum | cut -c1-16)
    if [ "$(cat "$site/.wheels" 2> /dev/null)" != "$wheels_stamp" ] && compgen -G "$carry/whl/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "$carry"/whl/*.whl || return 1
        echo "$wheels_stamp" > "$site/.wheels"
    fi
    vllm_tarball=$(compgen -G "$carry/vllm-*-hopper.tar.xz" | head -1)
    if [ -n "$vllm_tarball" ] && [ "$(cat "$site/.vllm" 2> /dev/null)" != "$(basename "$vllm_tarball")" ]; then
        tar -xJf "$vllm_tarball" -C "$site" || return 1
        basename "$vllm_tarball" > "$site/.vllm"
    fi
    # gridbench itself runs from this tree's src/ (no build tools needed), by the same
    # entry point its console script has; vllm by its own
    wrapper gridbench gridbench.cli
    [ -f "$site/.vllm" ] && wrapper vllm vllm.entrypoints.cli.main
    use_python_env
    python3 -c 'import gridbench, snakemake, gguf, llama_benchy, jsonschema' &&
        snakemake --version && command -v gridbench llama-benchy || return 1
    if [ -f "$site/.vllm" ]; then
        python3 -c 'import importlib.metadata as m; print("vllm", m.version("vllm"))'
    fi
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

# to_out NAME DIR PATH...: PATHs of DIR as $out/NAME, a gzipped tar, cut into NAME.part-*
# pieces of 15 MiB when larger (what one file back from a lent machine may be)
to_out() {
    local name=$1 dir=$2
    shift 2
    tar -czf "$out/$name" -C "$dir" "$@"
    if [ "$(stat -c %s "$out/$name")" -gt $((15 * 1048576)) ]; then
        split -b 15M -d "$out/$name" "$out/$name.part-"
        rm "$out/$name"
    fi
}

# the engines' compile caches an earlier loan packed (engine-cache.tar.gz, or its .part-*
# pieces): a start here loads what that loan compiled. Their folders are keyed by the engine's
# build and start (engines/compile_cache.py), so another vLLM or model never finds them; what
# this machine compiled itself is kept.
unpack_engine_cache() {
    compgen -G "$carry/engine-cache.tar.gz*" > /dev/null || return 0
    mkdir -p "$engine_cache"
    cat "$carry"/engine-cache.tar.gz* | tar -xz -C "$engine_cache" --skip-old-files
    echo "compile caches carried: $(find "$engine_cache" -mindepth 2 -maxdepth 2 -type d | wc -l) in $engine_cache"
}

# the compile caches, to carry to the next loan: in $out beside the study when they fit what
# comes back from it (OUT_FILES files of 16 MiB, OUT_MIB in all), else left behind, said so
pack_engine_cache() {
    local files mib
    [ -n "$(ls -A "$engine_cache" 2> /dev/null)" ] || return 0
    mib=$(($(du -sb "$engine_cache" | cut -f1) / 1048576))
    if [ "$mib" -gt $((${OUT_MIB:-64} * 4)) ]; then # not worth compressing to find out
        echo "the compile caches ($mib MiB) do not fit what comes back: left behind"
        return 0
    fi
    to_out engine-cache.tar.gz "$engine_cache" .
    files=$(ls "$out" | wc -l)
    mib=$(($(du -cb "$out"/* | tail -1 | cut -f1) / 1048576))
    if [ "$files" -gt "${OUT_FILES:-8}" ] || [ "$mib" -ge "${OUT_MIB:-64}" ]; then
        rm -f "$out"/engine-cache.tar.gz*
        echo "the compile caches do not fit what comes back ($files files, $mib MiB): left behind"
    fi
}

llama_cpp() {
    local src
    # a study without a llama.cpp engine neither builds nor checks one
    if [ -f "${configs[0]}" ] && ! grep -qE '^\s*kind:\s*llamacpp\b' "${configs[@]}"; then
        echo "no llama.cpp engine in the study: none built"
        return 0
    fi
    src=$(compgen -G "$carry/llama.cpp-src-*.tar.gz" | head -1)
    if [ -x "$llamacpp/bin/llama-server" ] && [ -f "$llamacpp/bin/.carried" ]; then
        # a carried build, or this machine's own from an earlier run: used if it sees the GPU
        # (--list-devices initialises CUDA, so a missing library or a kernel image the
        # driver rejects shows here rather than in every llama.cpp cell)
        local devices
        devices=$("$llamacpp/bin/llama-server" --list-devices 2>&1) || true
        echo "$devices"
        [[ $devices == *CUDA0* ]] && return 0
        echo "the llama.cpp build in $llamacpp/bin does not run here: building it from the sources"
        rm -rf "$llamacpp/bin"
    fi
    [ -n "$src" ] || { echo "no llama.cpp build runs here and $carry has no sources" >&2; return 1; }
    if [ -n "${WHILE_BUILDING:-}" ] && [ "${1:-}" != --wait ]; then
        # niced, and leaving cores free: the engine measuring meanwhile keeps the CPU it needs
        JOBS=$(($(nproc) * 3 / 4)) nice -n 19 bash scripts/build_llamacpp_cuda.sh "$src" \
            > logs/gpu/llamacpp_build.log 2>&1 &
        build_pid=$!
        echo "building llama.cpp in the background (logs/gpu/llamacpp_build.log)"
        return 0
    fi
    if [ -n "${build_pid:-}" ]; then
        wait "$build_pid" || { tail -40 logs/gpu/llamacpp_build.log; return 1; }
    else
        bash scripts/build_llamacpp_cuda.sh "$src" || return 1
    fi
    # a fresh build goes back with the results, to be carried next time
    if [ "$(cat "$llamacpp/bin/BUILD_STAMP")" != "$(cat "$llamacpp/bin/.carried" 2>/dev/null)" ]; then
        to_out llamacpp-cuda-bin.tar.gz "$llamacpp" bin
        ls -l "$out"/llamacpp-cuda-bin.tar.gz*
    fi
}

# trained drafts an earlier loan exported (gridbench draft export; draft-NAME.tar.gz in the carry
# folder, or its .part-* pieces): each target built by the workflow, then the draft unpacked
# where the workflow finds it trained. A draft that trains on another's data comes after that
# one's archive, which name order does not give: its import says so.
carried_drafts() {
    local archive parts targets
    for archive in $(compgen -G "$carry/draft-*.tar.gz*" | sed -E 's/\.part-[0-9]+$//' | sort -u); do
        read -ra parts <<< "$(compgen -G "$archive" || compgen -G "$archive.part-*" | sort | xargs)"
        targets=$(gridbench draft import --targets "${parts[@]}") || return 1
        # targets first: --quiet and --configfile take every word after them (Snakemake 9)
        # shellcheck disable=SC2086 # the target's paths, one a line
        snakemake -j1 $targets --quiet rules --configfile "${configs[@]}" || return 1
        gridbench draft import "${parts[@]}" || return 1
    done
}

earlier_results() { # earlier_results [SNAKEMAKE_ARGS...]: for the configs whose inputs exist
    [ -n "${RESULTS_FROM:-}" ] || return 0
    bash scripts/restore_results.sh "$RESULTS_FROM" --configfile "${configs[@]}" "$@"
}

sweep() {
    local left=$((budget - SECONDS - pack_s))
    if [ "$left" -lt 60 ]; then
        echo "only $left s left for the sweep: skipped"
        return 1
    fi
    echo "the sweep may take $left s"
    # SIGINT lets Snakemake stop its jobs and run its onerror handler (engines stopped); an
    # engine start that would not be ready by then is not begun (gridbench.engines.deadline)
    GRIDBENCH_DEADLINE=$(($(date +%s) + left)) timeout --signal=INT --kill-after=20 "$left" \
        snakemake -j1 --scheduler greedy --configfile "${configs[@]}" "$@"
}

# capacity_search [SNAKEMAKE_ARGS...]: the load section's capacity search, stopped in time to
# render and pack; a stopped search resumes next run (its probes' raw files are read back)
capacity_search() {
    local left=$((budget - SECONDS - pack_s - 30)) files=()
    if [ "$left" -lt 60 ]; then
        echo "only $left s left for the capacity search: skipped"
        return 1
    fi
    for config in "${configs[@]}"; do files+=(--configfile "$config"); done
    echo "the capacity search may take $left s"
    GRIDBENCH_DEADLINE=$(($(date +%s) + left)) timeout --signal=INT --kill-after=20 "$left" \
        gridbench load-search "${files[@]}" "$@"
}

# where this run's dataset and report are: partial/dataset, where a failed sweep leaves them
# (the workflow's onerror), else the workflow's own dataset/
dataset_dir() {
    if [ -d partial ]; then echo partial/dataset; else echo dataset; fi
}

finish() {
    local grid
    gridbench engine stop --all
    # a sweep stopped too hard for its onerror handler: the dataset, graphs and report of every
    # cell measured so far, by the command that handler runs, into the folder it writes. Never
    # into the workflow's own outputs: a later run would find them and measure nothing more.
    grid=$(ls -t .gridbench/grid-*.json 2> /dev/null | head -1)
    if [ -n "$grid" ] && [ ! -s dataset/comparison.md ] && [ ! -s partial/dataset/comparison.md ]; then
        gridbench finalize --grid "$grid" --outdir partial
    fi
    # no dataset is no failure of this step: the verdict at the end reports nothing measured
    [ -s "$(dataset_dir)/dataset.csv" ] || return 0
    DATASET="$(dataset_dir)/dataset.csv" python3 - << 'SUMMARY'
import os

import pandas as pd

frame = pd.read_csv(os.environ["DATASET"])
wanted = ["config", "context_tokens", "status", "decode_tps", "ttft_ms", "prefill_tps",
          "acceptance_rate", "mean_acceptance_length", "engine_startup_s"]
print(frame[[c for c in wanted if c in frame.columns]].to_string(index=False))
SUMMARY
}

pack() {
    local paths=()
    for path in results dataset graphs partial report.html logs .gridbench/grid-*.json \
        resources/models/*/weight_gb.tsv resources/models/*/SHAPE resources/models/*/quantize-*.log \
        resources/models/*/MANIFEST.json resources/models/*/*/MANIFEST.json resources/models/*/*/hf-*/MANIFEST.json \
        resources/drafts/*/RECIPE.json resources/drafts/*/steps resources/drafts/*/train_metrics.jsonl \
        "$llamacpp"/cmake-*.log "$llamacpp"/bin/BUILD_STAMP; do
        [ -e "$path" ] && paths+=("$path")
    done
    tar -czf "$out/study.tar.gz" "${paths[@]}"
    [ -s "$(dataset_dir)/dataset.csv" ] && cp "$(dataset_dir)/dataset.csv" "$out/"
    [ -s "$(dataset_dir)/comparison.md" ] && cp "$(dataset_dir)/comparison.md" "$out/"
    pack_engine_cache
    ls -l "$out"
}

echo "gridbench GPU study $study: ${configs[*]}, budget $budget s, carry $carry, out $out"
timed machine machine
if timed carry carried && timed python_env python_env; then # (its PATH and PYTHONPATH stay set)
    timed unpack_carried_build unpack_carried_build
    timed unpack_engine_cache unpack_engine_cache
    [ -f "$llamacpp/bin/BUILD_STAMP" ] && [ ! -f "$llamacpp/bin/.carried" ] &&
        cp "$llamacpp/bin/BUILD_STAMP" "$llamacpp/bin/.carried"
    # the models that need no llama.cpp are written while llama.cpp builds
    timed models_first bash scripts/prepare_gpu_models.sh --study "$study" --no-quantize \
        > logs/gpu/models_first.log 2>&1 &
    models_pid=$!
    build_pid=
    timed llama_cpp llama_cpp
    built=$?
    wait "$models_pid"
    cat logs/gpu/models_first.log
    if [ -n "$build_pid" ]; then
        # shellcheck disable=SC2086 # WHILE_BUILDING is a list of arguments
        timed earlier_results earlier_results $WHILE_BUILDING
        # shellcheck disable=SC2086
        timed sweep_while_building sweep $WHILE_BUILDING
        timed llama_cpp llama_cpp --wait
        built=$?
    fi
    if [ "$built" -eq 0 ] && timed models bash scripts/prepare_gpu_models.sh --study "$study" &&
        timed carried_drafts carried_drafts; then
        timed earlier_results earlier_results
        timed sweep sweep "$@"
        if [ "${CAPACITY_SEARCH:-}" = 1 ]; then
            # the dataset and report with the probed rates (the search measures, the sweep renders)
            timed capacity_search capacity_search "$@" && timed render sweep "$@"
        fi
    fi
    timed finish finish
fi
timed pack pack

# the run fails when a step failed or no cell was measured
failed=$(tail -n +"$first_timing" "$timings" | awk -F '\t' '$3 != 0 && !seen[$1]++ { print $1 }' | xargs)
measured=$(python3 -c 'import csv, sys; print(sum(r.get("status") == "ok" for r in csv.DictReader(open(sys.argv[1]))))' \
    "$(dataset_dir)/dataset.csv" 2> /dev/null || echo 0)
verdict=${failed:+failed steps: $failed}
[ "$measured" -gt 0 ] || verdict="${verdict:+$verdict; }no cell measured (no ok row in $(dataset_dir)/dataset.csv)"
if [ -n "$verdict" ]; then
    echo "FAILED in $SECONDS s: $verdict"
else
    echo "done in $SECONDS s: $measured cells ok"
fi
exec >&- 2>&-
wait "$tee_pid" # run.log complete before the command returns
[ -z "$verdict" ]
