"""Issue 27 slice 9 from the run directories: the 0.1 point of (b) at 16,000 updates beside the 0.3 world at 16,000
(slice 3). Per run: fr test NER F1 / LAS, English dev, dev perplexity at 4k, 8k, 12k, 16k; then each group's
mean ± std over its converged seeds and the gap. A run whose last en dev perplexity is above 50 or above 1.5x the
best of its sibling seeds (same point and model) stalled or started late, and is left out."""
import json, os, sys
import numpy as np

T = sys.argv[1]
points = {"ov0.1-16k-": "0.1", "steps16k-": "0.3"}

def run(name):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        r = json.load(open(f"{T}/ft/{name}/{t}/results.json"))
        d[t], d[t + "_dev"] = 100 * r["test"]["fr"][m], 100 * r["dev"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in (4000, 8000, 12000, 16000)}
    return d

groups, stalls = {}, {}
for prefix in points:
    for model in ("default", "no-anchors"):
        rs = {name: run(name) for name in sorted(os.listdir(f"{T}/ft")) if name.rsplit("-s", 1)[0] == prefix + model
              and all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse"))}
        best = min((r["ppl"][16000]["en"] for r in rs.values()), default=0)
        for name, r in rs.items():
            stalled = r["ppl"][16000]["en"] > min(50, 1.5 * best)
            print(f"{name:25s} fr NER {r['ner']:5.1f} LAS {r['parse']:5.1f}  en dev {r['ner_dev']:5.1f} / {r['parse_dev']:5.1f}  "
                  "dev ppl en/fr " + ", ".join(f"{s // 1000}k {p['en']:.1f}/{p['fr']:.1f}" for s, p in r["ppl"].items())
                  + ("  LEFT OUT" if stalled else ""))
            (stalls if stalled else groups).setdefault((prefix, model), []).append(r)
print()
def ms(v):
    return f"{np.mean(v):5.1f} ± {np.std(v):4.1f}"
for (prefix, model), rs in groups.items():
    print(f"overlap {points[prefix]} {model:11s} {len(rs)} converged  NER {ms([r['ner'] for r in rs])}  "
          f"LAS {ms([r['parse'] for r in rs])}  en dev NER {ms([r['ner_dev'] for r in rs])}")
for (prefix, model), rs in stalls.items():
    print(f"overlap {points[prefix]} {model:11s} left out: " + "  ".join(f"{r['ner']:.1f} / {r['parse']:.1f}" for r in rs))
for task in ("ner", "parse"):
    line = f"gap {task:5s}:"
    for prefix in points:
        d, n = ([r[task] for r in groups.get((prefix, m), [])] for m in ("default", "no-anchors"))
        if d and n:
            line += f"  {points[prefix]}: {np.mean(d) - np.mean(n):5.1f} ± {np.hypot(np.std(d), np.std(n)):4.1f}"
    print(line)
