#!/usr/bin/env bash
# The runs of the Sep Emb capacity study (notes/sep-emb-capacity.md), two at a time, one core
# each. Run from the repository root:  bash notes/sep-emb-capacity/run.sh OUT_DIR [NAME-sSEED ...]
# With names, only those rows of the queue run (e.g. p3-default-s1 p3-sep-emb-s1).
# Each line of the queue: NAME SEED WORLD [pretrain.py flags]. A run pretrains with --toy,
# then fine-tunes the three tasks with finetune.py --toy (seed = the pretraining seed).
set -euo pipefail
export T=$1
shift
export ONLY="$*"
mkdir -p "$T"
[ -d "$T/world-x16" ] || PYTHONPATH=. python notes/sep-emb-capacity/make_worlds.py "$T"

row() {
  name=$1
  seed=$2
  world=$3
  shift 3
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name-s$seed "* ]]; then
    return 0
  fi
  python pretrain.py --toy --data "$T/$world" --seed "$seed" --out "$T/pt/$name-s$seed" \
    --prep-dir "$T/prep" "$@" \
    > "$T/$name-s$seed.log" 2>&1
  python finetune.py --toy --data "$T/$world" --ckpt "$T/pt/$name-s$seed/best.pt" --seed "$seed" \
    --threads 1 --out "$T/ft/$name-s$seed" >> "$T/$name-s$seed.log" 2>&1
  echo "done $name-s$seed $(date -u +%H:%M)"
}
export -f row

# P1 (d = 64 on Table 1's world) is Table 1's own runs (RESULTS.md). The world arm at the
# unchanged preset: P3 (world-x4), P5 (world-x16). The model arm: P2 and P4 (d = 32 on world and
# world-x4; P4 was run first, then dropped: see the amendment in notes/sep-emb-capacity.md).
D32="--dim 32 --ffn-dim 128"
xargs -P 2 -L 1 bash -c 'row "$@"' _ <<ROWS
p4-default 0 world-x4 --bpe joint $D32
p4-sep-emb 0 world-x4 --sep emb $D32
p5-default 0 world-x16 --bpe joint
p5-sep-emb 0 world-x16 --sep emb
p3-default 0 world-x4 --bpe joint
p3-sep-emb 0 world-x4 --sep emb
p5-default 1 world-x16 --bpe joint
p5-sep-emb 1 world-x16 --sep emb
p3-default 1 world-x4 --bpe joint
p3-sep-emb 1 world-x4 --sep emb
p5-sep-tok 0 world-x16 --sep tok
p3-sep-tok 0 world-x4 --sep tok
p2-default 0 world --bpe joint $D32
p2-sep-emb 0 world --sep emb $D32
ROWS
