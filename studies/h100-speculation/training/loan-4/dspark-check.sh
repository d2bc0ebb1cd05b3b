# Loan 4 (2026-12-07), as sent, with too little device time left to train the study's head:
# does vLLM 0.26 on the GPU serve a DSpark head for SmolLM2-135M (a Llama-architecture target)?
# (vLLM 0.32's CPU build refuses: DSpark needs Model Runner V2.) The head is the CPU-trained
# prototype of 2026-12-06 (CI data sizes, block 8, 4 epochs), carried in .dspark-head/; the
# target is written by the workflow's own rule. Evidence only: no cell, no measurement.
# Loan 7 ran it again with DSPARK_HEAD (a 3-layer head) and DSPARK_K=8.
head=${DSPARK_HEAD:-.dspark-head}
STUDY=h100-speculation BUDGET_S=${BUDGET_S:-150} bash scripts/run_gpu_study.sh --until make_smollm2_hf
site=/tmp/gridbench-site
export PYTHONPATH="$PWD/src:$site" PATH="$site/bin:$PATH" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
start=$SECONDS
timeout "${SERVE_S:-300}" vllm serve resources/models/smollm2-135m-instruct/hf-q4_1 --port 18790 \
    --max-model-len 2048 --gpu-memory-utilization 0.3 --served-model-name smol \
    --speculative-config "{\"method\":\"dspark\",\"model\":\"$head\",\"num_speculative_tokens\":${DSPARK_K:-8}}" \
    ${DSPARK_SERVE_ARGS:-} \
    > "$OUT/dspark-serve.log" 2>&1 &
server=$!
until curl -sf localhost:18790/health > /dev/null; do
    kill -0 $server 2> /dev/null || { echo "vllm serve exited after $((SECONDS - start)) s"; tail -30 "$OUT/dspark-serve.log"; exit 1; }
    sleep 2
done
echo "healthy after $((SECONDS - start)) s"
for prompt in "Write a Python function that returns the n-th Fibonacci number." \
    "Explain step by step why the sum of two odd numbers is even." \
    "Hi! How are you today?" "Write a short story about a lighthouse keeper."; do
    curl -s localhost:18790/v1/chat/completions -H 'Content-Type: application/json' \
        -d "{\"model\":\"smol\",\"temperature\":0,\"max_tokens\":128,\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}]}" \
        >> "$OUT/dspark-answers.jsonl"
    echo >> "$OUT/dspark-answers.jsonl"
done
curl -s localhost:18790/metrics | grep -E '^vllm:spec_decode' > "$OUT/dspark-metrics.txt"
cat "$OUT/dspark-metrics.txt"
kill $server
wait $server
grep -m3 -iE "dspark|speculat|SpecDecoding metrics" "$OUT/dspark-serve.log"
