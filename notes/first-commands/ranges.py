"""Mean and min-max over seeds of every number the README's first commands print.

    for s in 0 1 2; do
      python pretrain.py --toy --seed $s --out runs/toy-s$s
      python finetune.py --toy --data runs/toy-s$s/toy --ckpt runs/toy-s$s/best.pt \
        --out runs/toy-s$s/ft --threads 1 --seed $s
      python align.py sentences --toy --data runs/toy-s$s/toy --ckpt runs/toy-s$s/best.pt \
        > runs/toy-s$s/align.txt
      python cka.py --toy --data runs/toy-s$s/toy --ckpt runs/toy-s$s/best.pt > runs/toy-s$s/cka.txt
    done
    python notes/first-commands/ranges.py runs/toy-s0 runs/toy-s1 runs/toy-s2
"""
import json
import os
import re
import sys


def last_eval(run):
    best = None
    with open(os.path.join(run, "log.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "dev_ppl" in record:
                best = record
    return best


def markdown_table(path):
    """{(row, column): value} of the last markdown table in a file."""
    rows = [l for l in open(path, encoding="utf-8") if l.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|\n").split("|")]
    cells = {}
    for line in rows[2:]:
        values = [c.strip() for c in line.strip("|\n").split("|")]
        for column, value in zip(header[1:], values[1:]):
            cells[(values[0], column)] = float(value)
    return header, [l.strip("|\n").split("|")[0].strip() for l in rows[2:]], cells


def spread(values):
    digits = 3 if max(values) <= 1 else 2
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main(runs):
    print(f"{len(runs)} seeds: mean (min-max)")
    for lang in ("en", "fr"):
        print(f"dev ppl {lang}: {spread([last_eval(r)['dev_ppl'][lang] for r in runs])}")
    for task in ("xnli", "ner", "parse"):
        scores = []
        for r in runs:
            with open(os.path.join(r, "ft", task, "results.json"), encoding="utf-8") as f:
                result = json.load(f)
            scores.append(100 * result["test"]["fr"][result["metric"]])
        print(f"fr test {task}: {spread(scores)}")
    for name in ("align.txt", "cka.txt"):
        tables = [markdown_table(os.path.join(r, name)) for r in runs]
        header, layers, _ = tables[0]
        print(f"\n{name}: mean (min-max)\n| layer | " + " | ".join(header[1:]) + " |")
        print("|---" * len(header) + "|")
        for layer in layers:
            cells = [spread([t[2][(layer, c)] for t in tables]).strip() for c in header[1:]]
            print(f"| {layer} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
