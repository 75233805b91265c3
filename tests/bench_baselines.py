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
import math
import os
import sys
from collections import Counter, defaultdict

import numpy as np


def witten_bell(counts, lower):
    """counts: history -> Counter(word -> n). Returns p(w | h) = (c(h, w) + T(h) p_lower(w)) / (c(h) + T(h)),
    T(h) = number of distinct words seen after h; an unseen history falls back to p_lower."""
    totals = {h: (sum(c.values()), len(c)) for h, c in counts.items()}

    def p(h, w, *lower_args):
        pl = lower(w, *lower_args)
        if h not in totals:
            return pl
        n, t = totals[h]
        return (counts[h].get(w, 0) + t * pl) / (n + t)
    return p


def baselines(train, dev, vocab_size):
    train, dev = np.asarray(train, dtype=np.int64), np.asarray(dev, dtype=np.int64)
    uni = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    uni /= uni.sum()
    left, both = defaultdict(Counter), defaultdict(Counter)
    for a, w, b in zip(train[:-2].tolist(), train[1:-1].tolist(), train[2:].tolist()):
        left[a][w] += 1
        both[(a, b)][w] += 1
    p_left = witten_bell(left, lambda w: uni[w])
    p_both = witten_bell(both, lambda w, a: p_left(a, w))
    nll = np.zeros(3)
    d = dev.tolist()
    for t in range(1, len(d) - 1):
        a, w, b = d[t - 1], d[t], d[t + 1]
        nll += [-math.log(uni[w]), -math.log(p_left(a, w)), -math.log(p_both((a, b), w, a))]
    return np.exp(nll / (len(d) - 2))


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
        u, b, n = baselines(ids["train"], ids["dev"], int(max(ids["train"].max(), ids["dev"].max())) + 1)
        print(f"{l:6} {u:9.1f} {b:12.1f} {n:16.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
