"""Draw figures/table1-delta.png: each Table 1 row's Δ in the toy lab against the paper's, en -> fr.

Δ is a row's mean over the three French test scores (XNLI accuracy, NER span F1, parsing LAS)
minus the Default's. Ours: RESULTS.md's Table 1 with the new --toy preset (the Δ column that
`finetune.py --table` prints). The paper's: its Table 1, the fr columns (the paper's own Δ column
averages each task over fr, ru and zh, so it is recomputed here from the fr columns alone).
Sep Tok and Sep Pos are ours only: they are not in the paper.

Run from the repository root (needs matplotlib): python notes/table1/plot_delta.py
It prints the table it draws.
"""
from matplotlib.figure import Figure

# row: (label, seeds, ours fr XNLI / NER / LAS, our Δ, the paper's fr XNLI / NER / LAS)
ROWS = [
    ("Default", 3, (67.2, 92.8, 89.0), 0.0, (73.6, 79.8, 73.2)),
    ("Wiki-CC", 1, (50.0, 85.6, 88.3), -8.4, (74.2, 74.0, 71.3)),
    ("No anchors", 4, (59.8, 57.4, 83.1), -16.3, (72.1, 74.0, 72.3)),
    ("Default anchors", 1, (57.3, 85.4, 83.0), -7.8, (74.0, 76.8, 73.0)),
    ("Extra anchors", 1, (60.5, 94.5, 87.7), -2.1, (74.0, 76.1, 73.3)),
    ("Sep Emb", 2, (34.0, 5.4, 9.0), -66.9, (72.7, 75.5, 71.7)),
    ("Sep L1-3", 1, (59.5, 84.1, 77.4), -9.3, (72.4, 74.0, 69.7)),
    ("Sep L1-6", 1, (34.0, 52.0, 47.2), -38.6, (61.9, 61.2, 61.7)),
    ("Sep Emb + L1-3", 1, (34.3, 0.0, 1.6), -71.0, (69.2, 73.8, 68.2)),
    ("Sep Emb + L1-6", 3, (34.3, 1.0, 1.5), -70.7, (51.6, 56.5, 50.9)),
]
OUT = "figures/table1-delta.png"


def mean(values):
    return sum(values) / len(values)


paper_default = mean(ROWS[0][4])
points = []
print(f"{'row':16s} {'seeds':>5s} {'our Δ':>7s} {'paper Δ (fr)':>13s}")
for label, seeds, ours, our_delta, paper in ROWS:
    paper_delta = mean(paper) - paper_default
    points.append((label, seeds, paper_delta, our_delta))
    print(f"{label:16s} {seeds:5d} {our_delta:+7.1f} {paper_delta:+13.1f}")

fig = Figure(figsize=(7.0, 4.6))
ax = fig.subplots()
# a row per Table 1 row, top to bottom in the table's order; a line joins the paper's Δ to ours
for y, (label, seeds, paper_delta, our_delta) in enumerate(points):
    ax.plot([paper_delta, our_delta], [y, y], color="gray", lw=1, zorder=1)
    paper_label = None
    our_label = None
    if y == 0:
        paper_label = "the paper (en-fr)"
        our_label = "toy, new --toy preset"
    ax.plot(paper_delta, y, "o", mfc="white", color="C1", label=paper_label, zorder=2)
    ax.plot(our_delta, y, "o", color="C0", label=our_label, zorder=2)
tick_labels = [f"{label} ({seeds})" for label, seeds, _, _ in points]
ax.set_yticks(range(len(points)), tick_labels, fontsize=8)
ax.invert_yaxis()
ax.set(xlim=(-75, 5))
ax.axvline(0, color="k", lw=0.5)
ax.set_xlabel("Δ against the Default (points; mean of fr XNLI, NER, LAS)")
title = "Table 1, en -> fr: each row's Δ, ours against the paper's (our seeds in brackets)"
ax.set_title(title, fontsize=9)
ax.grid(alpha=0.3, axis="x")
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
fig.savefig(OUT, dpi=110)
print("wrote", OUT)
