"""Draw RESULTS.md's Figs. 4, 6 and 7 from the tables the §5 commands saved (`| tee $S/NAME.md`): several
printed tables side by side, drawn by model.plot_layers, the function behind align.py's and cka.py's --plot."""
import os
import re
import sys

# the repository root (two folders up), where model.py is
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import model

S, F = sys.argv[1], sys.argv[2]


def table(name):
    """{row label: {column: cell}} of the markdown table in S/NAME.md; Fig. 4's ' (4a)' / ' (4b)' dropped."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in open(f"{S}/{name}.md")
            if line.startswith("|")]
    return {re.sub(r" \(4[ab]\)$", "", r[0]): dict(zip(rows[0][1:], r[1:])) for r in rows[2:]}


def draw(png, title, ylabel, lines):
    """lines: (legend, table, column); the layers (x) are those of the first line's table, in its order."""
    tables = {name: table(name) for _, name, _ in lines}
    cell = lambda t, layer, col: float(t[layer][col]) if layer in t and t[layer].get(col, "-") != "-" else "-"
    layers = [k for k in tables[lines[0][1]] if k != "avg"]
    rows = [[layer] + [cell(tables[name], layer, col) for _, name, col in lines] for layer in layers]
    model.plot_layers(f"{F}/{png}", title, ["layer"] + [legend for legend, _, _ in lines], rows, ylabel)


draw("fig4-words.png", "Fig. 4: word translation en->fr, P@1 (CSLS)", "P@1 (%)", [
    ("bilingual, no map", "words-bi", "no map"), ("bilingual, Procrustes", "words-bi", "Procrustes"),
    ("monolingual pair, no map", "words-mono", "no map"), ("monolingual pair, Procrustes", "words-mono", "Procrustes"),
    ("monolingual pair, contextual (5.1.2), Procrustes", "contextual-mono", "Procrustes")])
draw("fig6-sentences.png", "Fig. 6: sentence retrieval en->fr, P@1", "P@1 (%)", [
    ("bilingual, no map", "sentences-bi", "en->fr"), ("bilingual, Procrustes", "sentences-bi", "en->fr mapped"),
    ("monolingual pair, no map", "sentences-mono", "en->fr"),
    ("monolingual pair, Procrustes", "sentences-mono", "en->fr mapped")])
draw("fig7-cka.png", "Fig. 7: linear CKA of mean-pooled parallel sentences", "linear CKA", [
    ("en-fr bilingual", "cka-bi", "bilingual"), ("en-fr monolingual pair", "cka-mono", "monolingual"),
    ("random (bilingual's config)", "cka-bi", "random"),
    ("en-en' two English models (seeds 1, 3)", "cka-enen", "monolingual"),
    ("en-en' one model, separate embeddings", "cka-enen-sep", "bilingual")])
