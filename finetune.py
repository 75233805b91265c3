"""Zero-shot cross-lingual transfer, the measure of the paper (Conneau et al. 2020, §3.2, Table 1).

Fine-tune a pretrained encoder on English only, choose the epoch and the hyper-parameters on English dev, and
score the same weights on each target language's test set:
- XNLI: `</s> premise </s> hypothesis </s>`, dropout + linear softmax at position 0, accuracy (XLM `xnli.py`);
- NER (WikiAnn / PAN-X): a linear tagger on first subwords, span F1 (seqeval) after the paper's BIO repair;
- UD parsing: Dozat & Manning's biaffine parser on first subwords, one-root MST, UAS/LAS as `conll18_ud_eval.py`.
--align-layer runs §5.1.2 (Figure 5): English layers 0..i frozen, 4 new layers and the head trained on top, and
a monolingual target model's layer i mapped into them by align.py's orthogonal map.

    python finetune.py --toy --data runs/toy/toy --ckpt runs/toy/best.pt --out runs/toy/ft   # all three tasks
    python finetune.py --task ner --ckpt RUN/best.pt --data DATA --eval-langs fr --out runs/ner  # README "Real data"
    python finetune.py --task ner --toy --data WORLD --ckpt EN/best.pt --target-ckpt FR/best.pt --align-maps maps.npz \
        --align-layer 4 --eval-langs fr --out runs/aligned                   # §5.1.2
    python finetune.py --table runs/ft/default-s{0,1} runs/ft/sep-emb-s0   # Table 1 layout (also over -stepN dirs)
"""
import argparse
import collections
import fnmatch
import functools
import glob
import itertools
import json
import math
import os
import re
import shlex
import signal
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

import align
import bpe
from bpe import EOS_ID, UNK_ID, InputError, number, read_lines
from model import (DTYPES, AlignedEncoder, autocast, check_plot, encode_batch, encode_states, file_digest, load_model,
                   pick_device)


# -----------------------------------------------------------------------------
# Shared encoding: subwords as XLM feeds them (`</s> ids </s>`, windows for long sentences), first subwords

def first_subwords(tok, words, lang):
    """Subword ids of a word list and where each word starts; a word that encodes to nothing is <unk> (XTREME)."""
    ids, first = [], []
    for piece in tok.encode_words(words, lang):
        first.append(len(ids))
        ids.extend(piece or [UNK_ID])
    return ids, first


def word_states(model, seqs, firsts, lang, max_len, with_root):
    """States at each word's first subword (then ROOT, the leading </s>, first) -> (B, W, d) and the words' mask."""
    states = encode_states(model, seqs, lang, max_len)
    pos = [torch.tensor([0] * with_root + [1 + k for k in f], dtype=torch.long) for f in firsts]
    pos = nn.utils.rnn.pad_sequence(pos, batch_first=True, padding_value=-1).to(states.device)  # (B, W), -1: no word
    return states.gather(1, pos.clamp(min=0)[..., None].expand(-1, -1, states.size(-1))), pos >= 0


# -----------------------------------------------------------------------------
# A task: what each of the three sections below defines for the protocol, its grid preset and optimiser included

def warmup_linear(step, total, warmup=0.1):
    """LR factor: linear warm-up over the first 10 % of the updates, then linear decay to 0 (crosslingual-nlp)."""
    n_warm = max(1, int(warmup * total))
    return step / n_warm if step < n_warm else max(0.0, (total - step) / max(1, total - n_warm))


class Task:
    """What the §3.2 protocol asks of a task: `labels` from English train, a `metric` for English dev, featurize,
    run (the loss, or the predictions), score, its grid presets `paper` and `toy`, its optimisers. NER and parsing
    encode a long sentence in windows of `max_len` subwords (XNLI's featurize cuts a pair to fit instead)."""
    own_head_lr = False  # a classifier learning rate of its own, a third axis of the grid (XNLI)

    def __init__(self, train_examples, max_len=128):
        self.labels = self.label_set(train_examples)
        self.max_len = max_len

    def head(self, d, dropout):  # XNLI, NER (the parser has its own)
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(d, len(self.labels)))

    def optimizers(self, params, head, hp, total_steps):
        """NER, parsing: one Adam over the encoder and the head, warmup_linear (crosslingual-nlp)."""
        opt = torch.optim.Adam(params + list(head.parameters()), lr=hp["lr"])
        return [opt], [torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_linear(s, total_steps))]


# -----------------------------------------------------------------------------
# XNLI (§3.2): `</s> premise </s> hypothesis </s>`, a linear head at position 0, accuracy

# toydata.LABELS lists the same three in its generator's order; labels are matched by name, so the orders may differ
XNLI_LABELS = ("contradiction", "neutral", "entailment")  # ids 0, 1, 2 as XLM `src/evaluation/xnli.py`


class XNLITask(Task):
    """Dropout + Linear(d, 3) on the last layer at position 0 (the first </s>); the head's lr a grid axis (XLM)."""
    name, metric, own_head_lr = "xnli", "acc", True
    # §3.2's grid; an epoch is 20000 pairs, XLM's --epoch_size
    paper = dict(epochs=200, epoch_size=20000, batch_size=[4, 8], lr=[1.25e-6, 2.5e-6, 5e-6],
                 head_lr=[5e-6, 2.5e-5, 1.25e-4])
    toy = dict(epochs=10, epoch_size=0, batch_size=[16], lr=[2e-4, 5e-4], head_lr=[1e-3])  # --toy: tiny, larger lrs

    def optimizers(self, params, head, hp, total_steps):
        """XLM: two Adam optimisers, the encoder's and the classifier's, at fixed learning rates (no schedule)."""
        return [torch.optim.Adam(params, lr=hp["lr"]), torch.optim.Adam(head.parameters(), lr=hp["head_lr"])], []

    def label_set(self, train_examples):
        return list(XNLI_LABELS)  # XLM's fixed ids

    def featurize(self, examples, tok, lang, max_positions):
        """XLM's `</s> premise </s> hypothesis </s>`; too long, its longer side is cut (XLM cuts each to 256)."""
        feats = []
        for premise, hypothesis, label in examples:
            a, b = tok.encode(premise, lang), tok.encode(hypothesis, lang)
            while len(a) + len(b) > max_positions - 3:
                a, b = (a[:-1], b) if len(a) >= len(b) else (a, b[:-1])
            feats.append(([EOS_ID] + a + [EOS_ID] + b + [EOS_ID], self.labels.index(label)))
        return feats

    def run(self, model, head, batch, lang, predict=False):
        logits = head(encode_batch(model, [ids for ids, _ in batch], lang)[0][-1][:, 0])
        if predict:
            return logits.argmax(-1).tolist()
        return F.cross_entropy(logits.float(), torch.tensor([y for _, y in batch], device=logits.device))

    def score(self, examples, preds):
        return {"acc": sum(self.labels[p] == lab for (_, _, lab), p in zip(examples, preds)) / len(examples)}


# -----------------------------------------------------------------------------
# NER (§3.2): the paper's BIO repair, micro span F1, a linear tagger on first subwords

def repair_bio(tags):
    """The paper's repair heuristic (§3.2, from Wu & Dredze 2019), left to right: a standalone `I-X` (at the
    start, after O) becomes `B-X`; a run whose type changes, `B-X I-Y I-Z`, takes its last type:
    `B-Z I-Z I-Z`. The result is valid IOB2.
    ["I-PER", "O", "B-LOC", "I-ORG", "I-PER"] -> ["B-PER", "O", "B-PER", "I-PER", "I-PER"]"""
    out = list(tags)
    start = cur = None  # the open run: first index and type
    for t, tag in enumerate(out):
        if tag == "O":
            start = cur = None
        elif tag[:2] == "B-" and len(tag) > 2:
            start, cur = t, tag[2:]
        elif tag[:2] == "I-" and len(tag) > 2:
            if start is None:  # standalone I-X -> B-X
                out[t] = "B-" + tag[2:]
                start, cur = t, tag[2:]
            elif tag[2:] != cur:  # the type changed inside a run: the whole run so far takes the new one
                cur = tag[2:]
                out[start:t] = ["B-" + cur] + ["I-" + cur] * (t - start - 1)
        else:
            raise ValueError(f"tag {tag!r} at position {t} is not O, B-X or I-X")
    return out


def bio_spans(tags):
    """Typed spans {(type, start, end)} of a VALID IOB2 sequence (repair_bio first).
    ["B-PER", "I-PER", "O", "B-LOC"] -> {("PER", 0, 2), ("LOC", 3, 4)}"""
    spans, start, cur = set(), None, None
    for t, tag in enumerate(list(tags) + ["O"]):
        if cur is not None and tag != "I-" + cur:
            spans.add((cur, start, t))
            cur = None
        if tag != "O" and cur is None:
            start, cur = t, tag[2:]
    return spans


def span_f1(gold, pred):
    """Micro P, R, F1 over the typed spans of both sides repaired; a span counts when type, start and end match."""
    tp = n_gold = n_pred = 0
    for k, (g, p) in enumerate(zip(gold, pred, strict=True)):  # strict: a missing sentence raises ValueError
        if len(g) != len(p):
            raise ValueError(f"span_f1: sentence {k} has {len(g)} gold tags but {len(p)} predicted")
        G, P = bio_spans(repair_bio(g)), bio_spans(repair_bio(p))
        tp, n_gold, n_pred = tp + len(G & P), n_gold + len(G), n_pred + len(P)
    precision, recall = tp / n_pred if n_pred else 0.0, tp / n_gold if n_gold else 0.0
    return precision, recall, 2 * precision * recall / (precision + recall) if tp else 0.0


class NERTask(Task):
    """BIO tagging: dropout + Linear(d, n_tags) on the first subword of every word; span F1 after repair."""
    name, metric = "ner", "f1"
    # §3.2's grid; an epoch is one pass over train
    paper = dict(epochs=10, epoch_size=0, batch_size=[16, 32], lr=[2e-5, 3e-5, 5e-5], head_lr=[None])
    # --toy: a tiny model learns in a few epochs at larger learning rates; two sets: the best two are both
    toy = dict(epochs=4, epoch_size=0, batch_size=[16], lr=[3e-4, 1e-3], head_lr=[None])

    def label_set(self, train_examples):
        return ["O"] + sorted({t for _, ts in train_examples for t in ts} - {"O"})

    def featurize(self, examples, tok, lang, max_positions):  # a tag unseen in English train: -1 (dev/test only)
        ids = {t: i for i, t in enumerate(self.labels)}
        return [first_subwords(tok, words, lang) + ([ids.get(t, -1) for t in tags],) for words, tags in examples]

    def run(self, model, head, batch, lang, predict=False):
        h, mask = word_states(model, [ids for ids, _, _ in batch], [f for _, f, _ in batch], lang, self.max_len,
                              False)
        if predict:
            best = head(h).argmax(-1).tolist()
            return [[self.labels[k] for k in best[b][:len(f)]] for b, (_, f, _) in enumerate(batch)]
        y = torch.tensor([t for _, _, tags in batch for t in tags], device=mask.device)  # the order of h[mask]
        return F.cross_entropy(head(h)[mask].float(), y)

    def score(self, examples, preds):
        return dict(zip(("precision", "recall", "f1"), span_f1([tags for _, tags in examples], preds)))


# -----------------------------------------------------------------------------
# UD parsing (§3.2): biaffine scorer (Dozat & Manning), one-root MST decoding, UAS/LAS (CoNLL 2018)

def find_cycle(heads):
    """The first cycle (list of nodes) of a head array with heads[0] = -1, or None."""
    state = [2] + [0] * (len(heads) - 1)  # 0 unseen, 1 on the current path, 2 done
    for s in range(1, len(heads)):
        path, v = [], s
        while state[v] == 0:
            state[v] = 1
            path.append(v)
            v = heads[v]
        if state[v] == 1:  # the walk closed a loop
            return path[path.index(v):]
        for u in path:
            state[u] = 2
    return None


def strip_subtype(rel):
    """`nmod:poss` -> `nmod`: CoNLL 2018 compares the universal part only."""
    return rel.split(":")[0]


def attachment_scores(gold_heads, gold_rels, pred_heads, pred_rels):
    """(UAS, LAS) over all words, punctuation too, deprels without subtypes: `conll18_ud_eval.py` on gold tokens."""
    n = uas = las = 0
    for gh, gr, ph, pr in zip(gold_heads, gold_rels, pred_heads, pred_rels, strict=True):  # unequal lengths raise
        for a, b, c, d in zip(gh, gr, ph, pr, strict=True):
            n, uas, las = n + 1, uas + (a == c), las + (a == c and strip_subtype(b) == strip_subtype(d))
    return (uas / n, las / n) if n else (0.0, 0.0)


def chu_liu_edmonds(S):
    """Maximum spanning arborescence rooted at 0; S[d, h] = score of the arc h -> d, -inf = forbidden (row 0 and the
    diagonal are: mst_decode sets them, contraction keeps them). Every node takes its best head; a cycle C becomes one
    node c (into c from h: max over v in C of S[v, h] - S[v, head(v)]; out to d: max over u in C of S[d, u]), solved
    by recursion, then expanded."""
    n = len(S)
    heads = S.argmax(1)
    heads[0] = -1
    cycle = find_cycle(heads)
    if cycle is None:
        return heads
    C, rest = np.array(cycle), np.flatnonzero(~np.isin(np.arange(n), cycle))  # rest includes 0
    m = len(rest)
    S2 = np.full((m + 1, m + 1), -np.inf)
    S2[:m, :m] = S[np.ix_(rest, rest)]
    gain = S[np.ix_(C, rest)] - S[C, heads[C]][:, None]  # (|C|, m): enter the cycle at v from h
    enter, S2[m, :m] = gain.argmax(0), gain.max(0)
    leave, S2[:m, m] = S[np.ix_(rest, C)].argmax(1), S[np.ix_(rest, C)].max(1)  # leave it from u to d
    heads2 = chu_liu_edmonds(S2)
    for i in range(1, m):
        heads[rest[i]] = C[leave[i]] if heads2[i] == m else rest[heads2[i]]
    heads[C[enter[heads2[m]]]] = rest[heads2[m]]  # the one cycle node whose cycle arc is broken
    return heads


def mst_decode(scores):
    """The best tree with ONE word on ROOT; scores[d, h] (n+1, n+1), 0 = ROOT -> heads of 0..n, heads[0] = -1. One
    Chu-Liu-Edmonds run: every ROOT arc loses a constant M larger than the whole score range, so one root arc beats
    two and the order among one-root trees is unchanged."""
    S = np.array(scores, dtype=np.float64)
    finite = S[np.isfinite(S)]
    S[:, 0] -= (finite.max() - finite.min() + 1.0) * len(S) if finite.size else 1.0
    S[0, :] = -np.inf
    np.fill_diagonal(S, -np.inf)
    return chu_liu_edmonds(S)


ARC_MLP, REL_MLP, MLP_DROPOUT, LEAKY_SLOPE = 500, 100, 0.33, 0.1  # Dozat & Manning 2017's sizes (the paper's parser)


class Biaffine(nn.Module):
    """s[b, x, y, o] = [x ; 1]^T W_o [y ; 1] (B, T, T, n_out), the bias column on y optional."""

    def __init__(self, n_in, n_out, bias_y):
        super().__init__()
        self.bias_y = bias_y
        self.weight = nn.Parameter(torch.zeros(n_out, n_in + 1, n_in + bias_y))  # zero init as yzhangcs/parser

    def forward(self, x, y):  # (B, T, n_in) each
        x = torch.cat([x, torch.ones_like(x[..., :1])], -1)
        y = torch.cat([y, torch.ones_like(y[..., :1])], -1) if self.bias_y else y
        return torch.einsum("bxi,oij,byj->bxyo", x, self.weight, y)


class BiaffineParser(nn.Module):
    """On states h (B, T, d), 0 = ROOT: s_arc[b, i, j] scores head j for word i, s_rel[b, i, j, r] its label r."""

    def __init__(self, d_model, n_rels, arc_mlp=ARC_MLP, rel_mlp=REL_MLP, dropout=MLP_DROPOUT):
        super().__init__()

        def mlp(n):
            return nn.Sequential(nn.Linear(d_model, n), nn.LeakyReLU(LEAKY_SLOPE), nn.Dropout(dropout))
        self.arc_dep, self.arc_head = mlp(arc_mlp), mlp(arc_mlp)
        self.rel_dep, self.rel_head = mlp(rel_mlp), mlp(rel_mlp)
        self.arc_attn, self.rel_attn = Biaffine(arc_mlp, 1, bias_y=False), Biaffine(rel_mlp, n_rels, bias_y=True)

    def forward(self, h, mask):  # mask (B, T): True at the candidate heads (ROOT and words); the others score -inf
        s_arc = self.arc_attn(self.arc_dep(h), self.arc_head(h)).squeeze(-1)
        return s_arc.masked_fill(~mask[:, None, :], float("-inf")), self.rel_attn(self.rel_dep(h), self.rel_head(h))

    @staticmethod
    def loss(s_arc, s_rel, heads, rels):
        """CE over heads + CE over the label at the GOLD head (yzhangcs/parser); heads, rels (B, T), -1: no word."""
        words = heads >= 0
        s_gold = s_rel[words].gather(1, heads[words][:, None, None].expand(-1, 1, s_rel.size(-1))).squeeze(1)
        return F.cross_entropy(s_arc[words], heads[words]) + F.cross_entropy(s_gold, rels[words])

    @staticmethod
    def decode(s_arc, s_rel, mask):
        """MST on log-softmax arc scores, labels argmax at the chosen head -> per sentence CoNLL heads, label ids."""
        logp = s_arc.detach().float().log_softmax(-1).cpu().numpy()
        best_rel, words = s_rel.detach().argmax(-1).cpu().numpy(), mask[:, 1:].cpu().numpy()  # one copy each
        out_heads, out_rels = [], []
        for b in range(len(logp)):
            pos = np.concatenate([[0], 1 + np.flatnonzero(words[b])])  # ROOT, then the words
            heads = mst_decode(logp[b][np.ix_(pos, pos)])[1:]  # indices into pos = CoNLL word numbers
            out_heads.append(heads.tolist())
            out_rels.append([int(best_rel[b, i, pos[h]]) for i, h in zip(pos[1:], heads)])
        return out_heads, out_rels


class ParseTask(Task):
    """Biaffine parsing on first subwords, ROOT = the leading </s>; MST decoding; UAS/LAS (CoNLL 2018)."""
    name, metric = "parse", "las"
    paper, toy = NERTask.paper, NERTask.toy  # §3.2 gives parsing NER's grid

    def label_set(self, train_examples):
        return sorted({strip_subtype(r) for s in train_examples for r in s["rels"]})

    def head(self, d, dropout):
        return BiaffineParser(d, len(self.labels))

    def featurize(self, examples, tok, lang, max_positions):
        ids = {r: i for i, r in enumerate(self.labels)}
        return [first_subwords(tok, s["words"], lang) + (s["heads"], [ids.get(strip_subtype(r), -1) for r in s["rels"]])
                for s in examples]

    def run(self, model, head, batch, lang, predict=False):
        h, mask = word_states(model, [f[0] for f in batch], [f[1] for f in batch], lang, self.max_len, True)  # +ROOT
        s_arc, s_rel = head(h, mask)
        if predict:
            heads, rels = BiaffineParser.decode(s_arc, s_rel, mask)
            return [(h, [self.labels[r] for r in rs]) for h, rs in zip(heads, rels)]
        heads, rels = torch.full(mask.shape, -1), torch.full(mask.shape, -1)
        for b, (_, _, hs, rs) in enumerate(batch):
            heads[b, 1:1 + len(hs)], rels[b, 1:1 + len(rs)] = torch.tensor(hs), torch.tensor(rs)
        return BiaffineParser.loss(s_arc.float(), s_rel.float(), heads.to(mask.device), rels.to(mask.device))

    def score(self, examples, preds):
        gold = [s["heads"] for s in examples], [s["rels"] for s in examples]
        pred = [p[0] for p in preds], [p[1] for p in preds]
        return dict(zip(("uas", "las"), attachment_scores(*gold, *pred)))


TASKS = {task.name: task for task in (XNLITask, NERTask, ParseTask)}


# -----------------------------------------------------------------------------
# The zero-shot protocol (§3.2): a grid of hyper-parameter sets, each with its epoch chosen by English dev,
# the mean of the best two sets; language-specific parts frozen

def grid(task_name, args):
    """The hyper-parameter sets in a fixed order: batch size x encoder lr (x classifier lr for XNLI)."""
    head_lrs = args.head_lr if TASKS[task_name].own_head_lr else [None]
    return [{"batch_size": b, "lr": lr, "head_lr": hl} for b in args.batch_size for lr in args.lr for hl in head_lrs]


def hp_text(hp):
    return f"bs {hp['batch_size']} lr {hp['lr']:g}" + (f" head lr {hp['head_lr']:g}" if hp["head_lr"] else "")


def freeze_lang_specific(model):
    """Language-specific parameters (Sep Emb, Sep L1-k; §4.3) stay frozen: a target language is tested through ITS
    own parts and the shared top English tuned. -> the trainable parameters."""
    frozen = {id(p) for lang in range(model.config.n_langs) for p in model.lang_specific_parameters(lang)}
    for p in model.parameters():
        p.requires_grad_(id(p) not in frozen)
    return [p for p in model.parameters() if id(p) not in frozen]


@torch.no_grad()
def evaluate(task, model, head, feats, examples, lang, batch_size=64, bf16=False):
    """Scores of one split, in batches of 64 in length order (less padding), under training's autocast."""
    model.eval()
    head.eval()
    order = sorted(range(len(feats)), key=lambda i: len(feats[i][0]))
    preds, device = {}, next(model.parameters()).device
    for k in range(0, len(order), batch_size):
        chunk = order[k:k + batch_size]
        with autocast(device, "bfloat16" if bf16 else "float32"):
            preds.update(zip(chunk, task.run(model, head, [feats[i] for i in chunk], lang, predict=True)))
    return task.score(examples, [preds[i] for i in range(len(feats))])


def finetune_one(task, model, init_state, data, hp, args, log=print):
    """One hyper-parameter set: train on English, keep the epoch with the best English dev score, test every target
    with it. data: {"lang_id", "train"/"dev": (examples, feats), "test": {code: (examples, feats, lang_id)}}."""
    device = next(model.parameters()).device
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model.load_state_dict(init_state)
    head = task.head(model.config.dim, args.head_dropout).to(device)
    params = freeze_lang_specific(model)
    train, lang, (dev_ex, dev_feats) = data["train"][1], data["lang_id"], data["dev"]
    n_per_epoch = args.epoch_size or len(train)
    steps_per_epoch = math.ceil(n_per_epoch / hp["batch_size"])
    opts, scheds = task.optimizers(params, head, hp, steps_per_epoch * args.epochs)
    cpu_copy = lambda m: {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}  # noqa: E731
    # as XLM: an endless shuffled stream cut into epochs, each permutation drawn when reached (any --epoch-size fits)
    stream = (i for _ in itertools.count() for i in rng.permutation(len(train)))
    best, dev_curve = None, []
    bar = tqdm(total=args.epochs * steps_per_epoch, unit="step", desc=f"{task.name} {hp_text(hp)}", leave=False,
               disable=not sys.stderr.isatty(), mininterval=1)  # stderr, on a terminal only
    for epoch in range(1, args.epochs + 1):
        model.train()
        head.train()
        total_loss = 0.0
        for k in range(0, n_per_epoch, hp["batch_size"]):
            batch = [train[i] for i in itertools.islice(stream, min(hp["batch_size"], n_per_epoch - k))]
            with autocast(device, "bfloat16" if args.bf16 else "float32"):
                loss = task.run(model, head, batch, lang)
            if not torch.isfinite(loss):  # diverged: the set stops, run_task leaves it out of the selection
                bar.close()
                raise FloatingPointError(f"non-finite training loss ({loss.item()}) at epoch {epoch}, update "
                                         f"{k // hp['batch_size'] + 1} of {steps_per_epoch}; try a lower --lr")
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(params + list(head.parameters()), args.clip)
            for o in opts + scheds:
                o.step()
            total_loss += loss.item() * len(batch)
            bar.update()
        dev = evaluate(task, model, head, dev_feats, dev_ex, lang, bf16=args.bf16)
        dev_curve.append(dev[task.metric])
        with tqdm.external_write_mode():  # the line above the bar
            log(f"  epoch {epoch}: train loss {total_loss / n_per_epoch:.4f}  en dev {task.metric} "
                f"{100 * dev[task.metric]:.2f}")
        if best is None or dev[task.metric] > best["dev"][task.metric]:
            best = {"epoch": epoch, "dev": dev, "state": cpu_copy(model), "head": cpu_copy(head)}
    bar.close()
    model.load_state_dict(best["state"])
    head.load_state_dict(best["head"])
    test = {code: evaluate(task, model, head, feats, ex, lid, bf16=args.bf16)
            for code, (ex, feats, lid) in data["test"].items()}
    return {**hp, "best_epoch": best["epoch"], "dev_curve": dev_curve, "dev": best["dev"], "test": test}


def mean_of_best_two(records, metric):
    """§3.2: "we report the result on average of best two set of hyperparameters": by English dev (at each set's
    chosen epoch), every score of the best two averaged (one set: its own) -> (indices, dev, test)."""
    top = sorted(range(len(records)), key=lambda i: -records[i]["dev"][metric])[:2]  # ties: grid order
    mean = lambda scores: {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}  # noqa: E731
    test = {lang: mean([records[i]["test"][lang] for i in top]) for lang in records[top[0]]["test"]}
    return top, mean([records[i]["dev"] for i in top]), test


# -----------------------------------------------------------------------------
# Aligned transfer (§5.1.2, Figure 5): English layers 0..i frozen, 4 new layers on top; targets mapped into English

def setup_aligned(model, tok, langs, args):
    """The English model and the target's own joined by align.py's W (x_target @ W ~ x_english at layer I)."""
    if len(args.eval_langs) != 1:
        raise InputError("--align-layer: give exactly one --eval-langs (the --target-ckpt language)")
    code, en, path, layer = args.eval_langs[0], args.train_lang, args.align_maps, args.align_layer
    tmodel, ttok, tlangs, _ = load_ckpt(args.target_ckpt, "--target-ckpt", args.device, args.xlm_codes)
    n, dim = min(model.config.n_layers, tmodel.config.n_layers), model.config.dim
    if not 0 <= layer <= n:
        raise InputError(f"--align-layer {layer} outside 0..{n}")
    if tmodel.config.dim != dim:
        raise InputError(f"--target-ckpt dim {tmodel.config.dim} differs from --ckpt dim {dim}")
    W = torch.tensor(checked(align.load_map, path, code, en, layer, prefix="--align-maps: "), device=args.device)
    if W.shape != (dim, dim):
        raise InputError(f"--align-maps: {path}: maps of size {tuple(W.shape)}, not {dim}x{dim} (--ckpt's dim)")
    torch.manual_seed(args.seed)  # the new layers' init, so that --seed decides a run
    enc = AlignedEncoder({en: (model, lang_index(langs, en, args.ckpt, "--train-lang"), None),
                          code: (tmodel, lang_index(tlangs, code, args.target_ckpt, "--eval-langs"), W)},
                         layer).to(args.device)
    return enc, {en: (tok, en), code: (ttok, code)}


# =============================================================================
# The plumbing, not part of the paper: official file formats, the data directory, CLI, resume, --table / --plot

# -----------------------------------------------------------------------------
# Official formats: reader(path, lang) -> examples; `lang` picks XNLI 1.0's rows, checks raw PAN-X's prefixes

def nli_example(where, premise, hypothesis, label, column="XNLI label"):
    """One (premise, hypothesis, label) at `where` (path:line), checked: a known label (`column`), two sentences."""
    if label not in XNLI_LABELS:
        raise InputError(f"{where}: unknown {column} {label!r} (expected entailment, neutral, contradiction)")
    if not premise or not hypothesis:
        raise InputError(f"{where}: empty sentence1 or sentence2")
    return premise, hypothesis, label


def some(examples, path, what=None):
    if not examples:
        raise InputError(f"{path}: no {what or 'examples (empty split)'}")
    return examples


def read_nli_tsv(path, lang=None, *, cols, header_name=None, column="XNLI label"):
    """NLI tab-separated columns `cols` = (premise, hypothesis, label[, language]), in order or named by a header line
    (`header_name`) -> [(premise, hypothesis, label)] (`lang`'s rows); `contradictory` (XNLI-MT's) is contradiction."""
    lines = enumerate(read_lines(path), 1)
    header = next(lines, (1, ""))[1] if header_name else "\t".join(cols)
    names = [x.strip() for x in header.split("\t")]
    if not set(cols) <= set(names):
        raise InputError(f"{path}:1: expected the {header_name}, got {header[:80]!r}")
    examples = []
    for n, line, fields in ((n, line, [x.strip() for x in line.split("\t")]) for n, line in lines if line.strip()):
        if len(fields) != len(names):
            want = f"{len(names)} tab-separated columns (the header's)" if header_name else "<TAB>".join(cols)
            raise InputError(f"{path}:{n}: expected {want}, got {line[:80]!r}")
        premise, hypothesis, label, *language = (fields[names.index(c)] for c in cols)
        if language == [lang] or not language:
            if not label:
                raise InputError(f"{path}:{n}: no label (column {cols[2]} is empty)")
            label = "contradiction" if label == "contradictory" else label
            examples.append(nli_example(f"{path}:{n}", premise, hypothesis, label, column))
    return some(examples, path, len(cols) > 3 and f"rows of language {lang!r} (column language)")


# `premise<TAB>hypothesis<TAB>label` lines (XTREME's XNLI, MultiNLI as train-en.tsv) -> [(p, h, label)]
read_xnli = functools.partial(read_nli_tsv, cols=("premise", "hypothesis", "label"))
# XNLI 1.0 as distributed (Conneau et al. 2018, `XNLI-1.0.zip`: `xnli.dev.tsv`, `xnli.test.tsv`): one file for all 15
# languages, its columns read by name -> the rows of `lang`
read_xnli_1_0 = functools.partial(read_nli_tsv, cols=("sentence1", "sentence2", "gold_label", "language"),
                                  header_name="XNLI 1.0 header (columns gold_label, language, sentence1, sentence2)")
# XNLI-MT 1.0 (`XNLI-MT-1.0.zip`: `multinli/multinli.train.{lang}.tsv`, MultiNLI train and its translations)
read_xnli_mt = functools.partial(read_nli_tsv, cols=("premise", "hypo", "label"),
                                 header_name="XNLI-MT header premise<TAB>hypo<TAB>label", column="XNLI-MT label")


def read_multinli(path, lang=None):
    """MultiNLI 1.0 (Williams et al. 2018, `multinli_1.0.zip`: `multinli_1.0_train.jsonl`): a JSON object a line,
    `sentence1`, `sentence2`, `gold_label`; pairs without a gold label (`-`, no annotator majority) are skipped."""
    examples = []
    for n, line in filter(lambda n_line: n_line[1].strip(), enumerate(read_lines(path), 1)):
        try:
            row = json.loads(line)
            premise, hypothesis, label = (row[k].strip() for k in ("sentence1", "sentence2", "gold_label"))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InputError(f"{path}:{n}: expected a JSON object with string fields sentence1, sentence2, "
                             f"gold_label (MultiNLI .jsonl), got {line[:80]!r}") from None
        if label != "-":
            examples.append(nli_example(f"{path}:{n}", premise, hypothesis, label, "MultiNLI gold_label"))
    return some(examples, path, "examples with a gold label (empty split)")


def read_ner(path, lang=None, raw=False):
    """PAN-X `token<TAB>tag` (XTREME's `panx/{split}-{lang}.tsv`), blank lines ending sentences -> [(words, tags)]; raw
    PAN-X (every token `xx:...`) is refused: the prefix would tell every English word from every French one. `raw`
    (read_panx): Rahimi et al. 2019's files (`panx_dataset/{lang}/{split}`), `lang:token<TAB>tag`, `lang:` stripped."""
    sentences, words, tags = [], [], []
    lines = itertools.chain(enumerate(read_lines(path), 1), [(0, "")])  # a last blank line ends the last sentence
    for n, line in lines:
        if not line.strip():
            sentences += [(words, tags)] if words else []
            words, tags = [], []
            continue
        fields = line.split("\t")
        prefix, colon, word = fields[0].partition(":") if raw else (lang, ":", fields[0])
        if len(fields) != 2 or not colon or not word or not fields[1].strip():
            want = "lang:token<TAB>tag (raw PAN-X)" if raw else "token<TAB>tag"
            raise InputError(f"{path}:{n}: expected {want}, got {line!r}")
        if prefix != lang:
            raise InputError(f"{path}:{n}: PAN-X prefix {prefix + ':'!r} is not this file's language {lang!r}")
        words.append(word)
        tags.append(fields[1].strip())
        if tags[-1] != "O" and not re.fullmatch(r"[BI]-\S+", tags[-1]):
            raise InputError(f"{path}:{n}: tag {tags[-1]!r} is not O, B-X or I-X (IOB2)")
    words = [w for ws, _ in some(sentences, path, "sentences (empty split)") for w in ws]
    prefix = None if raw else re.match(r"[a-z]{2,3}:", words[0])
    if prefix and all(w.startswith(prefix[0]) for w in words):
        n = next(n for n, line in enumerate(read_lines(path), 1) if line.strip())  # the first token's line
        raise InputError(f"{path}:{n}: every token starts with {prefix[0]!r}: raw PAN-X, read from "
                         f"panx_dataset/{prefix[0][:-1]}/{{train,dev,test}} (the prefix is stripped there)")
    return sentences


read_panx = functools.partial(read_ner, raw=True)  # panx_dataset/{lang}/{split}


def read_conllu(path, lang=None):
    """CoNLL-U -> per sentence {"words", "heads" (0 = ROOT), "rels"}; each must be a tree (`conll18_ud_eval.py`)."""
    sentences, rows, start = [], [], None
    lines = itertools.chain(enumerate(read_lines(path), 1), [(0, "")])  # a last blank line ends the last sentence
    for n, line in lines:
        if line and not line.strip():  # UD's validator: a pseudo-empty line (else read as a sentence's end)
            raise InputError(f"{path}:{n}: a line of only spaces or tabs (CoNLL-U ends a sentence with an empty line)")
        if line:
            start = start or n
            cols = line.split("\t")
            if line.startswith("#") or len(cols) == 10 and ("-" in cols[0] or "." in cols[0]):
                continue
            if len(cols) != 10:
                raise InputError(f"{path}:{n}: expected 10 tab-separated CoNLL-U columns, got {len(cols)}")
            try:
                wid, head = int(cols[0]), int(cols[6])
            except ValueError:
                raise InputError(f"{path}:{n}: ID {cols[0]!r} / HEAD {cols[6]!r} is not an integer") from None
            if cols[7] in ("", "_"):
                raise InputError(f"{path}:{n}: missing DEPREL")
            rows.append((n, wid, cols[1], head, cols[7]))
            continue
        for k, (m, wid, _, head, _) in enumerate(rows, 1):
            if wid != k:
                raise InputError(f"{path}:{m}: word id {wid} out of sequence (expected {k})")
            if not 0 <= head <= len(rows):
                raise InputError(f"{path}:{m}: head {head} outside 0..{len(rows)}")
        heads = [r[3] for r in rows]
        if rows and heads.count(0) != 1:
            raise InputError(f"{path}:{start}: sentence is not a tree: {heads.count(0)} words on ROOT, expected one")
        if cycle := find_cycle([-1] + heads):
            raise InputError(f"{path}:{start}: sentence is not a tree: words "
                             f"{' -> '.join(map(str, cycle + cycle[:1]))} form a cycle (HEAD)")
        if rows:
            sentences.append({"words": [r[2] for r in rows], "heads": heads, "rels": [r[4] for r in rows]})
        rows, start = [], None
    return some(sentences, path, "sentences (empty split)")


# -----------------------------------------------------------------------------
# Data files: where --data holds each split of each task, and the reader of each file

# --data: where each split is looked for, the first layout with the file wins: (pattern, reader, its splits, the only
# languages it holds or None). {panx_split}: our test split is `heldout-from-dev` (XTREME's PAN-X test is unlabelled)
Layout = collections.namedtuple("Layout", "pattern reader splits langs", defaults=(None,))
LAYOUTS = {
    "xnli": [Layout("xnli/{lang}.{split}.tsv", read_xnli, "train dev test"),  # toydata.py
             Layout("xnli/{split}-{lang}.tsv", read_xnli, "train dev test"),  # our evaluation directory (XTREME names)
             Layout("XNLI-1.0/xnli.{split}.tsv", read_xnli_1_0, "dev test"),  # XNLI 1.0
             Layout("XNLI-MT-1.0/multinli/multinli.train.{lang}.tsv", read_xnli_mt, "train"),  # XNLI-MT 1.0
             Layout("multinli_1.0/multinli_1.0_train.jsonl", read_multinli, "train", "en")],  # MultiNLI 1.0
    "ner": [Layout("ner/{lang}.{split}.tsv", read_ner, "train dev test"),
            Layout("wikiann_panx/{panx_split}-{lang}.tsv", read_ner, "train dev test"),
            Layout("panx_dataset/{lang}/{split}", read_panx, "train dev test"),  # Rahimi et al. 2019, unpacked
            Layout("panx/{split}-{lang}.tsv", read_ner, "train dev test")],  # XTREME
    "parse": [Layout("ud/{lang}.{split}.conllu", read_conllu, "train dev test"),
              Layout("ud/UD_*/{lang}_*-ud-{split}*.conllu", read_conllu, "train dev test"),
              Layout("ud-treebanks-v2.3/UD_*/{lang}_*-ud-{split}.conllu", read_conllu, "train dev test")],  # UD 2.3
}
# the UD treebank of each language in the paper (§3.2); another one of the language: --treebank LANG=NAME
PAPER_TREEBANKS = {"en": "EWT", "fr": "GSD", "ru": "GSD", "zh": "GSD"}


def pick_treebank(hits, lang, treebanks, data_dir):
    """`hits` of one treebank (`UD_Language-NAME`): --treebank's, else the paper's, else the only one."""
    name = lambda p: os.path.basename(os.path.dirname(p)).rpartition("-")[2]  # noqa: E731
    found, want = sorted(set(map(name, hits))), treebanks.get(lang) or PAPER_TREEBANKS.get(lang)
    if want is None and len(found) > 1:
        raise InputError(f"parse: several UD treebanks for {lang} under --data {data_dir}: {', '.join(found)}; "
                         f"pick one with --treebank {lang}=NAME")
    if want not in found and want is not None:
        flag, hint = (f"--treebank {lang}={want}", "") if lang in treebanks else \
            (f"the paper's treebank for {lang}, {want}", f"; pick one with --treebank {lang}=NAME")
        raise InputError(f"parse: {flag}: no such treebank for {lang} under --data {data_dir} (found "
                         f"{', '.join(found)}){hint}")
    return [p for p in hits if want in (None, name(p))]


def resolve_files(task, data_dir, train_lang, eval_langs, train_file=None, treebanks=None, flag="--data"):
    """{"train", "dev": path, "test": {lang: path}} from LAYOUTS under --data (train: --train-file if given);
    `treebanks` {lang: NAME} (--treebank); a missing file names `flag` (the flag given) and the paths searched."""
    def find(lang, split):
        names = dict(lang=lang, split=split, panx_split="heldout-from-dev" if split == "test" else split)
        tried = []
        for layout in (x for x in LAYOUTS[task] if split in x.splits.split()):
            tried.append(layout.pattern.format(**names))
            held = not layout.langs or lang in layout.langs.split()  # MultiNLI: English only
            hits = sorted(glob.glob(tried[-1], root_dir=data_dir)) if held else []
            if "UD_*" in layout.pattern and hits:
                hits = pick_treebank(hits, lang, treebanks or {}, data_dir)
            if hits:
                if lang in (treebanks or {}) and "UD_*" not in layout.pattern:  # --treebank would be ignored
                    raise InputError(f"--treebank {lang}={treebanks[lang]}: the {lang} {split} file under --data "
                                     f"is not in a UD release tree ({hits[0]})")
                return os.path.join(data_dir, hits[0])
        # only a directory with the task's other files lacks just the train file (e.g. no English NLI train set)
        dev_names = dict(lang=train_lang, split="dev", panx_split="dev")
        other = split == "train" and any(glob.glob(layout.pattern.format(**dev_names), root_dir=data_dir)
                                         for layout in LAYOUTS[task])
        hint = "; pass --train-file" if other else f"; is {data_dir} a toydata.py world or a real-data directory?"
        raise InputError(f"{task}: no {lang} {split} file under {flag} {data_dir} (looked for "
                         f"{', '.join(os.path.join(data_dir, t) for t in tried)}){hint}")
    if train_file is not None and not os.path.isfile(train_file):
        raise InputError(f"--train-file {train_file}: not a file")
    if unused := sorted(set(treebanks or {}) - {train_lang, *eval_langs}):
        raise InputError(f"--treebank: {', '.join(unused)} is not the train language or one of --eval-langs")
    return {"train": train_file or find(train_lang, "train"), "dev": find(train_lang, "dev"),
            "test": {lang: find(lang, "test") for lang in eval_langs}}


def read_split(task, path, lang):
    """A file's examples by its layout's reader (a --train-file of another name: XNLI-MT, MultiNLI, or the first)."""
    parts = os.path.normpath(path).split(os.sep)
    for layout in LAYOUTS[task]:
        pattern = layout.pattern.format(lang="*", split="*", panx_split="*").split("/")
        if len(parts) >= len(pattern) and all(map(fnmatch.fnmatchcase, parts[-len(pattern):], pattern)):
            reader = layout.reader
            break
    else:  # a --train-file of no known layout
        name, xnli = os.path.basename(path), task == "xnli"
        reader = (read_xnli_mt if xnli and fnmatch.fnmatchcase(name, "multinli.train.*.tsv") else
                  read_multinli if xnli and name.endswith(".jsonl") else LAYOUTS[task][0].reader)
    return reader(path, lang)


# -----------------------------------------------------------------------------
# CLI: the flags, the checkpoints, main(argv): every flag and file checked, then each task's grid

def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " Unset grid flags take the paper's "
                                "values (the toy presets with --toy).", formatter_class=bpe.HelpFormatter)
    add, floats = p.add_argument, number(0, cast=float, many=True, above=True)  # a learning rate of 0 trains nothing
    add("--task", choices=sorted(TASKS), help="the task (default: all three with --toy, else required)")
    add("--ckpt", help="pretrain.py's best.pt, or a released XLM .pth with --xlm-codes; required")
    add("--xlm-codes", metavar="CODES", help="fastBPE codes of an XLM .pth as --ckpt/--target-ckpt (default: none)")
    add("--data", metavar="DIR", help="the toy world, or the downloads unpacked side by side (README); required")
    add("--toy", nargs="?", const=True, default=False, metavar="DIR", help="the toy presets (--data: the toy world); "
        "all three tasks unless --task. The old spelling --toy DIR (= --toy --data DIR) is deprecated")
    add("--train-lang", default="en", help="the language fine-tuned on; its dev set selects")
    add("--eval-langs", help="comma list of target languages (default: the checkpoint's other languages)")
    add("--train-file", help="the English train file (default: --data's; XNLI-MT, MultiNLI by their names)")
    add("--treebank", metavar="LANG=NAME,...", help="UD: another treebank than the paper's (default: en=EWT, fr=GSD, "
        "ru=GSD, zh=GSD), e.g. fr=FTB for UD_French-FTB")
    add("--epochs", type=number(1), help="epochs per set (default: paper 10 NER/parsing, 200 XNLI; --toy 4, 10)")
    add("--epoch-size", type=number(0), help="examples per epoch, 0 = one pass (default: 0; paper's XNLI 20000)")
    add("--batch-size", dest="one_batch_size", type=number(1, many=True), metavar="N",
        help="examples per step: one value (default: the grid of --batch-sizes)")
    add("--batch-sizes", dest="batch_size", type=number(1, many=True), metavar="N,...",
        help="grid of examples per step (default: paper 16,32, XNLI 4,8; --toy 16)")
    add("--lr", dest="one_lr", type=floats, metavar="LR", help="encoder learning rate: one value (default: --lrs)")
    add("--lrs", dest="lr", type=floats, metavar="LR,...", help="grid of encoder learning rates (default: paper "
        "2e-5,3e-5,5e-5, XNLI 1.25e-6,2.5e-6,5e-6; --toy 3e-4,1e-3, XNLI 2e-4,5e-4)")
    add("--head-lr", dest="one_head_lr", type=floats, metavar="LR", help="XNLI head lr: one (default: --head-lrs)")
    add("--head-lrs", dest="head_lr", type=floats, metavar="LR,...", help="grid of XNLI classifier learning rates "
        "(default: paper 5e-6,2.5e-5,1.25e-4; --toy 1e-3)")
    add("--max-len", type=number(2), help="NER/parsing: subwords per window (default: 128, at most positions - 2)")
    add("--head-dropout", type=number(0, 1, float), default=0.1, help="dropout before the XNLI/NER head")
    add("--clip", type=number(0, cast=float), default=5.0, help="gradient norm clipping, 0 = off")
    add("--seed", type=number(0, 2 ** 32), default=0, help="seed of every set: head init, data order")
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N, mps")
    add("--dtype", default="auto", choices=("auto",) + DTYPES, help="autocast as in pretrain.py (no float16)")
    add("--threads", type=number(0, 1025), help="CPU threads, 0 = torch's choice (default: 1 with --toy, else 0)")
    add("--align-layer", type=number(0), metavar="I", help="§5.1.2: freeze --ckpt's layers 0..I, add 4 (default: off)")
    add("--target-ckpt", help="§5.1.2: the target's own model, layer I mapped by --align-maps (with --align-layer)")
    add("--align-maps", help="§5.1.2: align.py contextual --save-maps .npz (with --align-layer)")
    add("--out", metavar="DIR", help="results.json and sets/ (a folder per task when several run); required. The "
        "same command again resumes: the finished sets are kept, the set in progress starts again from epoch 1")
    add("--overwrite", action="store_true", help="replace the results and sets of another run in --out")
    add("--allow-overlap", action="store_true", help="accept a train file holding most of the dev or a test set "
        "(default: refused: the epoch and the sets would be chosen, or scored, on training data)")
    add("--table", nargs="+", metavar="OUT_DIR", help="only print Table 1 of dirs NAME[-sSEED][-stepN] (default: off)")
    add("--plot", metavar="FILE.png", help="with --table over -stepN dirs: the learning curves too (needs matplotlib)")
    add("--with-stalled", action="store_true", help="with --table: the seeds whose MLM stalled count in the means too")
    return p


def checked(call, *args, prefix=""):  # call(*args), its ValueError an InputError starting with `prefix`
    try:
        return call(*args)
    except ValueError as e:
        raise InputError(prefix + str(e)) from None


def old_spellings(args):
    """--toy DIR -> --toy --data DIR; --batch-size / --lr / --head-lr with a comma list -> the grid flags."""
    args.data_flag = bpe.toy_data(args)  # the flag that gave the data directory, named in messages
    for k, flag in (("batch_size", "--batch-size"), ("lr", "--lr"), ("head_lr", "--head-lr")):
        if (one := vars(args).pop("one_" + k)) is not None:
            if getattr(args, k) is not None:
                raise InputError(f"{flag} and {flag}s: give one of them")
            if len(one) > 1:
                bpe.deprecated(f"{flag} with a comma list", f"{flag}s {','.join(map(str, one))}")
            setattr(args, k, one)


def load_ckpt(path, flag, device, xlm_codes=None):
    """(model, tokenizer, languages, other entries) of pretrain.py's best.pt or XLM's .pth (--xlm-codes); `flag`."""
    try:
        model, extra = load_model(path, device)
        return (model, *bpe.checkpoint_tokenizer(extra, path, xlm_codes), extra)
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise InputError(f"{flag}: {e}") from None


def lang_index(langs, code, ckpt, flag):  # bpe.checkpoint_lang: a language the checkpoint lacks names `flag`
    return bpe.checkpoint_lang(langs, code, f"{flag} {code}:", f" ({ckpt})")


def maps_origin(args):
    """--align-maps must be fitted on --ckpt and --target-ckpt, by the digests align.py records (or a note if none)."""
    with np.load(args.align_maps) as z:  # setup_aligned read it already
        sides = {str(z[s]): str(z[f"{s}_ckpt_digest"]) for s in ("src", "tgt") if f"{s}_ckpt_digest" in z.files}
    if not sides:
        print(f"note: --align-maps {args.align_maps} records no checkpoint digests (an older align.py): unchecked")
    for lang, flag, path in ((args.train_lang, "--ckpt", args.ckpt), (args.eval_langs[0], "--target-ckpt",
                                                                         args.target_ckpt)):
        if lang in sides and sides[lang] != digest(path):
            raise InputError(f"--align-maps {args.align_maps}: its {lang} side was fitted on the checkpoint "
                             f"{sides[lang]}, not on {flag} {path} ({digest(path)}); fit them on these models")


def prepare_task(task_name, files, model, routes, args):
    """Read and featurise every file of one task before any training -> (task, data); routes: code -> (tok, lang)."""
    try:
        train, dev = (read_split(task_name, files[s], args.train_lang) for s in ("train", "dev"))
        task = TASKS[task_name](train, args.max_len)
        tests = {code: read_split(task_name, path, code) for code, path in files["test"].items()}
    except (ValueError, OSError) as e:  # a reader's InputError, a file that is not UTF-8 or cannot be read
        raise InputError(str(e)) from None
    seen = set(map(repr, train))
    print(f"{task_name}: {args.train_lang} train {len(train)} from {files['train']}")
    for what, path, ex in [(f"{args.train_lang} dev", files["dev"], dev)] + [(f"{c} test", files["test"][c], tests[c])
                                                                            for c in tests]:
        if 2 * (shared := sum(repr(e) in seen for e in ex)) > len(ex) and not args.allow_overlap:
            raise InputError(f"{task_name}: the train file {files['train']} holds {shared} of the {len(ex)} examples "
                             f"of the {what} file {path}: scores on training data (--allow-overlap if meant)")
        if len(ex) < 2:
            raise InputError(f"{task_name}: {path}: one example; a score on one example is not a result")
        if unseen := sorted(set(task.label_set(ex)) - set(task.labels)):  # never predicted: scored as errors
            print(f"{task_name}: {path}: labels never seen in the English train set: {', '.join(unseen)}")
        print(f"{task_name}: {what} {len(ex)} from {path}")
    if max(args.batch_size) > (n_per_epoch := args.epoch_size or len(train)):
        raise InputError(f"--batch-size {max(args.batch_size)} is more than the {n_per_epoch} {task_name} training "
                         f"examples of an epoch ({files['train']}): every update would be the whole epoch")
    featurize = lambda ex, code: task.featurize(ex, routes[code][0], code, model.config.max_positions)  # noqa: E731
    data = {"lang_id": routes[args.train_lang][1], "train": (train, featurize(train, args.train_lang)),
            "dev": (dev, featurize(dev, args.train_lang)),
            "test": {code: (ex, featurize(ex, code), routes[code][1]) for code, ex in tests.items()}}
    return task, data


def run_task(task, data, files, args, out, job, done, model, pretrain):
    """§3.2: each set of the grid (to OUT/sets/, or from `done`), the mean of the best two (to OUT/results.json)."""
    os.makedirs(os.path.join(out, "sets"), exist_ok=True)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hps, records, took = grid(task.name, args), [], []
    for i, hp in enumerate(hps, 1):
        path = os.path.join(out, "sets", hp_text(hp).replace(" ", "-") + ".json")  # bs-16-lr-0.001.json
        what = f"{task.name}: hyper-parameter set {i}/{len(hps)}"
        if path in done:
            print(f"{what}: {hp_text(hp)}: finished in an earlier run ({path})")
            records.append(done[path])
            continue
        print(f"{what}: {hp_text(hp)}")
        t0 = time.time()
        try:
            rec = finetune_one(task, model, init_state, data, hp, args)
        except FloatingPointError as e:  # a NaN/inf loss
            print(f"{what} stopped: {e}; it is left out of the selection")
            rec = {**hp, "failed": str(e)}
        write_json(path, {"job": job, "record": rec})
        records.append(rec)
        took.append(time.time() - t0)
        left = (len(hps) - i) * sum(took) / len(took)
        print(f"{what} took {took[-1]:.0f} s" + f"; about {left / 60:.0f} min left for {task.name}'s grid" * (left > 0))
    model.load_state_dict(init_state)
    finished = [i for i, r in enumerate(records) if "failed" not in r]
    if not finished:
        raise InputError(f"{task.name}: every hyper-parameter set diverged (non-finite loss); try a lower --lr")
    top, dev, test = mean_of_best_two([records[i] for i in finished], task.metric)
    path, best_two = os.path.join(out, "results.json"), [finished[i] for i in top]
    write_json(path, {"task": task.name, "metric": task.metric, "files": files, "labels": task.labels,
                      "best_two": best_two, "dev": dev, "test": test, "configs": records, "job": job,
                      "args": vars(args), "pretrain": pretrain})
    picked = "; ".join(f"{hp_text(records[i])} (epoch {records[i]['best_epoch']})" for i in best_two)
    chosen = "the one hyper-parameter set" if len(finished) == 1 else \
        f"mean of the best two of {len(finished)} hyper-parameter sets by en dev"
    print(f"\n{task.name}: {chosen}: {picked}"
          + (f" ({len(records) - len(finished)} diverged set(s) left out)" if len(finished) < len(records) else ""))
    cols, rows = sorted(dev, key=lambda k: k != task.metric), [(args.train_lang, "dev", dev)]
    rows += [(code, "test", test[code]) for code in test]  # the selection metric first, then the others
    print(format_rows(["lang", "split"] + cols, [[c, split] + [f"{100 * s[k]:.2f}" for k in cols]
                                                 for c, split, s in rows]))
    print(chance_level(task, data) + f"\nwrote {path}")


def chance_level(task, data):
    """A guess's score: XNLI, the majority label's share of each split (33.3 if balanced); span F1 and LAS, about 0."""
    if task.name != "xnli":
        return f"chance: {task.metric} of a guess is about 0"
    splits = [("dev", data["dev"][0])] + [(f"{code} test", ex) for code, (ex, _, _) in data["test"].items()]
    return "chance (always the majority label): " + ", ".join(
        f"{what} {100 * max(collections.Counter(lab for *_, lab in ex).values()) / len(ex):.1f}" for what, ex in splits)


def _main(args):
    for k, why in (("plot", "it draws the curves of -stepN dirs"), ("with_stalled", "it counts stalled seeds")):
        if vars(args)[k] and not args.table:
            raise InputError(f"--{k.replace('_', '-')} goes with --table ({why})")
    if args.table and (unused := [a.option_strings[0] for a in build_parser()._actions if a.dest not in
                                  ("table", "plot", "with_stalled") and getattr(args, a.dest, a.default) != a.default]):
        raise InputError(f"--table only reads finished runs: {', '.join(unused)} would change nothing")
    old_spellings(args)
    check_plot(args.plot) if args.plot else None
    if args.table:
        print(results_table(args.table, args.with_stalled))
        return plot_curves(args.plot, args.table) if args.plot else None

    # every flag, checkpoint and data file is checked before any training; a mistake is one line
    if not (args.ckpt and args.out):
        raise InputError("--ckpt and --out are required (or --table)")
    if args.xlm_codes and not os.path.isfile(args.xlm_codes):
        raise InputError(f"--xlm-codes {args.xlm_codes}: no such file")
    if args.dtype == "float16":
        raise InputError("--dtype float16: fine-tuning has no GradScaler; use --dtype bfloat16 or float32")
    args.device, dtype, _ = pick_device(args.device, args.dtype)
    args.bf16 = dtype == "bfloat16"  # (auto on a GPU without bfloat16: float32)
    if not (args.align_layer is not None) == bool(args.target_ckpt) == bool(args.align_maps):
        raise InputError("--align-layer, --target-ckpt and --align-maps go together (aligned transfer, §5.1.2)")
    if not args.data:
        raise InputError("--data DIR is required" + " (the toy world, e.g. runs/toy/toy)" * bool(args.toy))
    if not os.path.isdir(args.data):
        raise InputError(f"{args.data_flag} {args.data}: no such directory")
    tasks = [args.task] if args.task else list(TASKS) if args.toy else []
    if not tasks:
        raise InputError("--task is required (only --toy runs all three)")
    pairs = [item.strip().partition("=")[::2] for item in args.treebank.split(",")] if args.treebank is not None else []
    treebanks = {lang: name.strip() for lang, name in pairs}  # --treebank fr=FTB -> {"fr": "FTB"}
    if not all(lang and name for lang, name in pairs) or len(treebanks) < len(pairs):
        raise InputError(f"--treebank {args.treebank}: expected LANG=NAME,... (each language once), e.g. fr=FTB")
    if treebanks and "parse" not in tasks:
        raise InputError("--treebank picks UD treebanks: it needs --task parse")
    if args.head_lr is not None and not any(TASKS[t].own_head_lr for t in tasks):
        raise InputError(f"--head-lr(s) is the XNLI classifier's learning rate: --task {tasks[0]} has no such grid")
    args.threads = (1 if args.toy else 0) if args.threads is None else args.threads
    torch.set_num_threads(args.threads) if args.threads else None
    model, tok, langs, extra = load_ckpt(args.ckpt, "--ckpt", args.device, args.xlm_codes)
    given = args.eval_langs or ",".join(lang for lang in langs if lang != args.train_lang)  # default: the others
    args.eval_langs = [x.strip() for x in given.split(",") if x.strip()]
    if not args.eval_langs or len(set(args.eval_langs)) < len(args.eval_langs):
        raise InputError(f"--eval-langs {given}: a language is given twice" if args.eval_langs else
                         f"--eval-langs {given!r}: no target language ({args.ckpt}: {langs})")
    most = max(2, model.config.max_positions - 2)  # <s> and </s> around each window
    if (args.max_len or 0) > most:
        raise InputError(f"--max-len {args.max_len}: the checkpoint has {model.config.max_positions} positions, a "
                         f"window at most {most} subwords")
    args.max_len = min(args.max_len or 128, most)
    if args.align_layer is not None:
        model, routes = setup_aligned(model, tok, langs, args)
        maps_origin(args)
    else:
        routes = {c: (tok, lang_index(langs, c, args.ckpt, "--eval-langs" if i else "--train-lang"))
                  for i, c in enumerate([args.train_lang] + args.eval_langs)}
    bpe.make_dir("--out", args.out)
    plans = []
    for name in tasks:  # every file of every task is read before the first set trains
        preset = TASKS[name].toy if args.toy else TASKS[name].paper  # the values of the grid flags left unset
        task_args = argparse.Namespace(**{**vars(args), **{k: v for k, v in preset.items() if vars(args)[k] is None}})
        files = resolve_files(name, args.data, args.train_lang, args.eval_langs, args.train_file,
                              treebanks if name == "parse" else None, args.data_flag)
        out = os.path.join(args.out, name) if len(tasks) > 1 else args.out
        job, done = earlier_sets(name, files, task_args, out)
        plans.append((*prepare_task(name, files, model, routes, task_args), files, task_args, out, job, done))
    for *_, out, _, _ in plans if args.overwrite else []:  # every task's earlier files, once every check passed
        for f in glob.glob(os.path.join(out, "sets", "*")) + glob.glob(os.path.join(out, "results.json")):
            os.remove(f)
    for plan in plans:  # what --table reads of the checkpoint: its dev perplexity, and the count models' (stalls)
        run_task(*plan, model, {k: extra.get(k) for k in ("step", "dev_ppl", "count_ppl")})


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill (a job's time limit) as Ctrl-C
    try:
        with bpe.reported(parser):  # a bad flag or input file: one line `error: ...`, exit code 1
            return _main(args)
    except (MemoryError, RuntimeError) as e:
        if not bpe.out_of_memory(e):
            raise
        raise SystemExit("error: out of memory; a smaller --batch-size or --max-len goes in another --out") from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the set in progress is lost, the finished ones are on disk (sets/)
        kept = glob.glob(os.path.join(args.out or "", "**", "sets", "*.json"), recursive=True)
        again = shlex.join(["python", "finetune.py"] + [str(a) for a in (sys.argv[1:] if argv is None else argv)
                                                        if a != "--overwrite"])  # it would remove what was kept
        print(f"finetune.py: interrupted; {len(kept)} finished hyper-parameter set(s) kept in {args.out} (the set in "
              f"progress starts again); to go on, run {again}" if kept else
              "finetune.py: interrupted before any set finished; nothing was kept", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGTERM, before)


# -----------------------------------------------------------------------------
# Resume: each finished set is OUT/sets/*.json, tagged with the run's identity: the same command goes on from them

def write_json(path, obj):  # through bpe.atomic_path: never half a file at `path`; a full disk is one line
    with bpe.write_errors(path), bpe.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)


def read_json(path, flag):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:  # missing, unreadable, not UTF-8, not JSON
        raise InputError(f"{flag}: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


# what a set's result depends on besides the checkpoints and data (not --device, --threads)
JOB_FLAGS = ("train_lang", "batch_size", "lr", "head_lr", "epochs", "epoch_size", "max_len", "head_dropout", "clip",
             "seed", "bf16", "align_layer")
digest = functools.cache(file_digest)  # read once per run: --toy's three tasks share the checkpoints


def earlier_sets(task_name, files, args, out):
    """The run's identity (task, JOB_FLAGS, checkpoint and data contents) and {set file: record} of the sets it
    finished in `out` earlier (the same command resumes); another run's results or sets: refused, naming why."""
    paths = {**{k: vars(args)[k] for k in ("ckpt", "target_ckpt", "align_maps", "xlm_codes")},
             "train file": files["train"], "dev file": files["dev"],
             **{f"{lang} test file": p for lang, p in files["test"].items()}}
    job = {"task": task_name, **{k: digest(p) for k, p in paths.items() if p}, **{k: vars(args)[k] for k in JOB_FLAGS}}
    done = {}
    found = glob.glob(os.path.join(out, "results.json")) + sorted(glob.glob(os.path.join(out, "sets", "*.json")))
    for path in [] if args.overwrite else found:  # --overwrite: _main removes them
        saved = read_json(path, "--out")
        old = saved["job"] if isinstance(saved, dict) and isinstance(saved.get("job"), dict) else {}
        if old != job:
            diff = ", ".join(k for k in sorted(set(old) | set(job)) if old.get(k) != job.get(k))
            raise InputError(f"{path} already exists, from another run (other {diff}); rerun with the same "
                             "flags, pass --overwrite to replace it, or use another --out")
        rec = saved.get("record")
        if path.endswith(os.path.join("sets", os.path.basename(path))) and not good_record(rec, task_name, args):
            raise InputError(f"{path}: not a finished set as finetune.py writes it (edited or damaged); remove "
                             "it to train that set again, or pass --overwrite")
        done[path] = rec
    return job, done


def good_record(rec, task_name, args):
    """A sets/*.json record: the set's hyper-parameters, and a failure or the scores that run_task averages."""
    metric, hps = TASKS[task_name].metric, grid(task_name, args)
    if not isinstance(rec, dict) or {k: rec.get(k) for k in ("batch_size", "lr", "head_lr")} not in hps:
        return False
    test = rec["test"] if isinstance(rec.get("test"), dict) else {}
    scores = [rec.get("dev")] + list(test.values())
    return "failed" in rec or (sorted(test) == sorted(args.eval_langs) and type(rec.get("best_epoch")) is int and all(
        isinstance(s, dict) and metric in s and all(is_score(v) for v in s.values()) for s in scores))


# -----------------------------------------------------------------------------
# --table: Table 1's layout over --out dirs, and --plot: the learning curves over -stepN dirs

def format_rows(header, rows):
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [header] + rows)


def mean_std(v):
    return "-" if not v else f"{np.mean(v):.1f}" + (f" ±{np.std(v):.1f}" if len(v) > 1 else "")


COLUMN_NAMES = {"ppl": "dev ppl", "xnli": "XNLI", "ner": "NER", "parse": "Parse"}  # --table's columns, in order
CHANCE = {"xnli": "XNLI 33.3 (three balanced labels)", "ner": "NER span F1 about 0", "parse": "LAS about 0"}


def is_score(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def table_cells(results, path):
    """A results.json's {(task, lang): test score in %, ("ppl", lang): dev ppl}; another shape is refused."""
    task, metric, pretrain = results["task"], TASKS[results["task"]].metric, results.get("pretrain") or {}
    ppl, count = (pretrain.get("dev_ppl") or {}, pretrain.get("count_ppl")) if isinstance(pretrain, dict) else (None, 0)
    valid = (results.get("metric") == metric and results["test"]
             and all(isinstance(s, dict) and is_score(s.get(metric)) for s in results["test"].values())
             and isinstance(ppl, dict) and all(isinstance(v, (int, float)) and v is not True for v in ppl.values()))
    if not valid:
        raise InputError(f"--table: {path}: not a results.json as finetune.py writes it (a {task} test {metric} or a "
                         "dev perplexity is missing or not a number); run the fine-tuning again")
    first = next(iter(ppl), None)  # the checkpoint's first language (English): its dev ppl against the count model
    left = (count.get(first) if isinstance(count, dict) and isinstance(count.get(first), dict) else {}).get("left")
    return {**{(task, lang): 100 * s[metric] for lang, s in results["test"].items()},
            **{("ppl", lang): v for lang, v in ppl.items()}, "stalled": is_score(left) and ppl[first] > left}


def read_table(run_dirs):
    """--table's dirs NAME[-sSEED][-stepN] (N: pretrain.py --snapshots) -> the columns (("ppl" or task, lang)) and
    {(NAME, N): [table_cells of each seed]}, in order."""
    groups, seen, runs_of = {}, {}, {}
    for d in run_dirs:
        if os.path.realpath(d) in seen:
            raise InputError(f"--table: {d} is given twice (as {seen[os.path.realpath(d)]}); a run counts once")
        seen[os.path.realpath(d)] = d
        name, step = re.fullmatch(r"(.+?)(?:-s\d+)?(?:-step(\d+))?", os.path.basename(os.path.normpath(d))).groups()
        cells, who = {}, set()
        for path in sorted(glob.glob("results.json", root_dir=d) + glob.glob("*/results.json", root_dir=d)):
            results = read_json(os.path.join(d, path), "--table")  # one task's, or one of --toy's three
            if isinstance(results, dict) and results.get("task") in TASKS and isinstance(results.get("test"), dict):
                if any(col[0] == results["task"] for col in cells):  # ./results.json and ./TASK/results.json
                    raise InputError(f"--table: {d} holds two {results['task']} results.json; a seed has one")
                cells.update(table_cells(results, os.path.join(d, path)))
                job = results.get("job") if isinstance(results.get("job"), dict) else {}
                who.add((job.get("ckpt"), job.get("seed")))  # a seed is its checkpoint and fine-tuning seed
        if not cells:
            raise InputError(f"--table: no results.json under {d}")
        if len(ckpts := {c for c, _ in who if c}) > 1:
            raise InputError(f"--table: {d} holds the results of {len(ckpts)} checkpoints; a seed is one model")
        for twin in (runs_of.get((name, step, w)) for w in who if w != (None, None)):
            if twin:
                raise InputError(f"--table: {twin} and {d} hold the same run (the same checkpoint and --seed); "
                                 "it would be counted as two seeds")
        runs_of.update({(name, step, w): d for w in who})
        groups.setdefault((name, step), []).append(cells)
    cols = sorted({c for runs in groups.values() for cells in runs for c in cells if c != "stalled"},
                  key=lambda c: (list(COLUMN_NAMES).index(c[0]), c[1]))
    names = list(dict.fromkeys(name for name, _ in groups))
    return cols, {k: groups[k] for k in sorted(groups, key=lambda k: (names.index(k[0]), int(k[1] or 0)))}


def results_table(run_dirs, with_stalled=False):
    """Table 1: a row per NAME (and N), dev ppl if known, test scores in %, their avg and Δ against the first row (the
    paper's Default), mean ± std over seeds. Seeds whose MLM stalled (English dev ppl above pretrain.py's left-bigram
    count model) are left out of the means unless with_stalled; a cell over fewer seeds than its row's is marked *."""
    cols, groups = read_table(run_dirs)
    scores = [c for c in cols if c[0] != "ppl"]
    steps = any(step for _, step in groups)
    lines, first, notes = [], None, ["chance: " + ", ".join(CHANCE[t] for t in dict.fromkeys(t for t, _ in scores))]
    for (name, step), runs in groups.items():
        stalled = [cells for cells in runs if cells.get("stalled")]
        runs = runs if with_stalled else [cells for cells in runs if not cells.get("stalled")]
        avgs = [np.mean([cells[c] for c in scores]) for cells in runs if all(c in cells for c in scores)]
        first = avgs if first is None else first
        values = [[cells[c] for cells in runs if c in cells] for c in cols] + [avgs]
        delta = f"{np.mean(avgs) - np.mean(first):+.1f}" if avgs and first else "-"
        lines.append([name] + [step or "-"] * steps + [str(len(runs)), str(len(stalled))]
                     + [mean_std(v) + "*" * (0 < len(v) < len(runs)) for v in values] + [delta])
    header = ["model"] + ["updates"] * steps + ["seeds", "stalled"] + [f"{COLUMN_NAMES[t]} {lang}" for t, lang in cols]
    if n_stalled := sum(int(line[len(header) - len(cols) - 1]) for line in lines):
        notes.append(f"{n_stalled} seed(s) whose MLM stalled on the unigram plateau " + (
            "are in the means (--with-stalled)" if with_stalled else "are left out (--with-stalled counts them)"))
    if any("*" in c for line in lines for c in line):
        notes.append("* averaged over fewer seeds than the row's")
    return format_rows(header + ["avg", "Δ"], lines) + "".join("\n" + n for n in notes)


def plot_curves(path, run_dirs):
    """--plot: a panel per column of the table, a line per NAME over N updates (log), mean ± std over seeds."""
    from matplotlib.figure import Figure  # not pyplot: no window, no backend to choose
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    cols, groups = read_table(run_dirs)
    if not any(step for _, step in groups):
        raise InputError("--plot: the --table dirs have no -stepN suffix, so there is no curve")
    fig, steps = Figure(figsize=(3.2 * len(cols), 3.4)), sorted({int(step) for _, step in groups if step})
    for ax, col in zip(fig.subplots(1, len(cols), squeeze=False)[0], cols):
        for name in dict.fromkeys(n for n, _ in groups):
            pts = [(int(step), v) for (n, step), runs in groups.items()
                   if n == name and step and (v := [cells[col] for cells in runs if col in cells])]
            if pts:
                xs, vs = zip(*pts)
                ax.errorbar(xs, [np.mean(v) for v in vs], yerr=[np.std(v) for v in vs], marker="o", ms=3,
                            capsize=2, label=name)
        ax.set(xscale="log", yscale="log" if col[0] == "ppl" else "linear", xlabel="updates",
               title=f"{COLUMN_NAMES[col[0]]} {col[1]}" + (" (test, %)" * (col[0] != "ppl")))
        ax.set_xticks(steps, [str(x) for x in steps], rotation=45, fontsize=8)
        ax.xaxis.set_minor_formatter(NullFormatter())
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter) if col[0] == "ppl" else ():
            axis(ScalarFormatter())
        ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    with bpe.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
