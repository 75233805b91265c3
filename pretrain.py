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
import fcntl
import gc
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from bpe import (EOS_ID, MASK_ID, MODES, HelpFormatter, InputError, Tokenizer, atomic_write, load_bin, make_dir,
                 number, parse_lang_files, prepare, reported, write_errors, write_text)
from model import MLM, ModelConfig, autocast, load_model, parse_sep, pick_device, save_model
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
# evaluation (XLM evaluate_mlm: deterministic masking, all selected tokens -> MASK)

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
        total, count = total + float(loss) * k, count + k
    model.train(was_training)
    mean = total / count  # above ~709.8 nats math.exp overflows: a diverged model
    return float("inf") if mean > math.log(sys.float_info.max) else math.exp(mean)

# -----------------------------------------------------------------------------
# the presets: the paper's values by default; --toy swaps in a CPU-sized one; an explicit flag wins

PAPER = dict(n_layers=8, dim=768, n_heads=12, ffn_dim=3072, dropout=0.1, attention_dropout=0.1, batch_size=96,
             bptt=256, lr=1e-4, warmup=30000, epoch_size=200000, epochs=200, max_steps=10**12, eval_every=0,
             log_every=100, accumulate=1, schedule="inverse_sqrt", pos_offsets=0, pos_offsets_from=0)
# chosen on the Default model (RESULTS.md, "Calibrating the --toy preset"); streams at random offsets in positions 0..47
# train every position a toy fine-tuning input uses, from update 2,000 on: before, 16 positions leave the plateau sooner
TOY = dict(n_layers=8, dim=64, n_heads=4, ffn_dim=256, batch_size=64, bptt=16, pos_offsets=48, pos_offsets_from=2000,
           lr=2e-3, warmup=500, schedule="linear", epoch_size=32000, max_steps=8000, log_every=500, threads=1)
MERGES = {"paper": (80000, 40000), "toy": (2000, 1000)}  # (joint, per language for separate/prefixed)

# -----------------------------------------------------------------------------
# the run: its state, the next micro-batch, one update, the training loop

@dataclass(slots=True)  # slots: an attribute not declared here cannot be set
class Run:
    """Everything a run holds, declared here only: the setup below the ruler fills it in, train() moves it on and
    checkpoint.pt keeps what --resume needs."""
    args: argparse.Namespace            # the flags, presets filled in (get_args)
    langs: list                         # --langs; the first is "English": it selects best.pt (paper §3.1)
    rank: int = 0                       # torchrun's RANK and WORLD_SIZE
    world_size: int = 1
    ddp: bool = False                   # under torchrun
    device: str = "cpu"                 # cuda:LOCAL_RANK, cpu or mps
    stop: "StopSignal" = None           # SIGTERM / Ctrl-C: finish the update, save, exit
    data_dir: str = None                # bpe.prepare's folder: tokenizer.json, {lang}.{train,dev}.bin
    tok: Tokenizer = None
    train_ids: list = None              # per language: the memory-mapped token ids
    dev_ids: list = None
    vocab_sizes: list = None            # per language (its own with --sep emb, else all the same)
    n_tokens: list = None               # training tokens per language
    raw_model: MLM = None               # the model itself: checkpoints, evaluation, --sep's parameters
    model: torch.nn.Module = None       # what trains: raw_model, in DDP and/or torch.compile
    ddp_model: DDP = None               # under torchrun: its gradient sync is switched per micro-batch
    params: list = None
    optimizer: torch.optim.Optimizer = None
    ctx: object = None                  # autocast (model.autocast)
    scaler: torch.amp.GradScaler = None  # enabled for float16 only
    sampler: StreamSampler = None       # this rank's language and batch order (p ∝ n^0.7)
    mask_gen: torch.Generator = None    # this rank's masking and --pos-offsets
    step: int = 0                       # updates done
    epoch: int = 0
    n_streams: int = 0                  # streams of this epoch, on this rank
    best_ppl: float = math.inf          # the best English dev perplexity so far
    count_ppl: dict = None              # the master's count models of each dev set (count_baselines)
    saved_step: int = None              # the step checkpoint.pt holds (None: not written by this run)
    next_batch: tuple = None            # the micro-batch drawn ahead (next_micro_batch)
    rng_before_next: tuple = None       # the sampler's and masking's states from before it, for checkpoint.pt
    warned_slow_save: bool = False
    master = property(lambda self: self.rank == 0)
    device_type = property(lambda self: torch.device(self.device).type)  # cuda, cpu or mps
    ckpt_path = property(lambda self: os.path.join(self.args.out, "checkpoint.pt"))
    log_path = property(lambda self: os.path.join(self.args.out, "log.jsonl"))

    def log(self, *a, **k):  # the master's lines: the progress bar is cleared first and drawn again after
        if self.master:
            with tqdm.external_write_mode(file=k.get("file")):
                print(*a, **k)


def next_micro_batch(run, update):
    """The host side of the next micro-batch, for `update` (0-based): its language and stream batch (the sampler),
    the masking, the --pos-offsets start, then on the device (pinned on a GPU: the copy does not wait), drawn during
    the backward before it. -> (lang, (inputs, targets, target positions, offset or None))."""
    args = run.args
    run.rng_before_next = (run.sampler.state_dict(), run.mask_gen.get_state())  # for checkpoint.pt (save_checkpoint)
    lang, i = run.sampler.next()
    x = torch.from_numpy(get_batch(run.train_ids[lang], i, args.batch_size, args.bptt))
    inputs, targets = mask_tokens(x, run.vocab_sizes[lang], run.mask_gen)
    where = (targets.view(-1) != -1).nonzero().squeeze(1)  # on the host: MLM.forward need not ask the GPU
    offset = (torch.randint(args.pos_offsets - args.bptt + 1, (args.batch_size,), generator=run.mask_gen)
              if args.pos_offsets > args.bptt and update >= args.pos_offsets_from else None)  # or 0
    pin = run.device_type == "cuda"
    return lang, tuple(t if t is None else (t.pin_memory() if pin else t).to(run.device, non_blocking=True)
                       for t in (inputs, targets, where, offset))


def update(run):
    """One update (XLM mlm_step): `accumulate` micro-batches of one language each, forward and backward (DDP syncs
    the gradients on the last); the update's one host-device sync, under torchrun its one all_reduce, of the loss,
    the languages any rank's micro-batches were in, a stop signal on any rank and the gradient norm (DDP made it the
    same on every rank); clipping at --clip and Adam, skipped when the loss or the norm is not finite.
    -> (mean loss, grad norm, the micro-batches' languages, SIGTERM / SIGINT / 0, stepped, skipped)."""
    args, n, fp16 = run.args, len(run.langs), run.scaler.is_enabled()
    loss_sum, flags, seen = torch.zeros((), device=run.device), torch.zeros(n + 2), []
    for micro in range(args.accumulate):
        lang, (inputs, targets, where, offset) = run.next_batch
        seen.append(lang)
        if run.ddp:  # sync gradients only on the last micro-batch
            run.ddp_model.require_backward_grad_sync = micro == args.accumulate - 1
        with run.ctx:
            _, loss = run.model(inputs, lang, targets, pos_offset=offset, target_index=where)
            if run.ddp and run.raw_model.has_lang_specific():  # + 0 x the other languages' own parameters: DDP
                others = [p for j in range(n) if j != lang for p in run.raw_model.lang_specific_parameters(j)]
                loss = loss + sum(p.view(-1)[0] for p in others) * 0.0  # sees them used (no find_unused_parameters)
        run.scaler.scale(loss / args.accumulate).backward()
        run.next_batch = next_micro_batch(run, run.step + (micro == args.accumulate - 1))  # one ahead, the end too
        loss_sum += loss.detach().float()
        run.n_streams += args.batch_size
    flags[seen] = 1.0
    if run.stop.signum:
        flags[n + (run.stop.signum == signal.SIGTERM)] = 1.0
    norm = torch.nn.utils.get_total_norm([p.grad for p in run.params if p.grad is not None])
    packed = torch.cat([(loss_sum / args.accumulate).view(1), flags.to(run.device, non_blocking=True),
                        norm.view(1).float()])
    if run.ddp:
        dist.all_reduce(packed[:n + 3])  # a sum: the loss is divided by the number of ranks below
    values = packed.tolist()  # the sync
    loss, used, grad_norm = values[0] / run.world_size, values[1:n + 1], values[n + 3]
    stop = signal.SIGTERM if values[n + 2] else signal.SIGINT if values[n + 1] else 0
    for j in range(n) if run.raw_model.has_lang_specific() else ():  # --sep: the own parameters of a language that
        for p in run.raw_model.lang_specific_parameters(j) if not used[j] else ():  # no rank's micro-batch was in get
            p.grad = None  # no gradient, not DDP's zero one: Adam's momentum would move them (XLM: only their updates)
    scale, step = run.scaler.get_scale(), math.isfinite(loss) and (math.isfinite(grad_norm) or fp16)
    if step and fp16:  # float16: unscale_ only once the loss is known finite, as it must be followed by the scaler's
        run.scaler.unscale_(run.optimizer)  # step (which skips an overflow itself and lowers the scale)
        norm, grad_norm = norm / scale, grad_norm / scale  # the norm was taken of the scaled gradients
    if step:
        torch.nn.utils.clip_grads_with_norm_(run.params, args.clip if args.clip > 0 else math.inf, norm)
        run.scaler.step(run.optimizer)
        run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm, seen, stop, step and run.scaler.get_scale() >= scale, not step


def train(run):
    """The training loop: get_lr, one update, the progress line; an evaluation (best.pt) at the end of an epoch and of
    the run, every --eval-every and at --snapshots, checkpoint.pt then (--save-every permitting) and when a signal
    stops the run. -> (the stopping signal or 0, why it diverged: --max-bad-steps non-finite losses, or dev ppl)."""
    args, bad_steps, stopped_by, diverged, t0, step0 = run.args, 0, 0, None, time.time(), run.step
    tokens_per_update = args.batch_size * args.bptt * args.accumulate * run.world_size
    updates = min(args.max_steps, args.epochs * math.ceil(args.epoch_size / (args.batch_size * args.accumulate)))
    bar = tqdm(total=updates, initial=run.step, unit="update", desc="pretrain", mininterval=1,
               disable=not run.master or not sys.stderr.isatty())  # stderr, on a terminal only
    run.stop.training, run.next_batch = True, next_micro_batch(run, run.step)
    while run.step < args.max_steps and run.epoch < args.epochs and not stopped_by:
        lr = get_lr(run.step, args.lr, args.warmup, schedule=args.schedule, max_steps=args.max_steps)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        loss, grad_norm, seen, stopped_by, stepped, skipped = update(run)
        run.step, bad_steps = run.step + int(stepped), bad_steps + 1 if skipped else 0
        bar.update(int(stepped))
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if skipped:
            run.log(f"step {run.step}: non-finite loss {loss} / grad norm {grad_norm}, update skipped "
                    f"({bad_steps} in a row)")
            log_json(run, {"step": run.step, "skipped": True, "loss": loss, "grad_norm": grad_norm})
            if bad_steps >= args.max_bad_steps:
                diverged = f"{bad_steps} non-finite losses in a row at step {run.step}"
                break
        if stepped and run.step % args.log_every == 0:
            tok_s, t0, step0 = tokens_per_update * (run.step - step0) / (time.time() - t0), time.time(), run.step
            run.log(f"step {run.step} | epoch {run.epoch} | loss {loss:.4f} | lr {lr:.2e} | grad norm {grad_norm:.2f} "
                    f"| {tok_s:,.0f} tok/s")
            log_json(run, {"step": run.step, "epoch": run.epoch, "lang": ",".join(run.langs[j] for j in seen),
                           "loss": loss, "lr": lr, "grad_norm": grad_norm, "tok_per_s": tok_s})
        last = run.step >= args.max_steps or run.n_streams >= args.epoch_size and run.epoch + 1 >= args.epochs
        due = (run.n_streams >= args.epoch_size or run.step >= args.max_steps
               or stepped and (args.eval_every and run.step % args.eval_every == 0 or run.step in args.snapshots))
        if run.n_streams >= args.epoch_size:  # the epoch counter moves on (XLM)
            run.n_streams, run.epoch = 0, run.epoch + 1
        if due and not evaluate(run):
            run.log(f"warning: step {run.step}: dev ppl is not finite; checkpoint.pt and best.pt were not overwritten")
            diverged = f"the dev perplexity is not finite at step {run.step}"
            break
        if stopped_by or due and (last or run.step - (run.saved_step or 0) >= args.save_every):
            save_checkpoint(run)
    bar.close()
    return stopped_by, diverged

# =====================================================================================================================
# The plumbing: flags, the run directory and signals, count models, checkpoints and log, setup, main

# -----------------------------------------------------------------------------
# flags (the presets above by default, each checked before any work); the run directory, its lock; signals, advice

RESUME_MAY_CHANGE = {"resume", "max_steps", "snapshots", "epochs", "log_every", "eval_every", "device", "compile",
                     "workers", "threads", "out", "data", "train_files", "dev_files", "prep_dir", "overwrite", "lr",
                     "warmup", "max_bad_steps", "save_every", "allow_overlap"}  # data: compared by their contents
MAX_POSITIONS = 16384  # --bptt and --pos-offsets size the position table: a larger one is a typo, not a model
DDP_TIMEOUT = timedelta(minutes=60)  # the other ranks wait while the master evaluates and saves (NCCL's 10 min: short)


def build_parser():
    count, natural, positions = number(1), number(0), number(1, MAX_POSITIONS, upto=True)
    fraction, rate, seed = number(0, 1, float, upto=True), number(0, 1, float), number(0, 2 ** 32)  # seed*1000+rank+1
    p = argparse.ArgumentParser("pretrain.py", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    a = p.add_argument

    def preset(flag, typ, what, **kw):  # unset: PAPER's value, or TOY's with --toy
        k = flag[2:].replace("-", "_")
        a(flag, type=typ, help=f"{what} (default: paper {PAPER[k]}{f'; --toy {TOY[k]}' if k in TOY else ''})", **kw)

    a("--out", required=True, metavar="DIR", help="run directory: checkpoint.pt, best.pt, log.jsonl...; required")
    a("--toy", action="store_true", help="a switch: the CPU-sized presets, on --data's toy world (or a new OUT/toy)")
    a("--data", metavar="DIR", help="{lang}.{train,dev}.txt (or mono/), or bpe.py's output (default: --toy's OUT/toy)")
    a("--train-files", metavar="LANG=PATH,...", help="text per language instead of --data (with --dev-files)")
    a("--dev-files", metavar="LANG=PATH,...", help="dev text per language (with --train-files)")
    a("--allow-overlap", action="store_true", help="accept a dev set that is the training text")
    a("--langs", default="en,fr", help="comma-separated; the first is 'English' (model selection, paper: en,xx)")
    a("--resume", action="store_true", help="continue from OUT/checkpoint.pt (--lr, --max-steps, ... may change)")
    a("--overwrite", action="store_true", help="start a new run in an --out holding an earlier run's files")
    a("--seed", type=seed, default=0, help="seed for init, data order, masking, dropout")
    a("--bpe", choices=MODES, default="joint", help="joint: Default; separate: Default anchors; prefixed: No anchors")
    a("--merges", type=count, help="BPE merges (default: paper 80000 joint, 40000 per language; --toy 2000 / 1000)")
    a("--code-switch", metavar="DICT", help="MUSE dictionary (or toy) to code-switch the training text (default: none)")
    a("--lowercase", action="store_true", help="lowercase and strip accents (XLM-15 style; off: the text as given)")
    a("--prep-dir", metavar="DIR", help="cache for prepared data (default: OUT/data)")
    a("--workers", type=count, default=1, help="processes for binarising text")
    a("--toy-size", choices=list(TOY_SIZES), default="full", help="toy world size (tiny is for tests)")
    a("--toy-overlap", type=fraction, default=0.0, help="toy: fraction of shared word forms (anchors)")
    a("--toy-order", default="svo", help="toy: word order of the second language, e.g. sov-na-post (toydata.py)")
    a("--toy-domain-shift", type=fraction, default=0.0, help="toy: topic shift between the languages (Wiki-CC: 1.0)")
    a("--toy-cyrillic", action="store_true", help="toy: write the second language in Cyrillic letters")
    a("--toy-seed", type=natural, default=0, help="toy: world seed")
    a("--sep", default="", help="language-specific parts, e.g. emb, 1-3, emb,1-6 (Table 1), tok, pos (default: none)")
    a("--lang-emb", action="store_true", help="add language embeddings (the paper is silent; mBERT, XLM-17/100 have)")
    for flag, typ, what in (("--n-layers", count, "layers"), ("--dim", count, "hidden size"),
                            ("--n-heads", count, "attention heads"), ("--ffn-dim", count, "feed-forward size"),
                            ("--dropout", rate, "dropout"), ("--bptt", positions, "tokens per stream"),
                            ("--epochs", count, "epochs"), ("--log-every", count, "progress line every N updates")):
        preset(flag, typ, what)
    preset("--attention-dropout", rate, "attention dropout (as XLM's recipes; its flag's default is 0)")
    preset("--batch-size", count, "streams of --bptt tokens per step, per GPU and micro-batch (x 8 GPUs: paper)")
    preset("--pos-offsets", number(0, MAX_POSITIONS, upto=True), "N: streams start at random in [0, N - bptt]")
    preset("--pos-offsets-from", natural, "--pos-offsets from update N on (before: each stream at 0)", metavar="N")
    a("--accumulate", type=count, help="micro-batches per update (default 1; on 1 GPU, 8 = the paper's 8 GPUs)")
    preset("--lr", number(0, cast=float, above=True), "peak learning rate")
    preset("--warmup", natural, "linear warm-up updates from 1e-7")
    preset("--schedule", None, "after warm-up: inverse_sqrt (XLM) or linear to 0", choices=["inverse_sqrt", "linear"])
    a("--clip", type=number(0, cast=float), default=5.0, help="gradient clipping norm, 0 = off (XLM's; paper: none)")
    preset("--epoch-size", count, "examples (streams) per GPU per epoch, XLM's meaning of an epoch")
    a("--max-steps", type=count, help="stop after this many updates (default: paper none; --toy 8000)")
    a("--eval-every", type=natural, help="also evaluate and save every N updates (default 0: once per epoch)")
    a("--snapshots", default="", metavar="STEP,...", help="also keep OUT/step{N}.pt at these updates (default: none)")
    a("--save-every", type=natural, default=0, metavar="N", help="checkpoint.pt at evaluations N+ updates apart")
    a("--max-bad-steps", type=count, default=5, help="stop after this many NaN/inf losses in a row")
    a("--device", default="auto", help="auto, cpu, cuda (cuda:LOCAL_RANK under torchrun), cuda:N, mps")
    a("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="autocast (auto: bf16 on "
      "GPUs that have it, else fp16 with a GradScaler; fp32 on CPU and MPS)")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--threads", type=count, help="CPU threads for torch (default torch's; --toy 1)")
    return p


def get_args(argv=None, p=None):
    args = (p or build_parser()).parse_args(argv)
    if {"RANK", "WORLD_SIZE"} & set(os.environ) and not {"LOCAL_RANK", "MASTER_ADDR"} <= set(os.environ):
        raise InputError("RANK / WORLD_SIZE are set in the environment, but this is no torchrun worker (no LOCAL_RANK "
                         "and MASTER_ADDR): unset them, or launch with torchrun")
    offsets_from_given = args.pos_offsets_from is not None  # on the command line, not the preset's
    for k, v in {**PAPER, **(TOY if args.toy else {})}.items():
        setattr(args, k, v if getattr(args, k) is None else getattr(args, k))
    args.merges = args.merges or MERGES["toy" if args.toy else "paper"][args.bpe != "joint"]
    langs, snapshots = args.langs.split(","), args.snapshots.replace(",", " ").split()
    updates = min(args.max_steps, args.epochs * math.ceil(args.epoch_size / (args.batch_size * args.accumulate)))
    try:  # toydata.py's own check of --toy-order, before anything is written (its message lacks the flag's name)
        if args.toy:
            parse_order(args.toy_order)
    except ValueError as e:
        raise InputError(f"--toy-order: {e}", 2) from None
    vars(args).update(parse_sep(args.sep, args.n_layers))  # sep_emb, sep_tok, sep_pos, sep_layers (or a usage line)
    if args.train_files and args.dev_files:  # both or neither (checked below)
        args.train_files = parse_lang_files("--train-files", args.train_files, langs)
        args.dev_files = parse_lang_files("--dev-files", args.dev_files, langs)
    args.prep_dir = args.prep_dir or os.path.join(args.out, "data")
    args.toy_world = args.toy and args.data is None and not args.train_files
    args.data = os.path.join(args.out, "toy") if args.toy_world else args.data
    toy_dict = os.path.join(args.data or "", "dict", f"{langs[0]}-{langs[-1]}.txt")  # written with the toy world
    cs = args.code_switch = toy_dict if args.code_switch == "toy" else args.code_switch
    refused = [  # (when, the usage line)
        (args.overwrite and args.resume, "--overwrite starts a new run; it cannot be combined with --resume"),
        (not all(map(str.isalpha, langs)) or len(set(langs)) < len(langs),
         f"--langs {args.langs}: expected distinct languages, each a code of letters, e.g. en,fr"),
        (args.dim % args.n_heads, f"--dim {args.dim} is not divisible by --n-heads {args.n_heads}"),
        (not all(x.isdigit() and int(x) > 0 for x in snapshots), f"--snapshots {args.snapshots}: expected 500,1000"),
        (max((int(x) for x in snapshots if x.isdigit()), default=0) > updates, f"--snapshots {args.snapshots}: the "
         f"run ends after {updates} updates (--max-steps, --epochs): a later snapshot would never be written"),
        (args.bptt < 2, f"--bptt {args.bptt}: a stream's first token is never predicted; at least 2 are needed"),
        (offsets_from_given and 0 < args.pos_offsets_from and args.pos_offsets <= args.bptt,
         f"--pos-offsets-from {args.pos_offsets_from}: no offsets to start (--pos-offsets {args.pos_offsets} is not "
         f"above --bptt {args.bptt})"),
        ((args.train_files is None) != (args.dev_files is None), "--train-files and --dev-files go together"),
        (args.train_files and args.data is not None, "give either --data or --train-files/--dev-files, not both"),
        (args.toy_world and len(langs) > 2, f"--langs {args.langs}: the toy world is bilingual; give one or two"),
        (args.data is None and not args.train_files, "--data (or --train-files/--dev-files, or --toy) is required"),
        (cs and args.sep_tok, "--code-switch needs one shared vocabulary; it cannot be combined with --sep emb or tok"),
        (cs and len(langs) != 2, "--code-switch needs exactly two --langs (the dictionary's source and target)"),
        (cs and not (os.path.isfile(cs) or args.toy_world and cs == toy_dict),
         f"--code-switch {cs}: no such file (for 'toy': --toy, or --data a toydata.py world)")]
    for message in (m for bad, m in refused if bad):
        raise InputError(message, 2)
    args.snapshots = sorted({int(x) for x in snapshots})
    return args

def run_files(out):
    """An earlier run's files in --out (toy/, toy.json, data/, args.json are inputs, reused by every run in --out)."""
    names = set(os.listdir(out)) if os.path.isdir(out) else set()
    snapshots = sorted((f for f in names if re.fullmatch(r"step\d+\.pt", f)), key=lambda f: int(f[4:-3]))
    return [f for f in ("checkpoint.pt", "best.pt", "log.jsonl") if f in names] + snapshots


@contextmanager
def locked(out, prep_dir, master):
    """--out made, locked by the master for all ranks (OUT/.lock: its pid); a failed run's new empty dirs go again."""
    new = set()
    for path in map(os.path.abspath, (out, prep_dir)):
        while not os.path.exists(path):
            new.add(path)
            path = os.path.dirname(path)
    make_dir("--out", out)
    with open(os.path.join(out, ".lock") if master else os.devnull, "a+") as f:
        try:
            master and fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"--out {out} is in use by another pretrain.py (pid {open(f.name).read().strip()} in "
                             f"{f.name}); wait for it to end, or use another --out") from None
        if master:
            f.truncate(0)
            print(os.getpid(), file=f, flush=True)
        try:
            yield
        finally:
            if master:
                os.remove(f.name)
            for d in sorted(new, key=len, reverse=True) if sys.exc_info()[0] else ():  # a child's path is longer
                with suppress(OSError):  # not empty: kept
                    os.rmdir(d)


def command(argv, then, lr=None):
    """ARGV made to go on (then="--resume") or start again ("--overwrite"), maybe at another --lr: all advice."""
    drop, kept, skip_value = ("--resume", "--overwrite") + (("--lr",) if lr else ()), [], False
    for a in argv:
        name = a.split("=", 1)[0]
        hit = name.startswith("--") and len(name) > 2 and any(d.startswith(name) for d in drop)  # argparse prefixes
        if not (hit or skip_value):
            kept.append(a)
        skip_value = hit and "=" not in a and "--lr".startswith(name)
    launcher = "torchrun ... pretrain.py" if "LOCAL_RANK" in os.environ else "python pretrain.py"
    return f"{launcher} {shlex.join(kept + [then] + (['--lr', f'{lr:g}'] if lr else []))}"


def how_to_go_on(ckpt_path, saved_step, argv, lr=None):
    return ("nothing was saved; start again with " + command(argv, "--overwrite", lr) if saved_step is None else
            f"{ckpt_path} holds step {saved_step}; go on with " + command(argv, "--resume", lr))


class StopSignal:
    """SIGTERM, Ctrl-C: at once before training; in it, the update is finished, checkpoint.pt saved, exit 128+sig."""

    def __init__(self, advice):
        self.signum, self.training, self.advice = None, False, advice  # advice(): how to go on, for a 2nd Ctrl-C
        self.old = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if not self.training:  # only inputs were written so far (toy/, data/), which the same command reuses
            raise SystemExit(f"error: stopped by {name} before training started; run the same command")
        self.signum, second = self.signum or signum, self.signum is not None
        if second and signum == signal.SIGINT:  # a 2nd ^C aborts; a repeated SIGTERM (torchrun's own) cannot
            raise SystemExit(f"error: stopped by a second SIGINT without saving; {self.advice()}")


# a forked child (bpe.binarize's pool) gets the default handlers: pool.terminate()'s SIGTERM ends it, even asleep in C
os.register_at_fork(after_in_child=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGINT)
                                            if isinstance(getattr(signal.getsignal(s), "__self__", None), StopSignal)])

# -----------------------------------------------------------------------------
# count models of the dev sets (the plateau's measure); checkpoint.pt (a bit-exact --resume); log.jsonl, best.pt

def count_baselines(train, dev, max_tokens=20_000_000):  # fitted on at most max_tokens: a Wikipedia's would not fit
    """Dev perplexities of unigram (add-one), left bigram and both-neighbour models (Witten-Bell, each on the last)."""
    t, d = np.asarray(train[:max_tokens], dtype=np.int64), np.asarray(dev, dtype=np.int64)
    V = int(max(t.max(), d.max())) + 1
    uni = (np.bincount(t, minlength=V) + 1.0) / (len(t) + V)  # add-one

    def witten_bell(hist, word, q_hist, q_word, lower):  # p(w | h) = (c(h, w) + T(h) lower) / (c(h) + T(h)), or lower
        keys, counts = np.unique(hist * V + word, return_counts=True)
        hs, first = np.unique(keys // V, return_index=True)
        n_h = np.add.reduceat(counts, first).astype(np.float64)  # tokens after h
        t_h = np.diff(np.append(first, len(keys))).astype(np.float64)  # distinct words after h
        q = q_hist * V + q_word
        i = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
        c = np.where(keys[i] == q, counts[i], 0)
        j = np.minimum(np.searchsorted(hs, q_hist), len(hs) - 1)
        seen = hs[j] == q_hist
        return np.where(seen, (c + t_h[j] * lower) / np.where(seen, n_h[j] + t_h[j], 1.0), lower)

    (a, w, b), (qa, qw, qb) = (t[:-2], t[1:-1], t[2:]), (d[:-2], d[1:-1], d[2:])  # left, word, right
    p_left = witten_bell(a, w, qa, qw, uni[qw])
    p_both = witten_bell(a * V + b, w, qa * V + qb, qw, p_left)
    return tuple(float(np.exp(-np.log(p).mean())) for p in (uni[qw], p_left, p_both))

def read_checkpoint(path, args, argv):
    """--resume's checkpoint.pt, refused when missing, damaged, NaN, foreign or of other flags; -> (it, what changed)"""
    if not os.path.isfile(path):
        raise InputError(f"--resume: no checkpoint.pt to go on from in {args.out}")
    try:
        model, ckpt = load_model(path)
    except ValueError as e:  # load_model's InputError: the file and what is wrong with it
        raise InputError(f"--resume: {e}; it cannot be continued: start again with {command(argv, '--overwrite')}")
    if not {"args", "optimizer", "rng"} <= set(ckpt):
        raise InputError(f"--resume: {path} is not a checkpoint written by pretrain.py")
    old, new, ckpt["model"] = ckpt["args"], vars(args), model.state_dict()
    old = {"pos_offsets_from": 0, **old}  # a checkpoint from before --pos-offsets-from drew offsets from update 0
    diff = "".join(f"\n  --{k.replace('_', '-')}: {old.get(k)!r} in the checkpoint, {new[k]!r} now"
                   for k in sorted(new) if k not in RESUME_MAY_CHANGE and old.get(k) != new[k])
    if diff:
        raise InputError(f"--resume: {path} was made with different flags:{diff}")
    return ckpt, ", ".join(f"--{k} {old.get(k)} -> {new[k]}" for k in ("lr", "warmup") if old.get(k) != new[k])


def data_of(run):  # what --resume compares: other dev sets would have best.pt chosen across two
    return {"n_tokens": run.n_tokens, "dev_sha1": [hashlib.sha1(np.asarray(d)).hexdigest() for d in run.dev_ids]}


def restore_checkpoint(run, ckpt):
    """Model, optimizer, progress, this rank's RNGs; log.jsonl cut back to the checkpoint's; a lost best.pt anew."""
    if ckpt["tokenizer"] != run.tok.to_dict() or any(ckpt["data"].get(k, v) != v for k, v in data_of(run).items()):
        raise InputError(f"--resume: the data in {run.data_dir} are not {run.ckpt_path}'s (training or dev sets)")
    if len(ckpt["rng"]) != run.world_size:  # every rank goes on from its own RNG states
        raise InputError(f"--resume: {run.ckpt_path} goes on with {len(ckpt['rng'])} processes only")
    run.raw_model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt["scaler"] and run.scaler.is_enabled():  # empty when the run was not fp16
        run.scaler.load_state_dict(ckpt["scaler"])
    run.step, run.epoch, run.n_streams, run.best_ppl = ckpt["step"], ckpt["epoch"], ckpt["n_streams"], ckpt["best_ppl"]
    if not os.path.exists(os.path.join(run.args.out, "best.pt")) and run.best_ppl < math.inf:
        run.log(f"note: no best.pt in {run.args.out} (its dev ppl: {run.best_ppl:.2f}); a new one from step {run.step}")
        run.best_ppl = math.inf
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
    """checkpoint.pt by the master, with every rank's RNGs from before the micro-batch drawn ahead (drawn again)."""
    t0, mine = time.time(), dict(zip(("sampler", "mask"), run.rng_before_next), torch=torch.get_rng_state(),
                                 cuda=torch.cuda.get_rng_state() if run.device_type == "cuda" else None)
    rngs = [None] * run.world_size if run.ddp else [mine]
    if run.ddp:
        dist.all_gather_object(rngs, mine)  # every rank's
    if run.master:
        checkpoint = {"model": run.raw_model.state_dict(), "optimizer": run.optimizer.state_dict(),
                      "scaler": run.scaler.state_dict(), "config": asdict(run.raw_model.config),
                      "args": vars(run.args), "tokenizer": run.tok.to_dict(), "langs": run.langs, "step": run.step,
                      "epoch": run.epoch, "n_streams": run.n_streams, "best_ppl": run.best_ppl, "rng": rngs,
                      "count_ppl": run.count_ppl, "data": {"dir": run.data_dir, **data_of(run)},
                      "log_bytes": os.path.getsize(run.log_path) if os.path.exists(run.log_path) else 0}
        atomic_write(run.ckpt_path, lambda tmp: torch.save(checkpoint, tmp))
    run.saved_step, seconds = run.step, time.time() - t0
    if run.ddp and seconds > 10 and not run.warned_slow_save:
        run.warned_slow_save = True
        run.log(f"warning: writing {run.ckpt_path} took {seconds:.0f} s: torchrun kills its workers 30 s after "
                "forwarding a SIGTERM, so a stop may keep only the checkpoint before it (see --save-every)")


def log_json(run, record):  # a line of log.jsonl, by the master, with the time
    if run.master:
        with write_errors(run.log_path), open(run.log_path, "a") as f:
            f.write(json.dumps({**record, "time": round(time.time(), 1)}) + "\n")


def evaluate(run):
    """The dev perplexities; best.pt when English improves (§3.1), step{N}.pt; -> all finite (else nothing saved)."""
    finite, args, en = True, run.args, run.langs[0]
    if run.master:
        ppl = {l: evaluate_ppl(run.raw_model, run.dev_ids[j], j, run.vocab_sizes[j], args.bptt, run.device, run.ctx)
               for j, l in enumerate(run.langs)}
        finite = all(math.isfinite(v) for v in ppl.values())
        improved = finite and ppl[en] < run.best_ppl
        run.log(f"eval step {run.step} epoch {run.epoch}: dev ppl " + ", ".join(f"{l} {v:.2f}" for l, v in ppl.items())
                + (" (best)" if improved else ""))
        log_json(run, {"step": run.step, "epoch": run.epoch, "dev_ppl": ppl, "best": improved}  # before checkpoint.pt
                 | ({"plateau": True} if ppl[en] > run.count_ppl[en]["left"] else {}))  # above the left bigram's
        run.best_ppl = ppl[en] if improved else run.best_ppl
        for name in ["best.pt"] * improved + [f"step{run.step}.pt"] * (finite and run.step in args.snapshots):
            with write_errors(os.path.join(args.out, name)):  # save_model writes its own temp file, then renames it
                save_model(os.path.join(args.out, name), run.raw_model, tokenizer=run.tok.to_dict(), langs=run.langs,
                           args=vars(args), step=run.step, dev_ppl=ppl, count_ppl=run.count_ppl)
    if run.ddp:  # the master's verdict: every rank stops after the same update
        dist.all_reduce(flag := torch.tensor([float(not finite)], device=run.device))
        finite = not flag.item()
    return finite

# -----------------------------------------------------------------------------
# setup: device, data (the toy world, bpe.prepare), model and optimizer, DDP; then main

def write_toy_world(args, langs, master):
    """The master writes OUT/toy once (OUT/toy.json: its knobs; other ones need --overwrite); the other ranks wait."""
    knobs = {"langs": langs if len(langs) > 1 else ["en", "fr"], **TOY_SIZES[args.toy_size],
             **{k: getattr(args, f"toy_{k}") for k in ("overlap", "order", "domain_shift", "cyrillic", "seed")}}
    record = os.path.join(args.out, "toy.json")
    read = lambda: json.loads(open(record).read()) if os.path.exists(record) else None  # noqa: E731
    if master and read() not in (None, knobs) and not args.overwrite:
        raise InputError(f"{args.data} was written with other --toy-* flags; add --overwrite, or use another --out")
    for d in (args.data, os.path.join(args.out, "data")) if master and read() not in (None, knobs) else ():
        shutil.rmtree(d, ignore_errors=True)  # --overwrite: the old world and its prepared data
    if master and read() != knobs:
        print(f"writing the toy world to {args.data}")
        try:
            write_world(args.data, force=True, **knobs)
        except OSError as e:  # a full disk, an unwritable directory
            raise SystemExit(f"error: cannot write the toy world: {e.filename or args.data}: {e.strerror or e}")
        write_text(record, json.dumps(knobs))
    while read() != knobs:  # the other ranks: until the master has written it
        time.sleep(2)


def load_data(run):
    args, langs = run.args, run.langs
    files = {l: {"train": args.train_files[l], "dev": args.dev_files[l]} for l in langs} if args.train_files else None
    run.data_dir = prepare(langs, args.prep_dir, args.data, files, mode=args.bpe, merges=args.merges,
                           separate_vocab=args.sep_tok, lowercase=args.lowercase, seed=args.seed,
                           code_switch=args.code_switch, workers=args.workers, master=run.master)
    try:
        run.tok = Tokenizer.load(os.path.join(run.data_dir, "tokenizer.json"))
        run.train_ids, meta = zip(*(load_bin(os.path.join(run.data_dir, f"{l}.train")) for l in langs))  # per lang
        run.dev_ids = [load_bin(os.path.join(run.data_dir, f"{l}.dev"))[0] for l in langs]
        run.vocab_sizes = [run.tok.vocab_size(l) for l in langs]
    except (OSError, ValueError, KeyError) as e:  # KeyError: a tokenizer without one of --langs
        raise InputError(f"cannot read the prepared data in {run.data_dir}: {e}") from None
    run.n_tokens = [len(ids) for ids in run.train_ids]
    (smallest, lang), same = min(zip(run.n_tokens, langs)), [l for l, t, d in zip(langs, run.train_ids, run.dev_ids)
                                                             if np.array_equal(t, d)]
    if same and not args.allow_overlap:  # --dev-files equal to --train-files, or a --data folder's copies
        raise InputError(f"the {same[0]} dev set is its training text: the dev perplexity, and best.pt chosen on it, "
                         "would measure what is trained on; give another dev set, or --allow-overlap if it is meant")
    if args.batch_size * args.bptt > smallest:  # every batch would be mostly `</s>` padding (a 10^9 typo: no memory)
        raise InputError(f"--batch-size {args.batch_size} x --bptt {args.bptt} is more than the {lang} training "
                         f"data ({smallest} tokens); lower --batch-size")
    run.sampler = StreamSampler([n_stream_batches(n, args.batch_size, args.bptt) for n in run.n_tokens],
                                sampling_probs([m["n_sentences"] for m in meta]), seed=[args.seed, run.rank])


def build_adam(params, lr, device_type):  # fused on the CPU too: the default's loop was 7 % of a --toy update
    return torch.optim.Adam(params, lr=lr, fused=True if device_type in ("cuda", "cpu") else None, **ADAM)


def build(run, dtype):
    """Model (alike on every rank), Adam, autocast (and a GradScaler for fp16); per-rank masking and dropout seeds."""
    torch.manual_seed(run.args.seed)
    shape = {k: getattr(run.args, k) for k in ("n_layers", "n_heads", "dim", "ffn_dim", "dropout", "attention_dropout",
                                               "lang_emb", "sep_emb", "sep_tok", "sep_pos", "sep_layers")}
    config = ModelConfig(vocab_size=max(run.vocab_sizes), n_langs=len(run.langs), **shape, vocab_sizes=run.vocab_sizes
                         if run.args.sep_tok else (), max_positions=max(512, run.args.bptt, run.args.pos_offsets))
    run.raw_model = run.model = MLM(config).to(run.device)
    run.params = list(run.raw_model.parameters())
    run.optimizer = build_adam(run.params, run.args.lr, run.device_type)
    run.ctx = autocast(run.device, dtype)
    run.scaler = torch.amp.GradScaler(run.device_type, enabled=(dtype == "float16"))
    run.mask_gen = torch.Generator().manual_seed(run.args.seed * 1000 + run.rank + 1)
    torch.manual_seed(run.args.seed * 1000 + run.rank + 2)


def setup(args, argv):
    run = Run(args=args, langs=args.langs.split(","), rank=int(os.environ.get("RANK", 0)),
              world_size=int(os.environ.get("WORLD_SIZE", 1)), ddp="RANK" in os.environ)
    local_rank = int(os.environ["LOCAL_RANK"]) if run.ddp else None  # "cuda" -> "cuda:LOCAL_RANK" (or cuda:0)
    run.device, dtype, backend = pick_device(args.device, args.dtype, local_rank)  # set_device and DDP need the index
    if run.device_type == "cuda":
        torch.cuda.set_device(run.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    run.stop = StopSignal(lambda: how_to_go_on(run.ckpt_path, run.saved_step, argv))
    found = run_files(args.out)
    if found and not (args.resume or args.overwrite):
        raise InputError(f"--out {args.out} holds {', '.join(found)} of an earlier run; pass " + "--resume to continue "
                         "it, " * ("checkpoint.pt" in found) + "--overwrite to start again, or another --out")
    ckpt, changed = read_checkpoint(run.ckpt_path, args, argv) if args.resume else (None, "")
    if args.toy_world:
        write_toy_world(args, run.langs, run.master)
    load_data(run)
    build(run, dtype)
    if ckpt:
        restore_checkpoint(run, ckpt)
        run.log(f"resumed from {run.ckpt_path} at step {run.step}, epoch {run.epoch}" + f" ({changed})" * bool(changed))
    for name in found if run.master and args.overwrite else ():  # a new run: no file of the earlier one is mixed in
        os.remove(os.path.join(args.out, name))
    if run.master:  # the flags of this run; the count models of its dev sets (the plateau's measure)
        atomic_write(os.path.join(args.out, "args.json"), lambda tmp: write_text(tmp, json.dumps(vars(args), indent=1)))
        run.count_ppl = {l: dict(zip(("unigram", "left", "both"), count_baselines(t, d)))
                         for l, t, d in zip(run.langs, run.train_ids, run.dev_ids)}
        run.log("\n".join(f"count models of the dev set ({l}): unigram {c['unigram']:.1f}, left bigram "
                          f"{c['left']:.1f}, both neighbours {c['both']:.1f}" for l, c in run.count_ppl.items()))
    if run.ddp:  # the other ranks wait for the master's evaluation and checkpoint in their next collective
        dist.init_process_group(backend=backend, timeout=DDP_TIMEOUT)
        run.model = run.ddp_model = DDP(run.raw_model, device_ids=[local_rank] if run.device_type == "cuda" else None)
        # DDP's gradient buckets follow the order of its first backward (--sep: the language drawn); one of language 0
        # on <s> <s> (eval: no RNG; gradients dropped) fixes it, so a resumed run sums the ranks' gradients alike
        x, others = torch.zeros((1, 2), dtype=torch.long, device=run.device), run.raw_model.lang_specific_parameters
        run.raw_model.eval()
        (run.ddp_model(x, 0, x)[1] + sum(p.view(-1)[0] for j in range(1, len(run.langs)) for p in others(j)) * 0.0
         ).backward()
        run.raw_model.train()
        run.optimizer.zero_grad(set_to_none=True)
    if args.compile:  # after DDP: the graph is split at its gradient buckets, so their all-reduce overlaps backward
        run.model = torch.compile(run.model)
    run.log(f"languages {run.langs} (sampling p = {np.round(run.sampler.probs, 3).tolist()}), vocab sizes "
            f"{run.vocab_sizes}, train tokens {run.n_tokens}\nmodel: {sum(p.numel() for p in run.params):,} "
            f"parameters, sep={args.sep or 'none'}, bpe={args.bpe}, dtype {dtype}, device {run.device}; "
            f"{args.batch_size * args.bptt * args.accumulate * run.world_size:,} tokens per update ({args.batch_size} "
            f"streams x {args.bptt} x {args.accumulate} accumulation x {run.world_size} processes)")
    return run


def main(argv=None):
    argv, t0, parser = sys.argv[1:] if argv is None else [str(a) for a in argv], time.time(), build_parser()
    with reported(parser):  # a bad input: one `error: ...` line (a flag's: with the usage line, code 2)
        args = get_args(argv, parser)
        with locked(args.out, args.prep_dir, int(os.environ.get("RANK", 0)) == 0):
            run = setup(args, argv)
            stopped_by, diverged = train(run)
    for sig, handler in run.stop.old.items():  # the handlers from before the run
        signal.signal(sig, handler)
    if run.ddp:  # the ranks' weights compared (a collective: no rank leaves before the master wrote checkpoint.pt)
        digests = [None] * run.world_size  # a checksum per tensor
        dist.all_gather_object(digests, [float(t.double().sum()) for t in run.raw_model.state_dict().values()])
        run.model = run.ddp_model = None  # its reducer holds gloo work: destroying the group first aborted 3 of 25 runs
        gc.collect()
        dist.destroy_process_group()
        if odd := [r for r, d in enumerate(digests) if d != digests[0]]:
            raise SystemExit(1 if not run.master else f"error: ranks {odd} hold other weights than rank 0")
        run.log(f"ranks agree: the {run.world_size} processes hold the same weights")
    if stopped_by:
        run.log(f"stopped by {signal.Signals(stopped_by).name} after step {run.step}: saved {run.ckpt_path}; to go on, "
                f"run {command(argv, '--resume')}", file=sys.stderr)
        sys.exit(128 + stopped_by)  # the shell's code for a process ended by that signal
    if diverged:
        raise SystemExit(1 if not run.master else f"error: {diverged}; "
                         + how_to_go_on(run.ckpt_path, run.saved_step, argv, lr=run.args.lr / 2))
    en, best, c = run.langs[0], run.best_ppl, (run.count_ppl or {}).get(run.langs[0])
    run.log(f"done: step {run.step}, epoch {run.epoch}, best {en} dev ppl {best:.2f}, in "
            f"{timedelta(seconds=round(time.time() - t0))}; {', '.join(run_files(run.args.out))} in {run.args.out}")
    if c and (best > c["left"] or best > c["both"]):  # the left bigram's: the stall rule (RESULTS.md); a note beyond
        run.log(f"warning: the MLM has not left the unigram plateau: {en} dev ppl {best:.2f} is above the left-bigram "
                f"count model's {c['left']:.1f} (unigram {c['unigram']:.1f}); its scores would measure an unconverged "
                "model: train longer (--max-steps) or try another --seed" if best > c["left"] else
                f"note: {en} dev ppl {best:.2f} is above the both-neighbour count model's {c['both']:.1f}: the MLM has "
                "not yet used more than the two neighbours of a masked token")


if __name__ == "__main__":
    main()
