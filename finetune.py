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

Reading order (one section per ruler): shared encoding (`</s> ids </s>` windows, first subwords, the
Task interface); XNLI; NER; parsing; the §3.2 protocol (grid, finetune_one, mean_of_best_two,
run_task); the resumable set store (OUT/sets/); §5.1.2 aligned transfer; the printers (--compare,
--table, --curve); the CLI (main(argv)).

Run (see --help for every flag and the data layouts it detects):
    python finetune.py --toy --ckpt runs/toy/best.pt --out runs/ft-toy        # all three tasks, toy preset
    python finetune.py --toy --task ner --ckpt runs/toy/best.pt --out runs/ft-ner
    python finetune.py --task parse --ckpt RUN/best.pt --data ../shared/data --eval-langs fr,ru,zh --out runs/parse
    python finetune.py --compare runs/a/results.json runs/b/results.json     # one table with the Δ column
    python finetune.py --table runs/ft/default-s0 runs/ft/default-s1 runs/ft/sep-emb-s0  # Table 1 layout
    python finetune.py --task ner --ckpt EN/best.pt --target-ckpt FR/best.pt --align-maps maps.npz \
        --align-layer 4 --eval-langs fr --data DIR --out runs/aligned        # §5.1.2 aligned transfer

--device and --dtype mean what they mean in pretrain.py (model.pick_device): on a GPU, --dtype auto
trains under bfloat16 autocast where supported, else float32; on CPU float32 (--bf16 = --dtype bfloat16).
"""
import argparse
import glob
import hashlib
import json
import math
import os
import re
import unicodedata

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import bpe
from bpe import EOS_ID, UNK_ID, parse_lang_path
from model import DTYPES, encode_batch, load_model, pick_device

# -----------------------------------------------------------------------------
# Shared encoding: subword ids as XLM feeds them (`</s> ids </s>`), first subwords, windows

def _read_lines(path):
    """(line number, line without its \\n or \\r\\n) for every line of a UTF-8 file. Bytes, not text mode:
    a stray \\r inside a line is not a line end (XNLI test files have them), and a line that is not UTF-8
    raises ValueError naming file and line instead of a bare UnicodeDecodeError."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            yield n, line[:-1] if line.endswith("\n") else line


def first_subwords(tok, words, lang):
    """Flat subword ids of a word list and the index of each word's first subword in them.
    A word the tokenizer turns into nothing becomes <unk> (XTREME's choice)."""
    ids, first = [], []
    for piece in tok.encode_words(words, lang):
        first.append(len(ids))
        ids.extend(piece if piece else [UNK_ID])
    return ids, first


def windows(n, size):
    """Cover n subwords with windows of at most `size` (shijie-wu/crosslingual-nlp `dataset/tagging.py`): -> [(start, end, keep_from)].

    Each next window restarts size // 2 subwords before the previous one ended; those are context only:
    positions [keep_from, end) take their states from this window, so every subword is taken exactly once.
    windows(10, 4) -> [(0, 4, 0), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    """
    if size < 2:
        raise ValueError(f"window size {size} < 2")
    out = [(0, min(n, size), 0)]
    while out[-1][1] < n:
        prev_end = out[-1][1]
        start = prev_end - size // 2
        out.append((start, min(start + size, n), prev_end))
    return out


def encode_states(model, seqs, lang, max_len, layer=-1):
    """States (B, 1 + L, d) of `layer` for content-id sequences (no specials), L = longest sequence:
    position 0 = the leading </s> (the parser's ROOT), position 1 + k = subword k; zeros after the end.

    Every sequence runs as `</s> ids[s:e] </s>` windows of at most max_len content subwords; a sentence
    that fits is exactly one window, so this is plain batching then. Longer ones are split, never dropped.
    """
    pieces = [(b, w) for b, ids in enumerate(seqs) for w in windows(max(len(ids), 1), max_len)]
    rs, cs, rd, cd = [], [], [], []  # source (window row, col) -> destination (sentence row, col)
    for r, (b, (s, e, keep)) in enumerate(pieces):
        ks = ([-1] if s == 0 else []) + list(range(keep, min(e, len(seqs[b]))))  # -1: the first window's </s> = ROOT
        rs += [r] * len(ks)
        cs += [1 + k - s for k in ks]
        rd += [b] * len(ks)
        cd += [1 + k for k in ks]
    rows = [[EOS_ID] + list(seqs[b][s:e]) + [EOS_ID] for b, (s, e, _) in pieces]
    h = encode_batch(model, rows, lang)[0][layer]  # (n_windows, T, d)
    device = h.device
    L = max(len(ids) for ids in seqs)
    out = h.new_zeros(len(seqs), 1 + L, h.size(-1))
    index = lambda *xs: tuple(torch.tensor(x, device=device) for x in xs)  # noqa: E731
    return out.index_put(index(rd, cd), h[index(rs, cs)])


def gather_words(states, firsts, with_root):
    """(B, 1 + L, d) subword states -> (B, W, d) first-subword states (+ ROOT at 0 when with_root) and
    the (B, W) bool mask of real positions."""
    W = max(len(f) for f in firsts) + with_root
    cols = torch.zeros(len(firsts), W, dtype=torch.long)
    mask = torch.zeros(len(firsts), W, dtype=torch.bool)
    for b, f in enumerate(firsts):
        pos = ([0] if with_root else []) + [1 + k for k in f]
        cols[b, :len(pos)] = torch.tensor(pos)
        mask[b, :len(pos)] = True
    cols, mask = cols.to(states.device), mask.to(states.device)
    return states.gather(1, cols[..., None].expand(-1, -1, states.size(-1))), mask


class Task:
    """What the §3.2 protocol asks of a task (XNLITask, NERTask, ParseTask below).

    Task(train_examples) fixes `labels` (label strings; a label's id is its index) from the English
    train set; `metric` is the score English dev selects by. Per split: featurize(examples, tok, lang,
    max_positions) -> features; per batch of features: loss(model, head, batch, lang, max_len) -> scalar
    and predict(...) -> one prediction per example; score(examples, preds) -> {name: fraction}.
    max_len is the window of the word-level tasks (encode_states); an XNLI pair is cut to the model's
    positions when featurized (pair_ids), so XNLI has no window.
    """
    name = metric = None

    def __init__(self, train_examples):
        self.labels = self.label_set(train_examples)

    def head(self, d, dropout):
        """dropout + Linear(d, n_labels) (XNLI, NER; the parser has its own)."""
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(d, len(self.labels)))


# -----------------------------------------------------------------------------
# XNLI (§3.2): `premise<TAB>hypothesis<TAB>label`, `</s> premise </s> hypothesis </s>`, a linear head at position 0

XNLI_LABELS = ("contradiction", "neutral", "entailment")  # XLM's label ids 0, 1, 2 (XLM `evaluation/xnli.py`)


def read_xnli(path):
    """`premise<TAB>hypothesis<TAB>label` per line (XTREME form) -> list of (premise, hypothesis, label).

    Labels are kept by name; MultiNLI's `contradictory` (XNLI-MT train) is renamed `contradiction`.
    A header line `premise hypo label` / `sentence1 sentence2 gold_label` is skipped; CRLF is fine.
    """
    examples = []
    for lineno, line in _read_lines(path):
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
        if label not in XNLI_LABELS:
            raise ValueError(f"{path}:{lineno}: unknown XNLI label {label!r} "
                             f"(expected {', '.join(reversed(XNLI_LABELS))})")
        examples.append((premise, hypothesis, label))
    if not examples:
        raise ValueError(f"{path}: no examples (empty split)")
    return examples


def pair_ids(tok, premise, hypothesis, lang, max_positions):
    """XLM's XNLI input `</s> premise </s> hypothesis </s>` (XLM `evaluation/xnli.py`). When too long for the
    positions, the longer side is cut first (XLM cuts each side to 256 tokens). Returns (ids, truncated)."""
    a, b = tok.encode(premise, lang), tok.encode(hypothesis, lang)
    budget = max_positions - 3
    truncated = len(a) + len(b) > budget
    while len(a) + len(b) > budget:
        if len(a) >= len(b):
            a = a[:-1]
        else:
            b = b[:-1]
    return [EOS_ID] + a + [EOS_ID] + b + [EOS_ID], truncated


class XNLITask(Task):
    """Pair classification: dropout + Linear(d, 3) on the last layer at position 0 (the first </s>)."""
    name, metric = "xnli", "acc"

    @staticmethod
    def label_set(train_examples):
        return list(XNLI_LABELS)  # XLM's fixed ids, whatever the train set holds (read_xnli admits no other)

    def check_labels(self, examples, path):
        bad = sorted({lab for _, _, lab in examples} - set(self.labels))
        if bad:
            raise ValueError(f"{path}: labels {bad} are not XNLI labels {self.labels}")

    def featurize(self, examples, tok, lang, max_positions):
        feats, n_cut = [], 0
        for p, h, lab in examples:
            ids, cut = pair_ids(tok, p, h, lang, max_positions)
            feats.append((ids, self.labels.index(lab)))
            n_cut += cut
        if n_cut:
            print(f"xnli: {n_cut} of {len(feats)} pairs were too long for {max_positions} positions and were cut")
        return feats

    def _logits(self, model, head, batch, lang):
        hs, _ = encode_batch(model, [ids for ids, _ in batch], lang)
        return head(hs[-1][:, 0])  # (B, d) at the first </s>

    def loss(self, model, head, batch, lang, max_len):
        y = torch.tensor([lab for _, lab in batch], device=next(model.parameters()).device)
        return F.cross_entropy(self._logits(model, head, batch, lang).float(), y)

    def predict(self, model, head, batch, lang, max_len):
        return self._logits(model, head, batch, lang).argmax(-1).tolist()

    def score(self, examples, preds):
        acc = sum(self.labels[p] == lab for (_, _, lab), p in zip(examples, preds)) / len(examples)
        return {"acc": acc}


# -----------------------------------------------------------------------------
# NER (§3.2): PAN-X `token<TAB>tag`, the paper's BIO repair, micro span F1, a linear tagger

_LANG_PREFIX = re.compile(r"^([a-z]{2,3}):")


def read_ner(path):
    """PAN-X `token<TAB>tag`, blank line between sentences -> list of (words, tags).

    The raw PAN-X files prefix every token with its language (`en:Paris`); the prefix is stripped when
    EVERY token of the file carries the same one (so a token like `12:30` in a plain file stays whole).
    """
    sentences, words, tags, lines = [], [], [], []
    for lineno, line in _read_lines(path):
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


class NERTask(Task):
    """BIO tagging: dropout + Linear(d, n_tags) on the first subword of every word; span F1 after repair."""
    name, metric = "ner", "f1"

    @staticmethod
    def label_set(train_examples):
        return ["O"] + sorted({t for _, ts in train_examples for t in ts} - {"O"})

    def check_labels(self, examples, path):
        bad = sorted({t for _, ts in examples for t in ts} - set(self.labels))
        if bad:
            raise ValueError(f"{path}: tags {bad} never occur in the English train set ({self.labels})")

    def featurize(self, examples, tok, lang, max_positions):
        feats = []
        for words, tags in examples:
            ids, first = first_subwords(tok, words, lang)
            feats.append((ids, first, [self.labels.index(t) if t in self.labels else -1 for t in tags]))
        return feats

    def _logits(self, model, head, batch, max_len, lang):
        states = encode_states(model, [ids for ids, _, _ in batch], lang, max_len)
        h, mask = gather_words(states, [f for _, f, _ in batch], with_root=False)
        return head(h), mask

    def loss(self, model, head, batch, lang, max_len):
        logits, mask = self._logits(model, head, batch, max_len, lang)
        y = torch.full(mask.shape, -1, dtype=torch.long)
        for b, (_, _, tags) in enumerate(batch):
            y[b, :len(tags)] = torch.tensor(tags)
        return F.cross_entropy(logits[mask].float(), y.to(mask.device)[mask], ignore_index=-1)

    def predict(self, model, head, batch, lang, max_len):
        logits, _ = self._logits(model, head, batch, max_len, lang)
        best = logits.argmax(-1).tolist()
        return [[self.labels[k] for k in best[b][:len(f)]] for b, (_, f, _) in enumerate(batch)]

    def score(self, examples, preds):
        p, r, f1 = span_f1([tags for _, tags in examples], preds)
        return {"precision": p, "recall": r, "f1": f1}


# -----------------------------------------------------------------------------
# UD parsing (§3.2): CoNLL-U with its tree check, biaffine scorer (D7), MST decoding, UAS/LAS (CoNLL 2018)

def read_conllu(path):
    """CoNLL-U -> list of sentences, each a dict with `words`, `upos`, `heads` (0 = root), `rels`.

    Comment lines (#), multiword ranges (`1-2`) and empty nodes (`1.1`) are skipped, as the CoNLL 2018
    scorer does for basic trees. DEPREL is kept as written (subtypes are stripped where it matters).
    Every sentence must be a tree as the scorer requires (`conll18_ud_eval.py` rejects the file
    otherwise): exactly one word on ROOT, no word its own head, no cycle; errors name the file and the
    line where the sentence starts.
    """
    sentences, rows = [], []
    start = None  # first line (comment or word) of the sentence being read

    def flush():
        if not rows:
            return
        n = len(rows)
        for k, (ln, wid, _, _, head, _) in enumerate(rows, 1):
            if wid != k:
                raise ValueError(f"{path}:{ln}: word id {wid} out of sequence (expected {k})")
            if not 0 <= head <= n:
                raise ValueError(f"{path}:{ln}: head {head} outside 0..{n}")
            if head == wid:
                raise ValueError(f"{path}:{ln}: word {wid} is its own head (HEAD = ID)")
        heads = [r[4] for r in rows]
        roots = [k for k, h in enumerate(heads, 1) if h == 0]
        if len(roots) != 1:
            raise ValueError(f"{path}:{start}: sentence is not a tree: {len(roots)} words on ROOT (HEAD 0)"
                             + (f": words {', '.join(map(str, roots))}" if roots else "") + "; expected exactly one")
        cycle = _find_cycle([-1] + heads)
        if cycle:
            raise ValueError(f"{path}:{start}: sentence is not a tree: words "
                             f"{' -> '.join(map(str, cycle + cycle[:1]))} form a cycle (HEAD)")
        sentences.append({"words": [r[2] for r in rows], "upos": [r[3] for r in rows],
                          "heads": heads, "rels": [r[5] for r in rows]})
        rows.clear()

    for lineno, line in _read_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            flush()
            start = None
            continue
        start = start or lineno
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
    flush()
    if not sentences:
        raise ValueError(f"{path}: no sentences (empty split)")
    return sentences


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


ARC_MLP, REL_MLP, MLP_DROPOUT, LEAKY_SLOPE = 500, 100, 0.33, 0.1  # D7 (Dozat & Manning 2017)


class Biaffine(nn.Module):
    """s[b, i, j, o] = [x_i ; 1]^T W_o [y_j ; 1] with optional bias columns on either side."""

    def __init__(self, n_in, n_out=1, bias_x=True, bias_y=True):
        super().__init__()
        self.n_out, self.bias_x, self.bias_y = n_out, bias_x, bias_y
        self.weight = nn.Parameter(torch.zeros(n_out, n_in + bias_x, n_in + bias_y))  # zero init as yzhangcs/parser (supar)

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
        """CE over heads + CE over the label at the GOLD head, each averaged over words (yzhangcs/parser, shijie-wu/crosslingual-nlp).
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


class ParseTask(Task):
    """Biaffine parsing on first subwords, ROOT = the leading </s>; MST decoding; UAS/LAS (CoNLL 2018)."""
    name, metric = "parse", "las"

    @staticmethod
    def label_set(train_examples):
        return sorted({strip_subtype(r) for s in train_examples for r in s["rels"]})

    def check_labels(self, examples, path):
        unseen = {}
        for s in examples:
            for r in s["rels"]:
                if strip_subtype(r) not in self.labels:
                    unseen[strip_subtype(r)] = unseen.get(strip_subtype(r), 0) + 1
        if unseen:  # not fatal: such words can never get the right label, so they count as LAS errors
            print(f"parse: {path}: deprels never seen in the English train set (they count as LAS errors): "
                  + ", ".join(f"{r} x{n}" for r, n in sorted(unseen.items())))

    def head(self, d, dropout):
        return BiaffineParser(d, len(self.labels))

    def featurize(self, examples, tok, lang, max_positions):
        feats = []
        for s in examples:
            ids, first = first_subwords(tok, s["words"], lang)
            rels = [self.labels.index(strip_subtype(r)) if strip_subtype(r) in self.labels else -1
                    for r in s["rels"]]
            feats.append((ids, first, s["heads"], rels))
        return feats

    def _scores(self, model, head, batch, max_len, lang):
        states = encode_states(model, [f[0] for f in batch], lang, max_len)
        h, mask = gather_words(states, [f[1] for f in batch], with_root=True)  # (B, 1 + W, d)
        return head(h, mask), mask

    def loss(self, model, head, batch, lang, max_len):
        (s_arc, s_rel), mask = self._scores(model, head, batch, max_len, lang)
        heads = torch.full(mask.shape, -1, dtype=torch.long)
        rels = torch.full(mask.shape, -1, dtype=torch.long)
        for b, (_, _, hs, rs) in enumerate(batch):
            heads[b, 1:1 + len(hs)] = torch.tensor(hs)
            rels[b, 1:1 + len(rs)] = torch.tensor(rs)
        heads, rels = heads.to(mask.device), rels.to(mask.device)
        heads[rels < 0] = -1  # (train labels are all known; kept for safety)
        return BiaffineParser.loss(s_arc.float(), s_rel.float(), heads, rels)

    def predict(self, model, head, batch, lang, max_len):
        (s_arc, s_rel), mask = self._scores(model, head, batch, max_len, lang)
        words = mask.clone()
        words[:, 0] = False
        heads, rels = BiaffineParser.decode(s_arc, s_rel, words)
        return [(h, [self.labels[r] for r in rs]) for h, rs in zip(heads, rels)]

    def score(self, examples, preds):
        gh, gr = [s["heads"] for s in examples], [s["rels"] for s in examples]
        ph, pr = [p[0] for p in preds], [p[1] for p in preds]
        uas, las = attachment_scores(gh, gr, ph, pr)
        nopunct = [[not is_punct(w, u) for w, u in zip(s["words"], s["upos"])] for s in examples]
        _, las_np = attachment_scores(gh, gr, ph, pr, nopunct)
        return {"uas": uas, "las": las, "las_nopunct": las_np}


TASKS = {"xnli": (XNLITask, read_xnli), "ner": (NERTask, read_ner), "parse": (ParseTask, read_conllu)}


# -----------------------------------------------------------------------------
# The zero-shot protocol (§3.2): grids, one set trained with its epoch chosen by English dev,
# the mean of the best two sets, language-specific parts frozen

# paper §3.2 grids (XNLI's epoch = 20000 pairs as XLM's --epoch_size; NER/parsing: a pass over train)
PAPER_PRESET = {
    "xnli": dict(epochs=200, epoch_size=20000, batch_size=[4, 8], lr=[1.25e-6, 2.5e-6, 5e-6],
                 head_lr=[5e-6, 2.5e-5, 1.25e-4]),
    "ner": dict(epochs=10, epoch_size=0, batch_size=[16, 32], lr=[2e-5, 3e-5, 5e-5], head_lr=[]),
    "parse": dict(epochs=10, epoch_size=0, batch_size=[16, 32], lr=[2e-5, 3e-5, 5e-5], head_lr=[]),
}
# --toy: a tiny model on the synthetic world learns in a few epochs at larger learning rates
# (two sets per task: the mean of the best two is then the mean of both)
TOY_PRESET = {
    "xnli": dict(epochs=10, epoch_size=0, batch_size=[16], lr=[2e-4, 5e-4], head_lr=[1e-3]),
    "ner": dict(epochs=4, epoch_size=0, batch_size=[16], lr=[3e-4, 1e-3], head_lr=[]),
    "parse": dict(epochs=4, epoch_size=0, batch_size=[16], lr=[3e-4, 1e-3], head_lr=[]),
}


def grid(task_name, args):
    """Hyper-parameter sets in a fixed order: batch size x encoder lr (x classifier lr for XNLI)."""
    head_lrs = args.head_lr if task_name == "xnli" else [None]
    return [{"batch_size": b, "lr": lr, "head_lr": hl} for b in args.batch_size for lr in args.lr for hl in head_lrs]


def freeze_lang_specific(model):
    """Language-specific parameters (separate embeddings / layers) stay frozen; the rest is tuned.
    English then trains the shared parts through its own (frozen) parts, and a target language at test
    time runs through ITS own parts and the same shared top. Returns the trainable parameters."""
    frozen = {id(p) for lang in range(model.config.n_langs) for p in model.lang_specific_parameters(lang)}
    trainable = []
    for p in model.parameters():
        p.requires_grad_(id(p) not in frozen)
        if id(p) not in frozen:
            trainable.append(p)
    return trainable


def warmup_linear(step, total, warmup=0.1):
    """LR factor: linear warm-up over the first 10 % of the updates, then linear decay to 0 (shijie-wu/crosslingual-nlp)."""
    n_warm = max(1, int(warmup * total))
    return step / n_warm if step < n_warm else max(0.0, (total - step) / max(1, total - n_warm))


@torch.no_grad()
def evaluate(task, model, head, feats, examples, lang, max_len, batch_size=64):
    """Scores of one split: batches in length order (less padding), predictions back in file order."""
    model.eval()
    head.eval()
    order = sorted(range(len(feats)), key=lambda i: len(feats[i][0]))
    preds = [None] * len(feats)
    for k in range(0, len(order), batch_size):
        chunk = order[k:k + batch_size]
        for i, p in zip(chunk, task.predict(model, head, [feats[i] for i in chunk], lang, max_len)):
            preds[i] = p
    return task.score(examples, preds)


class NonFiniteLoss(RuntimeError):
    """A hyper-parameter set diverged (NaN/inf loss): the set stops and is left out of the selection."""


def finetune_one(task, model, init_state, data, hp, args, log=print):
    """Train on English with one hyper-parameter set for args.epochs epochs, keep the epoch with the best
    English dev score, and score every target test set with that epoch's weights.

    data: {"train": (examples, feats), "dev": (examples, feats), "test": {lang: (examples, feats, lang_id)}}
    hp: {"batch_size", "lr", "head_lr"}. Returns a JSON-able record. Raises NonFiniteLoss when the
    training loss becomes NaN or inf.
    """
    device = next(model.parameters()).device
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model.load_state_dict(init_state)
    head = task.head(model.config.dim, args.head_dropout).to(device)
    enc_params = freeze_lang_specific(model)
    _, train = data["train"]
    n_per_epoch = args.epoch_size or len(train)
    steps_per_epoch = math.ceil(n_per_epoch / hp["batch_size"])
    total = steps_per_epoch * args.epochs
    if task.name == "xnli":  # XLM: two Adam optimisers with fixed learning rates, no schedule
        opts = [torch.optim.Adam(enc_params, lr=hp["lr"]), torch.optim.Adam(head.parameters(), lr=hp["head_lr"])]
        scheds = []
    else:  # one Adam, 10 % linear warm-up then linear decay (crosslingual-nlp)
        opts = [torch.optim.Adam(enc_params + list(head.parameters()), lr=hp["lr"])]
        scheds = [torch.optim.lr_scheduler.LambdaLR(opts[0], lambda s: warmup_linear(s, total))]
    lang0 = data["lang_id"]
    stream = np.array([], dtype=np.int64)  # XLM-style: an endless shuffled stream, cut into epochs
    best, dev_curve = None, []
    for epoch in range(1, args.epochs + 1):
        model.train()
        head.train()
        while len(stream) < n_per_epoch:
            stream = np.concatenate([stream, rng.permutation(len(train))])
        order, stream = stream[:n_per_epoch], stream[n_per_epoch:]
        total_loss = 0.0
        for k in range(0, n_per_epoch, hp["batch_size"]):
            batch = [train[i] for i in order[k:k + hp["batch_size"]]]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = task.loss(model, head, batch, lang0, args.max_len)
            if not torch.isfinite(loss):  # diverged: every later score would be argmax of NaN (0.00)
                raise NonFiniteLoss(f"non-finite training loss ({loss.item()}) at epoch {epoch}, update "
                                    f"{k // hp['batch_size'] + 1} of {steps_per_epoch}; try a lower --lr")
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(enc_params + list(head.parameters()), args.clip)
            for opt in opts:
                opt.step()
            for s in scheds:
                s.step()
            total_loss += loss.item() * len(batch)
        dev = evaluate(task, model, head, data["dev"][1], data["dev"][0], lang0, args.max_len, args.eval_batch_size)
        dev_curve.append(dev[task.metric])
        log(f"  epoch {epoch}: train loss {total_loss / n_per_epoch:.4f}  en dev {task.metric} "
            f"{100 * dev[task.metric]:.2f}")
        if best is None or dev[task.metric] > best["dev"][task.metric]:
            state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            hstate = {k: v.detach().to("cpu", copy=True) for k, v in head.state_dict().items()}
            best = {"epoch": epoch, "dev": dev, "state": state, "head": hstate}
    model.load_state_dict(best["state"])
    head.load_state_dict(best["head"])
    test = {code: evaluate(task, model, head, feats, ex, lid, args.max_len, args.eval_batch_size)
            for code, (ex, feats, lid) in data["test"].items()}
    return {**hp, "best_epoch": best["epoch"], "dev_curve": dev_curve, "dev": best["dev"], "test": test}


def mean_of_best_two(records, metric):
    """Paper §3.2: "we report the result on average of best two set of hyperparameters". Rank the sets
    by their (epoch-selected) English dev score, take the best two, average every score of both
    (English dev and each target test). One set only: its own scores. Returns (indices, dev, test)."""
    ranked = sorted(range(len(records)), key=lambda i: -records[i]["dev"][metric])  # stable: grid order on ties
    top = ranked[:2]
    dev = {k: float(np.mean([records[i]["dev"][k] for i in top])) for k in records[top[0]]["dev"]}
    test = {lang: {k: float(np.mean([records[i]["test"][lang][k] for i in top])) for k in scores}
            for lang, scores in records[top[0]]["test"].items()}
    return top, dev, test


def lang_index(langs, code, ckpt):
    if code not in langs:
        raise SystemExit(f"error: language {code!r} is not one of the checkpoint's languages {langs} ({ckpt})")
    return langs.index(code)


def prepare_task(task_name, model, tok, langs, files, args, log=print, routes=None):
    """Read and featurise every file of one task (train, dev, each target test) -> (task, data).
    Runs before any training, so a bad file stops the run at once (one line naming file and line)."""
    Task, reader = TASKS[task_name]
    routes = routes or {c: (tok, lang_index(langs, c, args.ckpt)) for c in [args.train_lang, *files["test"]]}
    try:
        train_ex = reader(files["train"])
        task = Task(train_ex)
        dev_ex = reader(files["dev"])
        task.check_labels(dev_ex, files["dev"])
        tests = {}
        for code, path in files["test"].items():
            tests[code] = reader(path)
            task.check_labels(tests[code], path)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    mp = model.config.max_positions
    tok0, lang0 = routes[args.train_lang]
    data = {"lang_id": lang0,
            "train": (train_ex, task.featurize(train_ex, tok0, args.train_lang, mp)),
            "dev": (dev_ex, task.featurize(dev_ex, tok0, args.train_lang, mp)), "test": {}}
    for code, ex in tests.items():
        tok_c, lid = routes[code]
        data["test"][code] = (ex, task.featurize(ex, tok_c, code, mp), lid)
    log(f"{task_name}: train {len(train_ex)} ({files['train']}), dev {len(dev_ex)}, "
        + ", ".join(f"{c} test {len(v[0])}" for c, v in data["test"].items()))
    return task, data


def run_task(task_name, model, tok, langs, files, args, log=print, routes=None, prepared=None, sets=None):
    """Fine-tune on English over the grid; returns the results dict written to results.json.
    routes (optional): language code -> (tokenizer, language key for model.hidden_states); by default
    every language uses `tok` and its index in `langs`. prepared: prepare_task's (task, data).
    sets (optional): a SetStore; each finished set is written there as it ends, and sets it already
    holds (an interrupted run with the same flags) are taken from it instead of trained again."""
    task, data = prepared or prepare_task(task_name, model, tok, langs, files, args, log, routes)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hps = grid(task_name, args)
    records = []
    for i, hp in enumerate(hps, 1):
        desc = ", ".join(f"{k} {v}" for k, v in hp.items() if v is not None)
        done = sets.get(hp) if sets else None
        if done is not None:
            log(f"{task_name}: hyper-parameter set {i}/{len(hps)}: {desc}: finished in an earlier run with the "
                f"same flags ({sets.path(hp)}), skipped")
            records.append(done)
            continue
        log(f"{task_name}: hyper-parameter set {i}/{len(hps)}: {desc}")
        try:
            rec = finetune_one(task, model, init_state, data, hp, args, log)
        except NonFiniteLoss as e:
            log(f"{task_name}: hyper-parameter set {i}/{len(hps)} stopped: {e}; it is left out of the selection")
            rec = {**hp, "failed": str(e)}
        if sets:
            sets.put(hp, rec)
        records.append(rec)
    model.load_state_dict(init_state)
    ok = [i for i, r in enumerate(records) if "failed" not in r]
    if not ok:
        raise SystemExit(f"error: {task_name}: every hyper-parameter set diverged (non-finite loss); no results "
                         "written. Try lower --lr / --head-lr (or --overwrite after changing nothing else)")
    top, dev, test = mean_of_best_two([records[i] for i in ok], task.metric)
    top = [ok[i] for i in top]
    return {"task": task_name, "metric": task.metric, "ckpt": args.ckpt, "train_lang": args.train_lang,
            "eval_langs": list(files["test"]), "files": files, "labels": task.labels,
            "protocol": "per set: epoch chosen by English dev; reported: mean of the best two sets by English dev",
            "best_two": top, "dev": dev, "test": test, "configs": records,
            "args": {k: v for k, v in vars(args).items() if not k.startswith("_")}}


# -----------------------------------------------------------------------------
# Resuming: OUT/sets/ holds one file per finished hyper-parameter set, keyed by everything that decides it

def write_json(path, obj):
    """bpe.atomic_write of a JSON file: never half a file at `path`; a failure (full disk) is one line."""
    def dump(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, ensure_ascii=False)
    bpe.atomic_write(path, dump)


def read_json(path, what):
    """A JSON file written by this script, or one line saying why it cannot be used."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:  # missing, unreadable, not UTF-8, not JSON (a hand edit?)
        raise SystemExit(f"error: {what}: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def file_digest(path, _cache={}):
    """sha256 (first 16 hex digits) of a file: a re-trained best.pt or an edited data file is another job."""
    key = (os.path.abspath(path), os.path.getsize(path), os.path.getmtime(path))
    if key not in _cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _cache[key] = h.hexdigest()[:16]
    return _cache[key]


# flags that change a set's result besides the grid itself (--device, --threads, --eval-batch-size do not)
JOB_FLAGS = ("train_lang", "epochs", "epoch_size", "max_len", "head_dropout", "clip", "seed", "bf16", "align_layer")


def job_identity(task_name, files, args):
    """What a finished set's record depends on, as plain JSON: the task, the checkpoint(s) and data files
    (path and content digest) and the training flags. Two runs with equal identities give equal sets."""
    paths = {"train": files["train"], "dev": files["dev"], **{f"test {c}": p for c, p in files["test"].items()}}
    ident = {"task": task_name, "ckpt": [os.path.abspath(args.ckpt), file_digest(args.ckpt)],
             "files": {k: [os.path.abspath(p), file_digest(p)] for k, p in paths.items()}}
    for name in ("target_ckpt", "align_maps"):
        if getattr(args, name, None):
            ident[name] = [os.path.abspath(getattr(args, name)), file_digest(getattr(args, name))]
    ident.update({k: getattr(args, k) for k in JOB_FLAGS})
    return ident


def identity_diff(old, new):
    """`--epochs: 3 there, 4 now; ...` for the keys that differ (one line)."""
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    flag = lambda k: k if k in ("task", "files") else "--" + k.replace("_", "-")  # noqa: E731
    show = lambda v: v[0] + " (other content)" if isinstance(v, list) and len(v) == 2 else v  # noqa: E731
    return "; ".join(f"{flag(k)}: {show(old.get(k))!s} there, {show(new.get(k))!s} now" for k in keys)


class SetStore:
    """OUT/sets/*.json: one file per finished hyper-parameter set ({"job", "hp", "record"}), written
    atomically when the set ends, so an interrupted grid resumes where it stopped."""

    def __init__(self, out, job):
        self.dir, self.job, self.done = os.path.join(out, "sets"), job, {}

    def name(self, hp):
        return "bs{}-lr{:g}".format(hp["batch_size"], hp["lr"]) + (f"-hlr{hp['head_lr']:g}" if hp["head_lr"] else "")

    def path(self, hp):
        return os.path.join(self.dir, self.name(hp) + ".json")

    def load(self):
        """Read the sets of an earlier run; refuse (one line) when they come from other flags or data."""
        for f in sorted(glob.glob(os.path.join(self.dir, "*.json"))):
            rec = read_json(f, "resume")
            if not isinstance(rec, dict) or not {"job", "hp", "record"} <= set(rec):
                raise SystemExit(f"error: {f} is not a hyper-parameter set written by finetune.py; "
                                 "move it away or pass --overwrite")
            if rec["job"] != self.job:
                raise SystemExit(f"error: {self.dir} holds hyper-parameter sets of a run with other flags or "
                                 f"data ({identity_diff(rec['job'], self.job)}); rerun with the same flags to "
                                 "resume, or use another --out, or pass --overwrite")
            self.done[self.name(rec["hp"])] = rec["record"]
        return self

    def clear(self):
        for f in glob.glob(os.path.join(self.dir, "*.json")) + glob.glob(os.path.join(self.dir, "*.tmp")):
            os.remove(f)

    def get(self, hp):
        return self.done.get(self.name(hp))

    def put(self, hp, record):
        os.makedirs(self.dir, exist_ok=True)
        write_json(self.path(hp), {"job": self.job, "hp": hp, "record": record})
        self.done[self.name(hp)] = record


def check_results(path, job, hps, overwrite):
    """results.json policy: a finished run of the SAME job and grid is reused (returned, nothing to do);
    anything else already at `path` is refused unless --overwrite. Returns the old results or None."""
    if overwrite or not os.path.exists(path):
        return None
    old = read_json(path, "--out")
    if isinstance(old, dict) and old.get("job") == job and [
            {k: c.get(k) for k in ("batch_size", "lr", "head_lr")} for c in old.get("configs", [])] == hps:
        return old
    why = (identity_diff(old["job"], job) if isinstance(old, dict) and isinstance(old.get("job"), dict)
           and old["job"] != job else "another grid, or written by an older finetune.py")
    raise SystemExit(f"error: {path} already exists (a finished run with other flags: {why}); "
                     "pass --overwrite to replace it, or use another --out")


# -----------------------------------------------------------------------------
# Aligned transfer (§5.1.2, Figure 5): frozen bottom i layers + 4 new layers; targets mapped into English

N_NEW_LAYERS = 4  # paper §5.1.2


class AlignedEncoder(nn.Module):
    """The encoder of the aligned-transfer experiment, with MLM.hidden_states' interface.

    English input runs through the pretrained English model up to layer i (frozen, eval mode), then
    through 4 NEW Transformer layers that are trained with the task head. A target-language input runs
    through its own (monolingual) target model up to layer i, is mapped into the English space by the
    orthogonal map W (x_tgt @ W ~ x_en, Procrustes from align.py), then through the same new layers.
    `lang` is a language code here; `routes[code] = (model, lang index in that model, W or None)`.
    """

    def __init__(self, routes, layer, n_new=N_NEW_LAYERS):
        super().__init__()
        from dataclasses import replace
        from model import Block
        self._routes = routes  # a plain dict: the frozen models are no submodules (not trained, not saved)
        for m, _, _ in routes.values():
            m.eval()
            m.requires_grad_(False)
        base = next(iter(routes.values()))[0].config
        self.config = replace(base, max_positions=min(m.config.max_positions for m, _, _ in routes.values()))
        self.layer = layer
        self.blocks = nn.ModuleList(Block(base) for _ in range(n_new))

    def lang_specific_parameters(self, lang):
        return []  # everything below layer i is frozen anyway; the new layers are shared

    def hidden_states(self, idx, lang, attn_mask=None):
        if lang not in self._routes:
            raise ValueError(f"aligned transfer: no model for language {lang!r}")
        model, lang_id, W = self._routes[lang]
        with torch.no_grad():
            x = model.hidden_states(idx, lang_id, attn_mask)[self.layer]
            if W is not None:
                x = x @ W.to(x)  # into the English space
        mask = keep = None
        if attn_mask is not None:
            mask, keep = attn_mask[:, None, None, :], attn_mask[..., None].to(x.dtype)
        hs = [x]
        for block in self.blocks:
            x = block(x, mask)
            x = x * keep if keep is not None else x
            hs.append(x)
        return hs


def load_align_map(path, layer, train_lang, target, dim):
    """W (dim, dim) with x_target @ W ~ x_train_lang at `layer` from align.py's --save-maps .npz
    (keys src_to_tgt, tgt_to_src: (n_layers + 1, d, d); src, tgt: language codes)."""
    keys = ("src", "tgt", "src_to_tgt", "tgt_to_src")
    try:
        with np.load(path) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise SystemExit(f"error: --align-maps {path}: no {missing[0]!r} entry "
                                 "(expected align.py contextual --save-maps)")
            src, tgt = str(z["src"]), str(z["tgt"])
            maps = {k: z[k] for k in ("src_to_tgt", "tgt_to_src")}
    except SystemExit:
        raise
    except Exception as e:  # missing, truncated, not an .npz: numpy raises OSError, ValueError, BadZipFile, ...
        raise SystemExit(f"error: --align-maps: cannot read {path}: {type(e).__name__}: {e} "
                         "(expected align.py contextual --save-maps .npz)")
    if (src, tgt) == (train_lang, target):
        M = maps["tgt_to_src"]
    elif (src, tgt) == (target, train_lang):
        M = maps["src_to_tgt"]
    else:
        raise SystemExit(f"error: {path}: maps are for {src}->{tgt}, not {target}->{train_lang}")
    if M.ndim != 3 or not 0 <= layer < len(M) or M.shape[1:] != (dim, dim):
        raise SystemExit(f"error: {path}: maps have shape {M.shape}; need layer {layer} of size {dim}x{dim}")
    if not np.isfinite(M[layer]).all():
        raise SystemExit(f"error: --align-maps {path}: the layer-{layer} map contains NaN or inf")
    return torch.tensor(M[layer], dtype=torch.float32)


def setup_aligned(model, tok, langs, args):
    """--align-layer: the English model's bottom layers + one target model per target language (the
    target checkpoint's tokenizer and language index) joined by the stored orthogonal map."""
    if not args.target_ckpt or not args.align_maps:
        raise SystemExit("error: --align-layer needs --target-ckpt and --align-maps")
    if len(args.eval_langs) != 1:
        raise SystemExit("error: --align-layer: give exactly one --eval-langs (the --target-ckpt language)")
    code = args.eval_langs[0]
    tmodel, textra = _load(args.target_ckpt, "--target-ckpt", args.device)
    ttok = _tokenizer(textra, args.target_ckpt, "--target-ckpt")
    tlang = lang_index(list(textra.get("langs") or ttok.langs), code, args.target_ckpt)
    n = min(model.config.n_layers, tmodel.config.n_layers)
    if not 0 <= args.align_layer <= n:
        raise SystemExit(f"error: --align-layer {args.align_layer} outside 0..{n}")
    if tmodel.config.dim != model.config.dim:
        raise SystemExit(f"error: --target-ckpt dim {tmodel.config.dim} differs from --ckpt dim {model.config.dim}")
    W = load_align_map(args.align_maps, args.align_layer, args.train_lang, code, model.config.dim)
    enc = AlignedEncoder({args.train_lang: (model, lang_index(langs, args.train_lang, args.ckpt), None),
                          code: (tmodel, tlang, W.to(args.device))}, args.align_layer).to(args.device)
    return enc, {args.train_lang: (tok, args.train_lang), code: (ttok, code)}


# -----------------------------------------------------------------------------
# Printers: one results.json (--compare), the paper's Table 1 layout (--table), transfer vs. updates (--curve)

METRIC_NAMES = {"xnli": ["acc"], "ner": ["f1", "precision", "recall"], "parse": ["las", "uas", "las_nopunct"]}


def format_table(results, names=None):
    """Rows: English dev, then each target test. One column block per result (model); with two or more
    results the last column is the paper's Δ of the selection metric (last model minus the first)."""
    task = results[0]["task"]
    metric = results[0]["metric"]
    cols = METRIC_NAMES[task] if len(results) == 1 else [metric]
    names = names or [os.path.basename(os.path.dirname(os.path.abspath(r["ckpt"]))) or r["ckpt"] for r in results]
    header = ["lang", "split"] + [f"{c}" if len(results) == 1 else f"{n}" for n in names for c in cols]
    if len(results) > 1:
        header.append("Δ")
    rows = [("en" if results[0]["train_lang"] == "en" else results[0]["train_lang"], "dev",
             [r["dev"] for r in results])]
    for lang in results[0]["eval_langs"]:
        rows.append((lang, "test", [r["test"].get(lang) for r in results]))
    lines = ["  ".join(f"{h:>11}" for h in header)]
    for lang, split, scores in rows:
        cells = [lang, split]
        for s in scores:
            cells += [f"{100 * s[c]:.2f}" if s and c in s else "-" for c in cols]
        if len(results) > 1:
            a, b = scores[0], scores[-1]
            cells.append(f"{100 * (b[metric] - a[metric]):+.2f}" if a and b else "-")
        lines.append("  ".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def read_cells(d, flag):
    """{(task, lang): test score in %} from one `finetune.py --out` directory ({xnli,ner,parse}/results.json,
    or one results.json), and the pretraining record of the checkpoint ({"step", "dev_ppl"}, may be empty)."""
    cells, pretrain = {}, {}
    for task in ("xnli", "ner", "parse"):
        for path in (os.path.join(d, task, "results.json"), os.path.join(d, "results.json")):
            if os.path.exists(path):
                r = read_json(path, flag)
                if isinstance(r, dict) and r.get("task") == task and isinstance(r.get("test"), dict):
                    cells.update({(task, lang): 100 * s[r["metric"]] for lang, s in r["test"].items()})
                    pretrain = r.get("pretrain") or pretrain
                    break
    if not cells:
        raise SystemExit(f"error: {flag}: no results.json under {d}")
    return cells, pretrain


def _columns(runs):
    return sorted({c for cells in runs for c in cells}, key=lambda c: (("xnli", "ner", "parse").index(c[0]), c[1]))


def _mean_std(v):
    return "-" if not v else f"{np.mean(v):.1f}" + (f" ±{np.std(v):.1f}" if len(v) > 1 else "")


def _format_rows(header, lines):
    widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header)] + [fmt(r) for r in lines])


SHORT = {"xnli": "XNLI", "ner": "NER", "parse": "Parse"}


def table1(run_dirs):
    """The paper's Table 1 layout from several fine-tuned models. Each directory is one `finetune.py --out`
    holding {xnli,ner,parse}/results.json (any subset). Rows = models; columns = task x target language
    (test score, the selection metric: XNLI acc, NER F1, parsing LAS), their average, and Δ = the row's
    average minus the first row's (the paper's Default). Directories named NAME-sSEED are one row NAME:
    each cell is the mean over seeds, followed by (± the standard deviation) when there are several."""
    rows = {}  # name -> list of {(task, lang): score}
    for d in run_dirs:
        name = re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(d)))
        rows.setdefault(name, []).append(read_cells(d, "--table")[0])
    cols = _columns([cells for runs in rows.values() for cells in runs])
    header = ["model", "seeds"] + [f"{SHORT[t]} {lang}" for t, lang in cols] + ["avg", "Δ"]
    lines, first_avg = [], None
    for name, runs in rows.items():
        out = [name, str(len(runs))] + [_mean_std([cells[c] for cells in runs if c in cells]) for c in cols]
        avgs = [np.mean([cells[c] for c in cols]) for cells in runs if all(c in cells for c in cols)]
        avg = float(np.mean(avgs)) if avgs else None
        if not lines:  # the first row (the paper's Default) is the reference of Δ
            first_avg = avg
        out.append("-" if avg is None else f"{avg:.1f}" + (f" ±{np.std(avgs):.1f}" if len(avgs) > 1 else ""))
        out.append("-" if avg is None or first_avg is None else f"{avg - first_avg:+.1f}")
        lines.append(out)
    return _format_rows(header, lines)


def learning_curve(run_dirs):
    """Transfer against pretraining updates (pretrain.py --snapshots, each snapshot fine-tuned). Directories
    are named NAME-sSEED-stepN (or NAME-stepN): one row per (NAME, N), cells the mean (± std) over seeds of
    the test scores, beside the snapshot's dev perplexity. Returns (text table, {name: {column: [(N, mean)]}})
    where the second part is what plot_curve draws."""
    runs = {}  # (name, step) -> list of (cells, pretrain)
    for d in run_dirs:
        m = re.fullmatch(r"(.+?)(?:-s\d+)?-step(\d+)", os.path.basename(os.path.normpath(d)))
        if not m:
            raise SystemExit(f"error: --curve: {d}: expected a directory named NAME-sSEED-stepN or NAME-stepN")
        runs.setdefault((m.group(1), int(m.group(2))), []).append(read_cells(d, "--curve"))
    cols = _columns([cells for v in runs.values() for cells, _ in v])
    ppl_langs = sorted({l for v in runs.values() for _, pt in v for l in (pt.get("dev_ppl") or {})})
    header = (["model", "updates", "seeds"] + [f"dev ppl {l}" for l in ppl_langs]
              + [f"{SHORT[t]} {lang}" for t, lang in cols])
    lines, series = [], {}
    for (name, step) in sorted(runs, key=lambda k: (list(dict.fromkeys(n for n, _ in runs)).index(k[0]), k[1])):
        v = runs[(name, step)]
        ppl = [_mean_std([pt["dev_ppl"][l] for _, pt in v if l in (pt.get("dev_ppl") or {})]) for l in ppl_langs]
        scores = [[cells[c] for cells, _ in v if c in cells] for c in cols]
        lines.append([name, str(step), str(len(v))] + ppl + [_mean_std(s) for s in scores])
        for c, s in zip(cols, scores):
            if s:
                series.setdefault(name, {}).setdefault(f"{SHORT[c[0]]} {c[1]}", []).append((step, float(np.mean(s))))
        for l in ppl_langs:
            p = [pt["dev_ppl"][l] for _, pt in v if l in (pt.get("dev_ppl") or {})]
            if p:
                series.setdefault(name, {}).setdefault(f"dev ppl {l}", []).append((step, float(np.mean(p))))
    return _format_rows(header, lines), series


def plot_curve(series, path):
    """One panel per column (task x language, dev perplexity), one line per model, x = updates (log scale)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("error: --plot needs matplotlib, which is not a requirement: pip install matplotlib")
    panels = list(dict.fromkeys(c for cols in series.values() for c in cols))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for name, cols in series.items():
            if panel in cols:
                x, y = zip(*cols[panel])
                ax.plot(x, y, marker="o", label=name)
        ax.set_xscale("log")
        steps = sorted({x for cols in series.values() for x, _ in cols.get(panel, [])})
        ax.set_xticks(steps, [f"{x:,}" for x in steps])
        ax.minorticks_off()
        ax.set_xlabel("pretraining updates")
        ax.set_title(panel + ("" if panel.startswith("dev ppl") else " (test, %)"))
        if panel.startswith("dev ppl"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    print(f"wrote {path}")


# -----------------------------------------------------------------------------
# CLI: data files, flags, checks before any work, main(argv)

TOY_LAYOUT = {"xnli": "xnli/{lang}.{split}.tsv", "ner": "ner/{lang}.{split}.tsv", "parse": "ud/{lang}.{split}.conllu"}
REAL_DIRS = {"xnli": "xnli", "ner": "wikiann_panx", "parse": "ud"}
# PAN-X's labelled test stand-in (data/wikiann_panx/SOURCE.md): the official test files have no labels
REAL_SPLIT_NAMES = {"train": ["train"], "dev": ["dev"], "test": ["test", "heldout-from-dev"]}


def find_file(data_dir, task, lang, split):
    """Path of one split, or None. Looks for, in order:
    toydata  DIR/{xnli,ner,ud}/{lang}.{split}.{tsv,tsv,conllu}
    data/    DIR/xnli/{split}-{lang}.tsv, DIR/wikiann_panx/{split}-{lang}.tsv (test = heldout-from-dev),
             DIR/ud/UD_*/{lang}_*-ud-{split}[.*].conllu (e.g. en_ewt-ud-train.first3000.conllu)
    DIR may also be the task folder itself. Several UD treebanks for one language: the first in sorted
    order is taken and the others are named (override with --test-file LANG=PATH)."""
    toy = os.path.join(data_dir, TOY_LAYOUT[task].format(lang=lang, split=split))
    if os.path.isfile(toy):
        return toy
    for base in (os.path.join(data_dir, REAL_DIRS[task]), data_dir):
        for name in REAL_SPLIT_NAMES[split]:
            if task == "parse":
                hits = sorted(glob.glob(os.path.join(base, "UD_*", f"{lang}_*-ud-{name}.conllu")) +
                              glob.glob(os.path.join(base, "UD_*", f"{lang}_*-ud-{name}.*.conllu")))
            else:
                hits = [p for p in [os.path.join(base, f"{name}-{lang}.tsv")] if os.path.isfile(p)]
            if hits:
                if len(hits) > 1:
                    print(f"{task}: {lang} {split}: using {hits[0]} (also found: {', '.join(hits[1:])})")
                return hits[0]
    return None


def resolve_files(task, data_dir, train_lang, eval_langs, train_file=None, dev_file=None, test_files=()):
    """{"train": path, "dev": path, "test": {lang: path}}: explicit flags first, else find_file."""
    tests = dict(test_files)
    files = {"train": train_file, "dev": dev_file,
             "test": {lang: tests.get(lang) for lang in eval_langs}}
    need = [("train", train_lang, "train"), ("dev", train_lang, "dev")] + [("test", lang, "test") for lang in eval_langs]
    for key, lang, split in need:
        have = files[key] if key != "test" else files["test"][lang]
        if have is None and data_dir:
            have = find_file(data_dir, task, lang, split)
        if have is None:
            hint = (" (the shared data has no English NLI train set: pass --train-file, e.g. MultiNLI train "
                    "in XNLI tsv form)" if task == "xnli" and split == "train" else "")
            flag = {"train": "--train-file PATH", "dev": "--dev-file PATH", "test": f"--test-file {lang}=PATH"}[key]
            raise SystemExit(f"error: {task}: no {lang} {split} file under --data {data_dir!r}{hint}; pass {flag}")
        if not os.path.isfile(have):
            raise SystemExit(f"error: {task}: {lang} {split} file {have!r} does not exist")
        if key == "test":
            files["test"][lang] = have
        else:
            files[key] = have
    return files


def _floats(s):
    """`1e-4,3e-4` -> [1e-4, 3e-4]: a non-empty comma list of positive finite numbers."""
    try:
        v = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {s!r}") from None
    if not v or not all(math.isfinite(x) and x > 0 for x in v):
        raise argparse.ArgumentTypeError(f"expected a comma list of positive numbers, got {s!r}")
    return v


def _ints(s):
    """`16,32` -> [16, 32]: a non-empty comma list of positive integers."""
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {s!r}") from None
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers >= 1, got {s!r}")
    return v


def _int_min(lo):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    return parse


def _float_in(lo, hi, hi_open=True):
    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        if not (lo <= v and (v < hi if hi_open else v <= hi)):
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}{')' if hi_open else ']'}, got {s}")
        return v
    return parse


def _lang_path(s):
    try:
        return parse_lang_path(s)  # the one LANG=PATH parser (bpe.py)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser():
    p = argparse.ArgumentParser(
        description="Zero-shot cross-lingual transfer (paper §3.2): fine-tune on English, choose epoch and "
                    "hyper-parameters on English dev, report each target language's test score as the mean "
                    "of the best two hyper-parameter sets.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Data files: --data DIR is a toydata.py world or laid out as ../shared/data (xnli/, "
               "wikiann_panx/, ud/UD_*/; see find_file); --train-file/--dev-file/--test-file override single files. Grids left unset "
               "take the paper's values (or the toy preset with --toy).")
    p.add_argument("--task", choices=sorted(TASKS), help="task; with --toy and no --task, all three run")
    p.add_argument("--ckpt", required=False, help="model checkpoint from pretrain.py (best.pt: model, config, tokenizer)")
    p.add_argument("--data", help="data directory (toydata world or ../shared/data style, see below)")
    p.add_argument("--toy", nargs="?", const="", default=None, metavar="DIR",
                   help="toydata.py world directory (default: toy/ next to --ckpt, where pretrain.py --toy writes "
                        "it): the data directory, plus the toy presets (small epochs and grids)")
    p.add_argument("--train-lang", default="en", help="the language fine-tuned on (its dev set selects)")
    p.add_argument("--eval-langs", default=None,
                   help="comma list of target languages (default: the checkpoint's other languages)")
    p.add_argument("--train-file", help="explicit English train file")
    p.add_argument("--dev-file", help="explicit English dev file")
    p.add_argument("--test-file", type=_lang_path, action="append", default=[], metavar="LANG=PATH",
                   help="explicit test file for one language (repeatable)")
    p.add_argument("--epochs", type=_int_min(1), help="epochs per hyper-parameter set (paper: 10 NER/parsing, 200 XNLI)")
    p.add_argument("--epoch-size", type=_int_min(0),
                   help="training examples per epoch, 0 = one pass over train (XNLI default 20000, as XLM)")
    p.add_argument("--batch-size", type=_ints, help="comma list (paper: 16,32 NER/parsing; 4,8 XNLI)")
    p.add_argument("--lr", type=_floats,
                   help="comma list of encoder learning rates (paper: 2e-5,3e-5,5e-5; XNLI 1.25e-6,2.5e-6,5e-6)")
    p.add_argument("--head-lr", type=_floats, help="XNLI only: comma list of classifier lrs (paper 5e-6,2.5e-5,1.25e-4)")
    p.add_argument("--max-len", type=_int_min(2), default=128,
                   help="NER/parsing: subwords per window (at most the model's positions - 2); longer sentences are "
                        "split into overlapping windows")
    p.add_argument("--head-dropout", type=_float_in(0, 1), default=0.1, help="dropout before the XNLI / NER linear layer")
    p.add_argument("--clip", type=_float_in(0, math.inf), default=5.0, help="gradient norm clipping (0 = off)")
    p.add_argument("--eval-batch-size", type=_int_min(1), default=64, help="sentences per batch when scoring")
    p.add_argument("--seed", type=int, default=0, help="seed of every hyper-parameter set (head init, data order)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda (= cuda:0), cuda:N, mps")
    p.add_argument("--dtype", default="auto", choices=("auto",) + DTYPES,
                   help="training autocast, as in pretrain.py: auto = bfloat16 on GPUs that support it, else "
                        "float32; float16 is refused (no GradScaler here)")
    p.add_argument("--bf16", dest="dtype", action="store_const", const="bfloat16", help="= --dtype bfloat16")
    p.add_argument("--threads", type=_int_min(0), default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--align-layer", type=_int_min(0), metavar="I",
                   help="aligned transfer (§5.1.2, Fig. 5): freeze layers 0..I of --ckpt, train 4 new layers + head; "
                        "targets use --target-ckpt's layer I mapped by --align-maps (0 = embeddings)")
    p.add_argument("--target-ckpt", help="aligned transfer: the target language's own (monolingual) model")
    p.add_argument("--align-maps", help="aligned transfer: align.py contextual --save-maps .npz (per-layer maps)")
    p.add_argument("--out", help="output directory: results.json, and sets/*.json with one file per finished "
                        "hyper-parameter set (per task sub-folder when several tasks run). A rerun with the same "
                        "flags skips the finished sets (resume); a finished results.json of another run is refused")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out's results.json and finished sets of an earlier run (by default refused "
                        "unless the flags, checkpoint and data are the same, which resumes)")
    p.add_argument("--compare", nargs="+", metavar="RESULTS_JSON",
                   help="only print one table for several results.json of the same task, with the Δ column")
    p.add_argument("--curve", nargs="+", metavar="OUT_DIR",
                   help="only print transfer against pretraining updates for --out directories named "
                        "NAME-sSEED-stepN (fine-tuned pretrain.py --snapshots): rows = (model, updates), the "
                        "snapshot's dev perplexity and the test scores, mean ± std over seeds")
    p.add_argument("--plot", metavar="FILE.png", help="with --curve: also draw it (needs matplotlib, not a "
                                                      "requirement)")
    p.add_argument("--table", nargs="+", metavar="OUT_DIR",
                   help="only print the paper's Table 1 layout for several --out directories (rows = models, "
                        "columns = task x target language, avg, Δ against the first row); NAME-s0, NAME-s1, ... "
                        "are seeds of one row NAME: mean ± std")
    return p


def _load(path, flag, device):
    """load_model with its ValueError (missing, damaged, NaN weights, ...) as one line naming the flag."""
    try:
        return load_model(path, map_location=device)
    except ValueError as e:
        raise SystemExit(f"error: {flag}: {e}") from None


def _tokenizer(extra, path, flag):
    if "tokenizer" not in extra:
        raise SystemExit(f"error: {flag} {path}: the checkpoint has no tokenizer (vocab/BPE); use pretrain.py's best.pt")
    try:
        return bpe.Tokenizer.from_dict(extra["tokenizer"])
    except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"error: {flag} {path}: unreadable tokenizer entry ({type(e).__name__}: {e})") from None


def check_out_dir(path):
    """Create --out (and parents) and make sure a file can be written there, before any work."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except FileExistsError:
        raise SystemExit(f"error: --out {path}: exists and is not a directory") from None
    except OSError as e:
        raise SystemExit(f"error: --out {path}: cannot write there ({e.strerror or e})") from None


def check_files(args):
    """Every data path flag names an existing file (a directory for --data) before anything is loaded
    (the checkpoints and --align-maps are checked by their loaders)."""
    named = [(f"--train-file {args.train_file}", args.train_file), (f"--dev-file {args.dev_file}", args.dev_file)]
    named += [(f"--test-file {lang}={path}", path) for lang, path in args.test_file]
    for what, path in named:
        if path is not None and not os.path.isfile(path):
            raise SystemExit(f"error: {what}: {'not a file' if os.path.exists(path) else 'no such file'}")
    if args.data is not None and not os.path.isdir(args.data):
        raise SystemExit(f"error: --data {args.data}: no such directory")


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.plot and not args.curve:
        raise SystemExit("error: --plot goes with --curve")
    if args.curve:
        text, series = learning_curve(args.curve)
        print(text)
        if args.plot:
            plot_curve(series, args.plot)
        return
    if args.table:
        print(table1(args.table))
        return
    if args.compare:
        results = [read_json(path, "--compare") for path in args.compare]
        for path, r in zip(args.compare, results):
            if not isinstance(r, dict) or not {"task", "metric", "dev", "test", "eval_langs", "train_lang"} <= set(r):
                raise SystemExit(f"error: --compare: {path} is not a results.json written by finetune.py")
        if len({r["task"] for r in results}) > 1:
            raise SystemExit("error: --compare: the results are from different tasks")
        print(format_table(results, names=args.compare))
        return

    # -------------------------------------------------------------------------
    # every flag and input file is checked before any work (one line each)
    if not args.ckpt or not args.out:
        raise SystemExit("error: --ckpt and --out are required (or --compare / --table)")
    if args.dtype == "float16":
        raise SystemExit("error: --dtype float16: fine-tuning in float16 needs a GradScaler, which finetune.py "
                         "does not have; use --dtype bfloat16 or float32")
    try:
        args.device, dtype, _ = pick_device(args.device, args.dtype)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    args.bf16 = dtype == "bfloat16"  # auto on a GPU without bfloat16: float32 (the set's identity keeps bf16)
    if args.align_layer is None and (args.target_ckpt or args.align_maps):
        raise SystemExit("error: --target-ckpt and --align-maps are for aligned transfer: give --align-layer too")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.toy and args.data and os.path.abspath(args.toy) != os.path.abspath(args.data):
        raise SystemExit(f"error: --toy {args.toy} and --data {args.data} name two data directories; give one")
    if args.toy is not None:  # --toy alone: the toy presets on --data, else on the world next to --ckpt
        args.data = args.toy or args.data or os.path.join(os.path.dirname(os.path.abspath(args.ckpt)), "toy")
        if not os.path.isdir(args.data):
            raise SystemExit(f"error: --toy: no toy world at {args.data} "
                             "(run pretrain.py --toy, or toydata.py --out DIR)")
    tasks = [args.task] if args.task else (["xnli", "ner", "parse"] if args.toy is not None else [])
    if not tasks:
        raise SystemExit("error: --task is required (only --toy runs all three)")
    check_files(args)
    model, extra = _load(args.ckpt, "--ckpt", args.device)
    tok = _tokenizer(extra, args.ckpt, "--ckpt")
    langs = list(extra.get("langs") or tok.langs)
    if args.eval_langs is not None:
        given, args.eval_langs = args.eval_langs, list(dict.fromkeys(x.strip() for x in args.eval_langs.split(",")
                                                                     if x.strip()))
        if not args.eval_langs:
            raise SystemExit(f"error: --eval-langs {given!r}: no language given")
    else:
        args.eval_langs = [lang for lang in langs if lang != args.train_lang]
        if not args.eval_langs:
            raise SystemExit(f"error: {args.ckpt} knows only {langs}: give --eval-langs (with --align-layer)")
    for lang, _ in args.test_file:
        if lang not in args.eval_langs:
            raise SystemExit(f"error: --test-file {lang}=...: {lang!r} is not one of --eval-langs {args.eval_langs}")
    for code in [args.train_lang] + (args.eval_langs if args.align_layer is None else []):
        lang_index(langs, code, args.ckpt)  # fail before any data is read
    args.max_len = max(2, min(args.max_len, model.config.max_positions - 2))
    routes = None
    if args.align_layer is not None:
        model, routes = setup_aligned(model, tok, langs, args)
    check_out_dir(args.out)
    jobs = []  # (name, targs, files, prepared, out, sets, finished results or None)
    for name in tasks:
        targs = argparse.Namespace(**vars(args))
        preset = (TOY_PRESET if args.toy is not None else PAPER_PRESET)[name]
        for k, v in preset.items():
            if getattr(targs, k) is None:
                setattr(targs, k, v)
        targs.head_lr = targs.head_lr or [None]
        files = resolve_files(name, args.data, args.train_lang, args.eval_langs, args.train_file, args.dev_file,
                              args.test_file)
        out = os.path.join(args.out, name) if len(tasks) > 1 else args.out
        job = job_identity(name, files, targs)
        done = check_results(os.path.join(out, "results.json"), job, grid(name, targs), args.overwrite)
        sets = SetStore(out, job)
        if not args.overwrite:
            sets.load()
        prepared = None if done else prepare_task(name, model, tok, langs, files, targs, routes=routes)
        jobs.append((name, targs, files, prepared, out, sets, done))

    # -------------------------------------------------------------------------
    # the grids; each finished set is on disk as soon as it ends
    for name, targs, files, prepared, out, sets, done in jobs:
        path = os.path.join(out, "results.json")
        if done:
            print(f"\n{name}: {path} is already complete for these flags, checkpoint and data: nothing to do "
                  "(--overwrite runs it again)")
            res = done
        else:
            check_out_dir(out)
            if args.overwrite:
                sets.clear()
                if os.path.exists(path):
                    os.remove(path)
            n_done = sum(sets.get(hp) is not None for hp in grid(name, targs))
            if n_done:
                print(f"{name}: resuming: {n_done} of {len(grid(name, targs))} hyper-parameter sets finished in "
                      f"an earlier run ({sets.dir})")
            res = run_task(name, model, tok, langs, files, targs, routes=routes, prepared=prepared, sets=sets)
            res["job"] = sets.job
            res["pretrain"] = {"step": extra.get("step"), "dev_ppl": extra.get("dev_ppl")}  # for --curve
            write_json(path, res)
        ok = [c for c in res["configs"] if "failed" not in c]
        picked = "; ".join(f"bs {res['configs'][i]['batch_size']} lr {res['configs'][i]['lr']:g}"
                           + (f" head lr {res['configs'][i]['head_lr']:g}" if res['configs'][i]['head_lr'] else "")
                           + f" (epoch {res['configs'][i]['best_epoch']})" for i in res["best_two"])
        failed = len(res["configs"]) - len(ok)
        print(f"\n{name}: mean of the best two of {len(ok)} hyper-parameter sets by en dev: {picked}"
              + (f" ({failed} diverged set(s) left out)" if failed else ""))
        print(format_table([res]))
        print(f"wrote {path}" if not done else f"results in {path}")


if __name__ == "__main__":
    main()
