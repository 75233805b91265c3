"""
Wikipedia-size preparation (run by hand, not collected by pytest): how bpe.learn_bpe grows with the number of
distinct words, and how fast binarisation runs per worker process.

    /usr/bin/time -v python tests/bench_bpe_scale.py learn --words 1000000 --merges 80000   # time, peak RSS
    python tests/bench_bpe_scale.py binarize --merges 10000                                  # MB/s per worker

learn: a generated, seeded Zipfian table of word counts (no text: learn_bpe reads counts). Words are 1 to 4
syllables drawn from a Zipfian inventory of 3,000 consonant-vowel(-consonant) syllables, so frequent pairs
repeat across words as in natural text; the word of frequency rank k gets count max(2, round(C / k)), with C set
so that the table holds --tokens running words (English Wikipedia: about 1e7 distinct words, 3e9 tokens).
Prints the time of learn_bpe alone and the peak RSS of the process (VmHWM) before and after it.
binarize: bpe.binarize of the English Leipzig file of ../shared/data/monolingual with a joint Tokenizer learned
on it, --workers 1: input MB per second of one worker, wall and CPU time.
"""
import argparse
import itertools
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bpe  # noqa: E402


def peak_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmHWM:"))


def zipf_counts(n_words, n_tokens, seed=0):
    """{word: count}: n_words distinct generated words, Zipfian counts summing to about n_tokens."""
    rng = random.Random(seed)
    onsets = list("bcdfghjklmnprstvwz") + ["ch", "sh", "th", "st", "tr", "pl", "br", "gr"]
    vowels = list("aeiouy") + ["ai", "ea", "ou", "ie"]
    codas = [""] * 6 + list("nrstlmkd")
    syllables = list(dict.fromkeys(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(6000)))
    cum = list(itertools.accumulate(1 / (k + 1) for k in range(len(syllables))))
    C = n_tokens / sum(1 / k for k in range(1, n_words + 1))
    words = {}
    while len(words) < n_words:
        n_syl = rng.choice((1, 2, 2, 3, 3, 4))
        w = "".join(rng.choices(syllables, cum_weights=cum, k=n_syl))
        if w not in words:
            words[w] = max(2, round(C / (len(words) + 1)))
    return words


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["learn", "binarize"])
    p.add_argument("--words", type=int, default=100000, help="learn: distinct words")
    p.add_argument("--tokens", type=float, help="learn: running words the counts add up to (default 300 x --words, "
                   "Wikipedia's ratio)")
    p.add_argument("--merges", type=int, default=80000)
    args = p.parse_args()
    if args.part == "learn":
        t0 = time.process_time()
        counts = zipf_counts(args.words, args.tokens or 300 * args.words)
        t_gen, rss0 = time.process_time() - t0, peak_mib()
        t0, w0 = time.process_time(), time.perf_counter()
        merges = bpe.learn_bpe(counts, args.merges)
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        print(f"{args.words:,} distinct words ({sum(counts.values()):.2e} tokens, generated in {t_gen:.0f} s, "
              f"peak RSS {rss0:,.0f} MiB): learn_bpe {len(merges):,} merges in {cpu:,.0f} s CPU ({wall:,.0f} s wall), "
              f"peak RSS {peak_mib():,.0f} MiB; load average {os.getloadavg()[0]:.1f}")
    else:
        path = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "monolingual",
                            "en.leipzig_wikipedia_2016_10K.txt")
        if not os.path.exists(path):
            sys.exit(f"{path}: not found")
        tok = bpe.Tokenizer.build({"en": path}, num_merges=args.merges, verbose=False)
        with tempfile.TemporaryDirectory() as d:
            t0, w0 = time.process_time(), time.perf_counter()
            meta = bpe.binarize(path, tok, "en", os.path.join(d, "en"), workers=1, verbose=False)
            cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        mb = os.path.getsize(path) / 1e6
        print(f"binarize {mb:.1f} MB ({meta['n_tokens']:,} ids) with {args.merges:,} merges, one worker: "
              f"{mb / cpu:.2f} MB/s CPU ({mb / wall:.2f} MB/s wall); load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
