"""Issue 27 slice 3 from the run directories: hypothesis (c), twice the updates. Per-run dev perplexity and fr test
NER F1 / LAS, the mean ± std beside the 8,000-update rows of Table 1, and the figure: Default and No anchors
(and the gap) against the number of updates."""
import json, os, sys
import numpy as np
from matplotlib.figure import Figure

T, out = sys.argv[1], sys.argv[2]
# Table 1 world, 8,000 updates (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]}}

def run(name):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        d[t] = 100 * json.load(open(f"{T}/ft/{name}/{t}/results.json"))["test"]["fr"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in (4000, 8000, 12000, 16000) if s in ppl}
    return d

stall_ppl = 30.0   # dev ppl en at the last update above this: a stall (converged runs: 8-14)
groups, stalls = {}, {}
for name in sorted(os.listdir(f"{T}/ft")):
    if name.rsplit("-s", 1)[0] not in ("steps16k-default", "steps16k-no-anchors") \
            or not all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse")):
        continue
    r = run(name)
    group = name.rsplit("-s", 1)[0].removeprefix("steps16k-")
    stalled = r["ppl"][16000]["en"] > stall_ppl
    print(f"{name:28s} NER {r['ner']:5.1f} LAS {r['parse']:5.1f}  dev ppl en/fr "
          + ", ".join(f"{s}: {p['en']:.1f}/{p['fr']:.1f}" for s, p in r["ppl"].items()) + ("  STALLED" if stalled else ""))
    (stalls if stalled else groups).setdefault(group, []).append(r)
print()
def ms(v):
    return f"{np.mean(v):5.1f} ± {np.std(v):4.1f}"
for g in ("default", "no-anchors"):
    rs = groups.get(g, [])
    if rs:
        print(f"16k {g:12s} {len(rs)} seeds  dev ppl en {ms([r['ppl'][16000]['en'] for r in rs])} fr "
              f"{ms([r['ppl'][16000]['fr'] for r in rs])}  NER {ms([r['ner'] for r in rs])}  LAS {ms([r['parse'] for r in rs])}")
    print(f" 8k {g:12s} 3 seeds  NER {ms(table1[g]['ner'])}  LAS {ms(table1[g]['parse'])}  (Table 1)")
for g, rs in stalls.items():
    print(f"16k {g} stalled: " + "  ".join(f"{r['ner']:.1f} / {r['parse']:.1f}" for r in rs))
if groups.get("default") and groups.get("no-anchors"):
    for task in ("ner", "parse"):
        g8 = np.mean(table1["default"][task]) - np.mean(table1["no-anchors"][task])
        g16 = np.mean([r[task] for r in groups["default"]]) - np.mean([r[task] for r in groups["no-anchors"]])
        print(f"gap {task}: 8k {g8:.1f} -> 16k {g16:.1f}")

fig = Figure(figsize=(10.5, 3.2))
axes = fig.subplots(1, 3)
for ax, (task, label) in zip(axes, (("ner", "NER fr (span F1, %)"), ("parse", "parsing fr (LAS, %)"))):
    for m, style in (("default", "o-"), ("no-anchors", "s--")):
        ys = [table1[m][task], [r[task] for r in groups.get(m, [])]]
        xs = [x for x, y in zip((8000, 16000), ys) if y]
        ys = [y for y in ys if y]
        line = ax.errorbar(xs, [np.mean(y) for y in ys], yerr=[np.std(y) for y in ys], fmt=style, capsize=3, label=m)
        v = [r[task] for r in stalls.get(m, [])]
        ax.plot([16000] * len(v), v, "x", color=line[0].get_color(), label=f"{m}, stalled MLM" if v else None)
    ax.set(title=label, xlabel="updates (--max-steps)", ylim=(0, 100), xticks=(8000, 16000), xlim=(6000, 18000))
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8, loc="lower right")
ax = axes[2]   # the gap, Default minus No anchors; error bar: the std of both groups combined
for task, style in (("ner", "o-"), ("parse", "s--")):
    xs, ys, es = [], [], []
    for x, d, n in ((8000, table1["default"][task], table1["no-anchors"][task]),
                    (16000, [r[task] for r in groups.get("default", [])], [r[task] for r in groups.get("no-anchors", [])])):
        if d and n:
            xs.append(x), ys.append(np.mean(d) - np.mean(n)), es.append(np.hypot(np.std(d), np.std(n)))
    ax.errorbar(xs, ys, yerr=es, fmt=style, capsize=3, label={"ner": "NER", "parse": "LAS"}[task])
ax.set(title="gap: Default − No anchors (points)", xlabel="updates (--max-steps)", ylim=(0, 70),
       xticks=(8000, 16000), xlim=(6000, 18000))
ax.grid(alpha=0.3)
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
fig.savefig(out, dpi=110)
