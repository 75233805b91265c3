"""finetune.py's scorers vs the reference tools, as known answers (the tools are not needed to run this file).

1. NER: `span_f1` vs seqeval 1.2.2, default (conlleval-style, non-strict) mode, on 300 seeded sentences of
   IOB2 tags over PER/LOC/ORG (`ner_case`). The predictions drop, retype, shrink, extend and split whole gold
   spans, start some spans with a standalone I-X and add stray one-token entities, but never change type
   inside a run. On such input the paper's repair (`repair_bio`) only turns a standalone I-X into B-X,
   which is also how seqeval/conlleval chunk it, so the two must agree. A hand-derived case with type
   changes inside a run shows where span_f1 deliberately differs (the paper's rule: B-X I-Y I-Z -> B-Z I-Z I-Z,
   one span of the final type; seqeval cuts the run into one chunk per type).
2. Parsing: `attachment_scores` vs the official CoNLL 2018 shared task scorer `conll18_ud_eval.py`
   (version 1.2, github.com/ufal/conll2018 evaluation_script/, commit 1a2c3733b3ce0b2779c4aba5fe77309f8e858481,
   sha256 589506a892ccb4aa8b0164b2dcc6536ecb571441786f0618c0f6328656c1a582) on the real UD French-GSD test
   file: 416 sentences, 10018 words (280 multiword tokens, whose words both sides score; no empty nodes),
   with HEAD and DEPREL perturbed by `perturb_parse` (seeded): heads moved to other positions (still a tree),
   re-rooted sentences, deprels swapped, and subtype-only changes (`nmod` -> `nmod:poss`, `obl:mod` -> `obl`)
   that both scorers must ignore. Tokenisation is unchanged, so the scorer's UAS/LAS F1 equal accuracies.

The generators below are the regeneration recipe: they use only `random.Random(seed)` (`random()` and
`randrange()`, stable across Python 3 versions). To regenerate, with seqeval and the CoNLL 2018 script installed
(here: a venv /tmp/refenv with seqeval==1.2.2, Python 3.11.7, and the script saved as
/tmp/conll18/conll18_ud_eval.py), run from the repository root:

    /tmp/refenv/bin/python - <<'EOF'
    import sys; sys.path[:0] = ["tests", ".", "/tmp/conll18"]
    import finetune as ft, test_reference_metrics as T, conll18_ud_eval as ud
    from seqeval.metrics import precision_score, recall_score, f1_score
    for gold, pred in (T.ner_case(), (T.TYPE_CHANGE_GOLD, T.TYPE_CHANGE_PRED)):
        print([float(m(gold, pred)) for m in (precision_score, recall_score, f1_score)])  # default mode
    sents = ft.read_conllu(T.UD_TEST)
    heads, rels = T.perturb_parse([s["heads"] for s in sents], [s["rels"] for s in sents])
    flat = iter(zip(sum(heads, []), sum(rels, [])))
    with open(T.UD_TEST, encoding="utf-8") as f, open("/tmp/conll18/system.conllu", "w", encoding="utf-8") as g:
        for line in f:
            cols = line.rstrip("\\n").split("\\t")
            if len(cols) == 10 and cols[0].isdigit():  # a word line (not a comment, range or empty node)
                h, r = next(flat)
                cols[6], cols[7] = str(h), r
                line = "\\t".join(cols) + "\\n"
            g.write(line)
    e = ud.evaluate(ud.load_conllu_file(T.UD_TEST), ud.load_conllu_file("/tmp/conll18/system.conllu"))
    for m in ("Words", "UAS", "LAS"):
        print(m, e[m].correct, e[m].gold_total, e[m].system_total, repr(e[m].f1))
    EOF

and paste the printed numbers into the constants below. (The script's command line,
`python /tmp/conll18/conll18_ud_eval.py -v GOLD /tmp/conll18/system.conllu`, prints the same values rounded.)

Run: python -m pytest -q tests/test_reference_metrics.py
"""
import os
import random

import pytest

import finetune as ft
from conftest import is_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UD_TEST = os.path.join(ROOT, "..", "shared", "data", "ud", "UD_French-GSD", "fr_gsd-ud-test.conllu")

# -----------------------------------------------------------------------------
# NER span F1 vs seqeval 1.2.2 (default mode)

NER_TYPES = ("PER", "LOC", "ORG")

# seqeval 1.2.2: precision_score, recall_score, f1_score (mode=None) on ner_case()
SEQEVAL_P = 0.5124481327800829
SEQEVAL_R = 0.5446527012127894
SEQEVAL_F1 = 0.5280598610368787
NER_COUNTS = (494, 964, 907)  # (true positives, predicted, gold) chunks; seqeval get_entities gives the same


def _gold_spans(tags):
    """(type, start, end_exclusive) of a valid IOB2 sequence, in order (the generator's own chunker)."""
    spans = []
    for t, tag in enumerate(tags):
        if tag.startswith("B-"):
            spans.append([tag[2:], t, t + 1])
        elif tag.startswith("I-"):
            spans[-1][2] = t + 1
    return [tuple(s) for s in spans]


def _no_type_change_in_a_run(tags):
    return all(not tag.startswith("I-") or t == 0 or tags[t - 1] == "O" or tags[t - 1][2:] == tag[2:]
               for t, tag in enumerate(tags))


def ner_case(seed=0, n_sentences=300):
    """(gold, pred): seeded IOB2 gold tags and predictions that perturb whole spans, no type change in a run."""
    rng = random.Random(seed)
    gold, pred = [], []
    for _ in range(n_sentences):
        length = 3 + rng.randrange(18)
        g = []
        while len(g) < length:
            if rng.random() < 0.6:
                g.append("O")
            else:
                typ, span_len = NER_TYPES[rng.randrange(3)], 1 + rng.randrange(4)
                g += ["B-" + typ] + ["I-" + typ] * (span_len - 1)
        g = g[:length]  # cutting the tail keeps it valid IOB2

        spans = []
        for typ, s, e in _gold_spans(g):
            u = rng.random()
            split = None
            if u < 0.50:
                pass  # kept as is
            elif u < 0.60:
                continue  # dropped
            elif u < 0.70:
                typ = NER_TYPES[(NER_TYPES.index(typ) + 1 + rng.randrange(2)) % 3]  # retyped
            elif u < 0.78 and e - s > 1:
                e -= 1  # shrunk at the end
            elif u < 0.85 and e - s > 1:
                s += 1  # shrunk at the start
            elif u < 0.92 and e < length and g[e] == "O":
                e += 1  # extended over an O
            elif e - s > 1:
                split = s + 1 + rng.randrange(e - s - 1)  # cut in two spans of the same type
            spans.append((typ, s, e, split))

        p = ["O"] * length
        for typ, s, e, split in spans:  # left to right, so p[s - 1] is final when the start is written
            standalone = (s == 0 or p[s - 1] == "O") and rng.random() < 0.25
            p[s] = ("I-" if standalone else "B-") + typ
            for t in range(s + 1, e):
                p[t] = ("B-" if t == split else "I-") + typ
        for t in range(length):  # stray one-token entities, B-X or standalone I-X
            if p[t] == "O" and (t == 0 or p[t - 1] == "O") and (t + 1 == length or not p[t + 1].startswith("I-")) \
                    and rng.random() < 0.05:
                p[t] = ("I-" if rng.random() < 0.5 else "B-") + NER_TYPES[rng.randrange(3)]
        assert _no_type_change_in_a_run(p)
        gold.append(g)
        pred.append(p)
    return gold, pred


def test_ner_case_is_the_recorded_one():
    """The generator still makes the data the reference numbers were computed on, and it exercises the repair."""
    gold, pred = ner_case()
    assert len(gold) == 300 and [len(g) for g in gold] == [len(p) for p in pred]
    assert all(_no_type_change_in_a_run(g) and _no_type_change_in_a_run(p) for g, p in zip(gold, pred))
    tp = sum(len(set(_gold_spans(g)) & ft.bio_spans(ft.repair_bio(p))) for g, p in zip(gold, pred))
    n_pred = sum(len(ft.bio_spans(ft.repair_bio(p))) for p in pred)
    n_gold = sum(len(_gold_spans(g)) for g in gold)
    assert (tp, n_pred, n_gold) == NER_COUNTS
    standalone = sum(tag.startswith("I-") and (t == 0 or p[t - 1] == "O") for p in pred for t, tag in enumerate(p))
    assert standalone >= 50  # many spans only exist after I-X -> B-X


def test_span_f1_equals_seqeval():
    p, r, f = ft.span_f1(*ner_case())
    assert abs(p - SEQEVAL_P) < 1e-12 and abs(r - SEQEVAL_R) < 1e-12 and abs(f - SEQEVAL_F1) < 1e-12
    assert conlleval_prf(*ner_case()) == pytest.approx((SEQEVAL_P, SEQEVAL_R, SEQEVAL_F1), abs=1e-12)


# Type changes inside a run, where the paper's repair and seqeval part ways (derivation in the test).
TYPE_CHANGE_GOLD = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG"], ["B-LOC", "I-LOC", "O"]]
TYPE_CHANGE_PRED = [["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "I-LOC", "I-ORG"], ["B-LOC", "I-PER", "O"]]
# seqeval 1.2.2 (default mode) on them, computed as above
SEQEVAL_TYPE_CHANGE = (0.2857142857142857, 0.5, 0.36363636363636365)


def conlleval_chunks(tags):
    """(type, start, end) chunks as conlleval / seqeval's default mode cut them from IOB2 tags: a chunk
    ends before a B-, an O or a type change, and a type change (or an I- after O) starts a new one.
    An independent re-derivation of seqeval's numbers, not span_f1's repair."""
    chunks, start, typ = [], None, None
    for i, t in enumerate(list(tags) + ["O"]):
        prefix, t_typ = (t.split("-", 1) + [None])[:2] if t != "O" else ("O", None)
        if start is not None and (prefix in ("B", "O") or t_typ != typ):
            chunks.append((typ, start, i))
            start = None
        if prefix != "O" and start is None:
            start, typ = i, t_typ
    return chunks


def conlleval_prf(gold, pred):
    g = {(s, c) for s, tags in enumerate(gold) for c in conlleval_chunks(tags)}
    p = {(s, c) for s, tags in enumerate(pred) for c in conlleval_chunks(tags)}
    P, R = len(g & p) / len(p), len(g & p) / len(g)
    return P, R, 2 * P * R / (P + R)


def test_span_f1_differs_from_seqeval_on_type_changes():
    """Gold spans: PER 0-2, LOC 3-4 | ORG 0-3 | LOC 0-2 (4 spans).

    span_f1 (paper repair, B-X I-Y I-Z -> B-Z I-Z I-Z): sentence 2 becomes ORG 0-3 (correct), sentence 3
    becomes PER 0-2 (wrong type): 4 predicted spans, 3 correct -> P = R = F1 = 3/4.
    seqeval (a type change starts a new chunk): sentence 2 is PER 0-1, LOC 1-2, ORG 2-3 and sentence 3 is
    LOC 0-1, PER 1-2, none correct: 7 predicted, 2 correct -> P = 2/7, R = 2/4, F1 = 2PR/(P+R) = 4/11.
    """
    assert ft.span_f1(TYPE_CHANGE_GOLD, TYPE_CHANGE_PRED) == pytest.approx((3 / 4, 3 / 4, 3 / 4), abs=1e-12)
    assert conlleval_prf(TYPE_CHANGE_GOLD, TYPE_CHANGE_PRED) == pytest.approx(SEQEVAL_TYPE_CHANGE, abs=1e-12)
    assert SEQEVAL_TYPE_CHANGE == pytest.approx((2 / 7, 1 / 2, 4 / 11), abs=1e-12)  # the hand derivation
    assert ft.span_f1(TYPE_CHANGE_GOLD, TYPE_CHANGE_PRED) != pytest.approx(SEQEVAL_TYPE_CHANGE)


# -----------------------------------------------------------------------------
# LAS / UAS vs conll18_ud_eval.py 1.2 on UD French-GSD test

# conll18_ud_eval.evaluate(gold, system): (correct, gold_total == system_total, f1) per metric
CONLL18_WORDS = (10018, 10018, 1.0)
CONLL18_UAS = (8638, 10018, 0.8622479536833699)
CONLL18_LAS = (7755, 10018, 0.7741066081054102)

# Universal dependency relations (UD v2), the pool for deprel swaps; subtypes for subtype-only changes.
UD_RELATIONS = ("acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound",
                "conj", "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat",
                "goeswith", "iobj", "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan",
                "parataxis", "punct", "reparandum", "root", "vocative", "xcomp")
SUBTYPES = ("poss", "tmod", "pass", "relcl", "arg", "mod", "name")


def _subtree(heads, k):
    """Word k and all its descendants (1-based ids)."""
    out = set()
    for j in range(1, len(heads) + 1):
        v = j
        while v != 0 and v != k:
            v = heads[v - 1]
        if v == k:
            out.add(j)
    return out


def perturb_parse(gold_heads, gold_rels, seed=0):
    """Seeded system output: per word, 12% head moved under a non-descendant, 1.5% the sentence re-rooted
    at it, 10% deprel swapped for another universal one (half the time with a subtype), 15% a subtype-only
    change (`nmod` -> `nmod:poss`, `obl:mod` -> `obl` or `obl:arg`). Every sentence stays a tree."""
    rng = random.Random(seed)
    pred_heads, pred_rels = [], []
    for gh, gr in zip(gold_heads, gold_rels):
        h, r = list(gh), list(gr)
        n = len(h)
        for i in range(n):
            k = i + 1
            u = rng.random()
            if u < 0.12 and h[i] != 0:
                blocked = _subtree(h, k) | {h[i]}
                cand = [j for j in range(1, n + 1) if j not in blocked]
                if cand:
                    h[i] = cand[rng.randrange(len(cand))]
            elif u < 0.135 and h[i] != 0:  # k becomes the root, the old root hangs from k
                h[h.index(0)] = k
                h[i] = 0
            v = rng.random()
            base = r[i].split(":")[0]
            if v < 0.10:
                others = [rel for rel in UD_RELATIONS if rel != base]
                r[i] = others[rng.randrange(len(others))]
                if rng.random() < 0.5:
                    r[i] += ":" + SUBTYPES[rng.randrange(len(SUBTYPES))]
            elif v < 0.25:
                subs = [rel for rel in [base] + [base + ":" + s for s in SUBTYPES] if rel != r[i]]
                r[i] = subs[rng.randrange(len(subs))]
        assert is_tree(h)
        pred_heads.append(h)
        pred_rels.append(r)
    return pred_heads, pred_rels


needs_ud = pytest.mark.skipif(not os.path.isfile(UD_TEST), reason="../shared/data/ud not present")


@needs_ud
def test_attachment_scores_equal_conll18_ud_eval():
    sents = ft.read_conllu(UD_TEST)
    gh, gr = [s["heads"] for s in sents], [s["rels"] for s in sents]
    ph, pr = perturb_parse(gh, gr)
    n = sum(len(h) for h in gh)
    assert (len(sents), n) == (416, CONLL18_WORDS[1])  # read_conllu keeps the words of multiword tokens
    uas, las = ft.attachment_scores(gh, gr, ph, pr)
    assert abs(uas - CONLL18_UAS[2]) < 1e-12 and abs(las - CONLL18_LAS[2]) < 1e-12
    assert (round(uas * n), round(las * n)) == (CONLL18_UAS[0], CONLL18_LAS[0])

    # the case exercises what it should: subtype-only changes (LAS would drop if they counted) and head errors
    pairs = [(a, b, c, d) for s in zip(gh, gr, ph, pr) for a, b, c, d in zip(*s)]
    same_head_subtype_only = sum(a == c and b != d and b.split(":")[0] == d.split(":")[0] for a, b, c, d in pairs)
    assert same_head_subtype_only > 1000
    las_without_stripping = sum(a == c and b == d for a, b, c, d in pairs) / n
    assert las_without_stripping < CONLL18_LAS[2] - 0.05
    # the reference numbers recounted from the pairs, independently of attachment_scores
    assert sum(a == c for a, b, c, d in pairs) == CONLL18_UAS[0]
    assert sum(a == c and b.split(":")[0] == d.split(":")[0] for a, b, c, d in pairs) == CONLL18_LAS[0]
    assert CONLL18_UAS[2] < 0.95 and CONLL18_LAS[2] < CONLL18_UAS[2]
