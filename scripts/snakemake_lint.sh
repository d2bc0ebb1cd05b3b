#!/usr/bin/env bash
# snakemake --lint, accepting exactly one suggestion on purpose: rules have no conda env or
# container, because they call the gridbench CLI of the project's own environment and the
# engines bring their own images (config/README.md). Any other lint fails.
set -uo pipefail
out=$(snakemake --lint "$@" 2>&1)
lints=$(printf '%s\n' "$out" | grep -E '^    \* ' | sort -u)
other=$(printf '%s\n' "$lints" | grep -v 'Specify a conda environment or container for each rule' || true)
if [ -n "$other" ]; then
    printf '%s\n' "$out"
    echo "snakemake --lint: unexpected lints:" >&2
    printf '%s\n' "$other" >&2
    exit 1
fi
echo "snakemake --lint: clean (apart from the documented conda/container suggestion)"
