"""Zero-shot cross-lingual transfer, the measure of the paper (Conneau et al. 2020, §3.2, Table 1).

Fine-tune a pretrained encoder on English only, choose the epoch and the hyper-parameters on English
dev, and score the same weights on each target language's test set: XNLI (XLM's `</s> premise </s>
hypothesis </s>`, a linear head at position 0, accuracy), NER (WikiAnn / PAN-X: a linear tagger on
first subwords, span F1 after the paper's BIO repair), UD parsing (Dozat & Manning's biaffine
parser, one-root MST, UAS/LAS as `conll18_ud_eval.py`). --align-layer runs §5.1.2 (Figure 5):
English layers 0..i frozen, 4 new layers trained on top, a target model's layer i mapped into them.

    python finetune.py --toy --data runs/toy/toy --ckpt runs/toy/best.pt --out runs/toy/ft
    python finetune.py --task ner --ckpt RUN/best.pt --data DATA --eval-langs fr --out runs/ner
    python finetune.py --table runs/ft/default-s{0,1} runs/ft/sep-emb-s0    (Table 1's layout)
"""
import argparse
import collections
import fnmatch
import functools
import glob
import hashlib
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
from model import (DTYPES, AlignedEncoder, autocast, check_plot, encode_batch, encode_states,
                   file_digest, load_encoder, load_model, pick_device, stall_note)


# -----------------------------------------------------------------------------
# Shared encoding: subwords as XLM feeds them (`</s> ids </s>`, windows for long sentences)

def first_subwords(tok, words, lang):
    """Subword ids of a word list and where each word starts; an empty word is <unk> (XTREME)."""
    ids = []
    first = []
    for piece in tok.encode_words(words, lang):
        first.append(len(ids))
        ids.extend(piece or [UNK_ID])
    return ids, first


def word_states(model, seqs, firsts, lang, max_len, with_root):
    """States at each word's first subword (ROOT, the leading </s>, first) -> (B, W, d), mask."""
    states = encode_states(model, seqs, lang, max_len)
    pos = [torch.tensor([0] * with_root + [1 + k for k in f], dtype=torch.long) for f in firsts]
    # (B, W), -1: no word
    pos = nn.utils.rnn.pad_sequence(pos, batch_first=True, padding_value=-1).to(states.device)
    index = pos.clamp(min=0)[..., None].expand(-1, -1, states.size(-1))
    return states.gather(1, index), pos >= 0


# -----------------------------------------------------------------------------
# A task: what each of the three sections below defines for the protocol

def warmup_linear(step, total, warmup=0.1):
    """LR factor: linear warm-up over 10 % of the updates, then linear decay to 0 (crosslingual)."""
    n_warm = max(1, int(warmup * total))
    if step < n_warm:
        return step / n_warm
    return max(0.0, (total - step) / max(1, total - n_warm))


class Task:
    """What the §3.2 protocol asks of a task: `labels` from English train, a `metric` for dev,
    featurize, run (the loss or the predictions), score, grid presets `paper` and `toy`, optimisers.
    NER and parsing encode a long sentence in windows of `max_len` subwords (XNLI cuts a pair)."""
    own_head_lr = False  # the head's own lr: a third grid axis (XNLI)

    def __init__(self, train_examples, max_len=128):
        self.labels = self.label_set(train_examples)
        self.max_len = max_len

    def head(self, d, dropout):  # XNLI, NER (the parser has its own)
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(d, len(self.labels)))

    def optimizers(self, params, head, hp, total_steps):
        """NER, parsing: one Adam over encoder and head, warmup_linear (crosslingual-nlp)."""
        opt = torch.optim.Adam(params + list(head.parameters()), lr=hp["lr"])
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_linear(s, total_steps))
        return [opt], [schedule]


# -----------------------------------------------------------------------------
# XNLI (§3.2): `</s> premise </s> hypothesis </s>`, a linear head at position 0, accuracy

# ids 0, 1, 2 as XLM's xnli.py (toydata.LABELS has another order: labels are matched by name)
XNLI_LABELS = ("contradiction", "neutral", "entailment")


class XNLITask(Task):
    """Dropout + Linear(d, 3) at position 0 (the first </s>); the head's lr a grid axis (XLM)."""
    name = "xnli"
    metric = "acc"
    own_head_lr = True
    # §3.2's grid; an epoch is 20000 pairs, XLM's --epoch_size
    paper = dict(epochs=200, epoch_size=20000, batch_size=[4, 8], lr=[1.25e-6, 2.5e-6, 5e-6],
                 head_lr=[5e-6, 2.5e-5, 1.25e-4])
    # --toy: tiny, larger learning rates
    toy = dict(epochs=10, epoch_size=0, batch_size=[16], lr=[2e-4, 5e-4], head_lr=[1e-3])

    def optimizers(self, params, head, hp, total_steps):
        """XLM: an Adam for the encoder, one for the classifier, at fixed learning rates."""
        encoder_opt = torch.optim.Adam(params, lr=hp["lr"])
        return [encoder_opt, torch.optim.Adam(head.parameters(), lr=hp["head_lr"])], []

    def label_set(self, train_examples):
        return list(XNLI_LABELS)  # XLM's fixed ids

    def featurize(self, examples, tok, lang, max_positions):
        """XLM's `</s> premise </s> hypothesis </s>`, the longer side cut to fit (XLM: to 256)."""
        feats = []
        for premise, hypothesis, label in examples:
            a = tok.encode(premise, lang)
            b = tok.encode(hypothesis, lang)
            while len(a) + len(b) > max_positions - 3:
                if len(a) >= len(b):
                    a = a[:-1]
                else:
                    b = b[:-1]
            feats.append(([EOS_ID] + a + [EOS_ID] + b + [EOS_ID], self.labels.index(label)))
        return feats

    def run(self, model, head, batch, lang, predict=False):
        states = encode_batch(model, [ids for ids, _ in batch], lang)[0][-1]
        logits = head(states[:, 0])
        if predict:
            return logits.argmax(-1).tolist()
        labels = torch.tensor([y for _, y in batch], device=logits.device)
        return F.cross_entropy(logits.float(), labels)

    def score(self, examples, preds):
        right = sum(self.labels[p] == label for (_, _, label), p in zip(examples, preds))
        return {"acc": right / len(examples)}


# -----------------------------------------------------------------------------
# NER (§3.2): the paper's BIO repair, micro span F1, a linear tagger on first subwords

def repair_bio(tags):
    """The paper's repair heuristic (§3.2, from Wu & Dredze 2019), left to right: a standalone `I-X`
    (at the start, after O) becomes `B-X`; a run whose type changes, `B-X I-Y I-Z`, takes its last
    type: `B-Z I-Z I-Z`. The result is valid IOB2.
    ["I-PER", "O", "B-LOC", "I-ORG", "I-PER"] -> ["B-PER", "O", "B-PER", "I-PER", "I-PER"]"""
    out = list(tags)
    start = None  # the open run's first index
    cur = None  # and its type
    for t, tag in enumerate(out):
        if tag == "O":
            start = None
            cur = None
        elif tag[:2] == "B-" and len(tag) > 2:
            start = t
            cur = tag[2:]
        elif tag[:2] == "I-" and len(tag) > 2:
            if start is None:  # standalone I-X -> B-X
                out[t] = "B-" + tag[2:]
                start = t
                cur = tag[2:]
            elif tag[2:] != cur:  # a type change: the whole run so far takes it
                cur = tag[2:]
                out[start:t] = ["B-" + cur] + ["I-" + cur] * (t - start - 1)
        else:
            raise ValueError(f"tag {tag!r} at position {t} is not O, B-X or I-X")
    return out


def bio_spans(tags):
    """Typed spans {(type, start, end)} of a VALID IOB2 sequence (repair_bio first).
    ["B-PER", "I-PER", "O", "B-LOC"] -> {("PER", 0, 2), ("LOC", 3, 4)}"""
    spans = set()
    start = None
    cur = None
    for t, tag in enumerate(list(tags) + ["O"]):
        if cur is not None and tag != "I-" + cur:
            spans.add((cur, start, t))
            cur = None
        if tag != "O" and cur is None:
            start = t
            cur = tag[2:]
    return spans


PRF = collections.namedtuple("PRF", "precision recall f1")


def span_f1(gold, pred):
    """Micro P, R, F1 over the typed spans (type, start, end) of both sides repaired."""
    tp = 0
    n_gold = 0
    n_pred = 0
    for k, (g, p) in enumerate(zip(gold, pred, strict=True)):  # strict: one missing raises
        if len(g) != len(p):
            raise ValueError(f"span_f1: sentence {k} has {len(g)} gold tags but {len(p)} predicted")
        G = bio_spans(repair_bio(g))
        P = bio_spans(repair_bio(p))
        tp += len(G & P)
        n_gold += len(G)
        n_pred += len(P)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    return PRF(precision, recall, 2 * precision * recall / (precision + recall) if tp else 0.0)


class NERTask(Task):
    """BIO tagging: dropout + Linear(d, n_tags) on each word's first subword; span F1."""
    name = "ner"
    metric = "f1"
    # §3.2's grid; an epoch is one pass over train
    paper = dict(epochs=10, epoch_size=0, batch_size=[16, 32], lr=[2e-5, 3e-5, 5e-5],
                 head_lr=[None])
    # --toy: larger learning rates for a tiny model; two sets, so the best two are both
    toy = dict(epochs=4, epoch_size=0, batch_size=[16], lr=[3e-4, 1e-3], head_lr=[None])

    def label_set(self, train_examples):
        return ["O"] + sorted({t for _, ts in train_examples for t in ts} - {"O"})

    def featurize(self, examples, tok, lang, max_positions):
        """(subword ids, first subwords, tag ids); a tag unseen in train is -1 (dev, test)."""
        ids = {t: i for i, t in enumerate(self.labels)}
        return [first_subwords(tok, words, lang) + ([ids.get(t, -1) for t in tags],)
                for words, tags in examples]

    def run(self, model, head, batch, lang, predict=False):
        seqs, firsts, tags = zip(*batch)
        h, mask = word_states(model, seqs, firsts, lang, self.max_len, False)
        if predict:
            best = head(h).argmax(-1).tolist()
            return [[self.labels[k] for k in best[b][:len(f)]] for b, f in enumerate(firsts)]
        # in the order of h[mask]
        y = torch.tensor([t for ts in tags for t in ts], device=mask.device)
        return F.cross_entropy(head(h)[mask].float(), y)

    def score(self, examples, preds):
        return span_f1([tags for _, tags in examples], preds)._asdict()


# -----------------------------------------------------------------------------
# UD parsing (§3.2): biaffine scorer (Dozat & Manning), one-root MST decoding, UAS/LAS (CoNLL 2018)

def find_cycle(heads):
    """The first cycle (list of nodes) of a head array with heads[0] = -1, or None."""
    state = [2] + [0] * (len(heads) - 1)  # 0 unseen, 1 on the current path, 2 done
    for s in range(1, len(heads)):
        path = []
        v = s
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


Attachment = collections.namedtuple("Attachment", "uas las")


def attachment_scores(gold_heads, gold_rels, pred_heads, pred_rels):
    """(UAS, LAS) over all words, punctuation too, deprels without subtypes (conll18_ud_eval)."""
    n = 0
    uas = 0
    las = 0
    sentences = zip(gold_heads, gold_rels, pred_heads, pred_rels, strict=True)  # unequal: raise
    for gh, gr, ph, pr in sentences:
        for gold_head, gold_rel, head, rel in zip(gh, gr, ph, pr, strict=True):
            n += 1
            uas += gold_head == head
            las += gold_head == head and strip_subtype(gold_rel) == strip_subtype(rel)
    if not n:
        return Attachment(0.0, 0.0)
    return Attachment(uas / n, las / n)


def chu_liu_edmonds(S):
    """Maximum spanning arborescence rooted at 0; S[d, h] = score of the arc h -> d, -inf =
    forbidden (row 0 and the diagonal are: mst_decode sets them, contraction keeps them). Every node
    takes its best head; a cycle C becomes one node c (into c from h: max over v in C of S[v, h] -
    S[v, head(v)]; out to d: max over u in C of S[d, u]), solved by recursion, then expanded."""
    n = len(S)
    heads = S.argmax(1)
    heads[0] = -1
    cycle = find_cycle(heads)
    if cycle is None:
        return heads
    C = np.array(cycle)
    rest = np.flatnonzero(~np.isin(np.arange(n), cycle))  # includes 0
    m = len(rest)
    S2 = np.full((m + 1, m + 1), -np.inf)
    S2[:m, :m] = S[np.ix_(rest, rest)]
    gain = S[np.ix_(C, rest)] - S[C, heads[C]][:, None]  # (|C|, m): enter at v from h
    enter = gain.argmax(0)
    S2[m, :m] = gain.max(0)
    out_of_cycle = S[np.ix_(rest, C)]  # leave it from u to d
    leave = out_of_cycle.argmax(1)
    S2[:m, m] = out_of_cycle.max(1)
    heads2 = chu_liu_edmonds(S2)
    for i in range(1, m):
        heads[rest[i]] = C[leave[i]] if heads2[i] == m else rest[heads2[i]]
    heads[C[enter[heads2[m]]]] = rest[heads2[m]]  # the one cycle arc broken
    return heads


def mst_decode(scores):
    """The best tree with ONE word on ROOT; scores[d, h] (n+1, n+1), 0 = ROOT -> heads of 0..n,
    heads[0] = -1. One Chu-Liu-Edmonds run: every ROOT arc loses a constant M larger than the whole
    score range, so one root arc beats two and the order among one-root trees is unchanged."""
    S = np.array(scores, dtype=np.float64)
    finite = S[np.isfinite(S)]
    M = (finite.max() - finite.min() + 1.0) * len(S) if finite.size else 1.0
    S[:, 0] -= M
    S[0, :] = -np.inf
    np.fill_diagonal(S, -np.inf)
    return chu_liu_edmonds(S)


# Dozat & Manning 2017's sizes (the paper's parser)
ARC_MLP, REL_MLP, MLP_DROPOUT, LEAKY_SLOPE = 500, 100, 0.33, 0.1


class Biaffine(nn.Module):
    """s[b, x, y, o] = [x ; 1]^T W_o [y ; 1] (B, T, T, n_out), the bias column on y optional."""

    def __init__(self, n_in, n_out, bias_y):
        super().__init__()
        self.bias_y = bias_y
        # zero init as yzhangcs/parser
        self.weight = nn.Parameter(torch.zeros(n_out, n_in + 1, n_in + bias_y))

    def forward(self, x, y):  # (B, T, n_in) each
        x = torch.cat([x, torch.ones_like(x[..., :1])], -1)
        if self.bias_y:
            y = torch.cat([y, torch.ones_like(y[..., :1])], -1)
        return torch.einsum("bxi,oij,byj->bxyo", x, self.weight, y)


class BiaffineParser(nn.Module):
    """On states h (B, T, d), 0 = ROOT: s_arc[b, i, j] scores head j of word i; s_rel its labels."""

    def __init__(self, d_model, n_rels, arc_mlp=ARC_MLP, rel_mlp=REL_MLP, dropout=MLP_DROPOUT):
        super().__init__()

        def mlp(n):
            return nn.Sequential(nn.Linear(d_model, n), nn.LeakyReLU(LEAKY_SLOPE),
                                 nn.Dropout(dropout))
        self.arc_dep = mlp(arc_mlp)
        self.arc_head = mlp(arc_mlp)
        self.rel_dep = mlp(rel_mlp)
        self.rel_head = mlp(rel_mlp)
        self.arc_attn = Biaffine(arc_mlp, 1, bias_y=False)
        self.rel_attn = Biaffine(rel_mlp, n_rels, bias_y=True)

    def forward(self, h, mask):
        """mask (B, T): True at the candidate heads (ROOT and words); the others score -inf."""
        s_arc = self.arc_attn(self.arc_dep(h), self.arc_head(h)).squeeze(-1)
        s_arc = s_arc.masked_fill(~mask[:, None, :], float("-inf"))
        return s_arc, self.rel_attn(self.rel_dep(h), self.rel_head(h))

    @staticmethod
    def loss(s_arc, s_rel, heads, rels):
        """CE over heads + CE over the label at the GOLD head (yzhangcs/parser); -1: no word."""
        words = heads >= 0
        at_gold = heads[words][:, None, None].expand(-1, 1, s_rel.size(-1))
        s_gold = s_rel[words].gather(1, at_gold).squeeze(1)
        return F.cross_entropy(s_arc[words], heads[words]) + F.cross_entropy(s_gold, rels[words])

    @staticmethod
    def decode(s_arc, s_rel, mask):
        """MST on log-softmax arc scores, the best label at the chosen head -> heads, label ids."""
        logp = s_arc.detach().float().log_softmax(-1).cpu().numpy()
        best_rel = s_rel.detach().argmax(-1).cpu().numpy()
        words = mask[:, 1:].cpu().numpy()
        out_heads = []
        out_rels = []
        for b in range(len(logp)):
            pos = np.concatenate([[0], 1 + np.flatnonzero(words[b])])  # ROOT, then the words
            heads = mst_decode(logp[b][np.ix_(pos, pos)])[1:]  # CoNLL word numbers
            out_heads.append(heads.tolist())
            out_rels.append([int(best_rel[b, i, pos[h]]) for i, h in zip(pos[1:], heads)])
        return out_heads, out_rels


class ParseTask(Task):
    """Biaffine parsing on first subwords, ROOT = the leading </s>; MST decoding; UAS/LAS."""
    name = "parse"
    metric = "las"
    paper = NERTask.paper  # §3.2 gives parsing NER's grid
    toy = NERTask.toy

    def label_set(self, train_examples):
        return sorted({strip_subtype(r) for s in train_examples for r in s["rels"]})

    def head(self, d, dropout):
        return BiaffineParser(d, len(self.labels))

    def featurize(self, examples, tok, lang, max_positions):
        ids = {r: i for i, r in enumerate(self.labels)}
        return [first_subwords(tok, s["words"], lang)
                + (s["heads"], [ids.get(strip_subtype(r), -1) for r in s["rels"]])
                for s in examples]

    def run(self, model, head, batch, lang, predict=False):
        seqs, firsts, *_ = zip(*batch)
        h, mask = word_states(model, seqs, firsts, lang, self.max_len, True)
        s_arc, s_rel = head(h, mask)
        if predict:
            heads, rels = BiaffineParser.decode(s_arc, s_rel, mask)
            return [(h, [self.labels[r] for r in rs]) for h, rs in zip(heads, rels)]
        heads = torch.full(mask.shape, -1)
        rels = torch.full(mask.shape, -1)
        for b, (_, _, hs, rs) in enumerate(batch):
            heads[b, 1:1 + len(hs)] = torch.tensor(hs)
            rels[b, 1:1 + len(rs)] = torch.tensor(rs)
        return BiaffineParser.loss(s_arc.float(), s_rel.float(), heads.to(mask.device),
                                   rels.to(mask.device))

    def score(self, examples, preds):
        gold = [[s["heads"] for s in examples], [s["rels"] for s in examples]]
        return attachment_scores(*gold, *zip(*preds))._asdict()


TASKS = {task.name: task for task in (XNLITask, NERTask, ParseTask)}


# -----------------------------------------------------------------------------
# The zero-shot protocol (§3.2): a grid of hyper-parameter sets, each with its epoch chosen by
# English dev, the mean of the best two sets; language-specific parts frozen

def grid(task_name, args):
    """The hyper-parameter sets in order: batch size x encoder lr (x classifier lr for XNLI)."""
    head_lrs = args.head_lr if TASKS[task_name].own_head_lr else [None]
    return [{"batch_size": b, "lr": lr, "head_lr": head_lr}
            for b in args.batch_size for lr in args.lr for head_lr in head_lrs]


def hp_text(hp):
    text = f"bs {hp['batch_size']} lr {hp['lr']:g}"
    if hp["head_lr"]:
        text += f" head lr {hp['head_lr']:g}"
    return text


def freeze_lang_specific(model):
    """Language-specific parameters (Sep Emb, Sep L1-k; §4.3) stay frozen: a target language is
    tested through ITS own parts and the shared top English tuned. -> the trainable parameters."""
    frozen = {id(p) for lang in range(model.config.n_langs)
              for p in model.lang_specific_parameters(lang)}
    for p in model.parameters():
        p.requires_grad_(id(p) not in frozen)
    return [p for p in model.parameters() if p.requires_grad]


def cpu_copy(module):
    return {k: v.to("cpu", copy=True) for k, v in module.state_dict().items()}


@torch.no_grad()
def evaluate(task, model, head, feats, examples, lang, batch_size=64, dtype="float32"):
    """Scores of one split, in batches of 64 in length order (less padding), under autocast."""
    model.eval()
    head.eval()
    order = sorted(range(len(feats)), key=lambda i: len(feats[i][0]))
    preds = {}
    device = next(model.parameters()).device
    for k in range(0, len(order), batch_size):
        chunk = order[k:k + batch_size]
        with autocast(device, dtype):
            chunk_preds = task.run(model, head, [feats[i] for i in chunk], lang, predict=True)
        preds.update(zip(chunk, chunk_preds))
    return task.score(examples, [preds[i] for i in range(len(feats))])


def finetune_one(task, model, init_state, data, hp, args, log=print):
    """One hyper-parameter set: train on English, keep the epoch with the best dev score, test every
    target with it. data: {"lang_id", "train"/"dev": (examples, feats), "test": {code: (examples,
    feats, lang_id)}}."""
    device = next(model.parameters()).device
    dtype = "bfloat16" if args.bf16 else "float32"
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model.load_state_dict(init_state)
    head = task.head(model.config.dim, args.head_dropout).to(device)
    params = freeze_lang_specific(model)
    train = data["train"][1]
    lang = data["lang_id"]
    dev_ex, dev_feats = data["dev"]
    n_per_epoch = args.epoch_size or len(train)
    steps_per_epoch = math.ceil(n_per_epoch / hp["batch_size"])
    opts, scheds = task.optimizers(params, head, hp, steps_per_epoch * args.epochs)
    # as XLM: an endless shuffled stream cut into epochs, each permutation drawn when reached
    stream = (i for _ in itertools.count() for i in rng.permutation(len(train)))
    best = None
    dev_curve = []
    # on stderr, on a terminal only
    bar = tqdm(total=args.epochs * steps_per_epoch, unit="step", desc=f"{task.name} {hp_text(hp)}",
               leave=False, disable=not sys.stderr.isatty(), mininterval=1)
    for epoch in range(1, args.epochs + 1):
        model.train()
        head.train()
        total_loss = 0.0
        for k in range(0, n_per_epoch, hp["batch_size"]):
            size = min(hp["batch_size"], n_per_epoch - k)
            batch = [train[i] for i in itertools.islice(stream, size)]
            with autocast(device, dtype):
                loss = task.run(model, head, batch, lang)
            if not torch.isfinite(loss):  # diverged: run_task leaves the set out
                bar.close()
                update = f"update {k // hp['batch_size'] + 1} of {steps_per_epoch}"
                raise FloatingPointError(f"non-finite training loss ({loss.item()}) at epoch "
                                         f"{epoch}, {update}; try a lower --lr")
            for opt in opts:
                opt.zero_grad()
            loss.backward()
            if args.clip > 0:
                nn.utils.clip_grad_norm_(params + list(head.parameters()), args.clip)
            for o in opts + scheds:
                o.step()
            total_loss += loss.item() * len(batch)
            bar.update()
        dev = evaluate(task, model, head, dev_feats, dev_ex, lang, dtype=dtype)
        dev_curve.append(dev[task.metric])
        with tqdm.external_write_mode():  # the line above the bar
            log(f"  epoch {epoch}: train loss {total_loss / n_per_epoch:.4f}  "
                f"{args.train_lang} dev {task.metric} {100 * dev[task.metric]:.2f}")
        if best is None or dev[task.metric] > best["dev"][task.metric]:
            best = {"epoch": epoch, "dev": dev, "state": cpu_copy(model), "head": cpu_copy(head)}
    bar.close()
    model.load_state_dict(best["state"])
    head.load_state_dict(best["head"])
    test = {code: evaluate(task, model, head, feats, ex, lang_id, dtype=dtype)
            for code, (ex, feats, lang_id) in data["test"].items()}
    return {**hp, "best_epoch": best["epoch"], "dev_curve": dev_curve, "dev": best["dev"],
            "test": test}


def mean_scores(scores):  # [{name: score}] -> {name: mean}
    return {k: float(np.mean([s[k] for s in scores])) for k in scores[0]}


# the indices of the best two records (one: its own), their mean dev and test scores
BestTwo = collections.namedtuple("BestTwo", "top dev test")


def mean_of_best_two(records, metric):
    """§3.2: "we report the result on average of best two set of hyperparameters": by English dev
    (at each set's chosen epoch), every score of the best two averaged (one set: its own)."""
    # ties: grid order
    top = sorted(range(len(records)), key=lambda i: -records[i]["dev"][metric])[:2]
    test = {lang: mean_scores([records[i]["test"][lang] for i in top])
            for lang in records[top[0]]["test"]}
    return BestTwo(top, mean_scores([records[i]["dev"] for i in top]), test)


def run_task(task, model, data, args, sets_dir, earlier, save):
    """§3.2: every hyper-parameter set of the grid fine-tunes the same pretrained weights, its
    epoch chosen by English dev; the result is the mean of the best two sets by dev (a diverged set
    is left out): {"best_two": their indices, "dev", "test": the mean scores, "configs": every
    set's record}. A set an earlier run finished is earlier[path]; save(path, record) keeps one."""
    init_state = cpu_copy(model)
    hps = grid(task.name, args)

    records = []
    took = []
    for i, hp in enumerate(hps, 1):
        # bs-16-lr-0.001.json
        path = os.path.join(sets_dir, hp_text(hp).replace(" ", "-") + ".json")
        what = f"{task.name}: hyper-parameter set {i}/{len(hps)}"
        if path in earlier:
            print(f"{what}: {hp_text(hp)}: finished in an earlier run ({path})")
            records.append(earlier[path])
            continue
        print(f"{what}: {hp_text(hp)}")
        t0 = time.time()
        try:
            record = finetune_one(task, model, init_state, data, hp, args)
        except FloatingPointError as e:  # a NaN/inf loss
            print(f"{what} stopped: {e}; it is left out of the selection")
            record = {**hp, "failed": str(e)}
        save(path, record)
        records.append(record)
        took.append(time.time() - t0)
        left = (len(hps) - i) * sum(took) / len(took)
        line = f"{what} took {took[-1]:.0f} s"
        if left > 0:
            line += f"; about {left / 60:.0f} min left for {task.name}'s grid"
        print(line)
    model.load_state_dict(init_state)
    finished = [i for i, r in enumerate(records) if "failed" not in r]
    if not finished:
        raise InputError(f"{task.name}: every hyper-parameter set diverged (non-finite loss); "
                         "try a lower --lr")
    best = mean_of_best_two([records[i] for i in finished], task.metric)
    return {"best_two": [finished[i] for i in best.top], "dev": best.dev, "test": best.test,
            "configs": records}


# =============================================================================
# The plumbing, not part of the paper: file formats, data directory, CLI, resume, --table/--plot

# -----------------------------------------------------------------------------
# Official formats: reader(path, lang) -> examples (`lang`: XNLI 1.0's rows, raw PAN-X's prefix)

def numbered_lines(path):
    """(line number, line) of a file, then (0, ""): a blank line ends its last sentence."""
    return itertools.chain(enumerate(read_lines(path), 1), [(0, "")])


def nli_example(where, premise, hypothesis, label, column="XNLI label"):
    """One (premise, hypothesis, label) at `where` (path:line): a known label, two sentences."""
    if label not in XNLI_LABELS:
        raise InputError(f"{where}: unknown {column} {label!r} (expected entailment, neutral, "
                         "contradiction)")
    if not premise or not hypothesis:
        raise InputError(f"{where}: empty sentence1 or sentence2")
    return premise, hypothesis, label


def nonempty(examples, path, what="examples (empty split)"):
    if not examples:
        raise InputError(f"{path}: no {what}")
    return examples


def read_nli_tsv(path, lang=None, *, cols, header_name=None, column="XNLI label"):
    """NLI tab-separated columns `cols` = (premise, hypothesis, label[, language]), in order or
    named by a header line (`header_name`) -> [(premise, hypothesis, label)] (`lang`'s rows);
    `contradictory` (XNLI-MT's) is contradiction."""
    lines = numbered_lines(path)
    header = next(lines)[1] if header_name else "\t".join(cols)
    names = [x.strip() for x in header.split("\t")]
    if not set(cols) <= set(names):
        raise InputError(f"{path}:1: expected the {header_name}, got {header[:80]!r}")
    examples = []
    for n, line in lines:
        if not line.strip():
            continue
        fields = [x.strip() for x in line.split("\t")]
        if len(fields) != len(names):
            want = (f"{len(names)} tab-separated columns (the header's)" if header_name else
                    "<TAB>".join(cols))
            raise InputError(f"{path}:{n}: expected {want}, got {line[:80]!r}")
        premise, hypothesis, label, *language = (fields[names.index(c)] for c in cols)
        if language and language != [lang]:  # another language's row
            continue
        if not label:
            raise InputError(f"{path}:{n}: no label (column {cols[2]} is empty)")
        if label == "contradictory":
            label = "contradiction"
        examples.append(nli_example(f"{path}:{n}", premise, hypothesis, label, column))
    if len(cols) > 3:
        return nonempty(examples, path, f"rows of language {lang!r} (column language)")
    return nonempty(examples, path)


# `premise<TAB>hypothesis<TAB>label` lines (XTREME's XNLI, MultiNLI as train-en.tsv)
read_xnli = functools.partial(read_nli_tsv, cols=("premise", "hypothesis", "label"))
# XNLI 1.0 as distributed (Conneau et al. 2018, `XNLI-1.0.zip`: `xnli.dev.tsv`, `xnli.test.tsv`):
# one file for all 15 languages, its columns read by name -> the rows of `lang`
read_xnli_1_0 = functools.partial(
    read_nli_tsv, cols=("sentence1", "sentence2", "gold_label", "language"),
    header_name="XNLI 1.0 header (columns gold_label, language, sentence1, sentence2)")
# XNLI-MT 1.0 (`XNLI-MT-1.0.zip`: `multinli/multinli.train.{lang}.tsv`, translated MultiNLI)
read_xnli_mt = functools.partial(read_nli_tsv, cols=("premise", "hypo", "label"),
                                 header_name="XNLI-MT header premise<TAB>hypo<TAB>label",
                                 column="XNLI-MT label")


def read_multinli(path, lang=None):
    """MultiNLI 1.0 (Williams et al. 2018, `multinli_1.0.zip`: `multinli_1.0_train.jsonl`): a JSON
    object a line, `sentence1`, `sentence2`, `gold_label`; pairs without a gold label (`-`, no
    annotator majority) are skipped."""
    examples = []
    for n, line in numbered_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            keys = ("sentence1", "sentence2", "gold_label")
            premise, hypothesis, label = (row[k].strip() for k in keys)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InputError(f"{path}:{n}: expected a JSON object with string fields "
                             f"sentence1, sentence2, gold_label (MultiNLI .jsonl), got "
                             f"{line[:80]!r}") from None
        if label != "-":
            where = f"{path}:{n}"
            examples.append(nli_example(where, premise, hypothesis, label, "MultiNLI gold_label"))
    return nonempty(examples, path, "examples with a gold label (empty split)")


def read_ner(path, lang=None, raw=False):
    """PAN-X `token<TAB>tag` (XTREME's `panx/{split}-{lang}.tsv`), blank lines ending sentences ->
    [(words, tags)]; raw PAN-X (every token `xx:...`) is refused: the prefix would tell every
    English word from every French one. `raw` (read_panx): Rahimi et al. 2019's files
    (`panx_dataset/{lang}/{split}`), `lang:token<TAB>tag`, `lang:` stripped."""
    sentences = []
    words = []
    tags = []
    for n, line in numbered_lines(path):
        if not line.strip():
            if words:
                sentences.append((words, tags))
            words = []
            tags = []
            continue
        fields = line.split("\t")
        word = fields[0]
        prefix = lang
        if raw:
            prefix, _, word = word.partition(":")
        if len(fields) != 2 or not word or not fields[1].strip():
            want = "lang:token<TAB>tag (raw PAN-X)" if raw else "token<TAB>tag"
            raise InputError(f"{path}:{n}: expected {want}, got {line!r}")
        if prefix != lang:
            raise InputError(f"{path}:{n}: PAN-X prefix {prefix + ':'!r} is not this file's "
                             f"language {lang!r}")
        words.append(word)
        tags.append(fields[1].strip())
        if tags[-1] != "O" and not re.fullmatch(r"[BI]-\S+", tags[-1]):
            raise InputError(f"{path}:{n}: tag {tags[-1]!r} is not O, B-X or I-X (IOB2)")
    nonempty(sentences, path, "sentences (empty split)")
    if raw:
        return sentences
    words = [w for ws, _ in sentences for w in ws]
    prefix = re.match(r"[a-z]{2,3}:", words[0])
    if prefix and all(w.startswith(prefix[0]) for w in words):
        # the first token's line
        n = next(n for n, line in numbered_lines(path) if line.strip())
        raise InputError(f"{path}:{n}: every token starts with {prefix[0]!r}: raw PAN-X, read "
                         f"from panx_dataset/{prefix[0][:-1]}/{{train,dev,test}} (the prefix is "
                         "stripped there)")
    return sentences


read_panx = functools.partial(read_ner, raw=True)  # panx_dataset/{lang}/{split}


def read_conllu(path, lang=None):
    """CoNLL-U -> per sentence {"words", "heads" (0 = ROOT), "rels"}; each must be a tree."""
    sentences = []
    rows = []
    start = None
    for n, line in numbered_lines(path):
        # UD's validator: a pseudo-empty line (else read as a sentence's end)
        if line and not line.strip():
            raise InputError(f"{path}:{n}: a line of only spaces or tabs (CoNLL-U ends a sentence "
                             "with an empty line)")
        if line:
            start = start or n
            cols = line.split("\t")
            if line.startswith("#") or len(cols) == 10 and ("-" in cols[0] or "." in cols[0]):
                continue
            if len(cols) != 10:
                raise InputError(f"{path}:{n}: expected 10 tab-separated CoNLL-U columns, got "
                                 f"{len(cols)}")
            try:
                wid = int(cols[0])
                head = int(cols[6])
            except ValueError:
                raise InputError(f"{path}:{n}: ID {cols[0]!r} / HEAD {cols[6]!r} is not an "
                                 "integer") from None
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
            raise InputError(f"{path}:{start}: sentence is not a tree: {heads.count(0)} words on "
                             "ROOT, expected one")
        if cycle := find_cycle([-1] + heads):
            raise InputError(f"{path}:{start}: sentence is not a tree: words "
                             f"{' -> '.join(map(str, cycle + cycle[:1]))} form a cycle (HEAD)")
        if rows:
            sentences.append({"words": [r[2] for r in rows], "heads": heads,
                              "rels": [r[4] for r in rows]})
        rows = []
        start = None
    return nonempty(sentences, path, "sentences (empty split)")


# -----------------------------------------------------------------------------
# Data files: where --data holds each split of each task, and the reader of each file

# --data: each split's layouts (pattern, reader, its splits if not all three, its only languages),
# the first found wins; {panx_split}: our test split is `heldout-from-dev` (XTREME's PAN-X test is
# unlabelled)

Layout = collections.namedtuple("Layout", "pattern reader splits langs",
                                defaults=("train dev test", None))
LAYOUTS = {
    "xnli": [Layout("xnli/{lang}.{split}.tsv", read_xnli),  # toydata.py
             # our evaluation directory (XTREME names)
             Layout("xnli/{split}-{lang}.tsv", read_xnli),
             Layout("XNLI-1.0/xnli.{split}.tsv", read_xnli_1_0, "dev test"),  # XNLI 1.0
             Layout("XNLI-MT-1.0/multinli/multinli.train.{lang}.tsv", read_xnli_mt, "train"),
             Layout("multinli_1.0/multinli_1.0_train.jsonl", read_multinli, "train", "en")],
    "ner": [Layout("ner/{lang}.{split}.tsv", read_ner),
            Layout("wikiann_panx/{panx_split}-{lang}.tsv", read_ner),
            # Rahimi et al. 2019, unpacked
            Layout("panx_dataset/{lang}/{split}", read_panx),
            Layout("panx/{split}-{lang}.tsv", read_ner)],  # XTREME
    "parse": [Layout("ud/{lang}.{split}.conllu", read_conllu),
              Layout("ud/UD_*/{lang}_*-ud-{split}*.conllu", read_conllu),
              # UD 2.3
              Layout("ud-treebanks-v2.3/UD_*/{lang}_*-ud-{split}.conllu", read_conllu)],
}
# the UD treebank of each language in the paper (§3.2); another one: --treebank LANG=NAME
PAPER_TREEBANKS = {"en": "EWT", "fr": "GSD", "ru": "GSD", "zh": "GSD"}


def treebank_name(path):  # .../UD_French-GSD/fr_gsd-ud-test.conllu -> GSD
    return os.path.basename(os.path.dirname(path)).rpartition("-")[2]


def pick_treebank(hits, lang, treebanks, data_dir):
    """`hits` of one treebank (`UD_Language-NAME`): --treebank's, the paper's, or the only one."""
    found = sorted(set(map(treebank_name, hits)))
    want = treebanks.get(lang) or PAPER_TREEBANKS.get(lang)
    if want is None and len(found) > 1:
        raise InputError(f"parse: several UD treebanks for {lang} under --data {data_dir}: "
                         f"{', '.join(found)}; pick one with --treebank {lang}=NAME")
    if want not in found and want is not None:
        flag = f"--treebank {lang}={want}"
        hint = ""
        if lang not in treebanks:
            flag = f"the paper's treebank for {lang}, {want}"
            hint = f"; pick one with --treebank {lang}=NAME"
        raise InputError(f"parse: {flag}: no such treebank for {lang} under --data {data_dir} "
                         f"(found {', '.join(found)}){hint}")
    return [p for p in hits if want in (None, treebank_name(p))]


def resolve_files(task, data_dir, train_lang, eval_langs, train_file=None, treebanks=None,
                  flag="--data"):
    """{"train", "dev": path, "test": {lang: path}} from LAYOUTS under --data (train: --train-file
    if given); `treebanks` {lang: NAME} (--treebank); a missing file names `flag` (the flag given)
    and the paths searched."""
    treebanks = treebanks or {}

    def find(lang, split):
        names = dict(lang=lang, split=split,
                     panx_split="heldout-from-dev" if split == "test" else split)
        tried = []
        for layout in LAYOUTS[task]:
            if split not in layout.splits.split():
                continue
            tried.append(layout.pattern.format(**names))
            held = not layout.langs or lang in layout.langs.split()  # MultiNLI: English only
            hits = sorted(glob.glob(tried[-1], root_dir=data_dir)) if held else []
            if "UD_*" in layout.pattern and hits:
                hits = pick_treebank(hits, lang, treebanks, data_dir)
            if not hits:
                continue
            if lang in treebanks and "UD_*" not in layout.pattern:  # --treebank would be ignored
                raise InputError(f"--treebank {lang}={treebanks[lang]}: the {lang} {split} file "
                                 f"under --data is not in a UD release tree ({hits[0]})")
            return os.path.join(data_dir, hits[0])
        # only a directory with the task's other files lacks just the train file (e.g. no English
        # NLI train set)
        dev_names = dict(lang=train_lang, split="dev", panx_split="dev")
        other = split == "train" and any(glob.glob(layout.pattern.format(**dev_names),
                                                   root_dir=data_dir) for layout in LAYOUTS[task])
        hint = ("; pass --train-file" if other else
                f"; is {data_dir} a toydata.py world or a real-data directory?")
        looked = ", ".join(os.path.join(data_dir, t) for t in tried)
        raise InputError(f"{task}: no {lang} {split} file under {flag} {data_dir} (looked for "
                         f"{looked}){hint}")
    if train_file is not None and not os.path.isfile(train_file):
        raise InputError(f"--train-file {train_file}: not a file")
    if unused := sorted(set(treebanks) - {train_lang, *eval_langs}):
        raise InputError(f"--treebank: {', '.join(unused)} is not the train language or one of "
                         "--eval-langs")
    return {"train": train_file or find(train_lang, "train"), "dev": find(train_lang, "dev"),
            "test": {lang: find(lang, "test") for lang in eval_langs}}


def read_split(task, path, lang):
    """A file's examples by its layout's reader (another --train-file: XNLI-MT, MultiNLI, or the
    first)."""
    parts = os.path.normpath(path).split(os.sep)
    for layout in LAYOUTS[task]:
        pattern = layout.pattern.format(lang="*", split="*", panx_split="*").split("/")
        tail = parts[-len(pattern):]
        if len(parts) >= len(pattern) and all(map(fnmatch.fnmatchcase, tail, pattern)):
            return layout.reader(path, lang)
    # a --train-file of no known layout
    name = os.path.basename(path)
    reader = LAYOUTS[task][0].reader
    if task == "xnli" and fnmatch.fnmatchcase(name, "multinli.train.*.tsv"):
        reader = read_xnli_mt
    if task == "xnli" and name.endswith(".jsonl"):
        reader = read_multinli
    return reader(path, lang)


# -----------------------------------------------------------------------------
# CLI: the flags, the checkpoints, main(argv): every flag and file checked, then each task's grid

# --help: what each kind of run requires (argparse cannot: --table needs no --ckpt), an example
USAGE = """%(prog)s --task {ner,parse,xnli} --ckpt CKPT --data DIR --out DIR [options]
       %(prog)s --toy --data WORLD --ckpt CKPT --out DIR [options]    (the three tasks)
       %(prog)s --table OUT_DIR [OUT_DIR ...] [--plot FILE.png] [--with-stalled]"""
EPILOG = """example: NER fine-tuned on English, tested on French, the paper's grid (6 sets):
  python finetune.py --task ner --ckpt runs/pt/best.pt --data DATA --eval-langs fr --out runs/ner
the same command again goes on from the sets it finished (OUT/sets/)"""


class HelpFormatter(bpe.HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """bpe.py's (each flag's default shown), with the usage, description and epilog as written."""


def build_parser():
    description = (__doc__.split("\n\n")[0] + "\nUnset grid flags take the paper's values (the toy "
                   "presets with --toy).")
    p = argparse.ArgumentParser(usage=USAGE, description=description, epilog=EPILOG,
                                formatter_class=HelpFormatter)

    def one(parse):  # a flag of one value: a grid of one
        return lambda s: [parse(s)]
    add = p.add_argument_group("data").add_argument
    add("--task", choices=sorted(TASKS),
        help="the task (default: all three with --toy, else required)")
    add("--data", metavar="DIR",
        help="the toy world, or the downloads unpacked side by side (README); required")
    add("--toy", nargs="?", const=True, default=False, metavar="DIR",
        help="the toy presets (--data: the toy world); all three tasks unless --task. The old "
        "spelling --toy DIR (= --toy --data DIR) is deprecated")
    add("--train-lang", default="en", help="the language fine-tuned on; its dev set selects")
    add("--eval-langs",
        help="comma list of target languages (default: the checkpoint's other languages)")
    add("--train-file",
        help="the English train file (default: --data's; XNLI-MT, MultiNLI by their names)")
    add("--treebank", metavar="LANG=NAME,...",
        help="UD: another treebank than the paper's (default: en=EWT, fr=GSD, ru=GSD, zh=GSD), "
        "e.g. fr=FTB for UD_French-FTB")
    add("--allow-overlap", action="store_true",
        help="accept a train file holding most of the dev or a test set (default: refused: the "
        "epoch and the sets would be chosen, or scored, on training data)")
    add = p.add_argument_group("model").add_argument
    add("--ckpt", help="pretrain.py's best.pt, or a released XLM .pth with --xlm-codes; required")
    add("--xlm-codes", metavar="CODES",
        help="fastBPE codes of an XLM .pth as --ckpt/--target-ckpt (default: none)")
    add("--align-layer", type=number(0), metavar="I",
        help="§5.1.2's aligned transfer (default: off). The encoder becomes --ckpt up to its layer "
        "I (0 = the embeddings), frozen, then 4 new Transformer layers trained with the task's "
        "head. English goes through --ckpt; the target language goes through its own --target-ckpt "
        "up to layer I, mapped into --ckpt's space by --align-maps")
    add("--target-ckpt", help="§5.1.2: the target language's own model (with --align-layer)")
    add("--align-maps",
        help="§5.1.2: align.py contextual --save-maps .npz, fitted on --target-ckpt and --ckpt "
        "(with --align-layer)")
    group = p.add_argument_group("fine-tuning")
    add = group.add_argument
    add("--epochs", type=number(1),
        help="epochs per set (default: paper 10 NER/parsing, 200 XNLI; --toy 4, 10)")
    add("--epoch-size", type=number(0),
        help="examples per epoch, 0 = one pass (default: 0; paper's XNLI 20000)")
    # one value, or a grid (--lrs); a learning rate of 0 trains nothing
    rate = dict(lo=0, cast=float, above=True)
    grids = [("batch-size", "N", dict(lo=1), "examples per step: one value (default: the grid of "
              "--batch-sizes)", "grid of examples per step (default: paper 16,32, XNLI 4,8; --toy "
              "16)"),
             ("lr", "LR", rate, "encoder learning rate: one value (default: --lrs)", "grid of "
              "encoder learning rates (default: paper 2e-5,3e-5,5e-5, XNLI 1.25e-6,2.5e-6,5e-6; "
              "--toy 3e-4,1e-3, XNLI 2e-4,5e-4)"),
             ("head-lr", "LR", rate, "XNLI head lr: one (default: --head-lrs)", "grid of XNLI "
              "classifier learning rates (default: paper 5e-6,2.5e-5,1.25e-4; --toy 1e-3)")]
    for name, metavar, kind, one_help, grid_help in grids:
        pair = group.add_mutually_exclusive_group().add_argument
        pair(f"--{name}", type=one(number(**kind)), metavar=metavar, help=one_help)
        pair(f"--{name}s", dest=name.replace("-", "_"), type=number(**kind, many=True),
             metavar=metavar + ",...", help=grid_help)
    add("--max-len", type=number(2),
        help="NER/parsing: subwords per window (default: 128, at most positions - 2); XNLI: at "
        "most N subwords in a pair besides its three </s> (default: the positions)")
    add("--head-dropout", type=number(0, 1, float), default=0.1,
        help="dropout before the XNLI/NER head")
    add("--clip", type=number(0, cast=float), default=5.0, help="gradient norm clipping, 0 = off")
    add("--seed", type=number(0, 2 ** 32), default=0,
        help="seed of every set: head init, data order")
    add = p.add_argument_group("run").add_argument
    add("--out", metavar="DIR",
        help="results.json and sets/ (a folder per task when several run); required. The same "
        "command again resumes: the finished sets are kept, the set in progress starts again from "
        "epoch 1")
    add("--overwrite", action="store_true",
        help="replace the results and sets of another run in --out")
    add("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N, mps")
    add("--dtype", default="auto", choices=("auto",) + DTYPES,
        help="autocast as in pretrain.py (no float16)")
    add("--threads", type=number(0, 1025),
        help="CPU threads, 0 = torch's choice (default: 1 with --toy, else 0)")
    add = p.add_argument_group("Table 1 of finished runs").add_argument
    add("--table", nargs="+", metavar="OUT_DIR",
        help="only print Table 1 of dirs NAME[-sSEED][-stepN] (default: off): a row per NAME, "
        "its seeds the pretraining runs, a snapshot at its step (as results.json records them)")
    add("--plot", metavar="FILE.png",
        help="with --table over snapshots: the learning curves too (needs matplotlib)")
    add("--with-stalled", action="store_true",
        help="with --table: the seeds whose MLM stalled count in the means too")
    return p


# a checkpoint's model, tokenizer, languages and other entries
Checkpoint = collections.namedtuple("Checkpoint", "model tok langs extra")


def load_ckpt(path, flag, device, xlm_codes=None):
    """pretrain.py's best.pt or XLM's .pth (--xlm-codes); an error names `flag`."""
    try:
        return Checkpoint(*load_encoder(path, device, bpe.checkpoint_tokenizer, xlm_codes))
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise InputError(f"{flag}: {e}") from None


def lang_index(langs, code, ckpt, flag):  # a language the checkpoint lacks names `flag`
    return bpe.checkpoint_lang(langs, code, f"{flag} {code}:", f" ({ckpt})")


def setup_aligned(model, tok, langs, args):
    """§5.1.2: the English model and the target's own joined by align.py's W (x_target @ W ~
    x_english at layer I) -> (the encoder, {code: (tokenizer, the encoder's language)})."""
    if len(args.eval_langs) != 1:
        raise InputError("--align-layer: give exactly one --eval-langs (the --target-ckpt "
                         "language)")
    code = args.eval_langs[0]
    en = args.train_lang
    layer = args.align_layer
    target = load_ckpt(args.target_ckpt, "--target-ckpt", args.device, args.xlm_codes)
    n = min(model.config.n_layers, target.model.config.n_layers)
    dim = model.config.dim
    if layer > n:  # --align-layer is at least 0
        raise InputError(f"--align-layer {layer} outside 0..{n}")
    if target.model.config.dim != dim:
        raise InputError(f"--target-ckpt dim {target.model.config.dim} differs from --ckpt dim "
                         f"{dim}")
    try:
        W = align.load_map(args.align_maps, code, en, layer)
    except ValueError as e:
        raise InputError(f"--align-maps: {e}") from None
    W = torch.tensor(W, device=args.device)
    if W.shape != (dim, dim):
        raise InputError(f"--align-maps: {args.align_maps}: maps of size {tuple(W.shape)}, not "
                         f"{dim}x{dim} (--ckpt's dim)")
    torch.manual_seed(args.seed)  # the new layers' init, so that --seed decides a run
    en_index = lang_index(langs, en, args.ckpt, "--train-lang")
    target_index = lang_index(target.langs, code, args.target_ckpt, "--eval-langs")
    by_lang = {en: (model, en_index, None), code: (target.model, target_index, W)}
    encoder = AlignedEncoder(by_lang, layer).to(args.device)
    return encoder, {en: (tok, en), code: (target.tok, code)}


def maps_origin(args):
    """--align-maps fitted on --ckpt and --target-ckpt, by the digests align.py records."""
    with np.load(args.align_maps) as z:  # setup_aligned read it already
        sides = {str(z[s]): str(z[f"{s}_ckpt_digest"]) for s in ("src", "tgt")
                 if f"{s}_ckpt_digest" in z.files}
    if not sides:
        print(f"note: --align-maps {args.align_maps} records no checkpoint digests (an older "
              "align.py): unchecked")
    for lang, flag, path in ((args.train_lang, "--ckpt", args.ckpt),
                             (args.eval_langs[0], "--target-ckpt", args.target_ckpt)):
        if lang in sides and sides[lang] != digest(path):
            raise InputError(f"--align-maps {args.align_maps}: its {lang} side was fitted on the "
                             f"checkpoint {sides[lang]}, not on {flag} {path} ({digest(path)}); "
                             "fit them on these models")


def content_key(example):
    """An example's text (no label) as another file holds it: Unicode NFC, whitespace collapsed."""
    sentences = [example["words"]] if isinstance(example, dict) else example[:-1]
    texts = [s if isinstance(s, str) else " ".join(s) for s in sentences]
    return "\t".join(map(bpe.normal_text, texts))


def prepare_task(task_name, files, model, encoders, args):
    """Read and featurise every file of one task -> (task, data); encoders: code -> (tokenizer, the
    model's language); data["notes"]: {"fr test": what makes its score mean little}."""
    splits = [(args.train_lang, "dev", files["dev"])]
    splits += [(code, "test", path) for code, path in files["test"].items()]
    try:
        train = read_split(task_name, files["train"], args.train_lang)
        task = TASKS[task_name](train, args.max_len)
        splits = [(code, split, path, read_split(task_name, path, code))
                  for code, split, path in splits]
    except (ValueError, OSError) as e:  # a reader's InputError, a file not UTF-8 or unreadable
        raise InputError(str(e)) from None
    print(f"{task_name}: {args.train_lang} train {len(train)} from {files['train']}")
    n_per_epoch = args.epoch_size or len(train)
    if max(args.batch_size) > n_per_epoch:
        raise InputError(f"--batch-size {max(args.batch_size)} is more than the {n_per_epoch} "
                         f"{task_name} training examples of an epoch ({files['train']}): every "
                         "update would be the whole epoch")
    tok, lang_id = encoders[args.train_lang]
    train_feats = task.featurize(train, tok, args.train_lang, args.positions)
    data = {"lang_id": lang_id, "train": (train, train_feats), "test": {}, "notes": {}}

    train_text = set(map(content_key, train))
    for code, split, path, examples in splits:
        what = f"{code} {split}"
        shared = sum(content_key(e) in train_text for e in examples)
        if 2 * shared > len(examples) and not args.allow_overlap:
            raise InputError(f"{task_name}: the train file {files['train']} holds {shared} of the "
                             f"{len(examples)} examples of the {what} file {path}: scores on "
                             "training data (--allow-overlap if meant)")
        if len(examples) < 2:
            raise InputError(f"{task_name}: {path}: one example; a score on one example is not a "
                             "result")
        # never predicted: scored as errors
        if unseen := sorted(set(task.label_set(examples)) - set(task.labels)):
            print(f"{task_name}: {path}: labels never seen in the {args.train_lang} train set: "
                  f"{', '.join(unseen)}")
        print(f"{task_name}: {what} {len(examples)} from {path}")
        tok, lang_id = encoders[code]
        feats = task.featurize(examples, tok, code, args.positions)
        if split == "dev":
            data["dev"] = (examples, feats)
        else:
            data["test"][code] = (examples, feats, lang_id)

        # what makes the split's score mean little, printed beside it
        notes = []
        if shared:
            notes.append(f"{shared} of its {len(examples)} examples are in the train file")
        ids = [i for f in feats for i in f[0] if i != EOS_ID]
        unk = 100 * ids.count(UNK_ID) / max(1, len(ids))
        if unk > 5:
            notes.append(f"{unk:.1f} % of the {what} tokens are <unk> (the vocabulary was learned "
                         "on other text); the score means little")
        if len(examples) < 50:
            notes.append(f"{len(examples)} examples only (fewer than 50); the score means little")
        if notes:
            data["notes"][what] = "; ".join(notes)
    return task, data


def chance_level(task, data):
    """A guess's score: XNLI, the majority label's share of each split; span F1 and LAS, about 0."""
    if task.name != "xnli":
        return f"chance: {task.metric} of a guess is about 0"
    splits = [("dev", data["dev"][0])]
    splits += [(f"{c} test", ex) for c, (ex, _, _) in data["test"].items()]
    shares = [(what, max(collections.Counter(y for *_, y in ex).values()) / len(ex))
              for what, ex in splits]
    return "chance (always the majority label): " + ", ".join(
        f"{what} {100 * share:.1f}" for what, share in shares)


def report(task, data, args, result, path):
    """The hyper-parameter sets chosen, the scores as a table, a guess's score."""
    configs = result["configs"]
    picked = "; ".join(f"{hp_text(configs[i])} (epoch {configs[i]['best_epoch']})"
                       for i in result["best_two"])
    n_finished = sum("failed" not in r for r in configs)
    chosen = ("the one hyper-parameter set" if n_finished == 1 else
              f"mean of the best two of {n_finished} hyper-parameter sets by {args.train_lang} dev")
    line = f"\n{task.name}: {chosen}: {picked}"
    if n_finished < len(configs):
        line += f" ({len(configs) - n_finished} diverged set(s) left out)"
    print(line)
    cols = sorted(result["dev"], key=lambda k: k != task.metric)  # the selection metric first
    rows = [(args.train_lang, "dev", result["dev"])]
    rows += [(code, "test", scores) for code, scores in result["test"].items()]
    cells = [[code, split] + [f"{100 * s[k]:.2f}" for k in cols] for code, split, s in rows]
    lines = format_rows(["lang", "split"] + cols, cells).split("\n")
    for k, (code, split, _) in enumerate(rows, 1):  # what makes a score mean little, beside it
        lines[k] = f"{lines[k]}  {data['notes'].get(f'{code} {split}', '')}".rstrip()
    if "checkpoint" in data["notes"]:
        lines.append(data["notes"]["checkpoint"])
    print("\n".join(lines + [chance_level(task, data), f"wrote {path}"]))


def _main(args):
    for k, why in (("plot", "it draws the curves of snapshots"),
                   ("with_stalled", "it counts stalled seeds")):
        if vars(args)[k] and not args.table:
            raise InputError(f"--{k.replace('_', '-')} goes with --table ({why})")
    if args.table and (unused := [a.option_strings[0] for a in build_parser()._actions
                                  if a.dest not in ("table", "plot", "with_stalled")
                                  and getattr(args, a.dest, a.default) != a.default]):
        raise InputError(f"--table only reads finished runs: {', '.join(unused)} would change "
                         "nothing")
    args.data_flag = bpe.toy_data(args)  # the flag that gave the data directory, named in messages
    if args.plot:
        check_plot(args.plot)
    if args.table:
        print(results_table(args.table, args.with_stalled))
        if args.plot:
            plot_curves(args.plot, args.table, args.with_stalled)
        return

    # every flag, checkpoint and data file is checked before any training; a mistake is one line
    if not (args.ckpt and args.out):
        raise InputError("--ckpt and --out are required (or --table)")
    if args.xlm_codes and not os.path.isfile(args.xlm_codes):
        raise InputError(f"--xlm-codes {args.xlm_codes}: no such file")
    if args.dtype == "float16":
        raise InputError("--dtype float16: fine-tuning has no GradScaler; use --dtype bfloat16 or "
                         "float32")
    args.device, dtype, _ = pick_device(args.device, args.dtype)
    args.bf16 = dtype == "bfloat16"  # (auto on a GPU without bfloat16: float32)
    if not (args.align_layer is not None) == bool(args.target_ckpt) == bool(args.align_maps):
        raise InputError("--align-layer, --target-ckpt and --align-maps go together (aligned "
                         "transfer, §5.1.2)")
    if not args.data:
        raise InputError("--data DIR is required"
                         + (" (the toy world, e.g. runs/toy/toy)" if args.toy else ""))
    if not os.path.isdir(args.data):
        raise InputError(f"{args.data_flag} {args.data}: no such directory")
    # toydata.py writes mono/ first and world.json last: mono/ alone was cut short
    if args.toy and not os.path.isfile(os.path.join(args.data, "world.json")):
        if os.path.isdir(os.path.join(args.data, "mono")):
            raise InputError(f"{args.data_flag} {args.data}: no world.json, not a whole toydata.py "
                             "world (cut short? write it again with toydata.py --force)")
    tasks = [args.task] if args.task else list(TASKS) if args.toy else []
    if not tasks:
        raise InputError("--task is required (only --toy runs all three)")
    items = args.treebank.split(",") if args.treebank is not None else []
    pairs = [item.strip().partition("=")[::2] for item in items]  # fr=FTB -> (fr, FTB)
    treebanks = {lang: name.strip() for lang, name in pairs}
    if not all(lang and name for lang, name in pairs) or len(treebanks) < len(pairs):
        raise InputError(f"--treebank {args.treebank}: expected LANG=NAME,... (each language "
                         "once), e.g. fr=FTB")
    if treebanks and "parse" not in tasks:
        raise InputError("--treebank picks UD treebanks: it needs --task parse")
    if args.head_lr is not None and not any(TASKS[t].own_head_lr for t in tasks):
        raise InputError(f"--head-lr(s) is the XNLI classifier's learning rate: --task {tasks[0]} "
                         "has no such grid")
    if args.threads is None:
        args.threads = 1 if args.toy else 0
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, langs, extra = load_ckpt(args.ckpt, "--ckpt", args.device, args.xlm_codes)
    # default: the checkpoint's other languages
    given = args.eval_langs or ",".join(lang for lang in langs if lang != args.train_lang)
    args.eval_langs = [x.strip() for x in given.split(",") if x.strip()]
    if not args.eval_langs:
        raise InputError(f"--eval-langs {given!r}: no target language ({args.ckpt}: {langs})")
    if len(set(args.eval_langs)) < len(args.eval_langs):
        raise InputError(f"--eval-langs {given}: a language is given twice")
    positions = model.config.max_positions
    most = max(2, positions - 2)  # <s> and </s> around each window
    if (args.max_len or 0) > most:
        raise InputError(f"--max-len {args.max_len}: the checkpoint has {positions} positions, a "
                         f"window at most {most} subwords")
    # XNLI: a pair cut to --max-len subwords besides its three </s> (default: the positions)
    args.positions = min(args.max_len + 3, positions) if args.max_len else positions
    args.max_len = min(args.max_len or 128, most)
    # what --table reads of the checkpoint, before --align-layer replaces the model
    pretrain, stall = pretrain_record(args.ckpt, extra, model)
    if args.align_layer is not None:
        model, encoders = setup_aligned(model, tok, langs, args)
        maps_origin(args)
    else:
        flags = [(args.train_lang, "--train-lang")] + [(c, "--eval-langs") for c in args.eval_langs]
        encoders = {c: (tok, lang_index(langs, c, args.ckpt, flag)) for c, flag in flags}
    # one finetune.py in --out, from its earlier sets to results.json
    with bpe.locked(args.out, "finetune.py"):
        plans = []
        # every file of every task is read before the first set trains
        for name in tasks:
            preset = TASKS[name].toy if args.toy else TASKS[name].paper
            unset = {k: v for k, v in preset.items() if vars(args)[k] is None}  # grid flags unset
            task_args = argparse.Namespace(**(vars(args) | unset))
            files = resolve_files(name, args.data, args.train_lang, args.eval_langs,
                                  args.train_file, treebanks if name == "parse" else None,
                                  args.data_flag)
            out = os.path.join(args.out, name) if len(tasks) > 1 else args.out
            identity = run_identity(name, files, task_args)
            earlier = earlier_sets(out, identity, name, task_args)
            task, data = prepare_task(name, files, model, encoders, task_args)
            if stall:
                data["notes"]["checkpoint"] = stall
            plans.append((task, data, files, task_args, out, identity, earlier))
        # every task's earlier files go, once every check passed
        if args.overwrite:
            for *_, out, _, _ in plans:
                for path in glob.glob(os.path.join(out, "sets", "*")) + glob.glob(
                        os.path.join(out, "results.json")):
                    os.remove(path)
        for task, data, files, task_args, out, identity, earlier in plans:
            sets = os.path.join(out, "sets")
            result = run_task(task, model, data, task_args, sets, earlier,
                              lambda path, record: write_json(path, {"job": identity,
                                                                     "record": record}))
            path = os.path.join(out, "results.json")
            write_json(path, {"task": task.name, "metric": task.metric, "files": files,
                              "labels": task.labels, **result, "notes": data["notes"],
                              "job": identity, "args": vars(task_args), "pretrain": pretrain})
            report(task, data, task_args, result, path)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    # a kill (a job's time limit) as Ctrl-C
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # a bad flag or input file: one line `error: ...`, exit code 1
        with bpe.reported(parser):
            return _main(args)
    except (MemoryError, RuntimeError) as e:
        if not bpe.out_of_memory(e):
            raise
        raise SystemExit("error: out of memory; a smaller --batch-size or --max-len goes in "
                         "another --out") from None
    except KeyboardInterrupt:
        # Ctrl-C, SIGTERM: the set in progress is lost, the finished ones are on disk (sets/)
        kept = glob.glob(os.path.join(args.out or "", "**", "sets", "*.json"), recursive=True)
        if argv is None:
            argv = sys.argv[1:]
        what = "interrupted before any set finished; nothing was kept"
        if kept:
            # without --overwrite: it would remove what was kept
            again = [str(a) for a in argv if a != "--overwrite"]
            what = (f"interrupted; {len(kept)} finished hyper-parameter set(s) kept in {args.out} "
                    "(the set in progress starts again); to go on, run "
                    + shlex.join(["python", "finetune.py"] + again))
        print(f"finetune.py: {what}", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGTERM, before)


# -----------------------------------------------------------------------------
# Resume: each finished set is OUT/sets/*.json, tagged with the run's identity

def write_json(path, obj):
    """Through bpe.atomic_path (its folder made): never half a file; a full disk is one line."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with bpe.write_errors(path), bpe.atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, ensure_ascii=False)


def read_json(path, flag):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:  # missing, unreadable, not UTF-8, not JSON
        why = getattr(e, "strerror", None) or e
        raise InputError(f"{flag}: cannot read {path}: {why}") from None


def dict_or_empty(value):  # a JSON field an older or edited file may lack
    return value if isinstance(value, dict) else {}


# what a set's result depends on besides the checkpoints and data (not --device, --threads)
JOB_FLAGS = ("train_lang", "batch_size", "lr", "head_lr", "epochs", "epoch_size", "max_len",
             "head_dropout", "clip", "seed", "bf16", "align_layer")
# read once per run: --toy's three tasks share the checkpoints
digest = functools.cache(file_digest)


def run_identity(task_name, files, args):
    """What a run's results depend on: the task, JOB_FLAGS, the checkpoints' and data's contents."""
    paths = {k: vars(args)[k] for k in ("ckpt", "target_ckpt", "align_maps", "xlm_codes")}
    paths["train file"] = files["train"]
    paths["dev file"] = files["dev"]
    paths.update({f"{lang} test file": p for lang, p in files["test"].items()})
    identity = {"task": task_name, **{k: digest(p) for k, p in paths.items() if p},
                **{k: vars(args)[k] for k in JOB_FLAGS}}
    if task_name == "xnli":  # a pair is cut to the positions (--max-len + 3), not to max_len
        identity["positions"] = args.positions
    return identity


def earlier_sets(out, identity, task_name, args):
    """{set file: record} of the sets the same run finished in `out`; another run's: refused."""
    if args.overwrite:  # _main removes them
        return {}
    sets = {}
    metric = TASKS[task_name].metric
    results = os.path.join(out, "results.json")
    for path in glob.glob(results) + sorted(glob.glob(os.path.join(out, "sets", "*.json"))):
        saved = read_json(path, "--out")
        old = dict_or_empty(saved.get("job")) if isinstance(saved, dict) else {}
        if old != identity:
            diff = ", ".join(k for k in sorted(old | identity) if old.get(k) != identity.get(k))
            raise InputError(f"{path} already exists, from another run (other {diff}); rerun with "
                             "the same flags, pass --overwrite to replace it, or use another --out")
        if path == results:
            continue
        # a set's hyper-parameters, and a failure or the scores that run_task averages
        record = saved.get("record")
        try:
            hp = {k: record[k] for k in ("batch_size", "lr", "head_lr")}
            done = "failed" in record
            if not done:
                scores = [record["dev"], *record["test"].values()]
                done = (sorted(record["test"]) == sorted(args.eval_langs)
                        and type(record["best_epoch"]) is int
                        and all(metric in s and all(map(is_score, s.values())) for s in scores))
        except (KeyError, TypeError, AttributeError):  # not a dict, a score missing
            done = False
        if not (done and hp in grid(task_name, args)):
            raise InputError(f"{path}: not a finished set as finetune.py writes it (edited or "
                             "damaged); remove it to train that set again, or pass --overwrite")
        sets[path] = record
    return sets


# -----------------------------------------------------------------------------
# --table: Table 1's layout over --out dirs, and --plot: the learning curves over snapshots

def format_rows(header, rows):
    """The first column left-aligned, the others right-aligned."""
    table = [header] + rows
    widths = [max(map(len, column)) for column in zip(*table)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))) for r in table)


def mean_std(v):
    if not v:
        return "-"
    text = f"{np.mean(v):.1f}"
    if len(v) > 1:
        text += f" ±{np.std(v):.1f}"
    return text


COLUMN_NAMES = {"ppl": "dev ppl", "xnli": "XNLI", "ner": "NER", "parse": "Parse"}  # in order
CHANCE = {"xnli": "XNLI 33.3 (three balanced labels)", "ner": "NER span F1 about 0",
          "parse": "LAS about 0"}


def is_score(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def pretrain_record(path, entries, model):
    """-> (results.json's "pretrain": the checkpoint's step, dev and count-model perplexities,
    "run": its weights' digest, "snapshot": written at one of its run's --snapshots, "stalled": its
    run's MLM, judged at the run's end (a snapshot by the run's best.pt beside it); its note)."""
    weights = b"".join(v.cpu().numpy().tobytes() for v in model.state_dict().values())
    snapshots = dict_or_empty(entries.get("args")).get("snapshots")
    record = {k: entries.get(k) for k in ("step", "dev_ppl", "count_ppl")}
    record["run"] = "sha256:" + hashlib.sha256(weights).hexdigest()[:16]
    record["snapshot"] = isinstance(snapshots, list) and record["step"] in snapshots
    if record["snapshot"]:
        path = os.path.join(os.path.dirname(path), "best.pt")
        entries = load_model(path)[1] if os.path.isfile(path) else {}
    note = stall_note(path, entries)
    record["stalled"] = note is not None
    return record, note


# the columns (("ppl" or task, lang)), {(row, N): [each pretraining run's cells]}, the notes
Table = collections.namedtuple("Table", "cols groups notes")


def read_table(run_dirs):
    """--table's dirs -> Table. A row: a dir's name less -sSEED and -stepN, marked when not
    zero-shot; its seeds: the pretraining runs (weights) its results record, each one's fine-tuning
    --seeds averaged; N: the step of a --snapshots checkpoint (none: the run's end). An older
    finetune.py's results record no run: the dir is one, N its name's -stepN. Cells: {(task, lang):
    test score in %, ("ppl", lang): dev ppl, "stalled"}."""
    runs = {}  # (row, N) -> {run: {fine-tuning seed: cells}}
    seen = {}  # (run, N, task, fine-tuning seed, row) -> its results.json
    given = {}
    marked = False
    for d in run_dirs:
        real = os.path.realpath(d)
        if real in given:
            raise InputError(f"--table: {d} is given twice (as {given[real]}); a run counts once")
        given[real] = d
        base = os.path.basename(os.path.normpath(d))
        name_step = re.search(r"-step(\d+)(?=-|$)", base)
        ckpts = set()
        found = glob.glob("results.json", root_dir=d) + glob.glob("*/results.json", root_dir=d)
        for path in sorted(os.path.join(d, p) for p in found):
            results = read_json(path, "--table")  # one task's, or one of --toy's
            if not (isinstance(results, dict) and results.get("task") in TASKS
                    and isinstance(results.get("test"), dict)):
                continue
            task = results["task"]
            test = results["test"]
            metric = TASKS[task].metric
            pretrain = results.get("pretrain") or {}
            ppl = pretrain.get("dev_ppl") or {} if isinstance(pretrain, dict) else None
            valid = (results.get("metric") == metric and test
                     and all(is_score(dict_or_empty(s).get(metric)) for s in test.values())
                     and isinstance(ppl, dict)
                     and all(isinstance(v, (int, float)) and v is not True for v in ppl.values()))
            if not valid:
                raise InputError(f"--table: {path}: not a results.json as finetune.py writes it (a "
                                 f"{task} test {metric} or a dev perplexity is missing or not a "
                                 "number); run the fine-tuning again")
            cells = {(task, lang): 100 * s[metric] for lang, s in test.items()}
            cells.update({("ppl", lang): v for lang, v in ppl.items()})
            # recorded at the run's end; an older finetune.py's: the checkpoint itself
            try:
                stalled = stall_note(path, pretrain) is not None
            except (TypeError, AttributeError):  # a hand-edited count model
                stalled = False
            cells["stalled"] = pretrain.get("stalled", stalled)
            job = dict_or_empty(results.get("job"))
            args = dict_or_empty(results.get("args"))
            ckpts.add(job.get("ckpt"))
            run = pretrain.get("run")
            step = pretrain.get("step") if pretrain.get("snapshot") else None
            if run is None:
                run = job.get("ckpt") or d
                step = int(name_step[1]) if name_step else None
            row = re.sub(r"-s(tep)?\d+(?=-|$)", "", base)
            if str(args.get("train_lang")) in test or args.get("allow_overlap"):
                row += " (not zero-shot)"
                marked = True
            key = (run, step, task, job.get("seed"), row)
            if key in seen:
                raise InputError(f"--table: {seen[key]} and {path} hold the same run (one "
                                 "pretraining run at one step, one task and --seed); it would be "
                                 "counted twice")
            seen[key] = path
            by_seed = runs.setdefault((row, step), {}).setdefault(run, {})
            by_seed.setdefault(job.get("seed"), {}).update(cells)
        if not ckpts:
            raise InputError(f"--table: no results.json under {d}")
        if len(ckpts - {None}) > 1:
            raise InputError(f"--table: {d} holds the results of {len(ckpts - {None})} "
                             "checkpoints; a seed is one model")
    names = list(dict.fromkeys(row for row, _ in runs))
    groups = {}
    # a run's fine-tuning seeds averaged
    for point in sorted(runs, key=lambda k: (names.index(k[0]), k[1] or 0)):
        groups[point] = [{c: np.mean([s[c] for s in seeds.values() if c in s])
                          for c in set().union(*seeds.values())} for seeds in runs[point].values()]
    cols = {c for point in groups.values() for cells in point for c in cells if c != "stalled"}
    cols = sorted(cols, key=lambda c: (list(COLUMN_NAMES).index(c[0]), c[1]))
    notes = []
    if marked:
        notes.append("(not zero-shot): fine-tuned on a test language (--train-lang) or with "
                     "--allow-overlap")
    return Table(cols, groups, notes)


def results_table(run_dirs, with_stalled=False):
    """Table 1: a row per model (and N), dev ppl, test scores in %, avg, Δ against the first row,
    mean ± std over seeds; stalled seeds out unless with_stalled; * a cell over fewer seeds."""
    cols, groups, notes = read_table(run_dirs)
    scores = [c for c in cols if c[0] != "ppl"]
    steps = any(step for _, step in groups)
    lines = []
    first = None
    n_stalled = 0
    thin = False  # a cell over fewer seeds than its row's
    for (name, step), runs in groups.items():
        stalled = sum(1 for cells in runs if cells["stalled"])
        n_stalled += stalled
        runs = [cells for cells in runs if with_stalled or not cells["stalled"]]
        avgs = [np.mean([cells[c] for c in scores]) for cells in runs
                if all(c in cells for c in scores)]
        if first is None:
            first = avgs
        line = [name]
        if steps:
            line.append(str(step or "-"))
        line += [str(len(runs)), str(stalled)]
        for v in [[cells[c] for cells in runs if c in cells] for c in cols] + [avgs]:
            line.append(mean_std(v))
            if 0 < len(v) < len(runs):
                line[-1] += "*"
                thin = True
        line.append(f"{np.mean(avgs) - np.mean(first):+.1f}" if avgs and first else "-")
        lines.append(line)
    header = ["model", "updates"] if steps else ["model"]
    header += ["seeds", "stalled"]
    header += [f"{COLUMN_NAMES[t]} {lang}" for t, lang in cols] + ["avg", "Δ"]
    notes.insert(0, "chance: " + ", ".join(CHANCE[t] for t in dict.fromkeys(t for t, _ in scores)))
    if n_stalled:
        counted = ("are in the means (--with-stalled)" if with_stalled else
                   "are left out (--with-stalled counts them)")
        notes.append(f"{n_stalled} seed(s) whose MLM stalled on the unigram plateau {counted}")
    if thin:
        notes.append("* averaged over fewer seeds than the row's")
    return "\n".join([format_rows(header, lines)] + notes)


def plot_curves(path, run_dirs, with_stalled=False):
    """--plot: a panel per column, a line per model over N updates, the seeds the table counts."""
    from matplotlib.figure import Figure  # not pyplot: no window, no backend to choose
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    cols, groups, _ = read_table(run_dirs)
    steps = sorted({step for _, step in groups if step})
    if not steps:
        raise InputError("--plot: no --table dir holds a snapshot's results (pretrain.py "
                         "--snapshots; an older finetune.py's: a -stepN dir), so there is no "
                         "curve")
    fig = Figure(figsize=(3.2 * len(cols), 3.4))
    for ax, col in zip(fig.subplots(1, len(cols), squeeze=False)[0], cols):
        lines = collections.defaultdict(dict)  # a model's {N: the values the table counts}
        for (name, step), runs in groups.items():
            v = [cells[col] for cells in runs
                 if col in cells and (with_stalled or not cells["stalled"])]
            if step and v:
                lines[name][step] = v
        for name, points in lines.items():
            ax.errorbar(list(points), [np.mean(v) for v in points.values()],
                        yerr=[np.std(v) for v in points.values()], marker="o", ms=3, capsize=2,
                        label=name)
        title = f"{COLUMN_NAMES[col[0]]} {col[1]}"
        ax.set(xscale="log", xlabel="updates", title=title + " (test, %)")
        ax.set_xticks(steps, [str(x) for x in steps], rotation=45, fontsize=8)
        ax.xaxis.set_minor_formatter(NullFormatter())
        if col[0] == "ppl":
            ax.set(yscale="log", title=title)
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    with bpe.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
