"""Draw RESULTS.md's anchor-gap figure: fr test NER F1 and LAS of Default and No anchors against the share of
identical entity-name parts (Table 1 world: the plain 30 % draw; --name-overlap 0: none). Mean ± std over seeds."""
import json, sys
import numpy as np
from matplotlib.figure import Figure

def scores(dirs):
    out = {"ner": [], "parse": []}
    for d in dirs:
        for t, m in (("ner", "f1"), ("parse", "las")):
            out[t].append(100 * json.load(open(f"{d}/{t}/results.json"))["test"]["fr"][m])
    return out

# Table 1 world (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]}}
T = sys.argv[1]
seeds = {"default": sys.argv[3].split(","), "no-anchors": sys.argv[4].split(",")}   # the converged runs
names0 = {m: scores([f"{T}/ft/names0-{m}-s{s}" for s in seeds[m]]) for m in ("default", "no-anchors")}
fig = Figure(figsize=(7.5, 3.2))
for ax, (task, label) in zip(fig.subplots(1, 2), (("ner", "NER fr (span F1, %)"), ("parse", "parsing fr (LAS, %)"))):
    for m, style in (("default", "o-"), ("no-anchors", "s--")):
        ys = [table1[m][task], names0[m][task]]
        ax.errorbar([0, 1], [np.mean(y) for y in ys], yerr=[np.std(y) for y in ys], fmt=style, capsize=3, label=m)
    ax.set_xticks([0, 1], ["names shared\n(Table 1 world, 28 %)", "names language-\nspecific (0 %)"], fontsize=8)
    ax.set(title=label, ylim=(0, 100), xlim=(-0.4, 1.4))
    ax.grid(alpha=0.3)
ax.legend(fontsize=8, loc="lower left")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
for m in names0:
    for t in ("ner", "parse"):
        v = names0[m][t]
        print(m, t, " / ".join(f"{x:.1f}" for x in v), f"mean {np.mean(v):.1f} ± {np.std(v):.1f}")
