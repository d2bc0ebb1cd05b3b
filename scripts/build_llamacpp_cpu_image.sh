#!/usr/bin/env bash
# Build the CPU llama.cpp engine image offline: the debootstrap base plus the xllamacpp wheel's
# package and gridbench's llama-server shim. Skips the build when the image holds this shim
# and this xllamacpp (its label says which): an image with an older shim would refuse the
# flags gridbench passes today.
# Usage: scripts/build_llamacpp_cpu_image.sh [IMAGE]   (run inside the venv that has xllamacpp)
set -euo pipefail
image=${1:-local/gridbench-llamacpp-cpu:latest}
base=local/debian-py:bookworm
here=$(cd "$(dirname "$0")/.." && pwd)
shim=$here/src/gridbench/testengines/xllamacpp_server.py
contents="$(sha256sum "$shim" | cut -c1-16)-xllamacpp-$(python3 -c 'import importlib.metadata as m; print(m.version("xllamacpp"))')"
if [ "$(docker image inspect -f '{{ index .Config.Labels "gridbench.contents" }}' "$image" 2>/dev/null)" = "$contents" ]; then
    echo "engine image $image present ($contents); not rebuilding"
    exit 0
fi
bash "$here/scripts/build_base_image.sh" "$base"
context=$(mktemp -d /tmp/gridbench-llamacpp-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
site=$(python3 -c 'import pathlib, xllamacpp; print(pathlib.Path(xllamacpp.__file__).parent)')
mkdir -p "$context/site"
cp -r "$site" "$context/site/"
rm -rf "$context/site/xllamacpp/__pycache__"
cp "$shim" "$context/xllamacpp_server.py"
cat > "$context/Dockerfile" <<DOCKERFILE
FROM $base
COPY site /opt/engine/site
COPY xllamacpp_server.py /opt/engine/xllamacpp_server.py
ENV PYTHONPATH=/opt/engine/site PYTHONUNBUFFERED=1
ENTRYPOINT ["python3", "/opt/engine/xllamacpp_server.py"]
LABEL gridbench.contents=$contents
DOCKERFILE
echo "building $image ($contents)"
docker build -q -t "$image" "$context" >/dev/null
echo "built $image"
