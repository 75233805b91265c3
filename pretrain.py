"""
Bilingual masked language model (MLM) pretraining, paper §3.1 and Table 1.

The XLM-style encoder of model.py, trained with BERT's MLM objective on monolingual streams of two languages in
every sharing regime of Table 1 (joint / separate / prefixed BPE, code-switched "extra anchors", separate
embeddings and bottom layers). As facebookresearch/XLM (src/data/dataset.py StreamDataset, src/trainer.py):
256-token streams with `</s>` separators and no padding, one language per batch drawn with p ∝ n^0.7, 15 % of
tokens predicted (80 % MASK / 10 % kept / 10 % random), Adam with linear warm-up then inverse square root decay,
best model by English dev perplexity. References: the paper (Conneau et al. 2020), BERT (Devlin et al. 2019),
XLM (Lample & Conneau 2019, github.com/facebookresearch/XLM).

Run:
    python pretrain.py --toy --out runs/toy                       # synthetic world, one CPU core, ~8 minutes
    python pretrain.py --data DIR --langs en,fr --accumulate 8 --out runs/default        # 1 GPU
    torchrun --standalone --nproc_per_node 8 pretrain.py --data DIR --langs en,fr --sep emb,1-3 --out runs/sep
    python pretrain.py ... --resume                               # continue from runs/.../checkpoint.pt
"""

import argparse
import gc
import json
import math
import os
import re
import shlex
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from bpe import (EOS_ID, MASK_ID, MODES, HelpFormatter, Tokenizer, atomic_write, load_bin, make_dir, number,
                 parse_lang_files, prepare, write_errors, write_text)
from model import MLM, ModelConfig, autocast, parse_sep, pick_device, save_model
from toydata import SIZES as TOY_SIZES, parse_order, write_world

MASK_PROB = 0.15              # paper §3.1 / BERT: 15 % of the positions are predicted
PRED_PROBS = (0.8, 0.1, 0.1)  # of those: MASK, kept, random id (XLM word_mask_keep_rand)
ALPHA = 0.7                   # language sampling exponent (XLM lg_sampling_factor)
# XLM's adam_inverse_sqrt defaults: eps 1e-8, no weight decay (XLM's README BERT recipe has 1e-6 and decoupled 0.01)
ADAM = dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

# -----------------------------------------------------------------------------
# masking, schedule, language sampling (pure functions, imported by the tests)

def mask_tokens(x, vocab_size, generator, mask_prob=MASK_PROB, probs=PRED_PROBS, at_least_one=False):
    """BERT/XLM masking of x, (B, T) int64 ids of one language -> (inputs, targets: the id where selected, else -1).
    Every position but 0 (XLM never predicts a stream's first) is selected with probability mask_prob, then becomes
    MASK / keeps its id / gets a uniform random id in [0, vocab_size) with `probs` (specials included, as XLM; with
    separate embeddings the language's own vocabulary: "we only sample random words within one language").
    at_least_one: one target per row (XLM's evaluation). [[1, 20, 21, 1]] -> [[1, 5, 21, 1]], [[-1, 20, -1, -1]]."""
    B, T = x.shape
    selected = torch.rand(B, T, generator=generator) < mask_prob
    selected[:, 0] = False
    if at_least_one and T > 1:
        selected[~selected.any(dim=1), T - 1] = True
    u = torch.rand(B, T, generator=generator)  # which of the three treatments
    random_ids = torch.randint(vocab_size, (B, T), generator=generator)
    inputs = torch.where(selected & (u >= probs[0] + probs[1]), random_ids, x)
    inputs[selected & (u < probs[0])] = MASK_ID
    return inputs, torch.where(selected, x, torch.full_like(x, -1))


def get_lr(step, lr=1e-4, warmup=30000, init_lr=1e-7, schedule="inverse_sqrt", max_steps=None):
    """XLM's adam_inverse_sqrt (the paper's): linear warm-up from init_lr to lr over `warmup` updates, then
    lr * sqrt(warmup / step), e.g. get_lr(120000) = 5e-5. schedule="linear" (--toy): the same warm-up, then straight
    down to 0 at max_steps, so a short run ends annealed."""
    if step < warmup:
        return init_lr + step * (lr - init_lr) / warmup
    if schedule == "linear":
        return lr * max(0.0, (max_steps - step) / max(max_steps - warmup, 1))
    return lr * math.sqrt(warmup / max(step, 1)) if warmup > 0 else lr


def sampling_probs(sentence_counts, alpha=ALPHA):
    """XLM's language sampling: q_l = n_l / sum n, p_l = q_l^alpha / sum_k q_k^alpha."""
    n = np.asarray(sentence_counts, dtype=np.float64)
    if (n <= 0).any():
        raise ValueError(f"every language needs at least one sentence, got counts {list(sentence_counts)}")
    q = n / n.sum()
    p = q ** alpha
    return p / p.sum()

# -----------------------------------------------------------------------------
# streams (XLM src/data/dataset.py StreamDataset), read straight from the memory-mapped ids

def n_stream_batches(n_tokens, batch_size, bptt):
    """Number of (batch_size x bptt) stream batches XLM cuts an array of n_tokens into."""
    return math.ceil(n_tokens / (batch_size * bptt))


def get_batch(ids, i, batch_size, bptt):
    """Batch i of XLM's stream layout, batch-first (batch_size, bptt) int64. XLM left-pads the corpus (`</s>` after
    every sentence) with `</s>` to a multiple of batch_size * bptt, lays it out as batch_size contiguous columns
    with one extra `</s>` row on top, and batch i is rows [i*bptt, (i+1)*bptt): no <pad>, sentences cut wherever
    the window ends. The indices are computed, so a Wikipedia-size memmap is never copied."""
    n = len(ids)
    L = n_stream_batches(n, batch_size, bptt) * bptt
    pad = L * batch_size - n
    rows = np.arange(i * bptt, (i + 1) * bptt)                     # rows of XLM's `data`
    k = np.arange(batch_size)[:, None] * L + rows[None, :] - 1      # index into the padded buffer
    is_eos = (rows[None, :] == 0) | (k < pad)                       # the top row or the left padding
    out = np.asarray(ids[np.clip(k - pad, 0, n - 1)], dtype=np.int64)
    out[is_eos] = EOS_ID
    return out


class StreamSampler:
    """Next (language drawn with `probs`, batch index from that language's current permutation, a fresh one each
    pass as XLM shuffles), from its own seeded RNG: every rank draws independently; state_dict() resumes it."""

    def __init__(self, n_batches, probs, seed):
        self.n_batches, self.probs = list(n_batches), np.asarray(probs, dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self.order = [np.zeros(0, dtype=np.int64) for _ in self.n_batches]
        self.pos = [0 for _ in self.n_batches]

    def next(self):
        lang = int(self.rng.choice(len(self.probs), p=self.probs))
        if self.pos[lang] >= len(self.order[lang]):
            self.order[lang] = self.rng.permutation(self.n_batches[lang])
            self.pos[lang] = 0
        i = int(self.order[lang][self.pos[lang]])
        self.pos[lang] += 1
        return lang, i

    def state_dict(self):
        # no copy of the permutations: next() replaces an order, it never changes one in place
        return {"rng": self.rng.bit_generator.state, "pos": list(self.pos),
                "order": [torch.from_numpy(np.asarray(o, dtype=np.int64)) for o in self.order]}

    def load_state_dict(self, d):
        self.rng.bit_generator.state = d["rng"]
        self.pos = list(d["pos"])
        self.order = [o.numpy().astype(np.int64) for o in d["order"]]

# -----------------------------------------------------------------------------
# evaluation (XLM evaluate_mlm: deterministic masking, all selected tokens -> MASK), and --sep's unused parameters

@torch.no_grad()
def evaluate_ppl(model, ids, lang, vocab_size, bptt, device, ctx, windows_per_forward=32):
    """MLM perplexity of a dev stream (batch size 1 as XLM, windows stacked for speed), masking seeded with 0:
    exp(sum CE / number of targets); inf when that overflows (a diverged model), NaN when the loss is NaN."""
    was_training, g, total, count = model.training, torch.Generator().manual_seed(0), 0.0, 0
    model.eval()
    n = n_stream_batches(len(ids), 1, bptt)
    for start in tqdm(range(0, n, windows_per_forward), desc=f"eval lang {lang}", leave=False, mininterval=2,
                      disable=not sys.stderr.isatty()):  # stderr, on a terminal only
        x = np.concatenate([get_batch(ids, i, 1, bptt) for i in range(start, min(n, start + windows_per_forward))])
        inputs, targets = mask_tokens(torch.from_numpy(x), vocab_size, g, probs=(1.0, 0.0, 0.0), at_least_one=True)
        k = int((targets != -1).sum())
        with ctx:
            _, loss = model(inputs.to(device), lang, targets.to(device))
        total += float(loss) * k
        count += k
    model.train(was_training)
    mean = total / count  # above ~709.8 nats math.exp overflows: a diverged model
    return float("inf") if mean > math.log(sys.float_info.max) else math.exp(mean)


def drop_unused_lang_grads(model, used):
    """None for the gradients of the language-specific parameters (--sep) of every language j that no micro-batch of
    this update was in, on any rank (used[j] == 0). The DDP zero term gives them an exact zero gradient, and Adam would
    still move them by momentum; with None Adam skips them: they change only on their own language's updates (XLM)."""
    for j, u in enumerate(used):
        if not u:
            for p in model.lang_specific_parameters(j):
                p.grad = None

# -----------------------------------------------------------------------------
# config and flags: the paper's values by default; --toy swaps in a CPU-sized preset; an explicit flag wins

PAPER = dict(n_layers=8, dim=768, n_heads=12, ffn_dim=3072, dropout=0.1, attention_dropout=0.1, batch_size=96,
             bptt=256, lr=1e-4, warmup=30000, epoch_size=200000, epochs=200, max_steps=10**12, eval_every=0,
             log_every=100, accumulate=1, schedule="inverse_sqrt", pos_offsets=0)
# chosen on the Default model only (RESULTS.md, "Calibrating the --toy preset") and frozen; streams at random offsets in
# positions 0..47 train every position a toy fine-tuning input uses
TOY = dict(n_layers=8, dim=64, n_heads=4, ffn_dim=256, batch_size=64, bptt=16, pos_offsets=48, lr=2e-3,
           warmup=500, schedule="linear", epoch_size=32000, max_steps=8000, eval_every=0, log_every=500, threads=1)
MERGES = {"paper": (80000, 40000), "toy": (2000, 1000)}  # (joint, per language for separate/prefixed)
# may differ on --resume (data are compared by vocabulary and token counts; --lr, --warmup: a diverged run goes on)
RESUME_MAY_CHANGE = {"resume", "max_steps", "snapshots", "epochs", "log_every", "eval_every", "device", "compile",
                     "workers", "threads", "out", "data", "train_files", "dev_files", "prep_dir", "overwrite",
                     "lr", "warmup", "max_bad_steps", "save_every"}
MAX_POSITIONS = 16384  # --bptt and --pos-offsets size the position table: a larger one is a typo, not a model
# torchrun: the other ranks wait in a collective while the master evaluates and writes checkpoint.pt (~1.4 GB at the
# paper's size); NCCL's default of 10 minutes would end a run whose dev sets are large
DDP_TIMEOUT = timedelta(minutes=60)


def build_parser():
    """The flags as parsed, nothing checked yet (get_args fills in the presets and checks every value); --help shows
    each flag's default (bpe.HelpFormatter), a preset's as "paper X; --toy Y"."""
    # every number flag is checked as argparse reads it (bpe.number: one line naming the flag and the value)
    count, natural, positions = number(1), number(0), number(1, MAX_POSITIONS, upto=True)
    fraction, rate = number(0, 1, float, upto=True), number(0, 1, float)
    seed = number(0, 2 ** 32)  # the masking generator is seeded with seed * 1000 + rank + 1 < 2^64
    p = argparse.ArgumentParser(prog="pretrain.py", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    a = p.add_argument

    def preset(flag, typ, what, **kw):  # unset: PAPER's value, or TOY's with --toy
        k = flag[2:].replace("-", "_")
        a(flag, type=typ, help=f"{what} (default: paper {PAPER[k]}" + (f"; --toy {TOY[k]})" if k in TOY else ")"),
          **kw)

    a("--out", required=True, metavar="DIR", help="run directory: checkpoint.pt, best.pt, log.jsonl (and toy/, data/); "
      "required")
    a("--toy", action="store_true", help="a switch: the CPU-sized presets, on the toy world given by --data (unset: a "
      "new one in OUT/toy)")
    a("--data", metavar="DIR", help="directory of {lang}.{train,dev}.txt (or toydata's mono/), or one bpe.py prepared "
      "(default with --toy: a new toy world in OUT/toy)")
    a("--train-files", metavar="LANG=PATH,...", help="text per language instead of --data, e.g. en=a.txt,fr=b.txt "
      "(with --dev-files)")
    a("--dev-files", metavar="LANG=PATH,...", help="dev text per language (with --train-files)")
    a("--langs", default="en,fr", help="comma-separated; the first is 'English' (model selection, paper: en,xx)")
    a("--resume", action="store_true",
      help="continue from OUT/checkpoint.pt (--lr, --warmup, --max-steps, --epochs may change)")
    a("--overwrite", action="store_true", help="start a new run in an --out holding an earlier run's files")
    a("--seed", type=seed, default=0, help="seed for init, data order, masking, dropout")
    # data preparation (bpe.prepare)
    a("--bpe", choices=MODES, default="joint", help="joint: Default; separate: Default anchors; prefixed: No anchors")
    a("--merges", type=count, help="BPE merge operations (default: paper 80000 joint, 40000 per "
      "language; --toy 2000 / 1000)")
    a("--code-switch", metavar="DICT", help="MUSE dictionary to code-switch the text with (Extra anchors, "
      "the training text code-switched once, when it is prepared), or toy (default: none)")
    a("--lowercase", action="store_true", help="lowercase and strip accents (XLM-15 style; off: the text as given)")
    a("--prep-dir", metavar="DIR", help="cache for prepared data (default: OUT/data)")
    a("--workers", type=count, default=1, help="processes for binarising text")
    # toy world (toydata.py)
    a("--toy-size", choices=list(TOY_SIZES), default="full", help="toy world size (tiny is for tests)")
    a("--toy-overlap", type=fraction, default=0.0, help="toy: fraction of shared word forms (anchors)")
    a("--toy-order", default="svo", help="toy: word order of the second language, e.g. sov-na-post (toydata.py)")
    a("--toy-domain-shift", type=fraction, default=0.0, help="toy: topic shift between the languages (Wiki-CC: 1.0)")
    a("--toy-cyrillic", action="store_true", help="toy: write the second language in Cyrillic letters")
    a("--toy-seed", type=natural, default=0, help="toy: world seed")
    # model (model.ModelConfig)
    a("--sep", default="", help="language-specific parts (Table 1): emb, 1-3, 1-6, emb,1-3, emb,1-6; "
      "also tok, pos (default: none, all shared)")
    a("--lang-emb", action="store_true", help="add language embeddings (off: the paper is silent; as the "
      "mBERT and XLM-17/100 checkpoints)")
    preset("--n-layers", count, "layers")
    preset("--dim", count, "hidden size")
    preset("--n-heads", count, "attention heads")
    preset("--ffn-dim", count, "feed-forward size")
    preset("--dropout", rate, "dropout")
    preset("--attention-dropout", rate, "attention dropout (as XLM's recipes; its flag's default is 0)")
    # optimisation
    preset("--batch-size", count, "examples (streams of --bptt tokens) per step, per GPU and micro-batch (x 8 GPUs "
           "in the paper)")
    preset("--bptt", positions, "tokens per stream")
    preset("--pos-offsets", number(0, MAX_POSITIONS, upto=True), "N: each stream starts at a random position in "
           "[0, N - bptt] (off: N <= bptt)")
    a("--accumulate", type=count, help="micro-batches per update (default 1; on 1 GPU, 8 = the paper's 8 GPUs)")
    preset("--lr", number(0, cast=float, above=True), "peak learning rate")
    preset("--warmup", natural, "linear warm-up updates from 1e-7")
    preset("--schedule", None, "after warm-up: inverse_sqrt (XLM) or linear to 0", choices=["inverse_sqrt", "linear"])
    a("--clip", type=number(0, cast=float), default=5.0, help="gradient clipping norm, 0 = off (XLM's "
      "clip_grad_norm; the paper names none)")
    preset("--epoch-size", count, "examples (streams) per GPU per epoch, XLM's meaning of an epoch")
    preset("--epochs", count, "epochs")
    a("--max-steps", type=count, help="stop after this many updates (default: paper none; --toy 8000)")
    a("--eval-every", type=natural, help="also evaluate and save every N updates (default 0: once per epoch)")
    a("--snapshots", default="", metavar="STEP,...", help="also keep the model at these updates as OUT/step{N}.pt "
      "(default: none)")
    a("--save-every", type=natural, default=0, metavar="N", help="write checkpoint.pt at an evaluation only N or "
      "more updates after the last one (default 0: at every evaluation; the run's end and a stop always save). Larger: "
      "less time writing while the other GPUs wait, but a crash redoes up to N updates")
    preset("--log-every", count, "progress line every N updates")
    a("--max-bad-steps", type=count, default=5, help="stop after this many NaN/inf losses in a row")
    # system
    a("--device", default="auto", help="auto, cpu, cuda (cuda:LOCAL_RANK under torchrun), cuda:N, mps")
    a("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
      help="autocast: auto = bf16 on GPUs that support it, else fp16 with a GradScaler; fp32 on CPU and MPS")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--threads", type=count, help="CPU threads for torch (default torch's; --toy 1)")
    return p


def get_args(argv=None):
    """The flags, presets filled in, every value checked before any work (one usage line each); resolves --sep."""
    p = build_parser()
    args = p.parse_args(argv)
    for k, v in {**PAPER, **(TOY if args.toy else {})}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.merges is None:
        args.merges = MERGES["toy" if args.toy else "paper"][args.bpe != "joint"]

    def check(condition, message):  # a usage line, exit 2
        if not condition:
            p.error(message)

    def parsed(prefix, parse, *a):  # a parser's ValueError -> one usage line
        try:
            return parse(*a)
        except ValueError as e:
            p.error(prefix + str(e))

    langs = args.langs.split(",")
    check(not (args.overwrite and args.resume), "--overwrite starts a new run; it cannot be combined with --resume")
    check(all(map(str.isalpha, langs)) and len(set(langs)) == len(langs),
          f"--langs {args.langs}: expected distinct languages, each a code of letters, e.g. en,fr")
    check(args.dim % args.n_heads == 0, f"--dim {args.dim} is not divisible by --n-heads {args.n_heads}")
    snapshots = args.snapshots.replace(",", " ").split()
    check(all(x.isdigit() and int(x) > 0 for x in snapshots), f"--snapshots {args.snapshots}: expected e.g. 500,1000")
    args.snapshots = sorted({int(x) for x in snapshots})
    vars(args).update(parsed("", parse_sep, args.sep, args.n_layers))  # sep_emb, sep_tok, sep_pos, sep_layers
    if args.toy:  # toydata.py's own check, before anything is written
        parsed("--toy-order: ", parse_order, args.toy_order)
    # the data: --data, --train-files/--dev-files or the toy world in OUT/toy; prepared in --prep-dir
    check((args.train_files is None) == (args.dev_files is None), "--train-files and --dev-files go together")
    if args.train_files:
        check(args.data is None, "give either --data or --train-files/--dev-files, not both")
        args.train_files = parsed("", parse_lang_files, "--train-files", args.train_files, langs)
        args.dev_files = parsed("", parse_lang_files, "--dev-files", args.dev_files, langs)
    args.prep_dir = args.prep_dir or os.path.join(args.out, "data")
    args.toy_world = args.toy and args.data is None and not args.train_files
    if args.toy_world:
        check(len(langs) <= 2, f"--langs {args.langs}: the toy world is bilingual (toydata.py); give one or two")
        args.data = os.path.join(args.out, "toy")
    check(args.data is not None or args.train_files, "--data (or --train-files/--dev-files, or --toy) is required")
    if args.code_switch:
        check(not args.sep_tok,
              "--code-switch needs one shared vocabulary; it cannot be combined with --sep emb or tok")
        check(len(langs) == 2, "--code-switch needs exactly two --langs (the dictionary's source and target)")
        toy_dict = os.path.join(args.data or "", "dict", f"{langs[0]}-{langs[1]}.txt")  # written with the toy world
        args.code_switch = toy_dict if args.code_switch == "toy" else args.code_switch
        check(os.path.isfile(args.code_switch) or args.toy_world and args.code_switch == toy_dict,
             f"--code-switch {args.code_switch}: no such file (for 'toy': --toy, or --data a toydata.py world)")
    return args

# -----------------------------------------------------------------------------
# the run directory, and the one form of advice printed when a run stops: a command this program accepts

def run_files(out):
    """What an earlier run wrote in --out: checkpoint.pt, best.pt, log.jsonl and its step{N}.pt snapshots. The toy
    world (toy/, toy.json) and the prepared data (data/) are inputs, reused by every run in --out."""
    names = set(os.listdir(out)) if os.path.isdir(out) else set()
    snapshots = sorted((f for f in names if re.fullmatch(r"step\d+\.pt", f)), key=lambda f: int(f[4:-3]))
    return [f for f in ("checkpoint.pt", "best.pt", "log.jsonl") if f in names] + snapshots


@contextmanager
def removed_if_left_empty(*paths):
    """The directories among `paths` and their parents that do not exist yet are removed again, the deepest first, when
    the body fails and they are still empty (--out, --prep-dir: the inputs are checked after make_dir)."""
    new = set()
    for path in map(os.path.abspath, paths):
        while not os.path.exists(path):
            new.add(path)
            path = os.path.dirname(path)
    try:
        yield
    except BaseException:
        for d in sorted(new, key=len, reverse=True):  # a child's path is longer than its parent's
            try:
                os.rmdir(d)
            except OSError:  # not empty (or never made): kept
                pass
        raise


def command(argv, then, lr=None):
    """`python pretrain.py ARGV` made to go on (then="--resume") or to start again (then="--overwrite"), with
    another --lr if given: every piece of advice the program prints is built here, so it is always accepted
    (the same command plus --resume would be refused when it holds --overwrite)."""
    drop, kept, skip_value = ("--resume", "--overwrite") + (("--lr",) if lr else ()), [], False
    for a in argv:
        name = a.split("=", 1)[0]
        hit = name.startswith("--") and len(name) > 2 and any(d.startswith(name) for d in drop)  # argparse prefixes
        if not (hit or skip_value):
            kept.append(a)
        skip_value = hit and "=" not in a and "--lr".startswith(name)
    launcher = "torchrun ... pretrain.py" if "LOCAL_RANK" in os.environ else "python pretrain.py"
    return f"{launcher} {shlex.join(kept + [then] + (['--lr', f'{lr:g}'] if lr else []))}"


def print_above_bars(*a, **k):
    """print, the progress bars on the terminal cleared first and drawn again after (the master's log lines)."""
    with tqdm.external_write_mode(file=k.get("file")):
        print(*a, **k)


def how_to_go_on(ckpt_path, saved_step, argv, lr=None):
    if saved_step is None:
        return "nothing was saved; start again with " + command(argv, "--overwrite", lr)
    return f"{ckpt_path} holds step {saved_step}; go on with " + command(argv, "--resume", lr)


class StopSignal:
    """SIGTERM (a preempted job) and Ctrl-C. Before training either stops the program at once (nothing to save).
    During training the first one only sets `signum` (a handler may interrupt a print): the loop finishes the update,
    saves checkpoint.pt and exits 128 + signal. A repeated SIGTERM is ignored, so it cannot abort that save: torchrun
    forwards the SIGTERM it gets to its workers, and a scheduler may signal them directly too. A second Ctrl-C stops
    at once without saving (checkpoint.pt is written atomically: the previous one stays)."""

    def __init__(self, advice):
        self.signum, self.training, self.advice = None, False, advice  # advice(): how to go on, for a 2nd Ctrl-C
        self.old = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if not self.training:  # only inputs were written so far (toy/, data/), which the same command reuses
            raise SystemExit(f"error: stopped by {name} before training started; run the same command")
        if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT:
            raise SystemExit(f"error: stopped by a second SIGINT without saving; {self.advice()}")

    def restore(self):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

# -----------------------------------------------------------------------------
# checkpoint.pt: read (--resume), restore and save. Everything needed to go on bit for bit, every rank's RNGs


def read_checkpoint(path, args, argv):
    """--resume: OUT/checkpoint.pt, refused in one line when missing, damaged, not pretrain.py's, made with other flags
    (RESUME_MAY_CHANGE aside) or holding NaN/inf weights. -> (checkpoint, the --lr/--warmup changes as text)."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: --resume: no checkpoint.pt to go on from in {args.out}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types here: RuntimeError, EOFError, OSError "[Errno 22]", ...
        torch_says = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:100]
        raise SystemExit(f"error: --resume: {path} is damaged or truncated ({os.path.getsize(path)} bytes; "
                         f"torch: {torch_says}); it cannot be continued")
    if not isinstance(ckpt, dict) or not {"args", "model", "optimizer", "rng"} <= set(ckpt):
        raise SystemExit(f"error: --resume: {path} is not a checkpoint written by pretrain.py")
    old, new = ckpt["args"], vars(args)
    diff = "".join(f"\n  --{k.replace('_', '-')}: {old.get(k)!r} in the checkpoint, {new[k]!r} now"
                   for k in sorted(new) if k not in RESUME_MAY_CHANGE and old.get(k) != new[k])
    if diff:
        raise SystemExit(f"error: --resume: {path} was made with different flags:{diff}")
    bad = [k for k, v in ckpt["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise SystemExit(f"error: --resume: {path} holds NaN or inf weights ({bad[0]}, {len(bad)} tensors): the run "
                         f"cannot go on from it; start again with {command(argv, '--overwrite', lr=args.lr / 2)}")
    return ckpt, ", ".join(f"--{k} {old.get(k)} -> {new[k]}" for k in ("lr", "warmup") if old.get(k) != new[k])


def rng_states(run):
    """This rank's RNG states for checkpoint.pt; the sampler's and the masking's from before the micro-batch drawn
    ahead (next_micro_batch), so that --resume draws it again."""
    sampler, mask = run.rng_before_next
    return {"sampler": sampler, "mask": mask, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if run.device_type == "cuda" else None}


def restore_checkpoint(run, ckpt):
    """The model, optimizer, scaler, progress and this rank's RNG states from a read_checkpoint(); log.jsonl is cut
    back to what it held then (what was logged after the checkpoint is done again)."""
    if ckpt["tokenizer"] != run.tok.to_dict() or ckpt["data"]["n_tokens"] != run.n_tokens:
        raise SystemExit(f"error: --resume: the data in {run.data_dir} are not the ones {run.ckpt_path} was trained on")
    if len(ckpt["rng"]) != run.world_size:  # every rank goes on from its own RNG states
        raise SystemExit(f"error: --resume: {run.ckpt_path} goes on with {len(ckpt['rng'])} processes only")
    run.raw_model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt["scaler"] and run.scaler.is_enabled():  # empty when the run was not fp16
        run.scaler.load_state_dict(ckpt["scaler"])
    run.step, run.epoch, run.n_streams, run.best_ppl = ckpt["step"], ckpt["epoch"], ckpt["n_streams"], ckpt["best_ppl"]
    rng, run.saved_step = ckpt["rng"][run.rank], run.step
    run.sampler.load_state_dict(rng["sampler"])
    run.mask_gen.set_state(rng["mask"])
    torch.set_rng_state(rng["torch"])
    if run.device_type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"])
    if run.master and os.path.exists(run.log_path) and os.path.getsize(run.log_path) > ckpt["log_bytes"]:
        os.truncate(run.log_path, ckpt["log_bytes"])
        run.log(f"{run.log_path}: records after step {run.step} dropped (they are redone from the checkpoint)")


def save_checkpoint(run):
    """checkpoint.pt, written by the master (atomically) with every rank's RNG states (a collective). Under torchrun
    a stop must fit in the 30 s between its SIGTERM and its SIGKILL to the workers: a slower write is reported."""
    t0, rngs = time.time(), [rng_states(run)]
    if run.ddp:
        rngs, mine = [None] * run.world_size, rngs[0]
        dist.all_gather_object(rngs, mine)
    if run.master:
        checkpoint = {"model": run.raw_model.state_dict(), "optimizer": run.optimizer.state_dict(),
                      "scaler": run.scaler.state_dict(), "config": asdict(run.config), "args": vars(run.args),
                      "tokenizer": run.tok.to_dict(), "langs": run.langs, "step": run.step, "epoch": run.epoch,
                      "n_streams": run.n_streams, "best_ppl": run.best_ppl, "rng": rngs,
                      "data": {"dir": run.data_dir, "n_tokens": run.n_tokens},
                      "log_bytes": os.path.getsize(run.log_path) if os.path.exists(run.log_path) else 0}
        atomic_write(run.ckpt_path, lambda tmp: torch.save(checkpoint, tmp))
    run.saved_step, seconds = run.step, time.time() - t0
    if run.ddp and seconds > 10 and not run.warned_slow_save:
        run.warned_slow_save = True
        run.log(f"warning: writing {run.ckpt_path} took {seconds:.0f} s: torchrun kills its workers 30 s after "
                "forwarding a SIGTERM, so a stop may keep only the checkpoint before it (see --save-every)")

# -----------------------------------------------------------------------------
# setup: device, data (the toy world, bpe.prepare), model and optimizer


def setup_device(args, ddp):
    """model.pick_device (bf16 only on a GPU of compute capability >= 8.0), then set_device and --threads."""
    try:  # "cuda" -> "cuda:LOCAL_RANK" (or cuda:0): set_device and DDP need the index
        device, dtype, backend = pick_device(args.device, args.dtype, int(os.environ["LOCAL_RANK"]) if ddp else None)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    if args.threads:
        torch.set_num_threads(args.threads)
    return device, dtype, backend


def write_toy_world(args, langs, master):
    """--toy without --data: the master writes toydata.write_world's world to OUT/toy once (OUT/toy.json records its
    knobs; a later run with other --toy-* flags is refused); the other ranks wait for it."""
    knobs = {"langs": langs if len(langs) > 1 else ["en", "fr"], "overlap": args.toy_overlap, "order": args.toy_order,
             "domain_shift": args.toy_domain_shift, "cyrillic": args.toy_cyrillic, "seed": args.toy_seed,
             **TOY_SIZES[args.toy_size]}
    record = os.path.join(args.out, "toy.json")
    if master and not os.path.exists(record):
        print(f"writing the toy world to {args.data}")
        try:
            write_world(args.data, force=True, **knobs)
        except OSError as e:  # a full disk, an unwritable directory
            raise SystemExit(f"error: cannot write the toy world: {e.filename or args.data}: {e.strerror or e}")
        write_text(record, json.dumps(knobs))
    while not os.path.exists(record):
        time.sleep(2)
    with open(record) as f:
        if json.load(f) != knobs:
            raise SystemExit(f"error: {args.data} was written with other --toy-* flags; use another --out")


def load_data(args, langs, master):
    """bpe.prepare (inputs checked first; the master prepares, the other ranks wait), then what it wrote: tokenizer,
    memory-mapped ids per language, vocabulary sizes. A batch larger than a language's data is refused."""
    files = {l: {"train": args.train_files[l], "dev": args.dev_files[l]} for l in langs} if args.train_files else None
    data_dir = prepare(langs, args.prep_dir, args.data, files, mode=args.bpe, merges=args.merges,
                       separate_vocab=args.sep_tok, lowercase=args.lowercase, seed=args.seed,
                       code_switch=args.code_switch, workers=args.workers, master=master)
    try:
        tok = Tokenizer.load(os.path.join(data_dir, "tokenizer.json"))
        train, meta = zip(*(load_bin(os.path.join(data_dir, f"{l}.train")) for l in langs))  # ids, header per lang
        dev = [load_bin(os.path.join(data_dir, f"{l}.dev"))[0] for l in langs]
        vocab_sizes = [tok.vocab_size(l) for l in langs]
    except (OSError, ValueError, KeyError) as e:  # KeyError: a tokenizer without one of --langs
        raise SystemExit(f"error: cannot read the prepared data in {data_dir}: {e}")
    n_tokens = [len(ids) for ids in train]
    smallest, lang = min(zip(n_tokens, langs))
    if args.batch_size * args.bptt > smallest:  # every batch would be mostly `</s>` padding (a 10^9 typo: no memory)
        raise SystemExit(f"error: --batch-size {args.batch_size} x --bptt {args.bptt} is more than the {lang} training "
                         f"data ({smallest} tokens); lower --batch-size")
    return SimpleNamespace(data_dir=data_dir, tok=tok, train=train, dev=dev, vocab_sizes=vocab_sizes, n_tokens=n_tokens,
                           probs=sampling_probs([m["n_sentences"] for m in meta]))


def build_adam(params, lr, device_type):
    """Adam with ADAM's values, fused (one kernel for every parameter) on a GPU and on the CPU, where the
    per-parameter loop of the default Adam was 7 % of a --toy update (tests/bench_toy_step.py)."""
    return torch.optim.Adam(params, lr=lr, fused=True if device_type in ("cuda", "cpu") else None, **ADAM)


def build(run, args, dtype):
    """Model (seeded alike on every rank), Adam (ADAM: XLM's values), AMP (autocast; a GradScaler for float16), then
    per-rank randomness: data order (numpy), masking (a torch CPU generator), dropout (torch's global generator)."""
    torch.manual_seed(args.seed)
    run.config = ModelConfig(vocab_size=max(run.vocab_sizes), n_langs=len(run.langs), n_layers=args.n_layers,
                             n_heads=args.n_heads, dim=args.dim, ffn_dim=args.ffn_dim, dropout=args.dropout,
                             attention_dropout=args.attention_dropout,
                             max_positions=max(512, args.bptt, args.pos_offsets), lang_emb=args.lang_emb,
                             sep_emb=args.sep_emb, sep_tok=args.sep_tok, sep_pos=args.sep_pos,
                             sep_layers=tuple(args.sep_layers),
                             vocab_sizes=tuple(run.vocab_sizes) if args.sep_tok else ())
    run.raw_model = run.model = MLM(run.config).to(run.device)
    run.params = list(run.raw_model.parameters())
    run.optimizer = build_adam(run.params, args.lr, run.device_type)
    run.ctx = autocast(run.device, dtype)
    run.scaler = torch.amp.GradScaler(run.device_type, enabled=(dtype == "float16"))
    run.sampler = StreamSampler([n_stream_batches(n, args.batch_size, args.bptt) for n in run.n_tokens], run.probs,
                                seed=[args.seed, run.rank])
    run.mask_gen = torch.Generator().manual_seed(args.seed * 1000 + run.rank + 1)
    torch.manual_seed(args.seed * 1000 + run.rank + 2)
    run.step, run.epoch, run.n_streams, run.best_ppl, run.saved_step = 0, 0, 0, float("inf"), None

# -----------------------------------------------------------------------------
# one update: micro-batches, the ranks' agreement, the optimizer step with its skip rule; evaluation


def next_micro_batch(run):
    """The host side of the next micro-batch: its language and stream batch (the sampler), the masking, the
    --pos-offsets start, then on the device (pinned on a GPU, so the copy does not wait). forward_backward draws it
    while the GPU still runs the backward before it. -> (lang, (inputs, targets, target positions, offset or None))."""
    args = run.args
    run.rng_before_next = (run.sampler.state_dict(), run.mask_gen.get_state())  # for checkpoint.pt (rng_states)
    lang, i = run.sampler.next()
    x = torch.from_numpy(get_batch(run.train[lang], i, args.batch_size, args.bptt))
    inputs, targets = mask_tokens(x, run.vocab_sizes[lang], run.mask_gen)
    where = (targets.view(-1) != -1).nonzero().squeeze(1)  # on the host: MLM.forward need not ask the GPU
    offset = None
    if args.pos_offsets > args.bptt:  # --pos-offsets: each stream starts at a random position
        offset = torch.randint(args.pos_offsets - args.bptt + 1, (args.batch_size,), generator=run.mask_gen)
    pin = run.device_type == "cuda"
    return lang, tuple(t if t is None else (t.pin_memory() if pin else t).to(run.device, non_blocking=True)
                       for t in (inputs, targets, where, offset))


def forward_backward(run):
    """One update's `accumulate` micro-batches, each of one language (XLM mlm_step). -> (mean loss, languages)."""
    args, loss_sum, seen = run.args, torch.zeros((), device=run.device), []
    for micro in range(args.accumulate):
        lang, (inputs, targets, where, offset) = run.next_batch
        seen.append(lang)
        if run.ddp:  # sync gradients only on the last micro-batch
            run.ddp_model.require_backward_grad_sync = micro == args.accumulate - 1
        with run.ctx:
            _, loss = run.model(inputs, lang, targets, pos_offset=offset, target_index=where)
            if run.ddp and run.raw_model.has_lang_specific():  # + 0 x the other languages' own parameters: DDP
                others = [p for j in range(len(run.langs)) if j != lang
                          for p in run.raw_model.lang_specific_parameters(j)]
                loss = loss + sum(p.view(-1)[0] for p in others) * 0.0  # sees them used (no find_unused_parameters)
        run.scaler.scale(loss / args.accumulate).backward()
        run.next_batch = next_micro_batch(run)  # host work while the GPU runs this backward; one ahead, at the end too
        loss_sum += loss.detach().float()
        run.n_streams += args.batch_size
    return loss_sum / args.accumulate, seen


def clip_gradients(run):
    """clip_grad_norm_ at --clip (0: none) -> the norm before clipping, a tensor on the device (not read here)."""
    return torch.nn.utils.clip_grad_norm_(run.params, run.args.clip if run.args.clip > 0 else math.inf)


def agree(run, loss, seen, grad_norm):
    """The update's one host-device sync (the scaler's float16 adds its own) and, under torchrun, its one all_reduce:
    the mean loss over ranks, which languages any rank's micro-batches were in (--sep), a stop signal on any rank;
    the gradient norm (the same on every rank: DDP has averaged the gradients) comes back in the same read.
    -> (loss, used, signum or 0, grad norm: NaN when None was passed)."""
    n, signum = len(run.langs), run.stop.signum
    flags = torch.zeros(n + 2)
    flags[seen] = 1.0
    if signum:
        flags[n + (signum == signal.SIGTERM)] = 1.0
    norm = torch.full((1,), math.nan, device=run.device) if grad_norm is None else grad_norm.view(1).float()
    packed = torch.cat([loss.view(1).float(), flags.to(run.device, non_blocking=True), norm])
    if run.ddp:
        dist.all_reduce(packed[:n + 3])  # a sum: the loss is divided by the number of ranks below
    values = packed.tolist()
    stop = signal.SIGTERM if values[n + 2] else signal.SIGINT if values[n + 1] else 0
    return values[0] / run.world_size, values[1:n + 1], stop, values[n + 3]


def optimizer_step(run, loss, used, grad_norm):
    """Step, unless the loss or the gradient norm is not finite: then the update is skipped. Without a GradScaler
    the gradients were clipped before agree(); float16 unscales and clips here, once the loss is known finite (the
    GradScaler skips an overflow itself and lowers its scale). -> (grad norm, stepped, skipped)."""
    if run.raw_model.has_lang_specific():
        drop_unused_lang_grads(run.raw_model, used)
    stepped, skipped = False, True
    if math.isfinite(loss) and run.scaler.is_enabled():
        run.scaler.unscale_(run.optimizer)
        grad_norm = float(clip_gradients(run))
    if math.isfinite(loss) and (math.isfinite(grad_norm) or run.scaler.is_enabled()):
        scale = run.scaler.get_scale()
        run.scaler.step(run.optimizer)
        run.scaler.update()
        stepped, skipped = run.scaler.get_scale() >= scale, False
    run.optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped, skipped


def log_json(run, record):
    """A line of log.jsonl, written by the master."""
    try:
        if run.master:
            with open(run.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
    except OSError as e:
        raise SystemExit(f"error: cannot write {run.log_path}: {e.strerror}")


def evaluate(run):
    """The master's English and other dev perplexities (XLM evaluate_mlm); best.pt when English improves (paper
    §3.1), step{N}.pt at --snapshots; a non-finite one overwrites nothing. -> every one finite (all ranks agree)."""
    finite, args = True, run.args
    if run.master:
        ppl = {l: evaluate_ppl(run.raw_model, run.dev[j], j, run.vocab_sizes[j], args.bptt, run.device, run.ctx)
               for j, l in enumerate(run.langs)}
        finite = all(math.isfinite(v) for v in ppl.values())
        improved = finite and ppl[run.langs[0]] < run.best_ppl
        run.log(f"eval step {run.step} epoch {run.epoch}: dev ppl " + ", ".join(f"{l} {v:.2f}" for l, v in ppl.items())
                + (" (best)" if improved else ""))
        log_json(run, {"step": run.step, "epoch": run.epoch, "dev_ppl": ppl, "best": improved})  # before checkpoint.pt
        run.best_ppl = ppl[run.langs[0]] if improved else run.best_ppl
        names = (["best.pt"] if improved else []) + ([f"step{run.step}.pt"] if finite and run.step in args.snapshots
                                                     else [])
        for name in names:
            with write_errors(os.path.join(args.out, name)):  # save_model writes its own temp file, then renames it
                save_model(os.path.join(args.out, name), run.raw_model, tokenizer=run.tok.to_dict(), langs=run.langs,
                           args=vars(args), step=run.step, dev_ppl=ppl)
    if run.ddp:  # the master's verdict: every rank stops after the same update
        flag = torch.tensor([float(not finite)], device=run.device)
        dist.all_reduce(flag)
        finite = not flag.item()
    return finite

# -----------------------------------------------------------------------------
# main: setup, then the training loop


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = get_args(argv)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    run = SimpleNamespace(args=args, langs=args.langs.split(","), ddp="RANK" in os.environ, rank=rank,
                          world_size=world_size, master=rank == 0, ckpt_path=os.path.join(args.out, "checkpoint.pt"),
                          log_path=os.path.join(args.out, "log.jsonl"), warned_slow_save=False, saved_step=None)
    run.device, dtype, backend = setup_device(args, run.ddp)
    run.device_type = torch.device(run.device).type  # cuda, cpu or mps
    run.log = log = print_above_bars if run.master else (lambda *a, **k: None)
    run.stop = StopSignal(lambda: how_to_go_on(run.ckpt_path, run.saved_step, argv))

    # the run directory: a new run refuses an earlier run's files unless --overwrite; --resume reads checkpoint.pt
    found = run_files(args.out)
    if found and not (args.resume or args.overwrite):
        raise SystemExit(f"error: --out {args.out} holds {', '.join(found)} of an earlier run; pass --resume to "
                         "continue it (with its checkpoint.pt), --overwrite to start again, or another --out")
    ckpt, changed = read_checkpoint(run.ckpt_path, args, argv) if args.resume else (None, "")
    with removed_if_left_empty(args.out, args.prep_dir):  # a refused --data leaves no empty --out behind
        make_dir("--out", args.out)
        if args.toy_world:
            write_toy_world(args, run.langs, run.master)
        vars(run).update(vars(load_data(args, run.langs, run.master)))
    build(run, args, dtype)
    if ckpt:
        restore_checkpoint(run, ckpt)
        log(f"resumed from {run.ckpt_path} at step {run.step}, epoch {run.epoch}"
            + (f" ({changed})" if changed else ""))
        del ckpt
    if run.master and args.overwrite:  # a new run: no file of the earlier one is mixed in
        for name in found:
            os.remove(os.path.join(args.out, name))
    if run.ddp:  # the other ranks wait for the master's evaluation and checkpoint in their next collective
        dist.init_process_group(backend=backend, timeout=DDP_TIMEOUT)
        run.model = run.ddp_model = DDP(run.raw_model, device_ids=[torch.device(run.device).index]
                                        if run.device_type == "cuda" else None)
    if args.compile:  # after DDP: the graph is split at its gradient buckets, so their all-reduce overlaps backward
        run.model = torch.compile(run.model)
    tokens_per_update = args.batch_size * args.bptt * args.accumulate * world_size
    log(f"languages {run.langs} (sampling p = {np.round(run.probs, 3).tolist()}), vocab sizes {run.vocab_sizes}, "
        f"train tokens {run.n_tokens}")
    log(f"model: {sum(p.numel() for p in run.params):,} parameters, sep={args.sep or 'none'}, bpe={args.bpe}; "
        f"{tokens_per_update:,} tokens per update ({args.batch_size} streams x {args.bptt} x {args.accumulate} "
        f"accumulation x {world_size} processes), dtype {dtype}, device {run.device}")

    # training loop: one update = `accumulate` micro-batches; evaluation at the end of an epoch and of the run, every
    # --eval-every and at --snapshots; checkpoint.pt then (--save-every permitting) and when a signal stops the run
    bad_steps, stopped_by, diverged, t0 = 0, 0, None, time.time()
    updates = min(args.max_steps, args.epochs * math.ceil(args.epoch_size / (args.batch_size * args.accumulate)))
    bar = tqdm(total=updates, initial=run.step, unit="update", desc="pretrain", mininterval=1,
               disable=not run.master or not sys.stderr.isatty())  # stderr, on a terminal only
    run.stop.training = True
    run.next_batch = next_micro_batch(run)
    while run.step < args.max_steps and run.epoch < args.epochs and not stopped_by:
        lr = get_lr(run.step, args.lr, args.warmup, schedule=args.schedule, max_steps=args.max_steps)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        loss, seen = forward_backward(run)
        grad_norm = None if run.scaler.is_enabled() else clip_gradients(run)  # read by agree, in its one sync
        loss, used, stopped_by, grad_norm = agree(run, loss, seen, grad_norm)
        grad_norm, stepped, skipped = optimizer_step(run, loss, used, grad_norm)
        run.step, bad_steps = run.step + int(stepped), bad_steps + 1 if skipped else 0
        bar.update(int(stepped))
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if skipped:
            log(f"step {run.step}: non-finite loss {loss} / grad norm {grad_norm}, update skipped "
                f"({bad_steps} in a row)")
            log_json(run, {"step": run.step, "skipped": True, "loss": loss, "grad_norm": grad_norm})
            if bad_steps >= args.max_bad_steps:
                diverged = f"{bad_steps} non-finite losses in a row at step {run.step}"
                break
        if stepped and run.step % args.log_every == 0:
            tok_s, t0 = tokens_per_update * args.log_every / (time.time() - t0), time.time()
            log(f"step {run.step} | epoch {run.epoch} | loss {loss:.4f} | lr {lr:.2e} | grad norm {grad_norm:.2f} | "
                f"{tok_s:,.0f} tok/s")
            log_json(run, {"step": run.step, "epoch": run.epoch, "lang": ",".join(run.langs[j] for j in seen),
                           "loss": loss, "lr": lr, "grad_norm": grad_norm, "tok_per_s": tok_s})
        last = run.step >= args.max_steps or run.n_streams >= args.epoch_size and run.epoch + 1 >= args.epochs
        due = (run.n_streams >= args.epoch_size or run.step >= args.max_steps
               or stepped and (args.eval_every and run.step % args.eval_every == 0 or run.step in args.snapshots))
        if run.n_streams >= args.epoch_size:  # the epoch counter moves on (XLM)
            run.n_streams, run.epoch = 0, run.epoch + 1
        if due and not evaluate(run):
            log(f"warning: step {run.step}: dev ppl is not finite; checkpoint.pt and best.pt were not overwritten")
            diverged = f"the dev perplexity is not finite at step {run.step}"
            break
        if stopped_by or due and (last or run.step - (run.saved_step or 0) >= args.save_every):
            save_checkpoint(run)
    bar.close()
    run.stop.restore()
    if run.ddp:
        # no rank leaves before the master has written checkpoint.pt (torchrun kills the rest); NCCL: on this GPU
        dist.barrier(device_ids=[torch.device(run.device).index] if run.device_type == "cuda" else None)
        # free the DDP wrapper (its reducer holds gloo work) first: with torch 2.13 + gloo, destroying the group while
        # it lived aborted 3 of 25 two-process runs ("terminate called without an active exception"), 0 of 30 after
        del run.model, run.ddp_model
        gc.collect()
        dist.destroy_process_group()
    if stopped_by:
        log(f"stopped by {signal.Signals(stopped_by).name} after step {run.step}: saved {run.ckpt_path}; to go on, "
            f"run {command(argv, '--resume')}", file=sys.stderr)
        sys.exit(128 + stopped_by)  # the shell's code for a process ended by that signal
    if diverged:
        raise SystemExit(1 if not run.master else f"error: {diverged}; "
                         + how_to_go_on(run.ckpt_path, run.saved_step, argv, lr=args.lr / 2))
    log(f"done: step {run.step}, epoch {run.epoch}, best {run.langs[0]} dev ppl {run.best_ppl:.2f}; "
        f"files in {args.out}")


if __name__ == "__main__":
    main()
