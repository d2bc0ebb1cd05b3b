#!/usr/bin/env bash
# The device takes 64 MiB a transfer: this checkout's working tree (tracked files and untracked
# ones git does not ignore) and one carried piece (scripts/device_carry.sh). The committed
# studies make the tree ~48 MiB, leaving room for 15 MiB pieces (17 transfers for the vLLM
# carry); leaving them out of the transfer leaves room for 59 MiB pieces (5 transfers).
#   scripts/device_slim_tree.sh on [KEEP...]   every studies/* folder but KEEP leaves the index
#                                              (its files stay on disk) and is ignored, so
#                                              it does not travel; prints the tree's size
#   scripts/device_slim_tree.sh off            puts them back in the index, as HEAD has them
# While it is on, commit only with paths (`git commit -- PATH...`): a plain commit would
# record the studies as deleted. `status` says whether it is on.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=.git/info/exclude
begin="# device_slim_tree.sh: begin" end="# device_slim_tree.sh: end"

tree_mib() {
    git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2> /dev/null |
        awk '{ s += $1 } END { printf "%.1f MiB\n", s / 1048576 }'
}

case ${1:-} in
on)
    shift
    if grep -qx "$begin" "$exclude" 2> /dev/null; then
        echo "already on; the tree that travels: $(tree_mib)"
        exit 0
    fi
    echo "$begin" >> "$exclude"
    for dir in studies/*/; do
        dir=${dir%/}
        [[ " $* " == *" ${dir#studies/} "* ]] && continue
        git ls-files --error-unmatch "$dir" > /dev/null 2>&1 || continue
        git rm -r --cached -q "$dir"
        echo "/$dir/" >> "$exclude"
    done
    echo "$end" >> "$exclude"
    echo "studies out of the transfer; the tree that travels: $(tree_mib)"
    ;;
off)
    sed -i "/^$begin\$/,/^$end\$/d" "$exclude"
    git reset -q -- studies
    echo "studies back in the index; the tree: $(tree_mib)"
    ;;
status)
    if grep -qx "$begin" "$exclude" 2> /dev/null; then echo on; else echo off; fi
    echo "the tree that travels: $(tree_mib)"
    ;;
*)
    echo "usage: $0 on [KEEP_STUDY...] | off | status" >&2
    exit 2
    ;;
esac
