"""Synthetic en / fr text with a paper-sized vocabulary (random Zipf-distributed words, no language in
it): runs/gpu/{en,fr}.{train,dev}.txt for the GPU session of notes/gpu.md."""
import numpy as np
rng = np.random.default_rng(0)
letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
def words(n, alphabet):
    out = set()
    while len(out) < n:
        out.add("".join(rng.choice(alphabet, rng.integers(3, 11))))
    return sorted(out)
for lang, alpha in (("en", letters[:20]), ("fr", letters[6:])):
    w = np.array(words(120000, alpha))
    p = 1.0 / np.arange(1, len(w) + 1); p /= p.sum()
    for split, n in (("train", 60000), ("dev", 500)):
        with open(f"runs/gpu/{lang}.{split}.txt", "w") as f:
            for _ in range(n):
                f.write(" ".join(w[rng.choice(len(w), rng.integers(20, 41), p=p)]) + "\n")
