"""Issue 27 slice 11 from the run directories. (c)'s width arm: d = 128 at --lr 1e-3 on the Table 1 world, 8,000
updates, beside Table 1's d = 64 and the control, d = 64 at --lr 1e-3 (one seed per model). (b)'s 0.1 point at
16,000 updates with Default seeds 3-4 added, beside the 0.3 world at 16,000 (slice 3). Per run: fr test NER F1 /
LAS, English dev, dev perplexity at four points; then each group's mean ± std over its converged seeds and the
gap. A run whose last en dev perplexity is above 50 or above 1.5x the best of its sibling seeds (same point and
model) stalled or started late, and is left out."""
import json, os, sys
import numpy as np

T = sys.argv[1]
# Table 1 world, 8,000 updates, d = 64 (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]}}
# run prefix: label, the updates at which the dev perplexity is printed (the last one is the run's end)
points = {"d128-lr1e-3-": ("d 128, lr 1e-3, 8k", (2000, 4000, 6000, 8000)),
          "d64-lr1e-3-": ("d 64, lr 1e-3, 8k", (2000, 4000, 6000, 8000)),
          "ov0.1-16k-": ("overlap 0.1, 16k", (4000, 8000, 12000, 16000)),
          "steps16k-": ("overlap 0.3, 16k", (4000, 8000, 12000, 16000))}

def run(name, steps):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        r = json.load(open(f"{T}/ft/{name}/{t}/results.json"))
        d[t], d[t + "_dev"] = 100 * r["test"]["fr"][m], 100 * r["dev"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in steps}
    return d

groups, left_out = {}, {}
for prefix, (label, steps) in points.items():
    for model in table1:
        rs = {name: run(name, steps) for name in sorted(os.listdir(f"{T}/ft"))
              if name.rsplit("-s", 1)[0] == prefix + model
              and all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse"))}
        best = min((r["ppl"][steps[-1]]["en"] for r in rs.values()), default=0)
        for name, r in rs.items():
            out = r["ppl"][steps[-1]]["en"] > min(50, 1.5 * best)
            print(f"{name:27s} fr NER {r['ner']:5.1f} LAS {r['parse']:5.1f}  en dev {r['ner_dev']:5.1f} / "
                  f"{r['parse_dev']:5.1f}  dev ppl en/fr "
                  + ", ".join(f"{s // 1000}k {p['en']:.1f}/{p['fr']:.1f}" for s, p in r["ppl"].items())
                  + ("  LEFT OUT" if out else ""))
            (left_out if out else groups).setdefault((label, model), []).append(r)
for model, v in table1.items():  # Table 1's converged seeds, as printed there
    groups[("d 64, lr 2e-3, 8k", model)] = [{"ner": a, "parse": b} for a, b in zip(v["ner"], v["parse"])]
print()
def ms(v):
    return f"{np.mean(v):5.1f} ± {np.std(v):4.1f}"
for (label, model), rs in groups.items():
    print(f"{label:19s} {model:11s} {len(rs)} converged  NER {ms([r['ner'] for r in rs])}  "
          f"LAS {ms([r['parse'] for r in rs])}")
for (label, model), rs in left_out.items():
    print(f"{label:19s} {model:11s} left out: " + "  ".join(f"{r['ner']:.1f} / {r['parse']:.1f}" for r in rs))
labels = list(dict.fromkeys(label for label, _ in groups))
for task in ("ner", "parse"):
    for label in labels:
        d, n = ([r[task] for r in groups.get((label, m), [])] for m in table1)
        if d and n:
            print(f"gap {task:5s} {label:19s} {np.mean(d) - np.mean(n):5.1f} ± {np.hypot(np.std(d), np.std(n)):4.1f}"
                  f"  ({len(d)} / {len(n)} converged seeds)")
