"""Issue 27 slice 7 from the run directories: Sep Emb with twice the updates (--max-steps 16000) on the Table 1
world, six seeds, beside its six seeds at 8,000 updates and the 16,000-update Default and No anchors. Per run the
fr test NER F1 / LAS, English dev, dev perplexity; then mean ± std, median, the NER-LAS correlation, and the figure:
each seed's NER and LAS at 8,000 and 16,000 updates, seed to seed."""
import json, os, sys
import numpy as np
from matplotlib.figure import Figure

T, out = sys.argv[1], sys.argv[2]
# Sep Emb seeds 0 and 1 at 8,000 updates are Table 1's (RESULTS.md, "Table 1"): fr test NER / LAS
table1_sep_emb = {0: (38.0, 58.9), 1: (0.3, 14.1)}

def run(name):
    d = {}
    for t, m in (("ner", "f1"), ("parse", "las")):
        r = json.load(open(f"{T}/ft/{name}/{t}/results.json"))
        d[t], d["en_" + t] = 100 * r["test"]["fr"][m], 100 * r["dev"][m]
    ppl = {r["step"]: r["dev_ppl"] for r in map(json.loads, open(f"{T}/pt/{name}/log.jsonl")) if "dev_ppl" in r}
    d["ppl"] = {s: ppl[s] for s in (2000, 4000, 8000, 12000, 16000) if s in ppl}
    d["last"] = ppl[max(ppl)]
    return d

def done(name):
    return all(os.path.exists(f"{T}/ft/{name}/{t}/results.json") for t in ("ner", "parse"))

r8 = {s: dict(zip(("ner", "parse"), v)) for s, v in table1_sep_emb.items()}
r8.update({s: run(f"sep-emb-s{s}") for s in range(2, 6)})
r16 = {s: run(f"steps16k-sep-emb-s{s}") for s in range(6) if done(f"steps16k-sep-emb-s{s}")}
print("Sep Emb, 16,000 updates (fr test NER / LAS; en dev NER / LAS; dev ppl en / fr at 4k, 8k, 12k, 16k)")
for s, r in r16.items():
    print(f"  s{s}  {r['ner']:5.1f} / {r['parse']:5.1f}   en dev {r['en_ner']:.1f} / {r['en_parse']:.1f}   "
          + ", ".join(f"{p['en']:.1f} / {p['fr']:.1f}" for k, p in r["ppl"].items() if k >= 4000))
stalled = [s for s, r in r16.items() if r["last"]["en"] > min(50, 1.5 * min(q["last"]["en"] for q in r16.values()))]
print(f"stalled (last en dev ppl above 50 or 1.5x the best seed's): {stalled or 'none'} of {len(r16)}")

def summary(rs, label):
    ner, las = [r["ner"] for r in rs], [r["parse"] for r in rs]
    print(f"{label:30s} {len(rs)} seeds  NER {np.mean(ner):5.1f} ± {np.std(ner):4.1f} (median {np.median(ner):5.1f})"
          f"  LAS {np.mean(las):5.1f} ± {np.std(las):4.1f} (median {np.median(las):5.1f})"
          + (f"  r(NER, LAS) = {np.corrcoef(ner, las)[0, 1]:.2f}" if len(rs) > 2 else ""))
summary(list(r8.values()), "Sep Emb, 8,000 updates")
summary([r for s, r in r16.items() if s not in stalled], "Sep Emb, 16,000 updates")
paired = [s for s in r16 if s not in stalled]
if paired:
    for t in ("ner", "parse"):
        dif = [r16[s][t] - r8[s][t] for s in paired]
        print(f"  {t}: 16k minus 8k per seed " + ", ".join(f"s{s} {d:+.1f}" for s, d in zip(paired, dif))
              + f"; {sum(d > 5 for d in dif)} of {len(dif)} up by more than 5 points")
others = {}   # the 16,000-update Default and No anchors of slice 3, converged seeds
for m in ("default", "no-anchors"):
    rs = [run(n) for n in sorted(os.listdir(f"{T}/ft")) if n.rsplit("-s", 1)[0] == f"steps16k-{m}" and done(n)]
    others[m] = [r for r in rs if r["last"]["en"] <= min(50, 1.5 * min(q["last"]["en"] for q in rs))]
    summary(others[m], f"{m}, 16,000 updates")

fig = Figure(figsize=(9.5, 3.2))
for ax, (task, label) in zip(fig.subplots(1, 2), (("ner", "NER fr (span F1, %)"), ("parse", "parsing fr (LAS, %)"))):
    for s in r8:
        ys = [r8[s][task]] + ([r16[s][task]] if s in r16 else [])
        ax.plot([0, 1][:len(ys)], ys, "o-" if s not in stalled else "x--", color=f"C{s}", label=f"seed {s}")
    for m, style in (("default", "k-"), ("no-anchors", "k:")):
        y = np.mean([r[task] for r in others[m]])
        ax.plot([0.85, 1.15], [y, y], style, lw=1.2, label=f"{m}, 16k mean")
    ax.set_xticks([0, 1], ["8,000 updates\n(Table 1 world)", "16,000 updates"], fontsize=8)
    ax.set(title=f"Sep Emb: {label}", xlim=(-0.3, 1.3), ylim=(0, 100))
    ax.grid(alpha=0.3)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
fig.tight_layout()
fig.savefig(out, dpi=110)
