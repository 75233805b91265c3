"""Issue 27's summary figure from the run directories: the No-anchors gap (Default minus No anchors, fr test NER F1
and LAS) against each axis of the four hypotheses, mean over the converged seeds with the two groups' std combined.
(a) world scale, (b) --overlap at 8,000 and at 16,000 updates, (c) updates and width, (d) --name-overlap; the Table 1
world at 8,000 updates is the shared point of every panel. A run whose last en dev perplexity is above 50 or above
1.5x the best of its sibling seeds (the same point and model) stalled or started late and is left out."""
import json, os, sys
import numpy as np
from matplotlib.figure import Figure

T, out = sys.argv[1], sys.argv[2]
# Table 1 world, 8,000 updates (RESULTS.md, "Table 1"): per-seed fr test NER / LAS of the converged runs
table1 = {"default": {"ner": [90.5, 92.2, 94.2], "parse": [94.2, 83.8, 92.1]},
          "no-anchors": {"ner": [37.6, 68.1, 54.7], "parse": [76.9, 71.8, 85.6]}}

def converged(prefix, model):
    """fr test NER / LAS of the converged runs T/ft/{prefix}{model}-s*."""
    runs = []
    for name in sorted(os.listdir(f"{T}/ft")):
        if name.rsplit("-s", 1)[0] != prefix + model or not os.path.exists(f"{T}/ft/{name}/parse/results.json"):
            continue
        ppl = [r["dev_ppl"]["en"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r]
        runs.append((ppl[-1], {t: 100 * json.load(open(f"{T}/ft/{name}/{t}/results.json"))["test"]["fr"][m]
                               for t, m in (("ner", "f1"), ("parse", "las"))}))
    best = min((p for p, _ in runs), default=0)
    return {t: [r[t] for p, r in runs if p <= min(50, 1.5 * best)] for t in ("ner", "parse")}

# per panel: title, x label, tick labels, series (label, marker fill, a run prefix per tick: None for Table 1,
# "" for no point); each point at the preset calibrated on its own Default
panels = [
    ("(a) vocabulary size", "world scale (merges scaled with it)", ["×1", "×4\n(--lr 1e-3)"],
     [("8,000 updates", "full", [None, "x4-lr1e-3-"])]),
    ("(b) identical forms", "--overlap", ["0.1", "0.3", "0.5"],
     [("8,000 updates (0.1: --lr 1e-3)", "full", ["ov0.1-lr1e-3-", None, "ov0.5-"]),
      ("16,000 updates", "none", ["ov0.1-16k-", "steps16k-", ""])]),
    ("(c) training and width", "model", ["d 64\n8,000", "d 64\n16,000", "d 128\n8,000\n(--lr 1e-3)"],
     [("", "full", [None, "steps16k-", "d128-lr1e-3-"])]),
    ("(d) entity names", "identical entity-name parts", ["none\n(--name-overlap 0)", "30 %"],
     [("8,000 updates", "full", ["names0-", None])]),
]
fig = Figure(figsize=(12, 3.5))
for ax, (title, xlabel, ticks, series) in zip(fig.subplots(1, 4, sharey=True), panels):
    for s, (slabel, fill, prefixes) in enumerate(series):
        got = [None if p == "" else [table1[m] if p is None else converged(p, m) for m in ("default", "no-anchors")]
               for p in prefixes]  # per tick: the Default's and No anchors' converged scores
        for task, style, color, dx in (("ner", "o-", "C0", -0.03), ("parse", "s--", "C1", 0.03)):
            xs, ys, es = [], [], []
            for i, (tick, g) in enumerate(zip(ticks, got)):
                if g is None:
                    continue
                d, n = g
                where = tick.replace("\n", " ")[:12]
                name = f"{title:24s} {where:12s} {slabel.split(' (')[0]:15s} {task:5s}"
                if d[task] and n[task]:
                    xs.append(i + dx + 0.1 * s), ys.append(np.mean(d[task]) - np.mean(n[task]))
                    es.append(np.hypot(np.std(d[task]), np.std(n[task])))
                    print(f"{name} gap {ys[-1]:5.1f} ± {es[-1]:4.1f}  ({len(d[task])} / {len(n[task])} converged seeds)")
                else:
                    print(f"{name} not measured: no converged " + ("Default" if not d[task] else "No-anchors") + " seed")
                    if task == "ner":
                        ax.text(i + 0.1 * s, 50, "not\nmeasured:\nMLMs\nstalled", ha="center", fontsize=7,
                                color="gray")
            label = {"ner": "NER gap", "parse": "LAS gap"}[task] + (f", {slabel}" if len(series) > 1 else "")
            ax.errorbar(xs, ys, yerr=es, fmt=style, color=color, mfc=color if fill == "full" else "white",
                        capsize=3, label=label)
    ax.set_xticks(range(len(ticks)), ticks, fontsize=8)
    ax.set(title=title, xlabel=xlabel, xlim=(-0.5, len(ticks) - 0.5), ylim=(-15, 100))
    ax.axhline(0, color="k", lw=0.5)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=6, loc="upper right")
fig.axes[0].set_ylabel("Default − No anchors (points)")
fig.axes[0].legend(fontsize=8, loc="upper left")
fig.tight_layout()
fig.savefig(out, dpi=110)
