"""
Count-based perplexity baselines for the MLM's dev perplexity (run by hand, not a test).

    python tests/bench_baselines.py runs/toy/data/joint-2000-*      # a prepared data directory

For every language of a prepared directory (bpe.py / pretrain.py: tokenizer.json + {lang}.{train,dev}.bin)
it fits three count models on the train ids and prints their perplexity on every dev token (the flat
stream, `</s>` separators included), to be read beside pretrain.py's dev perplexity:
- unigram: p(w), add-one smoothed;
- left bigram: p(w | left neighbour), Witten-Bell interpolated with the unigram;
- both neighbours: p(w | left, right), Witten-Bell interpolated with the left bigram. An MLM that sees
  both sides of a masked token should get at least this low, and lower where longer context helps.
These are what the world allows a local model to reach on the same tokens: an MLM far above the
both-neighbour number has not learned its language yet.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pretrain import count_baselines  # noqa: E402  (the one copy: pretrain.py reports them for its own dev sets)


def main(argv):
    if len(argv) != 1 or not os.path.isfile(os.path.join(argv[0], "tokenizer.json")):
        raise SystemExit("usage: python tests/bench_baselines.py PREPARED_DIR (with tokenizer.json and "
                         "{lang}.{train,dev}.bin)")
    d = argv[0]
    langs = sorted({f.split(".")[0] for f in os.listdir(d) if f.endswith(".train.bin")})
    print(f"{'lang':6} {'unigram':>9} {'left bigram':>12} {'both neighbours':>16}")
    for l in langs:
        ids = {}
        for s in ("train", "dev"):
            with open(os.path.join(d, f"{l}.{s}.json")) as f:
                meta = json.load(f)
            ids[s] = np.memmap(os.path.join(d, f"{l}.{s}.bin"), dtype=meta["dtype"], mode="r")
        u, b, n = count_baselines(ids["train"], ids["dev"])
        print(f"{l:6} {u:9.1f} {b:12.1f} {n:16.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
