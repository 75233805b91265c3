"""Speed and memory of the analysis code (run by hand, not collected by pytest: no `test_` prefix).

    python tests/bench_analysis.py                     # CKA n=10000 d=768, CSLS 50k x 50k x 300
    python tests/bench_analysis.py --csls-n 200000     # the issue's full CSLS size (~30 min on 2 cores)

1. linear_cka (feature-space form, O(n d²)) against linear_cka_gram (Gram form, O(n² d)) at
   n = 10,000 sentences, d = 768 (BERT-base width): goal >= 10x faster and equal to 1e-8.
2. csls_knn over n x n random unit vectors of dimension 300 (MUSE: 200k-word vocabularies): wall time
   and the process's peak resident memory (goal <= 2 GB), measured in a fresh subprocess so that the CKA
   part's Gram matrices do not count.
"""
import argparse
import os
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def peak_rss_mb():
    """This process's peak resident memory in MB: VmHWM of /proc/self/status (Linux). Not getrusage's
    ru_maxrss, which Linux carries over an exec: the CSLS child would start at the parent's CKA peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: kB on Linux, bytes on macOS


def bench_cka(n, d):
    from cka import linear_cka, linear_cka_gram
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    Y = X @ rng.standard_normal((d, d)) / np.sqrt(d) + rng.standard_normal((n, d))
    t = time.perf_counter(); a = linear_cka(X, Y); t_feat = time.perf_counter() - t
    t = time.perf_counter(); b = linear_cka_gram(X, Y); t_gram = time.perf_counter() - t
    print(f"CKA n={n} d={d}: feature form {t_feat:.3f} s, Gram form {t_gram:.3f} s, "
          f"speed-up {t_gram / t_feat:.1f}x, |difference| {abs(a - b):.2e} (CKA = {a:.6f})")
    return t_gram / t_feat, abs(a - b)


def bench_csls(n, d, k, n_queries=None):
    from align import csls_knn
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n_queries or n, d), dtype=np.float32)
    Y = rng.standard_normal((n, d), dtype=np.float32)
    base = peak_rss_mb()
    t = time.perf_counter()
    idx = csls_knn(X, Y, k=k)
    dt = time.perf_counter() - t
    print(f"CSLS {len(X)} queries x {n} candidates x {d} (k={k}, float32): {dt:.1f} s, peak RSS {peak_rss_mb():.0f} MB "
          f"(inputs + interpreter before the call: {base:.0f} MB); {len(idx)} neighbours")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cka-n", type=int, default=10000, help="sentences for the CKA benchmark")
    ap.add_argument("--cka-d", type=int, default=768, help="features for the CKA benchmark")
    ap.add_argument("--csls-n", type=int, default=50000, help="queries = candidates for CSLS (issue: 200000)")
    ap.add_argument("--csls-queries", type=int, default=None, help="queries if fewer than --csls-n")
    ap.add_argument("--csls-d", type=int, default=300, help="vector dimension for CSLS")
    ap.add_argument("--k", type=int, default=10, help="CSLS neighbourhood size")
    ap.add_argument("--part", choices=["all", "cka", "csls"], default="all", help="run one part only")
    args = ap.parse_args()
    if args.part in ("all", "cka"):
        speedup, diff = bench_cka(args.cka_n, args.cka_d)
        print(f"  goal >= 10x and <= 1e-8: {'met' if speedup >= 10 and diff <= 1e-8 else 'NOT met'}")
    if args.part == "csls":
        bench_csls(args.csls_n, args.csls_d, args.k, args.csls_queries)
    elif args.part == "all":  # a fresh process, so peak memory is the CSLS run's own
        subprocess.run([sys.executable, os.path.abspath(__file__), "--part", "csls", "--csls-n", str(args.csls_n),
                        "--csls-queries", str(args.csls_queries or args.csls_n), "--csls-d", str(args.csls_d),
                        "--k", str(args.k)], check=True)
