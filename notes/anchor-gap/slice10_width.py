"""Issue 27 slice 10 from the run directories: hypothesis (c)'s width arm, d = 128 at the preset's 8,000 updates on
the Table 1 world, beside Table 1's d = 64. Per run: fr test NER F1 / LAS, English dev, dev perplexity at 2k, 4k, 6k,
8k; then each model's mean over its converged seeds and the gap. A run whose last en dev perplexity is above 50 or
above 1.5x the best of its sibling seeds stalled or started late, and is left out."""
import json, os, sys
import numpy as np

T = sys.argv[1]
# Table 1 world, 8,000 updates, d = 64 (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]}}

def run(name):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        r = json.load(open(f"{T}/ft/{name}/{t}/results.json"))
        d[t], d[t + "_dev"] = 100 * r["test"]["fr"][m], 100 * r["dev"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in (2000, 4000, 6000, 8000)}
    return d

groups = {}
for model in table1:
    rs = {name: run(name) for name in sorted(os.listdir(f"{T}/ft")) if name.rsplit("-s", 1)[0] == "d128-" + model
          and all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse"))}
    best = min((r["ppl"][8000]["en"] for r in rs.values()), default=0)
    for name, r in rs.items():
        out = r["ppl"][8000]["en"] > min(50, 1.5 * best)
        print(f"{name:20s} fr NER {r['ner']:5.1f} LAS {r['parse']:5.1f}  en dev {r['ner_dev']:5.1f} / {r['parse_dev']:5.1f}  "
              "dev ppl en/fr " + ", ".join(f"{s // 1000}k {p['en']:.1f}/{p['fr']:.1f}" for s, p in r["ppl"].items())
              + ("  LEFT OUT" if out else ""))
        if not out:
            groups.setdefault(model, []).append(r)
print()
def ms(v):
    return f"{np.mean(v):5.1f} ± {np.std(v):4.1f}"
for model, rs in groups.items():
    print(f"d 128 {model:11s} {len(rs)} converged  NER {ms([r['ner'] for r in rs])}  LAS {ms([r['parse'] for r in rs])}"
          f"   (d 64: NER {ms(table1[model]['ner'])}  LAS {ms(table1[model]['parse'])})")
for task in ("ner", "parse"):
    d, n = ([r[task] for r in groups.get(m, [])] for m in table1)
    if d and n:
        print(f"gap {task:5s}: d 128 {np.mean(d) - np.mean(n):5.1f} ± {np.hypot(np.std(d), np.std(n)):4.1f}   d 64 "
              f"{np.mean(table1['default'][task]) - np.mean(table1['no-anchors'][task]):5.1f} ± "
              f"{np.hypot(np.std(table1['default'][task]), np.std(table1['no-anchors'][task])):4.1f}")
