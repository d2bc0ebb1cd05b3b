#!/usr/bin/env bash
# pip for the GPU study machine (CPython 3.12, x86_64 manylinux), run from here; used by
# scripts/prepare_device_carry.sh and tests/test_gpu_carry.py so both see one target.
#   download INTO REQUIREMENT...   a cp312 manylinux (or pure) wheel of each pinned
#                                  REQUIREMENT, once: what INTO holds already is kept
#   resolve PIP_INSTALL_ARGS...    `pip install --dry-run` for that machine, offline: only the
#                                  --find-links given count, not this machine's packages,
#                                  index or pip configuration
#   env: PYTHON_VERSION (3.12), the target machine's Python; PYTHON (python3), pip's Python here
set -euo pipefail

pyver=${PYTHON_VERSION:-3.12}
python=${PYTHON:-python3}
target=(--only-binary=:all: --python-version "$pyver" --implementation cp)
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_5 manylinux1; do
    target+=(--platform "${tag}_x86_64")
done

download() { # download REQUIREMENT INTO
    local requirement=$1 into=$2 name version
    name=${requirement%%==*}
    version=${requirement##*==}
    if compgen -G "$into/$(echo "$name" | tr - _)-$version-*.whl" > /dev/null ||
        compgen -G "$into/$name-$version-*.whl" > /dev/null; then
        return 0
    fi
    if ! "$python" -m pip download -q --disable-pip-version-check --no-deps "${target[@]}" \
        -d "$into" "$requirement" 2> /dev/null; then
        # no wheel on PyPI (a pure-Python sdist, e.g. connection-pool): build one
        "$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$into" "$requirement"
    fi
}

case ${1:-} in
    download)
        into=$2
        shift 2
        mkdir -p "$into"
        for requirement in "$@"; do
            download "$requirement" "$into"
        done
        ;;
    resolve)
        shift
        # --target: pip allows a foreign platform only when installing elsewhere, even dry
        scratch=$(mktemp -d)
        trap 'rm -rf "$scratch"' EXIT
        PIP_CONFIG_FILE=/dev/null "$python" -m pip --isolated install --dry-run --no-index \
            --ignore-installed --disable-pip-version-check "${target[@]}" --target "$scratch" "$@"
        ;;
    *)
        echo "usage: $0 download INTO REQUIREMENT... | resolve PIP_INSTALL_ARGS..." >&2
        exit 2
        ;;
esac
