"""
Benchmark bpe.py against subword-nmt (run by hand, not collected by pytest: the file name does not
start with test_). subword-nmt is a reference tool here, not a project dependency:

    pip install subword-nmt
    python tests/bench_bpe.py                      # 10k merges on all of ../shared/data/monolingual
    python tests/bench_bpe.py --merges 2000 --max-lines 3000   # quicker

1. learn: word counts of every file (pretokenize, the file's language from its name), then
   bpe.learn_bpe and subword-nmt's learn_bpe (--dict-input, the same counts) in the same process;
   prints both times, the ratio, and whether the merge lists are identical.
2. apply: the learned codes applied to every pretokenised line (words joined by single spaces) with
   bpe.BPE.apply and subword-nmt's BPE.process_line, both with fresh per-word caches, alternating for
   --rounds rounds; prints MB/s of input text per CPU second (median) and whether every output line is
   identical. --apply-only skips subword-nmt's learning (minutes) and compares application only.
Exits with status 1 if anything differs.
"""

import argparse
import contextlib
import glob
import io
import os
import statistics
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bpe  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                   "data", "monolingual"), help="directory of *.txt")
parser.add_argument("--merges", type=int, default=10000, help="number of merges")
parser.add_argument("--min-freq", type=int, default=2, help="min pair frequency")
parser.add_argument("--max-lines", type=int, default=None, help="lines per file (default: all)")
parser.add_argument("--rounds", type=int, default=3, help="apply timings (median)")
parser.add_argument("--apply-only", action="store_true",
                    help="skip subword-nmt's learning (minutes): learn with bpe.py, compare application only")
args = parser.parse_args()

try:
    from subword_nmt import apply_bpe as snmt_apply
    from subword_nmt import learn_bpe as snmt_learn
except ImportError:
    sys.exit("this benchmark needs the reference tool: pip install subword-nmt")

# -----------------------------------------------------------------------------
# word counts and pretokenised lines

files = sorted(glob.glob(os.path.join(args.data, "*.txt")))
if not files:
    sys.exit(f"no *.txt files in {args.data}")
counts, lines = Counter(), []
for path in files:
    lang = os.path.basename(path).split(".")[0]
    for line in bpe.read_lines(path, args.max_lines):
        words = bpe.pretokenize(line, lang)
        counts.update(words)
        lines.append(" ".join(words))
n_bytes = sum(len(l.encode("utf-8")) + 1 for l in lines)
print(f"{len(files)} files, {len(lines)} lines, {n_bytes / 1e6:.1f} MB pretokenised, "
      f"{len(counts)} distinct words, {sum(counts.values())} words")

# -----------------------------------------------------------------------------
# learn

t0 = time.perf_counter()
ours = bpe.learn_bpe(counts, args.merges, args.min_freq)
t_ours = time.perf_counter() - t0

dict_file = io.StringIO("".join(f"{w} {c}\n" for w, c in counts.items()))
codes_file = io.StringIO()
if args.apply_only:
    codes_file.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in ours))
    ref, same_merges = ours, True
    print(f"learn {len(ours)} merges: bpe.py {t_ours:.1f} s (subword-nmt not run: --apply-only)")
else:
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        snmt_learn.learn_bpe(dict_file, codes_file, args.merges, args.min_freq, is_dict=True)
    t_ref = time.perf_counter() - t0
    ref = [tuple(l.split(" ")) for l in codes_file.getvalue().split("\n")[1:] if l]
    same_merges = ours == ref
    print(f"learn {len(ours)} merges: bpe.py {t_ours:.1f} s, subword-nmt {t_ref:.1f} s, "
          f"ratio {t_ref / t_ours:.2f}x, merges identical: {same_merges}")
if not same_merges:
    k = next((i for i, (x, y) in enumerate(zip(ours, ref)) if x != y), min(len(ours), len(ref)))
    print(f"  first difference at merge {k}: ours {ours[k:k + 1]} subword-nmt {ref[k:k + 1]}")

# -----------------------------------------------------------------------------
# apply

codes = codes_file.getvalue()
t_ref, t_ours = [], []
for r in range(args.rounds):  # alternating, each with fresh caches; process CPU time (a shared machine)
    ref_bpe = snmt_apply.BPE(io.StringIO(codes))
    t0 = time.process_time()
    ref_out = [ref_bpe.process_line(l) for l in lines]
    t_ref.append(time.process_time() - t0)
    our_bpe = bpe.BPE(ours)
    t0 = time.process_time()
    our_out = [our_bpe.apply(l) for l in lines]
    t_ours.append(time.process_time() - t0)
t_ref, t_ours = statistics.median(t_ref), statistics.median(t_ours)

n_diff = sum(x != y for x, y in zip(our_out, ref_out))
print(f"apply {len(lines)} lines (CPU time, median of {args.rounds}): bpe.py {n_bytes / 1e6 / t_ours:.2f} MB/s, "
      f"subword-nmt {n_bytes / 1e6 / t_ref:.2f} MB/s (ratio {t_ref / t_ours:.2f}x), lines differing: {n_diff}")
sys.exit(0 if same_merges and n_diff == 0 else 1)
