#!/usr/bin/env bash
# Build the CPU llama.cpp engine image offline: the debootstrap base plus the xllamacpp wheel's
# package and gridbench's llama-server shim. Skips the build when the image exists.
# Usage: scripts/build_llamacpp_cpu_image.sh [IMAGE]   (run inside the venv that has xllamacpp)
set -euo pipefail
image=${1:-local/gridbench-llamacpp-cpu:latest}
base=local/debian-py:bookworm
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "engine image $image present; not rebuilding"
    exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/build_base_image.sh" "$base"
context=$(mktemp -d /tmp/gridbench-llamacpp-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
site=$(python3 -c 'import pathlib, xllamacpp; print(pathlib.Path(xllamacpp.__file__).parent)')
mkdir -p "$context/site"
cp -r "$site" "$context/site/"
rm -rf "$context/site/xllamacpp/__pycache__"
cp "$here/src/gridbench/testengines/xllamacpp_server.py" "$context/xllamacpp_server.py"
cat > "$context/Dockerfile" <<DOCKERFILE
FROM $base
COPY site /opt/engine/site
COPY xllamacpp_server.py /opt/engine/xllamacpp_server.py
ENV PYTHONPATH=/opt/engine/site PYTHONUNBUFFERED=1
ENTRYPOINT ["python3", "/opt/engine/xllamacpp_server.py"]
DOCKERFILE
echo "building $image"
docker build -q -t "$image" "$context" >/dev/null
echo "built $image"
