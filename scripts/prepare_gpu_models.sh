#!/usr/bin/env bash
# The GPU study's models, offline: a ~3 B-parameter random-weight llama in Llama-3.2-3B's
# shape (3072 wide, 28 layers, FFN 8192, 24 heads of 128, 8 K/V heads; 1168-token vocab),
# written in F16 by gridbench's own generator (streamed: memory stays flat), then
# llama-quantize'd to Q8_0 and Q4_0. The Q4_0 copy is also the draft model: the same weights,
# so it agrees with every target on nearly every token. Its token embedding and output
# matrix stay Q8_0: these random models pick the next token mostly from those two (see
# gridbench/assets/gguf_model.py), and at 4 bits the greedy next token would differ from
# F16's for about one token in five, at 8 bits for one in fifty; a token reads only one
# embedding row, and the output matrix is 0.2 % of the bytes, so decode speed stays Q4_0's.
# Plus the matching tokenizer.json, and weight_gb.tsv: GB of weights one decoded token
# reads, per file (the checkpoints' active_weight_gb).
# Idempotent: files of the same shape are kept; a changed shape starts over.
#   usage: scripts/prepare_gpu_models.sh [--f16-only] [OUTDIR]    (default resources/models/h200)
#   env:   LLAMA_QUANTIZE  (resources/llamacpp-cuda/bin/llama-quantize)
#          MODEL_SHAPE     generator flags (the 3 B shape above; a small one rehearses on a CPU)
# Needs the gridbench CLI on PATH; --f16-only skips what needs llama-quantize, so the
# generator can run while llama.cpp is still being built.
set -euo pipefail
cd "$(dirname "$0")/.."

f16_only=false
if [ "${1:-}" = --f16-only ]; then
    f16_only=true
    shift
fi
out=${1:-resources/models/h200}
quantize=${LLAMA_QUANTIZE:-resources/llamacpp-cuda/bin/llama-quantize}
shape=${MODEL_SHAPE:---n-embd 3072 --n-layer 28 --n-ff 8192 --head-dim 128 --n-head-kv 8 --n-ctx 32768}

mkdir -p "$out"
if [ "$(cat "$out/SHAPE" 2>/dev/null)" != "$shape" ]; then
    rm -f "$out"/*.gguf "$out/weight_gb.tsv"
    echo "$shape" > "$out/SHAPE"
fi
started=$SECONDS
[ -s "$out/tokenizer.json" ] || gridbench assets tokenizer --out "$out/tokenizer.json"
if [ ! -s "$out/target-f16.gguf" ]; then
    # shellcheck disable=SC2086 # the shape is a list of flags
    gridbench assets gguf --out "$out/target-f16.gguf" --file-type f16 $shape
    echo "generated target-f16.gguf in $((SECONDS - started)) s"
fi
$f16_only && exit 0

for type in Q8_0 Q4_0; do
    file="$out/target-${type,,}.gguf"
    [ -s "$file" ] && continue
    step=$SECONDS
    keep=()
    [ "$type" = Q4_0 ] && keep=(--token-embedding-type q8_0 --output-tensor-type q8_0)
    "$quantize" "${keep[@]}" "$out/target-f16.gguf" "$file.partial" "$type" "$(nproc)" \
        > "$out/quantize-${type,,}.log" 2>&1 || {
        tail -20 "$out/quantize-${type,,}.log" >&2
        rm -f "$file.partial"
        exit 1
    }
    mv "$file.partial" "$file"
    echo "quantized $type in $((SECONDS - step)) s"
done
gridbench assets weight-gb "$out"/target-f16.gguf "$out"/target-q8_0.gguf "$out"/target-q4_0.gguf \
    > "$out/weight_gb.tsv.partial"
mv "$out/weight_gb.tsv.partial" "$out/weight_gb.tsv"
ls -l "$out"
echo "GB of weights read per decoded token (file, GB):"
cat "$out/weight_gb.tsv"
echo "models ready in $out ($((SECONDS - started)) s)"
