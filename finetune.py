"""Zero-shot cross-lingual transfer: XNLI, NER (WikiAnn / PAN-X) and UD dependency parsing.

The paper's measure of cross-lingual structure (Conneau et al. 2020, §3.2, Table 1): fine-tune a
pretrained encoder on English only, choose the epoch and the hyper-parameters on English dev, and
evaluate the same model directly on the other languages' test sets.

- XNLI: `</s> premise </s> hypothesis </s>`, dropout + linear softmax on the last layer at position 0,
  two Adam optimisers (encoder lr, classifier lr), accuracy (XLM `evaluation/xnli.py`).
- NER: BIO tags, a linear layer on the first subword of every word, span F1 after the paper's repair
  heuristic (Wu & Dredze 2019).
- Parsing: Dozat & Manning's biaffine parser on the first subword of every word (ROOT = position 0),
  Chu-Liu-Edmonds MST decoding with exactly one root, UAS/LAS as the CoNLL 2018 scorer with gold
  tokenisation (punctuation counted, deprel subtypes stripped).

Run (see --help for every flag):
    python finetune.py --task ner --ckpt runs/toy/best.pt --toy runs/toy/toy --out runs/ft-ner
    python finetune.py --toy --ckpt runs/toy/best.pt --out runs/ft            # all three tasks, toy preset
    python finetune.py --task parse --ckpt best.pt --data ../shared/data --eval-langs fr,ru,zh --out runs/parse
"""
import math
import os
import re
import unicodedata

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Readers for the formats in data/ (and toydata.py, which writes the same formats)

XNLI_LABELS = ("contradiction", "neutral", "entailment")  # XLM's label ids 0, 1, 2 (PAPER_NOTES §4.1)


def read_xnli(path):
    """`premise<TAB>hypothesis<TAB>label` per line (XTREME form) -> list of (premise, hypothesis, label).

    Labels are kept by name; MultiNLI's `contradictory` (XNLI-MT train) is renamed `contradiction`.
    A header line `premise hypo label` / `sentence1 sentence2 gold_label` is skipped; CRLF is fine.
    """
    examples = []
    with open(path, encoding="utf-8", newline="\n") as f:  # a stray \r is not a line end
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{lineno}: expected premise<TAB>hypothesis<TAB>label, "
                                 f"got {len(fields)} tab-separated field(s)")
            premise, hypothesis, label = (x.strip() for x in fields)
            if lineno == 1 and label in ("label", "gold_label"):
                continue
            label = "contradiction" if label == "contradictory" else label
            if not premise or not hypothesis or not label:
                raise ValueError(f"{path}:{lineno}: empty premise, hypothesis or label")
            examples.append((premise, hypothesis, label))
    if not examples:
        raise ValueError(f"{path}: no examples (empty split)")
    return examples


_LANG_PREFIX = re.compile(r"^([a-z]{2,3}):")


def read_ner(path):
    """PAN-X `token<TAB>tag`, blank line between sentences -> list of (words, tags).

    The raw PAN-X files prefix every token with its language (`en:Paris`); the prefix is stripped when
    EVERY token of the file carries the same one (so a token like `12:30` in a plain file stays whole).
    """
    sentences, words, tags, lines = [], [], [], []
    with open(path, encoding="utf-8", newline="\n") as f:  # a stray \r is not a line end
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                if words:
                    sentences.append((words, tags))
                    words, tags = [], []
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0] or not fields[1].strip():
                raise ValueError(f"{path}:{lineno}: expected token<TAB>tag, got {line!r}")
            tag = fields[1].strip()
            if tag != "O" and not re.match(r"^[BI]-\S+$", tag):
                raise ValueError(f"{path}:{lineno}: tag {tag!r} is not O, B-X or I-X (IOB2)")
            words.append(fields[0])
            tags.append(tag)
            lines.append(fields[0])
    if words:
        sentences.append((words, tags))
    if not sentences:
        raise ValueError(f"{path}: no sentences (empty split)")
    prefixes = {m.group(1) if m else None for m in map(_LANG_PREFIX.match, lines)}
    if len(prefixes) == 1 and None not in prefixes:
        n = len(prefixes.pop()) + 1
        sentences = [([w[n:] for w in ws], ts) for ws, ts in sentences]
    return sentences


def read_conllu(path):
    """CoNLL-U -> list of sentences, each a dict with `words`, `upos`, `heads` (0 = root), `rels`.

    Comment lines (#), multiword ranges (`1-2`) and empty nodes (`1.1`) are skipped, as the CoNLL 2018
    scorer does for basic trees. DEPREL is kept as written (subtypes are stripped where it matters).
    """
    sentences, rows = [], []

    def flush(lineno):
        if not rows:
            return
        n = len(rows)
        for k, (ln, wid, _, _, head, _) in enumerate(rows, 1):
            if wid != k:
                raise ValueError(f"{path}:{ln}: word id {wid} out of sequence (expected {k})")
            if not 0 <= head <= n:
                raise ValueError(f"{path}:{ln}: head {head} outside 0..{n}")
        sentences.append({"words": [r[2] for r in rows], "upos": [r[3] for r in rows],
                          "heads": [r[4] for r in rows], "rels": [r[5] for r in rows]})
        rows.clear()

    with open(path, encoding="utf-8", newline="\n") as f:  # a stray \r is not a line end
        lineno = 0
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                flush(lineno)
                continue
            if line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 10:
                raise ValueError(f"{path}:{lineno}: expected 10 tab-separated CoNLL-U columns, got {len(cols)}")
            if "-" in cols[0] or "." in cols[0]:
                continue  # multiword token range or empty node
            try:
                wid, head = int(cols[0]), int(cols[6])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: ID {cols[0]!r} / HEAD {cols[6]!r} is not an integer") from None
            if not cols[7] or cols[7] == "_":
                raise ValueError(f"{path}:{lineno}: missing DEPREL")
            rows.append((lineno, wid, cols[1], cols[3], head, cols[7]))
        flush(lineno)
    if not sentences:
        raise ValueError(f"{path}: no sentences (empty split)")
    return sentences


# -----------------------------------------------------------------------------
# NER scoring: the paper's BIO repair, then micro span F1

def repair_bio(tags):
    """The paper's repair heuristic (Wu & Dredze 2019, used in §3.2), applied left to right.

    - a standalone `I-X` (at the start, after O) becomes `B-X`;
    - a run whose types change, `B-X I-Y I-Z`, takes its final type: `B-Z I-Z I-Z`.
    Example: ["I-PER", "O", "B-LOC", "I-ORG", "I-PER"] -> ["B-PER", "O", "B-PER", "I-PER", "I-PER"].
    The result is valid IOB2: every I-T continues a run of type T.
    """
    out = list(tags)
    start, cur = None, None  # open run: first index and type
    for t, tag in enumerate(out):
        if tag == "O":
            start, cur = None, None
        elif tag.startswith("B-") and len(tag) > 2:
            start, cur = t, tag[2:]
        elif tag.startswith("I-") and len(tag) > 2:
            typ = tag[2:]
            if start is None:  # standalone I-X -> B-X
                out[t] = "B-" + typ
                start, cur = t, typ
            elif typ != cur:  # type changed inside a run: the whole run so far takes the new type
                out[start] = "B-" + typ
                for k in range(start + 1, t):
                    out[k] = "I-" + typ
                cur = typ
        else:
            raise ValueError(f"tag {tag!r} at position {t} is not O, B-X or I-X")
    return out


def bio_spans(tags):
    """Typed spans (type, start, end_exclusive) of a VALID IOB2 sequence (run repair_bio first).

    ["B-PER", "I-PER", "O", "B-LOC"] -> {("PER", 0, 2), ("LOC", 3, 4)}
    """
    spans, start, cur = set(), None, None
    for t, tag in enumerate(list(tags) + ["O"]):
        if cur is not None and not (tag.startswith("I-") and tag[2:] == cur):
            spans.add((cur, start, t))
            start, cur = None, None
        if tag.startswith("B-") or tag.startswith("I-"):  # (an I- here only after repair failed: treat as B-)
            if cur is None:
                start, cur = t, tag[2:]
    return spans


def span_f1(gold, pred):
    """Micro precision, recall, F1 over typed spans of the repaired sequences (fractions in [0, 1]).

    gold, pred: lists of tag sequences (one per sentence, same lengths). Both sides go through
    repair_bio (gold files are valid IOB2, so this only matters for predictions). A span counts as a
    true positive when type, start and end all match (CoNLL / seqeval default-mode chunking).
    """
    if len(gold) != len(pred):
        raise ValueError(f"span_f1: {len(gold)} gold sentences but {len(pred)} predicted")
    tp = n_gold = n_pred = 0
    for k, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"span_f1: sentence {k} has {len(g)} gold tags but {len(p)} predicted")
        G, P = bio_spans(repair_bio(g)), bio_spans(repair_bio(p))
        tp, n_gold, n_pred = tp + len(G & P), n_gold + len(G), n_pred + len(P)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


# -----------------------------------------------------------------------------
# Parsing scoring (CoNLL 2018 with gold tokenisation) and MST decoding

def strip_subtype(rel):
    """`nmod:poss` -> `nmod` (CoNLL 2018 compares the universal part only)."""
    return rel.split(":")[0]


def is_punct(word, upos=None):
    """Punctuation for the secondary no-punct LAS: gold UPOS PUNCT/SYM, else all chars Unicode P*."""
    if upos is not None:
        return upos in ("PUNCT", "SYM")
    return all(unicodedata.category(c).startswith("P") for c in word)


def attachment_scores(gold_heads, gold_rels, pred_heads, pred_rels, mask=None):
    """(UAS, LAS) over all words of all sentences, fractions in [0, 1] (D6: punctuation counted).

    UAS = head correct; LAS = head correct AND deprel correct with subtypes stripped on both sides
    (`nmod:poss` = `nmod`). With gold tokenisation the CoNLL 2018 F1 equals this accuracy.
    `mask` (optional, same nesting, True = score this word) gives e.g. the no-punctuation variant.
    """
    n = uas = las = 0
    for k, (gh, gr, ph, pr) in enumerate(zip(gold_heads, gold_rels, pred_heads, pred_rels)):
        if not len(gh) == len(gr) == len(ph) == len(pr):
            raise ValueError(f"attachment_scores: sentence {k} has mismatched lengths")
        m = mask[k] if mask is not None else [True] * len(gh)
        for a, b, c, d, keep in zip(gh, gr, ph, pr, m):
            if not keep:
                continue
            n += 1
            if a == c:
                uas += 1
                las += strip_subtype(b) == strip_subtype(d)
    if len(gold_heads) != len(pred_heads):
        raise ValueError(f"attachment_scores: {len(gold_heads)} gold sentences but {len(pred_heads)} predicted")
    return (uas / n, las / n) if n else (0.0, 0.0)


def _find_cycle(heads):
    """First cycle (list of nodes) in a head array where heads[0] = -1, or None."""
    n = len(heads)
    color = [0] * n  # 0 unseen, 1 on the current path, 2 done
    color[0] = 2
    for s in range(1, n):
        path, v = [], s
        while color[v] == 0:
            color[v] = 1
            path.append(v)
            v = heads[v]
        if color[v] == 1:  # closed a loop on the current path
            return path[path.index(v):]
        for u in path:
            color[u] = 2
    return None


def _chu_liu_edmonds(S):
    """Maximum spanning arborescence rooted at 0. S[d, h] = score of arc h -> d (-inf = forbidden).

    Recursive contraction (Chu & Liu 1965, Edmonds 1967): every node takes its best head; if that makes a
    cycle C, contract C to one node c whose incoming arc from h scores max_v S[v,h] - S[v,head(v)] (v in C)
    and whose outgoing arc to d scores max_u S[d,u] (u in C); solve the smaller graph; expand.
    """
    n = len(S)
    heads = S.argmax(1)
    heads[0] = -1
    cycle = _find_cycle(heads)
    if cycle is None:
        return heads
    in_c = np.zeros(n, bool)
    in_c[cycle] = True
    rest = np.flatnonzero(~in_c)  # includes 0
    C = np.array(cycle)
    m = len(rest)
    S2 = np.full((m + 1, m + 1), -np.inf)
    S2[:m, :m] = S[np.ix_(rest, rest)]
    gain = S[np.ix_(C, rest)] - S[C, heads[C]][:, None]  # (|C|, m): enter the cycle at v from h
    enter = gain.argmax(0)
    S2[m, :m] = gain.max(0)
    out = S[np.ix_(rest, C)]  # (m, |C|): leave the cycle from u to d
    leave = out.argmax(1)
    S2[:m, m] = out.max(1)
    S2[0, :] = -np.inf
    np.fill_diagonal(S2, -np.inf)
    heads2 = _chu_liu_edmonds(S2)
    new = heads.copy()
    for i in range(1, m):
        d = rest[i]
        new[d] = C[leave[i]] if heads2[i] == m else rest[heads2[i]]
    h = heads2[m]
    new[C[enter[h]]] = rest[h]  # the one cycle node whose cycle arc is broken
    return new


def mst_decode(scores):
    """Best dependency tree with exactly ONE word attached to ROOT. scores[d, h], node 0 = ROOT.

    scores: (n+1, n+1) array of arc scores (e.g. log-probabilities); row 0 and the diagonal are ignored.
    Returns heads for nodes 0..n (heads[0] = -1). The single-root constraint is enforced exactly in one
    Chu-Liu-Edmonds run by subtracting a constant M from every ROOT arc: any tree needs >= 1 root arc,
    and with M larger than the total score range, one root arc always beats two; among one-root trees
    the order is unchanged.
    """
    S = np.array(scores, dtype=np.float64)
    n = len(S)
    if n < 2:
        return np.array([-1] * n)
    finite = S[np.isfinite(S)]
    M = (finite.max() - finite.min() + 1.0) * n if finite.size else 1.0
    S[:, 0] -= M
    S[0, :] = -np.inf
    np.fill_diagonal(S, -np.inf)
    return _chu_liu_edmonds(S)


# -----------------------------------------------------------------------------
# Biaffine parser head (Dozat & Manning 2017; D7)

ARC_MLP, REL_MLP, MLP_DROPOUT, LEAKY_SLOPE = 500, 100, 0.33, 0.1  # D7, PAPER_NOTES §4.3


class Biaffine(nn.Module):
    """s[b, i, j, o] = [x_i ; 1]^T W_o [y_j ; 1] with optional bias columns on either side."""

    def __init__(self, n_in, n_out=1, bias_x=True, bias_y=True):
        super().__init__()
        self.n_out, self.bias_x, self.bias_y = n_out, bias_x, bias_y
        self.weight = nn.Parameter(torch.zeros(n_out, n_in + bias_x, n_in + bias_y))  # zero init as SUPAR

    def forward(self, x, y):  # x, y: (B, T, n_in)
        if self.bias_x:
            x = torch.cat([x, torch.ones_like(x[..., :1])], -1)
        if self.bias_y:
            y = torch.cat([y, torch.ones_like(y[..., :1])], -1)
        s = torch.einsum("bxi,oij,byj->bxyo", x, self.weight, y)  # (B, T, T, n_out)
        return s.squeeze(-1) if self.n_out == 1 else s


class BiaffineParser(nn.Module):
    """Arc and label scorers on encoder states h (B, T, d), position 0 = ROOT.

    s_arc[b, i, j]    = score of head j for dependent i (bias on the dependent side only);
    s_rel[b, i, j, r] = score of label r for the arc j -> i (bias on both sides).
    """

    def __init__(self, d_model, n_rels, arc_mlp=ARC_MLP, rel_mlp=REL_MLP, dropout=MLP_DROPOUT):
        super().__init__()

        def mlp(n):
            return nn.Sequential(nn.Linear(d_model, n), nn.LeakyReLU(LEAKY_SLOPE), nn.Dropout(dropout))

        self.arc_dep, self.arc_head, self.rel_dep, self.rel_head = mlp(arc_mlp), mlp(arc_mlp), mlp(rel_mlp), mlp(rel_mlp)
        self.arc_attn = Biaffine(arc_mlp, 1, bias_x=True, bias_y=False)
        self.rel_attn = Biaffine(rel_mlp, n_rels, bias_x=True, bias_y=True)

    def forward(self, h, mask):
        """h (B, T, d); mask (B, T) True at candidate heads (ROOT and first subwords).
        Returns s_arc (B, T, T) with non-candidate heads at -inf, and s_rel (B, T, T, R)."""
        s_arc = self.arc_attn(self.arc_dep(h), self.arc_head(h))
        s_arc = s_arc.masked_fill(~mask[:, None, :], float("-inf"))
        s_rel = self.rel_attn(self.rel_dep(h), self.rel_head(h))
        return s_arc, s_rel

    @staticmethod
    def loss(s_arc, s_rel, heads, rels):
        """CE over heads + CE over the label at the GOLD head, each averaged over words (SUPAR, CLN).
        heads, rels: (B, T) gold head POSITION and label id per dependent, -1 where not a word."""
        words = heads >= 0
        arc_loss = F.cross_entropy(s_arc[words], heads[words])
        s_gold = s_rel[words].gather(1, heads[words][:, None, None].expand(-1, 1, s_rel.size(-1))).squeeze(1)
        return arc_loss + F.cross_entropy(s_gold, rels[words])

    @staticmethod
    def decode(s_arc, s_rel, words):
        """MST per sentence on log-softmax arc scores; label = argmax at the chosen head.
        words: (B, T) bool, True at the dependents' (first-subword) positions. Returns per sentence the
        CoNLL heads (0 = ROOT, k = k-th word) and label ids of its words, in order."""
        logp = s_arc.detach().float().log_softmax(-1).cpu().numpy()
        best_rel = s_rel.detach().argmax(-1).cpu().numpy()
        out_heads, out_rels = [], []
        for b in range(len(logp)):
            pos = np.concatenate([[0], np.flatnonzero(words[b].cpu().numpy())])  # ROOT + word positions
            heads = mst_decode(logp[b][np.ix_(pos, pos)])[1:]  # indices into pos = CoNLL word numbers
            out_heads.append(heads.tolist())
            out_rels.append([int(best_rel[b, i, pos[h]]) for i, h in zip(pos[1:], heads)])
        return out_heads, out_rels
