"""Summarise the Sep Emb capacity study: every run's convergence and scores, the gaps per point,
and the figure figures/sep-emb-capacity.png (with matplotlib).

    python notes/sep-emb-capacity/summarize.py OUT_DIR     # OUT_DIR of run.sh

P1's rows are Table 1's runs (RESULTS.md, measured with the same preset on the same world), and
the first session's P3 / P5 runs are typed in below (their folders were not kept); OUT_DIR's runs
are read and added to them.
"""
import glob
import json
import os
import re
import sys

TASKS = ["xnli", "ner", "parse"]
# the paper's Table 1, en-fr, fr test: Default and Sep Emb (§4.3)
PAPER = {"default": [73.6, 79.8, 73.2], "sep-emb": [72.7, 75.5, 71.7]}
# Table 1 of RESULTS.md (the current preset): fr XNLI / NER / LAS per seed; en / fr dev ppl
P1 = {
    "default": [[58.3, 92.9, 82.1], [70.7, 89.6, 92.9], [72.7, 95.8, 92.2]],
    "sep-emb": [[34.7, 10.1, 11.0], [33.3, 0.7, 6.9]],
    "sep-tok": [[53.0, 23.2, 68.8]],
}
P1_PER_TOKEN = 525913 / 380172
# the first session's converged runs at P3 and P5 (2026-11-28, the first Results table of
# notes/sep-emb-capacity.md; their folders were not kept), typed in: fr XNLI / NER / LAS per seed
EARLIER = {
    "p3": {"default": [[73.2, 92.5, 83.2]], "sep-emb": [[34.5, 5.6, 6.9]]},
    "p5": {"default": [[66.8, 81.0, 92.8], [68.5, 93.5, 91.5]],
           "sep-emb": [[36.2, 4.8, 3.5], [33.7, 0.0, 3.5]]},
}
EARLIER_PER_TOKEN = {"p3": 525783 / 1524653, "p5": 525913 / 6104786}
POINTS = {"p1": "x1", "p3": "x4", "p5": "x16", "p2": "x1, d=32", "p4": "x4, d=32"}


def read_run(out, name):
    """One run's pretraining verdict and fine-tuning scores."""
    log = open(os.path.join(out, f"{name}.log"), encoding="utf-8").read()
    params = int(re.search(r"model: ([\d,]+) parameters", log).group(1).replace(",", ""))
    tokens = sum(int(t) for t in re.search(r"train tokens \[([\d, ]+)\]", log).group(1).split(","))
    evals = []
    with open(os.path.join(out, "pt", name, "log.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "dev_ppl" in record:
                evals.append(record)
    run = {"name": name, "params": params, "tokens": tokens, "scores": None}
    result_files = {t: os.path.join(out, "ft", name, t, "results.json") for t in TASKS}
    if all(os.path.exists(p) for p in result_files.values()):
        scores = []
        en_dev = []
        for task in TASKS:
            with open(result_files[task], encoding="utf-8") as f:
                r = json.load(f)
            scores.append(100 * r["test"]["fr"][r["metric"]])
            en_dev.append(100 * r["dev"][r["metric"]])
        counts = r["pretrain"]["count_ppl"]["en"]
        run.update(scores=scores, en_dev=en_dev, counts=counts)
        run["ppl"] = r["pretrain"]["dev_ppl"]
        below = [e["step"] for e in evals if e["dev_ppl"]["en"] < counts["left"]]
        run["exit"] = below[0] if below else None
        run["converged"] = run["ppl"]["en"] < counts["left"]
    return run


def mean(rows):
    return [sum(col) / len(col) for col in zip(*rows)]


def main(out):
    names = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(out, "p[2-5]-*-s*.log")))
    runs = [read_run(out, n) for n in names]
    print("run              params  tokens  per-token | en ppl  fr ppl  left  both  exit  verdict"
          " | fr XNLI  NER   LAS | en dev XNLI  NER   LAS")
    for r in runs:
        if r["scores"] is None:
            print(f"{r['name']:16s} (not finished)")
            continue
        verdict = "converged" if r["converged"] else "NOT converged"
        print(f"{r['name']:16s} {r['params']:7d} {r['tokens']:8d} {r['params'] / r['tokens']:6.3f} | "
              f"{r['ppl']['en']:6.2f} {r['ppl']['fr']:6.2f} {r['counts']['left']:5.1f} "
              f"{r['counts']['both']:5.1f} {str(r['exit']):>5s}  {verdict:13s} | "
              + " ".join(f"{s:5.1f}" for s in r["scores"]) + " | "
              + " ".join(f"{s:5.1f}" for s in r["en_dev"]))

    # the gaps: Default - model, per point, over the converged runs
    table = {"p1": dict(P1)}
    per_token = {"p1": P1_PER_TOKEN, **EARLIER_PER_TOKEN}
    for point, models in EARLIER.items():
        table[point] = {model: list(rows) for model, rows in models.items()}
    for r in runs:
        if r["scores"] is None or not r["converged"]:
            continue
        point, model = r["name"].split("-", 1)
        model = model.rsplit("-s", 1)[0]
        table.setdefault(point, {}).setdefault(model, []).append(r["scores"])
        if model == "default":
            per_token[point] = r["params"] / r["tokens"]
    paper_gap = [d - s for d, s in zip(PAPER["default"], PAPER["sep-emb"])]
    print(f"\npaper (en-fr) Default - Sep Emb: XNLI {paper_gap[0]:.1f} NER {paper_gap[1]:.1f} "
          f"LAS {paper_gap[2]:.1f} mean {sum(paper_gap) / 3:.1f}")
    print("point  world       per-token  model    seeds | gap XNLI   NER   LAS  mean | "
          "range of the mean gap over seeds")
    gaps = {}
    for point in sorted(table, key=lambda p: -per_token.get(p, 0)):
        models = table[point]
        if "default" not in models:
            continue
        base = mean(models["default"])
        for model in ("sep-emb", "sep-tok"):
            if model not in models:
                continue
            gap = [b - s for b, s in zip(base, mean(models[model]))]
            seed_means = [sum(b - s for b, s in zip(base, row)) / 3 for row in models[model]]
            gaps.setdefault(model, []).append((per_token[point], gap))
            print(f"{point:6s} {POINTS[point]:11s} {per_token[point]:8.3f}  {model:8s} "
                  f"{len(models[model])}/{len(models['default'])} | "
                  + " ".join(f"{g:5.1f}" for g in gap) + f" {sum(gap) / 3:5.1f} | "
                  f"{min(seed_means):.1f} to {max(seed_means):.1f}")
    draw(gaps, paper_gap)


def draw(gaps, paper_gap):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib is not installed: no figure")
        return
    fig = Figure(figsize=(9, 4))
    for ax, model in zip(fig.subplots(1, 2, sharey=True, sharex=True), ("sep-emb", "sep-tok")):
        points = sorted(gaps.get(model, []))
        x = [p for p, _ in points]
        for k, label in enumerate(["XNLI", "NER", "LAS"]):
            ax.plot(x, [g[k] for _, g in points], marker="o", label=label, alpha=0.7)
        ax.plot(x, [sum(g) / 3 for _, g in points], marker="s", color="black", lw=2, label="mean")
        ax.axhline(sum(paper_gap) / 3, color="black", ls="--", label="paper's mean (Sep Emb)")
        ax.set(xscale="log", xlabel="parameters per training token (Default)",
               title=f"Default − {'Sep Emb' if model == 'sep-emb' else 'Sep Tok'}, fr test")
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel("gap (points)")
    fig.axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(os.path.dirname(__file__), "..", "..", "figures", "sep-emb-capacity.png")
    fig.savefig(path, dpi=100)
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main(sys.argv[1])
