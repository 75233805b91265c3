"""Issue 27 slice 6 from the run directories: hypothesis (b) completed as far as it went. Per-run dev perplexity, en dev
and fr test NER F1 / LAS at --overlap 0.1 (the recalibration try at --lr 1e-3) and 0.5 (all three seeds of each model),
each group's mean ± std over its converged seeds, and the gap against Table 1's 0.3. A run whose last en dev perplexity
is above 50 or above 1.5x the best of its sibling seeds (same point and model) stalled and is left out."""
import json, os, sys
import numpy as np

T = sys.argv[1]
# Table 1 world, 8,000 updates (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]}}
points = {"ov0.1-lr1e-3-": "0.1, --lr 1e-3", "ov0.5-": "0.5"}

def run(name):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        r = json.load(open(f"{T}/ft/{name}/{t}/results.json"))
        d[t], d[t + "_dev"] = 100 * r["test"]["fr"][m], 100 * r["dev"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in (2000, 4000, 8000)}
    return d

groups, stalls = {}, {}
for prefix in points:
    for model in table1:
        rs = {name: run(name) for name in sorted(os.listdir(f"{T}/ft")) if name.rsplit("-s", 1)[0] == prefix + model
              and all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse"))}
        best = min((r["ppl"][8000]["en"] for r in rs.values()), default=0)
        for name, r in rs.items():
            stalled = r["ppl"][8000]["en"] > min(50, 1.5 * best)
            print(f"{name:26s} fr NER {r['ner']:5.1f} LAS {r['parse']:5.1f}  en dev {r['ner_dev']:5.1f} / {r['parse_dev']:5.1f}  "
                  "dev ppl en/fr " + ", ".join(f"{s // 1000}k {p['en']:.1f}/{p['fr']:.1f}" for s, p in r["ppl"].items())
                  + ("  STALLED" if stalled else ""))
            (stalls if stalled else groups).setdefault((prefix, model), []).append(r)
print()
def ms(v):
    return f"{np.mean(v):5.1f} ± {np.std(v):4.1f}"
for (prefix, model), rs in groups.items():
    print(f"overlap {points[prefix]:15s} {model:11s} {len(rs)} converged  NER {ms([r['ner'] for r in rs])}  "
          f"LAS {ms([r['parse'] for r in rs])}")
for (prefix, model), rs in stalls.items():
    print(f"overlap {points[prefix]:15s} {model:11s} stalled: " + "  ".join(f"{r['ner']:.1f} / {r['parse']:.1f}" for r in rs))
for task in ("ner", "parse"):
    line = f"gap {task:5s}: 0.3 {np.mean(table1['default'][task]) - np.mean(table1['no-anchors'][task]):5.1f}"
    for prefix in points:
        d, n = ([r[task] for r in groups.get((prefix, m), [])] for m in table1)
        if d and n:
            line += f", {points[prefix]} {np.mean(d) - np.mean(n):5.1f} ± {np.hypot(np.std(d), np.std(n)):4.1f}"
    print(line)
