#!/usr/bin/env bash
# Everything a GPU machine without a package registry needs for scripts/run_gpu_study.sh,
# gathered here where pip reaches PyPI, into one folder to copy (or carry) there:
#   DIR/llama.cpp-src-lcp*.tar.gz   llama.cpp's trimmed sources (scripts/fetch_llamacpp_source.sh)
#   DIR/whl/*.whl                   the Python packages the machine lacks (scripts/gpu-device-wheels.txt)
# A llama.cpp build that an earlier run packed (llamacpp-cuda-bin.tar.gz, or its .part-*
# pieces) may be added to DIR by hand: the run then reuses it instead of building.
# Idempotent: what is already there is kept.
#   usage: scripts/prepare_device_carry.sh [DIR]      (default .device-carry)
#   env:   PYTHON_VERSION (3.12), the target machine's Python
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-.device-carry}
pyver=${PYTHON_VERSION:-3.12}
python=${PYTHON:-python3}
mkdir -p "$dir/whl"

bash scripts/fetch_llamacpp_source.sh "$dir" > /dev/null

platforms=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
grep -Ev '^\s*(#|$)' scripts/gpu-device-wheels.txt | while read -r requirement; do
    name=${requirement%%==*}
    version=${requirement##*==}
    pattern="$(echo "$name" | tr - _)-$version-*.whl"
    # shellcheck disable=SC2086 # the pattern is globbed on purpose
    if compgen -G "$dir/whl/$pattern" > /dev/null || compgen -G "$dir/whl/$name-$version-*.whl" > /dev/null; then
        continue
    fi
    if ! "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$pyver" --implementation cp "${platforms[@]}" -d "$dir/whl" "$requirement" 2> /dev/null; then
        # no wheel on PyPI (a pure-Python sdist, e.g. connection-pool): build one
        "$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$dir/whl" "$requirement"
    fi
done
echo "carry folder $dir: $(du -sh "$dir" | cut -f1) ($(ls "$dir/whl" | wc -l) wheels)"
