#!/usr/bin/env bash
# A carry folder (scripts/prepare_device_carry.sh) in pieces, for a machine that takes files
# in transfers too small for the whole: cut here, then there stash the pieces one at a time
# and verify and reassemble them.
#   scripts/device_carry.sh cut DIR                   DIR/pieces/c1 … cN: the folder as one tar
#                                                     stream, split into pieces that each fit
#                                                     one transfer beside the working tree,
#                                                     each with a MANIFEST of every piece's
#                                                     and the whole stream's sha256
#   scripts/device_carry.sh stash PIECE_DIR [STASH]   keep one piece (…/pieces/cK) in STASH,
#                                                     checked against its MANIFEST
#   scripts/device_carry.sh unpack DIR [STASH]        once every piece is there: check the
#                                                     whole stream's sha256, unpack it into DIR
# STASH (default /tmp/gridbench-carry) lives outside the checkout, so pieces sent by earlier
# commands stay while the machine does. Both steps are idempotent: a piece already stashed,
# or a stream already unpacked into DIR, is not done again; the stream is reproducible
# (sorted, fixed owners and times), so unchanged content is cut into the same pieces.
# A transfer brings TRANSFER_MIB (64) MiB: the checkout's working tree (tracked and untracked,
# not ignored, files) and one piece. A piece is what is left, less 1 MiB, unless PIECE_MIB says.
# Exit 3 from unpack: pieces missing.
set -euo pipefail

# piece_bytes: PIECE_MIB, or what one transfer holds beside this checkout's working tree
piece_bytes() {
    local transfer tree left
    if [ -n "${PIECE_MIB:-}" ]; then
        echo $((PIECE_MIB * 1048576))
        return 0
    fi
    transfer=$((${TRANSFER_MIB:-64} * 1048576))
    tree=$(cd "$(dirname "$0")/.." && git ls-files -z -co --exclude-standard |
        xargs -0 -r stat -c %s -- 2> /dev/null | awk '{ s += $1 } END { print s + 0 }')
    left=$((transfer - tree - 1048576))
    if [ "$left" -lt 1048576 ]; then
        echo "the working tree ($((tree / 1048576)) MiB) leaves no room for a piece in a transfer of" \
            "${TRANSFER_MIB:-64} MiB: ignore or move what need not travel, or set PIECE_MIB" >&2
        return 1
    fi
    echo $((left / 1048576 * 1048576))
}

cut_pieces() {
    local dir=$1 pieces=$1/pieces stream digest size count manifest n=0 part
    size=$(piece_bytes) || return 1
    stream=$(mktemp)
    tar -C "$dir" --exclude=./pieces --exclude=./.carry-stream --sort=name --owner=0 --group=0 \
        --numeric-owner --mtime=@0 -cf "$stream" .
    digest=$(sha256sum "$stream" | cut -d' ' -f1)
    if [ "$(sed -n 's/^stream //p' "$pieces/c1/MANIFEST" 2> /dev/null)" = "$digest" ] &&
        [ "$(sed -n 's/^piece_bytes //p' "$pieces/c1/MANIFEST")" = "$size" ]; then
        rm -f "$stream"
        return 0
    fi
    rm -rf "$pieces"
    mkdir -p "$pieces/split"
    split -b "$size" -d -a 3 "$stream" "$pieces/split/part-"
    rm -f "$stream"
    count=$(ls "$pieces/split" | wc -l)
    manifest=$(mktemp)
    {
        echo "stream $digest"
        echo "pieces $count"
        echo "piece_bytes $size"
        (cd "$pieces/split" && sha256sum part-*)
    } > "$manifest"
    for part in "$pieces"/split/part-*; do
        n=$((n + 1))
        mkdir "$pieces/c$n"
        mv "$part" "$pieces/c$n/"
        cp "$manifest" "$pieces/c$n/MANIFEST"
    done
    rmdir "$pieces/split"
    rm -f "$manifest"
}

stash_piece() {
    local piece=$1 stash=$2 part name
    [ -f "$piece/MANIFEST" ] || { echo "no MANIFEST in $piece: not a carry piece" >&2; return 1; }
    mkdir -p "$stash"
    if [ -f "$stash/MANIFEST" ] && ! cmp -s "$piece/MANIFEST" "$stash/MANIFEST"; then
        echo "the stash held pieces of another carry: starting over" >&2
        rm -rf "$stash"
        mkdir -p "$stash"
    fi
    cp "$piece/MANIFEST" "$stash/MANIFEST"
    for part in "$piece"/part-*; do
        name=$(basename "$part")
        if ! grep -q " $name\$" "$stash/MANIFEST"; then
            echo "$name is not listed in $piece/MANIFEST" >&2
            return 1
        fi
        if [ -f "$stash/$name" ] && (cd "$stash" && grep " $name\$" MANIFEST | sha256sum -c --quiet - 2> /dev/null); then
            continue
        fi
        cp "$part" "$stash/$name.partial"
        mv "$stash/$name.partial" "$stash/$name"
        (cd "$stash" && grep " $name\$" MANIFEST | sha256sum -c --quiet -) || {
            rm -f "$stash/$name"
            echo "$name arrived damaged: send $piece again" >&2
            return 1
        }
    done
    echo "stashed $(basename "$piece"): $(ls "$stash"/part-* | wc -l) of $(sed -n 's/^pieces //p' "$stash/MANIFEST") pieces in $stash"
}

unpack() {
    local dir=$1 stash=$2 digest count have
    [ -f "$stash/MANIFEST" ] || { echo "no pieces in $stash: stash them first" >&2; return 3; }
    digest=$(sed -n 's/^stream //p' "$stash/MANIFEST")
    count=$(sed -n 's/^pieces //p' "$stash/MANIFEST")
    if [ "$(cat "$dir/.carry-stream" 2> /dev/null)" = "$digest" ]; then
        echo "$dir already holds carry $digest"
        return 0
    fi
    have=$(ls "$stash"/part-* 2> /dev/null | wc -l)
    if [ "$have" -ne "$count" ]; then
        echo "$have of $count pieces in $stash: stash the others first" >&2
        return 3
    fi
    if [ "$(cat "$stash"/part-* | sha256sum | cut -d' ' -f1)" != "$digest" ]; then
        echo "the reassembled carry does not match its sha256: stash the pieces again" >&2
        return 1
    fi
    mkdir -p "$dir"
    cat "$stash"/part-* | tar -x -C "$dir"
    echo "$digest" > "$dir/.carry-stream"
    echo "unpacked carry $digest ($count pieces) into $dir"
}

case "${1:-}" in
cut) cut_pieces "${2:?carry folder}" ;;
stash) stash_piece "${2:?piece folder}" "${3:-/tmp/gridbench-carry}" ;;
unpack) unpack "${2:?target folder}" "${3:-/tmp/gridbench-carry}" ;;
*)
    echo "usage: $0 cut DIR | stash PIECE_DIR [STASH] | unpack DIR [STASH]" >&2
    exit 2
    ;;
esac
