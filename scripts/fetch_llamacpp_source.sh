#!/usr/bin/env bash
# llama.cpp's sources as the llama-cpp-python sdist on PyPI vendors them (vendor/llama.cpp),
# trimmed to what a build of llama-server and llama-quantize needs (no docs/, benches/,
# media/ or models/*.gguf; app/ and tools/ stay), as one tarball of about 12 MB. Run it
# where pip reaches PyPI; carry the tarball to the GPU machine and build there with
# scripts/build_llamacpp_cuda.sh. Idempotent: an existing tarball is kept.
#   usage: scripts/fetch_llamacpp_source.sh [OUTDIR]      (default resources/llamacpp-cuda)
# Prints the tarball's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

# The sdist this was tested with, and its digest: another version needs LLAMA_CPP_PYTHON_SHA256 too.
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
sha256=${LLAMA_CPP_PYTHON_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}
outdir=${1:-resources/llamacpp-cuda}
tarball="$outdir/llama.cpp-src-lcp$version.tar.gz"

if [ -s "$tarball" ]; then
    echo "$tarball"
    exit 0
fi
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "downloading the llama-cpp-python $version sdist from PyPI" >&2
"$python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$tmp/sdist" "llama-cpp-python==$version" >&2
sdist=$(ls "$tmp"/sdist/llama_cpp_python-"$version".tar.gz)
echo "$sha256  $sdist" | sha256sum -c --quiet - >&2 || {
    echo "the sdist's sha256 is not $sha256: set LLAMA_CPP_PYTHON_SHA256 for version $version" >&2
    exit 1
}

mkdir -p "$tmp/llama.cpp"
tar -xzf "$sdist" -C "$tmp/llama.cpp" --strip-components=3 "llama_cpp_python-$version/vendor/llama.cpp"
(
    cd "$tmp/llama.cpp"
    rm -rf docs benches media
    find models -name '*.gguf' -delete
    printf 'llama.cpp as vendored by llama-cpp-python %s (sdist sha256 %s), trimmed by gridbench %s\n' \
        "$version" "$sha256" "scripts/fetch_llamacpp_source.sh" > GRIDBENCH_SOURCE
)
mkdir -p "$outdir"
# reproducible (sorted, fixed owners and times, no gzip timestamp): a build's stamp holds the
# tarball's digest, so a re-fetched tarball still matches a build carried from elsewhere
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - -C "$tmp" llama.cpp |
    gzip -n > "$tmp/src.tar.gz"
mv "$tmp/src.tar.gz" "$tarball"
echo "wrote $tarball ($(du -h "$tarball" | cut -f1))" >&2
echo "$tarball"
