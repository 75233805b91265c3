"""Issue 27 slice 2 from the run directories: per-run dev perplexity and fr test NER F1 / LAS, each group's mean ±
std, and the figure: Default and No anchors against --overlap (0.1, 0.3 = Table 1, 0.5), and Sep Emb's six seeds."""
import json, os, sys
import numpy as np
from matplotlib.figure import Figure

T, out = sys.argv[1], sys.argv[2]
# Table 1 world (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs and Sep Emb's two seeds
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]},
          "sep-emb": {"ner": [38.0, 0.3], "parse": [58.9, 14.1]}}

def run(name):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        d[t] = 100 * json.load(open(f"{T}/ft/{name}/{t}/results.json"))["test"]["fr"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in (2000, 4000, 8000) if s in ppl}
    return d

def done(name):
    return all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse"))

stall_ppl = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0   # dev ppl en at 8,000 above this: a stall
slice2 = [f"sep-emb-s{i}" for i in range(2, 6)] + ["ov0.1-default-s0", "ov0.1-default-s1", "ov0.1-no-anchors-s0",
                                                   "ov0.5-default-s0", "ov0.5-default-s1", "ov0.5-no-anchors-s0"]
groups, stalls = {}, {}
for name in sorted(os.listdir(f"{T}/ft")):
    if not done(name) or name not in slice2:   # the runs of this slice only (later slices add seeds and points)
        continue
    r = run(name)
    group = name.rsplit("-s", 1)[0]
    stalled = r["ppl"][8000]["en"] > stall_ppl
    print(f"{name:24s} NER {r['ner']:5.1f} LAS {r['parse']:5.1f}  dev ppl en/fr "
          + ", ".join(f"{s}: {p['en']:.1f}/{p['fr']:.1f}" for s, p in r["ppl"].items()) + ("  STALLED" if stalled else ""))
    (stalls if stalled else groups).setdefault(group, []).append(r)
print()
for g, rs in groups.items():
    cells = [f"{np.mean([r[k] for r in rs]):5.1f} ±{np.std([r[k] for r in rs]):4.1f}" for k in ("ner", "parse")]
    ppl = [f"{np.mean([r['ppl'][8000][l] for r in rs]):5.1f} ±{np.std([r['ppl'][8000][l] for r in rs]):3.1f}" for l in ("en", "fr")]
    print(f"{g:22s} {len(rs)}  {ppl[0]}  {ppl[1]}  {cells[0]}  {cells[1]}")
for g, rs in stalls.items():
    print(f"{g + ' (stalled)':22s} {len(rs)}  " + "  ".join(f"{r['ner']:.1f} / {r['parse']:.1f}" for r in rs))

fig = Figure(figsize=(10.5, 3.2))
axes = fig.subplots(1, 3)
for ax, (task, label) in zip(axes[:2], (("ner", "NER fr (span F1, %)"), ("parse", "parsing fr (LAS, %)"))):
    for m, style in (("default", "o-"), ("no-anchors", "s--")):
        xs, ys = [], []
        for ov in (0.1, 0.3, 0.5):
            v = table1[m][task] if ov == 0.3 else [r[task] for r in groups.get(f"ov{ov}-{m}", [])]
            if v:
                xs.append(ov), ys.append(v)
        line = ax.errorbar(xs, [np.mean(y) for y in ys], yerr=[np.std(y) for y in ys], fmt=style, capsize=3, label=m)
        for ov in (0.1, 0.5):  # stalled MLMs (not in the means): an x each
            v = [r[task] for r in stalls.get(f"ov{ov}-{m}", [])]
            ax.plot([ov] * len(v), v, "x", color=line[0].get_color(), label=f"{m}, stalled MLM" if v else None)
    ax.set(title=label, xlabel="--overlap (share of identical forms)", ylim=(0, 100), xticks=(0.1, 0.3, 0.5), xlim=(0.03, 0.57))
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8, loc="lower right")
sep = table1["sep-emb"]
new = groups.get("sep-emb", [])
ax = axes[2]
ax.scatter(sep["ner"], sep["parse"], marker="o", label="seeds 0-1 (Table 1)")
ax.scatter([r["ner"] for r in new], [r["parse"] for r in new], marker="^", label=f"seeds 2-{1 + len(new)}")
ax.set(title="Sep Emb, Table 1 world: each seed", xlabel="NER fr", ylabel="LAS fr", xlim=(0, 100), ylim=(0, 100))
ax.grid(alpha=0.3)
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
fig.savefig(out, dpi=110)
