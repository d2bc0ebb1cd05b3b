#!/usr/bin/env bash
# loan 4: the open loop's schedule lag on this host's CPUs (benchmarks/load_schedule.py),
# against the paced server with batched token clocks, at the study's rates
set -u
export PYTHONPATH="$PWD/src:/tmp/gridbench-site" PATH="/tmp/gridbench-site/bin:$PATH"
nproc
for rate in ${RATES:-64 256 1024}; do
    requests=$(python3 -c "print(max(1000, int($rate * 5)))")
    echo "== rate $rate, $requests requests"
    python3 benchmarks/load_schedule.py --rate "$rate" --requests "$requests" --processes 1,auto \
        --batched --server-processes 4 --tokens 32
done 2>&1 | tee "$OUT/lag.log"
