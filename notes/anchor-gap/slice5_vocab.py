"""Issue 27 slice 5 from the run directories: hypothesis (a), vocabulary size. Per-run dev perplexity, en dev and fr
test NER F1 / LAS of every x4 run (the unchanged --toy preset, the two recalibration tries, the recalibrated preset),
each group's mean ± std over its converged seeds, the gap, and the figure: Default, No anchors and the gap against
the world's scale, x1 (Table 1) and x4 each at the preset calibrated on its Default, x4 at the unchanged preset beside."""
import json, os, sys
import numpy as np
from matplotlib.figure import Figure

T, out = sys.argv[1], sys.argv[2]
# Table 1 world, 8,000 updates (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]}}
presets = {"x4-": "unchanged preset (2e-3, 8k)", "x4-16k-": "try 1 (2e-3, 16k)", "x4-lr1e-3-": "x4 preset (1e-3, 8k)"}
behind = 1.5   # a run whose last en dev perplexity is above 1.5x the best seed's of its preset and model stalled

def run(name):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        r = json.load(open(f"{T}/ft/{name}/{t}/results.json"))
        d[t], d[t + "_dev"] = 100 * r["test"]["fr"][m], 100 * r["dev"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in (2000, 4000, 8000, 12000, 16000) if s in ppl}
    return d

groups, stalls = {}, {}
for prefix in presets:
    for name in sorted(os.listdir(f"{T}/ft")):
        model = name.removeprefix(prefix).rsplit("-s", 1)[0]
        if not name.startswith(prefix) or model not in table1 or \
                not all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse")):
            continue
        r = run(name)
        print(f"{name:24s} fr NER {r['ner']:5.1f} LAS {r['parse']:5.1f}  en dev {r['ner_dev']:5.1f} / {r['parse_dev']:5.1f}  "
              "dev ppl en/fr " + ", ".join(f"{s // 1000}k {p['en']:.1f}/{p['fr']:.1f}" for s, p in r["ppl"].items())
              )
        groups.setdefault((prefix, model), []).append(r)
for key, rs in list(groups.items()):
    best = min(r["ppl"][max(r["ppl"])]["en"] for r in rs)
    stalls[key] = [r for r in rs if r["ppl"][max(r["ppl"])]["en"] > behind * best]
    groups[key] = [r for r in rs if r not in stalls[key]]
print()
def ms(v):
    return f"{np.mean(v):5.1f} ± {np.std(v):4.1f}"
for (prefix, model), rs in groups.items():
    if rs: print(f"{presets[prefix]:28s} {model:11s} {len(rs)} converged  NER {ms([r['ner'] for r in rs])}  LAS "
          f"{ms([r['parse'] for r in rs])}  dev ppl en {ms([r['ppl'][max(r['ppl'])]['en'] for r in rs])}")
for (prefix, model), rs in stalls.items():
    if rs: print(f"{presets[prefix]:28s} {model:11s} left out (stalled or unconverged): " + "  ".join(f"{r['ner']:.1f} / {r['parse']:.1f}" for r in rs))
def scores(prefix, model, task):
    return table1[model][task] if prefix is None else [r[task] for r in groups.get((prefix, model), [])]
def gap(prefix, task):
    d, n = scores(prefix, "default", task), scores(prefix, "no-anchors", task)
    return (np.mean(d) - np.mean(n), np.hypot(np.std(d), np.std(n))) if d and n else None
for task in ("ner", "parse"):
    print(f"gap {task}: x1 {gap(None, task)[0]:.1f} ± {gap(None, task)[1]:.1f}" + "".join(
        f", {presets[p]} {gap(p, task)[0]:.1f} ± {gap(p, task)[1]:.1f}" for p in ("x4-", "x4-lr1e-3-") if gap(p, task)))

fig = Figure(figsize=(10.5, 3.2))
axes = fig.subplots(1, 3)
for ax, (task, label) in zip(axes, (("ner", "NER fr (span F1, %)"), ("parse", "parsing fr (LAS, %)"))):
    for m, style in (("default", "o-"), ("no-anchors", "s--")):
        ys = [scores(None, m, task), scores("x4-lr1e-3-", m, task)]
        xs = [x for x, y in zip((1, 4), ys) if y]
        ys = [y for y in ys if y]
        line = ax.errorbar(xs, [np.mean(y) for y in ys], yerr=[np.std(y) for y in ys], fmt=style, capsize=3,
                           label=f"{m}, each scale's preset")
        v = scores("x4-", m, task)   # x4 at the unchanged preset: converged seeds, no line
        ax.plot([4.25] * len(v), v, style[0], mfc="none", color=line[0].get_color(),
                label=f"{m}, x4 at the unchanged preset" if v else None)
        v = [r[task] for r in stalls.get(("x4-lr1e-3-", m), [])]
        ax.plot([4] * len(v), v, "x", color=line[0].get_color(), label=f"{m}, stalled MLM" if v else None)
    ax.set(title=label, xlabel="world scale (toydata.py --scale)", ylim=(0, 100), xscale="log", xticks=(1, 4),
           xticklabels=("×1", "×4"), xlim=(0.7, 6))
    ax.minorticks_off()
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=7, loc="lower left")
ax = axes[2]   # the gap, Default minus No anchors; error bar: the std of both groups combined
for task, style in (("ner", "o-"), ("parse", "s--")):
    pts = [(x, gap(p, task)) for x, p in ((1, None), (4, "x4-lr1e-3-")) if gap(p, task)]
    ax.errorbar([x for x, _ in pts], [g[0] for _, g in pts], yerr=[g[1] for _, g in pts], fmt=style, capsize=3,
                label={"ner": "NER", "parse": "LAS"}[task])
ax.set(title="gap: Default − No anchors (points)", xlabel="world scale (toydata.py --scale)", ylim=(-10, 70),
       xscale="log", xticks=(1, 4), xticklabels=("×1", "×4"), xlim=(0.7, 6))
ax.minorticks_off()
ax.axhline(0, color="k", lw=0.5)
ax.grid(alpha=0.3)
ax.legend(fontsize=8, loc="upper right")
fig.tight_layout()
fig.savefig(out, dpi=110)
