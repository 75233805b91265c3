"""
Bilingual masked language model (MLM) pretraining, paper §3.1 and Table 1.

The XLM-style encoder of model.py, trained with BERT's MLM objective on monolingual streams of
two languages in every sharing regime of Table 1 (joint / separate / prefixed BPE, code-switched
"extra anchors", separate embeddings and bottom layers). As facebookresearch/XLM
(src/data/dataset.py StreamDataset, src/trainer.py): 256-token streams with `</s>` separators and
no padding, one language per batch drawn with p ∝ n^0.7, 15 % of tokens predicted (80 % MASK /
10 % kept / 10 % random), Adam with linear warm-up then inverse square root decay, best model by
English dev perplexity. References: the paper (Conneau et al. 2020), BERT (Devlin et al. 2019),
XLM (Lample & Conneau 2019, github.com/facebookresearch/XLM).

Run:
  python pretrain.py --toy --out runs/toy           # synthetic world, one CPU core, ~8 minutes
  python pretrain.py --data DIR --langs en,fr --accumulate 8 --out runs/default           # 1 GPU
  torchrun --standalone --nproc_per_node 8 pretrain.py --data DIR --langs en,fr --sep emb,1-3 \\
      --out runs/sep                                # the paper's run
  python pretrain.py ... --resume                   # continue from runs/.../checkpoint.pt
"""

import argparse
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
from dataclasses import dataclass
from datetime import timedelta
from os.path import exists, getsize, isdir, isfile, join
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from bpe import (EOS_ID, MASK_ID, MODES, HelpFormatter, InputError, Tokenizer, load_bin, locked,
                 number, parse_lang_files, prepare, reported, write_errors, write_text)
from model import MLM, ModelConfig, autocast, load_model, parse_sep, pick_device, save_model
from toydata import SIZES as TOY_SIZES, parse_order, write_world

MASK_PROB = 0.15              # paper §3.1 / BERT: 15 % of the positions are predicted
PRED_PROBS = (0.8, 0.1, 0.1)  # of those: MASK, kept, random id (XLM word_mask_keep_rand)
ALPHA = 0.7                   # language sampling exponent (XLM lg_sampling_factor)
# XLM's adam_inverse_sqrt defaults (its README's BERT recipe: eps 1e-6, decoupled decay 0.01)
ADAM = dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

# -----------------------------------------------------------------------------
# masking, schedule, language sampling (pure functions, imported by the tests)

def mask_tokens(x, vocab_size, generator, mask_prob=MASK_PROB, probs=PRED_PROBS,
                at_least_one=False):
    """BERT/XLM masking of x, (B, T) int64 ids of one language -> (inputs, targets: the id where
    selected, else -1). Every position but 0 (XLM never predicts a stream's first) is selected with
    probability mask_prob, then becomes MASK / keeps its id / gets a uniform random id in
    [0, vocab_size) with `probs` (specials included, as XLM; with separate embeddings the language's
    own vocabulary: "we only sample random words within one language"). at_least_one: one target
    per row (XLM's evaluation). [[1, 20, 21, 1]] -> [[1, 5, 21, 1]], [[-1, 20, -1, -1]]."""
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
    """XLM's adam_inverse_sqrt (the paper's): linear warm-up from init_lr to lr over `warmup`
    updates, then lr * sqrt(warmup / step), e.g. get_lr(120000) = 5e-5. schedule="linear" (--toy):
    the same warm-up, then straight down to 0 at max_steps, so a short run ends annealed."""
    if step < warmup:
        return init_lr + step * (lr - init_lr) / warmup
    if schedule == "linear":
        return lr * max(0.0, (max_steps - step) / max(max_steps - warmup, 1))
    return lr * math.sqrt(warmup / step) if warmup > 0 else lr


def sampling_probs(sentence_counts, alpha=ALPHA):
    """XLM's language sampling: q_l = n_l / sum n, p_l = q_l^alpha / sum_k q_k^alpha."""
    n = np.asarray(sentence_counts, dtype=np.float64)
    if (n <= 0).any():
        raise ValueError("every language needs at least one sentence, got counts "
                         f"{list(sentence_counts)}")
    q = n / n.sum()
    p = q ** alpha
    return p / p.sum()

# -----------------------------------------------------------------------------
# streams (XLM src/data/dataset.py StreamDataset), read straight from the memory-mapped ids

def n_stream_batches(n_tokens, batch_size, bptt):
    """Number of (batch_size x bptt) stream batches XLM cuts an array of n_tokens into."""
    return math.ceil(n_tokens / (batch_size * bptt))


def get_batch(ids, i, batch_size, bptt):
    """Batch i of XLM's stream layout, batch-first (batch_size, bptt) int64. XLM left-pads the
    corpus (`</s>` after every sentence) with `</s>` to a multiple of batch_size * bptt, lays it out
    as batch_size contiguous columns with one extra `</s>` row on top, and batch i is rows
    [i*bptt, (i+1)*bptt): no <pad>, sentences cut wherever the window ends. The indices are
    computed, so a Wikipedia-size memmap is never copied."""
    n = len(ids)
    L = n_stream_batches(n, batch_size, bptt) * bptt
    pad = L * batch_size - n
    rows = np.arange(i * bptt, (i + 1) * bptt)                 # rows of XLM's `data`
    k = np.arange(batch_size)[:, None] * L + rows[None, :] - 1  # index into the padded buffer
    is_eos = (rows[None, :] == 0) | (k < pad)                   # the top row or the left padding
    out = np.asarray(ids[np.clip(k - pad, 0, n - 1)], dtype=np.int64)
    out[is_eos] = EOS_ID
    return out


class StreamSampler:
    """Next (language drawn with `probs`, batch index from that language's current permutation, a
    fresh one each pass as XLM shuffles), from its own seeded RNG: every rank draws independently;
    state_dict() resumes it."""

    def __init__(self, n_batches, probs, seed):
        self.n_batches = n_batches
        self.probs = np.asarray(probs, dtype=np.float64)
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
        order = [torch.from_numpy(o) for o in self.order]
        return {"rng": self.rng.bit_generator.state, "pos": list(self.pos), "order": order}

    def load_state_dict(self, d):
        self.rng.bit_generator.state = d["rng"]
        self.pos = list(d["pos"])
        self.order = [o.numpy() for o in d["order"]]

# -----------------------------------------------------------------------------
# evaluation (XLM evaluate_mlm: deterministic masking, all selected tokens -> MASK)

@torch.no_grad()
def evaluate_ppl(model, ids, lang, vocab_size, bptt, device, amp, windows_per_forward=32):
    """MLM perplexity of a dev stream (batch size 1 as XLM, windows stacked for speed), masking
    seeded with 0, under `amp` (autocast or nothing): exp(sum CE / number of targets); inf when that
    overflows (a diverged model), NaN when the loss is NaN."""
    was_training = model.training
    g = torch.Generator().manual_seed(0)
    total = 0.0
    count = 0
    model.eval()
    n = n_stream_batches(len(ids), 1, bptt)
    # a progress bar on stderr, on a terminal only
    for start in tqdm(range(0, n, windows_per_forward), desc=f"eval lang {lang}", leave=False,
                      mininterval=2, disable=not sys.stderr.isatty()):
        windows = range(start, min(n, start + windows_per_forward))
        x = np.concatenate([get_batch(ids, i, 1, bptt) for i in windows])
        inputs, targets = mask_tokens(torch.from_numpy(x), vocab_size, g, probs=(1.0, 0.0, 0.0),
                                      at_least_one=True)
        k = int((targets != -1).sum())
        with amp:
            _, loss = model(inputs.to(device), lang, targets.to(device))
        total += float(loss) * k
        count += k
    model.train(was_training)
    mean = total / count  # above ~709.8 nats math.exp overflows: a diverged model
    return math.inf if mean > math.log(sys.float_info.max) else math.exp(mean)

# -----------------------------------------------------------------------------
# the presets: the paper's values by default; --toy swaps in a CPU-sized one; an explicit flag wins

PAPER = dict(n_layers=8, dim=768, n_heads=12, ffn_dim=3072, dropout=0.1, attention_dropout=0.1,
             batch_size=96, bptt=256, lr=1e-4, warmup=30000, epoch_size=200000, epochs=200,
             max_steps=10**12, eval_every=0, log_every=100, accumulate=1, schedule="inverse_sqrt",
             pos_offsets=0, pos_offsets_from=0)
# chosen on the Default model (RESULTS.md, "Calibrating the --toy preset"); streams at random
# offsets in positions 0..47 train every position a toy fine-tuning input uses, from update 2,000
# on: before, 16 positions leave the plateau sooner
TOY = dict(n_layers=8, dim=64, n_heads=4, ffn_dim=256, batch_size=64, bptt=16, pos_offsets=48,
           pos_offsets_from=2000, lr=2e-3, warmup=500, schedule="linear", epoch_size=32000,
           max_steps=8000, log_every=500, threads=1)
MERGES = {"paper": (80000, 40000), "toy": (2000, 1000)}  # (joint, per language: separate/prefixed)

# -----------------------------------------------------------------------------
# the run's state, the next micro-batch, one update

@dataclass(slots=True)  # slots: an attribute not declared here cannot be set
class Run:
    """Everything a run holds: set up below the ruler, moved on by train(), in checkpoint.pt."""
    args: argparse.Namespace            # the flags, presets filled in (get_args)
    langs: list                         # --langs; the first, "English", selects best.pt
    rank: int = 0                       # torchrun's RANK and WORLD_SIZE
    world_size: int = 1
    ddp: bool = False                   # under torchrun
    device: str = "cpu"                 # cuda:LOCAL_RANK, cpu or mps
    stop: "StopSignal" = None           # SIGTERM / Ctrl-C: finish the update, save, exit
    data_dir: str = None                # bpe.prepare's folder
    tok: Tokenizer = None
    train_ids: list = None              # per language: the memory-mapped token ids
    dev_ids: list = None
    vocab_sizes: list = None            # per language (its own with --sep emb)
    n_tokens: list = None               # training tokens per language
    raw_model: MLM = None               # the model itself: checkpoints, evaluation
    model: torch.nn.Module = None       # what trains: raw_model in DDP / torch.compile
    ddp_model: DDP = None               # its gradient sync is switched per micro-batch
    params: list = None
    optimizer: torch.optim.Optimizer = None
    amp: object = None                  # the autocast context (model.autocast)
    scaler: torch.amp.GradScaler = None  # enabled for float16 only
    sampler: StreamSampler = None       # this rank's language and batch order
    mask_rng: torch.Generator = None    # this rank's masking and --pos-offsets
    step: int = 0                       # updates done
    epoch: int = 0                      # epochs done
    n_streams: int = 0                  # streams of this epoch, on this rank
    best_ppl: float = math.inf          # the best English dev perplexity so far
    best_step: int = None               # the update that had it
    left_plateau_at: int = None         # the first update below the left bigram
    count_models: dict = None           # the master's count models of the dev sets
    saved_step: int = None              # the step checkpoint.pt holds (None: none)
    next_batch: tuple = None            # the micro-batch drawn ahead
    rng_before_next: tuple = None       # the RNG states from before it
    warned_slow_save: bool = False
    master = property(lambda self: self.rank == 0)
    device_type = property(lambda self: torch.device(self.device).type)  # cuda, cpu or mps
    ckpt_path = property(lambda self: join(self.args.out, "checkpoint.pt"))
    log_path = property(lambda self: join(self.args.out, "log.jsonl"))
    tokens_per_update = property(lambda self: self.args.batch_size * self.args.bptt
                                 * self.args.accumulate * self.world_size)
    # the epoch (from 1) of the last update: an epoch's last update sets n_streams back to 0
    current_epoch = property(lambda self: self.epoch + int(self.n_streams > 0))

    def log(self, *a, **k):  # the master's lines, the progress bar cleared first
        if self.master:
            with tqdm.external_write_mode(file=k.get("file")):
                print(*a, **k)


def next_micro_batch(run, update_index):
    """The micro-batch for update `update_index`, drawn on the host during the backward before it,
    then on the device: -> (lang, (inputs, targets, target positions, offset start or None))."""
    args = run.args
    # the sampler's and the masking's states before this draw, for checkpoint.pt
    run.rng_before_next = (run.sampler.state_dict(), run.mask_rng.get_state())
    lang, i = run.sampler.next()
    x = torch.from_numpy(get_batch(run.train_ids[lang], i, args.batch_size, args.bptt))
    inputs, targets = mask_tokens(x, run.vocab_sizes[lang], run.mask_rng)
    # found on the host: MLM.forward need not ask the GPU
    where = (targets.view(-1) != -1).nonzero().squeeze(1)
    offset = None  # every stream at position 0
    if args.pos_offsets > args.bptt and update_index >= args.pos_offsets_from:
        offset = torch.randint(args.pos_offsets - args.bptt + 1, (args.batch_size,),
                               generator=run.mask_rng)
    pin = run.device_type == "cuda"
    batch = []
    for t in (inputs, targets, where, offset):
        if t is not None:
            t = (t.pin_memory() if pin else t).to(run.device, non_blocking=True)
        batch.append(t)
    return lang, tuple(batch)


def zero_term(model, lang):
    """0 x the other languages' own parameters (--sep): DDP sees them used in the loss."""
    others = [p for j in range(model.config.n_langs) if j != lang
              for p in model.lang_specific_parameters(j)]
    return sum(p.view(-1)[0] for p in others) * 0.0


class Step(NamedTuple):
    """What one update did (a float16 overflow is neither stepped nor non_finite)."""
    loss: float         # the mean over micro-batches and ranks
    grad_norm: float    # before clipping
    langs: list         # this rank's micro-batches' languages
    stop: int           # SIGTERM, SIGINT or 0: a signal on any rank
    stepped: bool       # Adam moved the weights
    non_finite: bool    # skipped: the loss (or norm) was NaN or inf


def update(run):
    """One update (XLM mlm_step): `accumulate` micro-batches of one language each, forward and
    backward; one host-device sync; clipping at --clip and Adam, unless the loss is not finite."""
    args = run.args
    n_langs = len(run.langs)
    loss_sum = torch.zeros((), device=run.device)
    langs = []
    for micro in range(args.accumulate):
        lang, (inputs, targets, where, offset) = run.next_batch
        langs.append(lang)
        is_last_micro = micro == args.accumulate - 1
        if run.ddp:  # sync gradients only on the last micro-batch
            run.ddp_model.require_backward_grad_sync = is_last_micro
        with run.amp:
            _, loss = run.model(inputs, lang, targets, pos_offset=offset, target_index=where)
            if run.ddp:
                loss = loss + zero_term(run.raw_model, lang)
        run.scaler.scale(loss / args.accumulate).backward()
        # drawn while the backward runs; after the last micro-batch, the next update's first
        run.next_batch = next_micro_batch(run, run.step + int(is_last_micro))
        loss_sum += loss.detach().float()
        run.n_streams += args.batch_size

    # one read (under torchrun one all_reduce) of the mean loss, the languages any rank used, a
    # stop signal on any rank and the gradient norm (the same on every rank)
    flags = torch.zeros(n_langs + 2)  # the languages, then SIGINT, SIGTERM
    flags[langs] = 1.0
    if run.stop.signum:
        flags[n_langs + (run.stop.signum == signal.SIGTERM)] = 1.0
    norm = torch.nn.utils.get_total_norm([p.grad for p in run.params if p.grad is not None])
    mean_loss = (loss_sum / args.accumulate).view(1)
    packed = torch.cat([mean_loss, flags.to(run.device, non_blocking=True), norm.view(1).float()])
    if run.ddp:
        dist.all_reduce(packed[:n_langs + 3])  # a sum: the loss is divided by the ranks below
    values = packed.tolist()  # the sync
    loss = values[0] / run.world_size
    used = values[1:n_langs + 1]
    grad_norm = values[n_langs + 3]
    stop = 0
    if values[n_langs + 1]:
        stop = signal.SIGINT
    if values[n_langs + 2]:
        stop = signal.SIGTERM

    # --sep: a language no rank used gets no gradient on its own parameters (DDP's zero one would
    # still move them through Adam's momentum; XLM updates only what the batch used)
    for lang_id in range(n_langs):
        if not used[lang_id]:
            for p in run.raw_model.lang_specific_parameters(lang_id):
                p.grad = None

    # clip and step, unless the loss (or, without float16's scaler, the norm) is not finite
    fp16 = run.scaler.is_enabled()
    scale = run.scaler.get_scale()
    finite = math.isfinite(loss) and (math.isfinite(grad_norm) or fp16)
    if finite and fp16:
        # float16: unscale_ (then the scaler's step, which skips an overflow) once the loss is
        # known finite; the norm was taken of the scaled gradients
        run.scaler.unscale_(run.optimizer)
        norm = norm / scale
        grad_norm = grad_norm / scale
    if finite:
        max_norm = args.clip if args.clip > 0 else math.inf
        torch.nn.utils.clip_grads_with_norm_(run.params, max_norm, norm)
        run.scaler.step(run.optimizer)
        run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    stepped = finite and run.scaler.get_scale() >= scale
    return Step(loss, grad_norm, langs, stop, stepped, non_finite=not finite)

# ==================================================================================================
# The plumbing: the loop, flags, signals, count models, checkpoints and log, setup, main

# -----------------------------------------------------------------------------
# the training loop

class Ending(NamedTuple):
    """How train() ended."""
    by: str         # "--max-steps", "--epochs", "SIGTERM", "SIGINT" or "divergence"
    signum: int     # the stopping signal, or 0
    diverged: str   # why it diverged (non-finite losses, dev ppl), or None


def total_updates(args):  # the updates --max-steps and --epochs allow
    updates_per_epoch = math.ceil(args.epoch_size / (args.batch_size * args.accumulate))
    return min(args.max_steps, args.epochs * updates_per_epoch)


def train(run):
    """The loop: get_lr, one update, the progress line; an evaluation at each epoch's end, every
    --eval-every, at --snapshots and at the end; checkpoint.pt then and at a signal. -> Ending."""
    args = run.args
    bad_steps = 0      # non-finite losses in a row
    stopped_by = 0     # the signal that stops the run
    diverged = None
    t0 = time.time()   # the time and step of the last progress line
    step0 = run.step
    bar = tqdm(total=total_updates(args), initial=run.step, unit="update", desc="pretrain",
               mininterval=1, disable=not run.master or not sys.stderr.isatty())  # on a terminal
    run.stop.training = True
    if not args.resume:
        log_json(run, {"count_models": run.count_models})
    run.next_batch = next_micro_batch(run, run.step)
    while run.step < args.max_steps and run.epoch < args.epochs and not stopped_by:
        # the learning rate of this update
        lr = get_lr(run.step, args.lr, args.warmup, schedule=args.schedule,
                    max_steps=args.max_steps)
        for group in run.optimizer.param_groups:
            group["lr"] = lr

        # forward, backward, clip, Adam
        result = update(run)
        stopped_by = result.stop
        if result.stepped:
            run.step += 1
            bar.update(1)
        bar.set_postfix(loss=f"{result.loss:.3f}", refresh=False)

        # a non-finite loss skips the update; --max-bad-steps of them in a row end the run
        bad_steps = bad_steps + 1 if result.non_finite else 0
        if result.non_finite:
            run.log(f"step {run.step}: non-finite loss {result.loss} / grad norm "
                    f"{result.grad_norm}, update skipped ({bad_steps} in a row)")
            log_json(run, {"step": run.step, "skipped": True, "loss": result.loss,
                           "grad_norm": result.grad_norm})
            if bad_steps >= args.max_bad_steps:
                diverged = f"{bad_steps} non-finite losses in a row at step {run.step}"
                break

        # the progress line
        if result.stepped and run.step % args.log_every == 0:
            tok_s = run.tokens_per_update * (run.step - step0) / (time.time() - t0)
            t0 = time.time()
            step0 = run.step
            run.log(f"step {run.step} | epoch {run.current_epoch} | loss {result.loss:.4f} | "
                    f"lr {lr:.2e} | grad norm {result.grad_norm:.2f} | {tok_s:,.0f} tok/s")
            langs = ",".join(run.langs[j] for j in result.langs)
            log_json(run, {"step": run.step, "epoch": run.current_epoch, "lang": langs,
                           "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm,
                           "tok_per_s": tok_s})

        # the end of an epoch (XLM's: --epoch-size streams on each rank) and of the run
        epoch_ends = run.n_streams >= args.epoch_size
        last = run.step >= args.max_steps or (epoch_ends and run.epoch + 1 >= args.epochs)
        if epoch_ends:
            run.n_streams = 0
            run.epoch += 1

        # evaluate (best.pt, snapshots) then, and every --eval-every, at --snapshots
        on_schedule = args.eval_every > 0 and run.step % args.eval_every == 0
        asked = result.stepped and (on_schedule or run.step in args.snapshots)
        evaluate_now = epoch_ends or run.step >= args.max_steps or asked
        if evaluate_now and not evaluate(run):
            run.log(f"warning: step {run.step}: dev ppl is not finite; checkpoint.pt and best.pt "
                    "were not overwritten")
            diverged = f"the dev perplexity is not finite at step {run.step}"
            break

        # checkpoint.pt: at evaluations --save-every apart and at the end, or when a signal stops
        save_due = last or run.step - (run.saved_step or 0) >= args.save_every
        if stopped_by or (evaluate_now and save_due):
            save_checkpoint(run)
    bar.close()
    ended_by = "--max-steps" if run.step >= args.max_steps else "--epochs"
    if diverged:
        ended_by = "divergence"
    if stopped_by:  # main says so first, diverged or not
        ended_by = signal.Signals(stopped_by).name
    log_json(run, {"ended_by": ended_by, "step": run.step, "epoch": run.current_epoch})
    return Ending(ended_by, stopped_by, diverged)

# -----------------------------------------------------------------------------
# flags (the presets above by default, each checked before any work); signals, advice

RESUME_MAY_CHANGE = {"resume", "max_steps", "snapshots", "epochs", "log_every", "eval_every",
                     "device", "compile", "workers", "threads", "out", "data", "train_files",
                     "dev_files", "prep_dir", "overwrite", "lr", "warmup", "max_bad_steps",
                     "save_every", "allow_overlap"}  # data: compared by their contents
# the flags added since the first release, and the value a checkpoint from before each one meant
LATER_FLAGS = {"toy_cyrillic": False, "schedule": "inverse_sqrt", "pos_offsets": 0,
               "pos_offsets_from": 0}
MAX_POSITIONS = 16384  # --bptt and --pos-offsets size the position table: larger is a typo
# the toy world's knobs when not given: they shape the world that --toy writes to OUT/toy
TOY_WORLD = dict(toy_size="full", toy_overlap=0.0, toy_order="svo", toy_domain_shift=0.0,
                 toy_cyrillic=False, toy_seed=0)


class Help(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """bpe.py's --help (each flag's default), the description and the examples as written."""


def build_parser():
    count = number(1)
    natural = number(0)
    fraction = number(0, 1, float, upto=True)
    rate = number(0, 1, float)
    p = argparse.ArgumentParser("pretrain.py", description=__doc__.split("\n\n")[0],
                                usage="pretrain.py --out DIR [--toy] [--data DIR | --train-files "
                                "LANG=PATH,... --dev-files LANG=PATH,...] [flags below]",
                                epilog="examples:" + __doc__.split("Run:")[1], formatter_class=Help)
    data = p.add_argument_group("data").add_argument
    model = p.add_argument_group("model").add_argument
    training = p.add_argument_group("training").add_argument
    run = p.add_argument_group("run").add_argument

    def preset(add, flag, typ, what, **kw):  # unset: PAPER's value, or TOY's with --toy
        k = flag[2:].replace("-", "_")
        toy = f"; --toy {TOY[k]}" if k in TOY else ""
        add(flag, type=typ, help=f"{what} (default: paper {PAPER[k]}{toy})", **kw)

    data("--toy", action="store_true",
         help="the CPU-sized presets, on --data's toy world (or a new OUT/toy)")
    data("--data", metavar="DIR", help="{lang}.{train,dev}.txt (or mono/), or bpe.py's output; "
         "required, unless --toy (OUT/toy) or --train-files")
    data("--train-files", metavar="LANG=PATH,...",
         help="text per language instead of --data (with --dev-files)")
    data("--dev-files", metavar="LANG=PATH,...", help="dev text per language (with --train-files)")
    data("--allow-overlap", action="store_true", help="accept a dev set that is the training text")
    data("--langs", default="en,fr",
         help="comma-separated; the first is 'English' (model selection, paper: en,xx)")
    data("--bpe", choices=MODES, default="joint",
         help="joint: Default; separate: Default anchors; prefixed: No anchors")
    data("--merges", type=count,
         help="BPE merges (default: paper 80000 joint, 40000 per language; --toy 2000 / 1000)")
    data("--code-switch", metavar="DICT",
         help="MUSE dictionary (or toy) to code-switch the training text (default: none)")
    data("--lowercase", action="store_true",
         help="lowercase and strip accents (XLM-15 style; off: the text as given)")
    data("--prep-dir", metavar="DIR", help="cache for prepared data (default: OUT/data)")
    data("--workers", type=count, default=1, help="processes for binarising text")
    # the toy world's knobs: None when not given (get_args), as they need a world --toy writes
    data("--toy-size", choices=TOY_SIZES,
         help="toy world size, tiny for tests (default: full)")
    data("--toy-overlap", type=fraction,
         help="toy: fraction of shared word forms, anchors (default: 0.0)")
    data("--toy-order",
         help="toy: word order of the second language, e.g. sov-na-post (default: svo)")
    data("--toy-domain-shift", type=fraction,
         help="toy: topic shift between the languages, Wiki-CC: 1.0 (default: 0.0)")
    data("--toy-cyrillic", action="store_true", default=None,
         help="toy: write the second language in Cyrillic letters")
    data("--toy-seed", type=natural, help="toy: world seed (default: 0)")

    model("--sep", default="", help="language-specific parts, e.g. emb, 1-3, emb,1-6 (Table 1), "
          "tok, pos (default: none)")
    model("--lang-emb", action="store_true",
          help="add language embeddings (the paper is silent; mBERT, XLM-17/100 have)")
    for flag, typ, what in (
            ("--n-layers", count, "layers"), ("--dim", count, "hidden size"),
            ("--n-heads", count, "attention heads"), ("--ffn-dim", count, "feed-forward size"),
            ("--dropout", rate, "dropout"),
            ("--attention-dropout", rate,
             "attention dropout (as XLM's recipes; its flag's default is 0)")):
        preset(model, flag, typ, what)

    # seed * 1000 + rank + 1 seeds the masking
    training("--seed", type=number(0, 2 ** 32), default=0,
             help="seed for init, data order, masking, dropout")
    for flag, typ, what in (
            ("--bptt", number(1, MAX_POSITIONS, upto=True), "tokens per stream"),
            ("--batch-size", count,
             "streams of --bptt tokens per step, per GPU and micro-batch (x 8 GPUs: paper)"),
            ("--lr", number(0, cast=float, above=True), "peak learning rate"),
            ("--warmup", natural, "linear warm-up updates from 1e-7"),
            ("--epoch-size", count,
             "examples (streams) per GPU per epoch, XLM's meaning of an epoch"),
            ("--epochs", count, "epochs"),
            ("--pos-offsets", number(0, MAX_POSITIONS, upto=True),
             "N: streams start at random in [0, N - bptt]")):
        preset(training, flag, typ, what)
    preset(training, "--pos-offsets-from", natural,
           "--pos-offsets from update N on (before: each stream at 0)", metavar="N")
    training("--accumulate", type=count,
             help="micro-batches per update (default 1; on 1 GPU, 8 = the paper's 8 GPUs)")
    preset(training, "--schedule", None, "after warm-up: inverse_sqrt (XLM) or linear to 0",
           choices=["inverse_sqrt", "linear"])
    training("--clip", type=number(0, cast=float), default=5.0,
             help="gradient clipping norm, 0 = off (XLM's; paper: none)")
    training("--max-steps", type=count,
             help="stop after this many updates (default: paper none; --toy 8000)")
    training("--max-bad-steps", type=count, default=5,
             help="stop after this many NaN/inf losses in a row")

    run("--out", required=True, metavar="DIR",
        help="run directory: checkpoint.pt, best.pt, log.jsonl...; required")
    run("--resume", action="store_true",
        help="continue from OUT/checkpoint.pt (--lr, --max-steps, ... may change)")
    run("--overwrite", action="store_true",
        help="start a new run in an --out holding an earlier run's files")
    preset(run, "--log-every", count, "progress line every N updates")
    run("--eval-every", type=natural,
        help="also evaluate and save every N updates (default 0: once per epoch)")
    run("--snapshots", default="", metavar="STEP,...",
        help="also keep OUT/step{N}.pt at these updates (default: none)")
    run("--save-every", type=natural, default=0, metavar="N",
        help="checkpoint.pt at evaluations N+ updates apart")
    run("--device", default="auto",
        help="auto, cpu, cuda (cuda:LOCAL_RANK under torchrun), cuda:N, mps")
    run("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="autocast (auto: bf16 on GPUs that have it, else fp16 with a GradScaler; fp32 on CPU "
        "and MPS)")
    run("--compile", action="store_true", help="torch.compile the model")
    run("--threads", type=count, help="CPU threads for torch (default torch's; --toy 1)")
    return p


def get_args(argv=None, p=None):
    args = (p or build_parser()).parse_args(argv)
    # a torchrun worker has all five; a part of them is a leftover (or a launcher's mistake)
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if {"RANK", "WORLD_SIZE"} & set(os.environ):
        if missing:
            raise InputError("RANK / WORLD_SIZE are set in the environment, but this is no "
                             f"torchrun worker (no {' and '.join(missing)}): unset them, or launch "
                             "with torchrun")
        # RANK 1 of WORLD_SIZE 1 would wait for the others for ever
        ranks = [os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")]
        if not all(map(str.isdigit, ranks)) or int(ranks[0]) >= int(ranks[2]):
            raise InputError(f"RANK={ranks[0]} LOCAL_RANK={ranks[1]} WORLD_SIZE={ranks[2]} in "
                             "the environment: expected whole numbers, RANK below WORLD_SIZE (as "
                             "torchrun sets them)")
    # on the command line, not the preset's
    offsets_from_given = args.pos_offsets_from is not None
    toy_flags = [f"--{k.replace('_', '-')}" for k in TOY_WORLD if getattr(args, k) is not None]
    for k, v in {**PAPER, **(TOY if args.toy else {}), **TOY_WORLD}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.merges = args.merges or MERGES["toy" if args.toy else "paper"][args.bpe != "joint"]
    langs = args.langs.split(",")
    snapshots = args.snapshots.replace(",", " ").split()
    updates = total_updates(args)
    # toydata.py's own check of --toy-order, before anything is written (its message lacks the flag)
    try:
        if args.toy:
            parse_order(args.toy_order)
    except ValueError as e:
        raise InputError(f"--toy-order: {e}", 2) from None
    # sep_emb, sep_tok, sep_pos, sep_layers (or a usage line)
    vars(args).update(parse_sep(args.sep, args.n_layers))
    if args.train_files and args.dev_files:  # both or neither (checked below)
        args.train_files = parse_lang_files("--train-files", args.train_files, langs)
        args.dev_files = parse_lang_files("--dev-files", args.dev_files, langs)
    args.prep_dir = args.prep_dir or join(args.out, "data")
    args.toy_world = args.toy and args.data is None and not args.train_files
    if args.toy_world:
        args.data = join(args.out, "toy")
    # written with the toy world
    toy_dict = join(args.data or "", "dict", f"{langs[0]}-{langs[-1]}.txt")
    if args.code_switch == "toy":
        args.code_switch = toy_dict
    cs = args.code_switch
    bad_snapshots = not all(x.isdigit() and int(x) > 0 for x in snapshots)
    snapshot_steps = sorted({int(x) for x in snapshots if x.isdigit()})
    refused = [  # (when, the usage line)
        (args.overwrite and args.resume,
         "--overwrite starts a new run; it cannot be combined with --resume"),
        (not all(map(str.isalpha, langs)) or len(set(langs)) < len(langs),
         f"--langs {args.langs}: expected distinct languages, each a code of letters, e.g. en,fr"),
        (args.dim % args.n_heads, f"--dim {args.dim} is not divisible by --n-heads {args.n_heads}"),
        (bad_snapshots, f"--snapshots {args.snapshots}: expected 500,1000"),
        (max(snapshot_steps, default=0) > updates,
         f"--snapshots {args.snapshots}: the run ends after {updates} updates (--max-steps, "
         "--epochs): a later snapshot would never be written"),
        (args.bptt < 2,
         f"--bptt {args.bptt}: a stream's first token is never predicted; at least 2 are needed"),
        (offsets_from_given and 0 < args.pos_offsets_from and args.pos_offsets <= args.bptt,
         f"--pos-offsets-from {args.pos_offsets_from}: no offsets to start (--pos-offsets "
         f"{args.pos_offsets} is not above --bptt {args.bptt})"),
        ((args.train_files is None) != (args.dev_files is None),
         "--train-files and --dev-files go together"),
        (args.train_files and args.data is not None,
         "give either --data or --train-files/--dev-files, not both"),
        (args.toy_world and len(langs) > 2,
         f"--langs {args.langs}: the toy world is bilingual; give one or two"),
        (toy_flags and not args.toy_world, f"{' '.join(toy_flags)}: the --toy-* flags shape only "
         "the world that --toy writes without --data or --train-files; here they would change "
         "nothing: leave them out"),
        (args.data is None and not args.train_files,
         "--data (or --train-files/--dev-files, or --toy) is required"),
        # toydata.py writes mono/ first and world.json last: mono/ alone was cut short
        (args.toy and args.data and isdir(join(args.data, "mono"))
         and not isfile(join(args.data, "world.json")),
         f"--data {args.data}: no world.json, not a whole toydata.py world (cut short? write it "
         "again with toydata.py --force)"),
        (cs and args.sep_tok,
         "--code-switch needs one shared vocabulary; it cannot be combined with --sep emb or tok"),
        (cs and len(langs) != 2,
         "--code-switch needs exactly two --langs (the dictionary's source and target)"),
        (cs and not (isfile(cs) or args.toy_world and cs == toy_dict),
         f"--code-switch {cs}: no such file (for 'toy': --toy, or --data a toydata.py world)")]
    for bad, message in refused:
        if bad:
            raise InputError(message, 2)
    args.snapshots = snapshot_steps
    return args


def run_files(out):
    """An earlier run's files in --out (toy/, toy.json, data/, args.json: inputs, reused)."""
    names = set(os.listdir(out)) if isdir(out) else set()
    snapshots = [f for f in names if re.fullmatch(r"step\d+\.pt", f)]
    snapshots.sort(key=lambda f: int(f[4:-3]))
    return [f for f in ("checkpoint.pt", "best.pt", "log.jsonl") if f in names] + snapshots


def command(argv, then, lr=None):
    """ARGV made to go on (then="--resume") or start again ("--overwrite"), maybe at a new --lr."""
    drop = ("--resume", "--overwrite", "--lr") if lr else ("--resume", "--overwrite")
    kept = []
    skip_value = False
    for a in argv:
        name = a.split("=", 1)[0]
        # argparse takes prefixes of a flag
        hit = name.startswith("--") and len(name) > 2 and any(d.startswith(name) for d in drop)
        if not (hit or skip_value):
            kept.append(a)
        skip_value = hit and "=" not in a and "--lr".startswith(name)
    launcher = "torchrun ... pretrain.py" if "LOCAL_RANK" in os.environ else "python pretrain.py"
    new_lr = ["--lr", f"{lr:g}"] if lr else []
    return f"{launcher} {shlex.join(kept + [then] + new_lr)}"


def how_to_go_on(run, argv, lr=None):
    if run.saved_step is None:
        return "nothing was saved; start again with " + command(argv, "--overwrite", lr)
    go_on = command(argv, "--resume", lr)
    return f"{run.ckpt_path} holds step {run.saved_step}; go on with {go_on}"


class StopSignal:
    """SIGTERM, Ctrl-C: at once before training; in it, after the update and checkpoint.pt."""

    def __init__(self, advice):
        self.signum = None
        self.training = False
        self.advice = advice  # advice(): how to go on, for a 2nd Ctrl-C
        self.old = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(self, signum, frame):
        if not self.training:  # only inputs (toy/, data/) so far: the same command reuses them
            raise SystemExit(f"error: stopped by {signal.Signals(signum).name} before training "
                             "started; run the same command")
        second = self.signum is not None
        self.signum = self.signum or signum
        # a second Ctrl-C aborts; a repeated SIGTERM (torchrun's own) cannot
        if second and signum == signal.SIGINT:
            raise SystemExit(f"error: stopped by a second SIGINT without saving; {self.advice()}")


def default_handlers():
    """A forked child (bpe.binarize's pool) gets the default handlers: pool.terminate() ends it."""
    for s in (signal.SIGTERM, signal.SIGINT):
        if isinstance(getattr(signal.getsignal(s), "__self__", None), StopSignal):
            signal.signal(s, signal.SIG_DFL)


os.register_at_fork(after_in_child=default_handlers)

# -----------------------------------------------------------------------------
# count models of the dev sets; checkpoint.pt (a bit-exact --resume); log.jsonl, best.pt

def count_baselines(train_ids, dev_ids, max_tokens=20_000_000):
    """Dev perplexities of unigram (add-one), left bigram and both-neighbour models (Witten-Bell,
    each on the last), fitted on at most max_tokens."""
    t = np.asarray(train_ids[:max_tokens], dtype=np.int64)
    d = np.asarray(dev_ids, dtype=np.int64)
    V = max(t.max(), d.max()) + 1
    uni = (np.bincount(t, minlength=V) + 1.0) / (len(t) + V)  # add-one

    def witten_bell(hist, word, q_hist, q_word, lower):
        """p(w | h) = (c(h, w) + T(h) lower) / (c(h) + T(h)), or `lower` for an unseen h."""
        keys, counts = np.unique(hist * V + word, return_counts=True)
        hs, first = np.unique(keys // V, return_index=True)
        n_h = np.add.reduceat(counts, first)  # tokens after h
        t_h = np.diff(np.append(first, len(keys)))  # distinct words after h
        q = q_hist * V + q_word
        i = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
        c = np.where(keys[i] == q, counts[i], 0)
        j = np.minimum(np.searchsorted(hs, q_hist), len(hs) - 1)
        known = hs[j] == q_hist
        return np.where(known, (c + t_h[j] * lower) / np.where(known, n_h[j] + t_h[j], 1.0), lower)

    a, w, b = t[:-2], t[1:-1], t[2:]  # left, word, right
    qa, qw, qb = d[:-2], d[1:-1], d[2:]
    p_left = witten_bell(a, w, qa, qw, uni[qw])
    p_both = witten_bell(a * V + b, w, qa * V + qb, qw, p_left)
    return tuple(float(np.exp(-np.log(p).mean())) for p in (uni[qw], p_left, p_both))


# how far a run is, Run's fields in checkpoint.pt
PROGRESS = ("step", "epoch", "n_streams", "best_ppl", "best_step", "left_plateau_at")


def read_checkpoint(path, args, argv):
    """--resume's checkpoint.pt, refused when missing, damaged, NaN, foreign or of other flags; a
    flag not given is the checkpoint's (its release's preset, or LATER_FLAGS') -> (it, changes)"""
    if not isfile(path):
        raise InputError(f"--resume: no checkpoint.pt to go on from in {args.out}")
    try:
        model, ckpt = load_model(path)
    except ValueError as e:  # load_model's InputError: the file and what is wrong with it
        raise InputError(f"--resume: {e}; it cannot be continued: start again with "
                         f"{command(argv, '--overwrite')}")
    if not {"args", "optimizer", "rng"} <= set(ckpt):
        raise InputError(f"--resume: {path} is not a checkpoint written by pretrain.py")
    for flag, value, key in (("--max-steps", args.max_steps, "step"),
                             ("--epochs", args.epochs, "epoch")):
        if value <= ckpt[key]:
            raise InputError(f"--resume: {path} is at {key} {ckpt[key]} already; {flag} {value} "
                             "would train nothing (give a larger one)")
    ckpt["model"] = model.state_dict()
    saved = ckpt["args"]
    old = {**parse_sep(saved["sep"], saved["n_layers"]), **LATER_FLAGS, **saved}
    given = vars(build_parser().parse_args(argv))  # None: not on the command line
    new = vars(args)  # args itself: a value set here is the run's
    compared = [k for k in sorted(new) if k not in RESUME_MAY_CHANGE]
    unknown = [f"--{k.replace('_', '-')}" for k in compared if k not in old]
    if unknown:
        raise InputError(f"--resume: {path} is of a pretrain.py from before {', '.join(unknown)}; "
                         f"this one cannot go on from it: start again with "
                         f"{command(argv, '--overwrite')}")
    kept = []
    for k in compared:
        if given.get(k, "") is None and old[k] != new[k]:
            kept.append(f"--{k.replace('_', '-')} {old[k]}")
            new[k] = old[k]
    diff = [f"--{k.replace('_', '-')} {old[k]!r} in the checkpoint, {new[k]!r} now"
            for k in compared if old[k] != new[k]]
    if diff:
        raise InputError(f"--resume: {path} was made with different flags: {'; '.join(diff)}")
    changed = [f"--{k} {old[k]} -> {new[k]}" for k in ("lr", "warmup") if old[k] != new[k]]
    if kept:
        changed.append(f"{', '.join(kept)} as in the checkpoint")
    return ckpt, f" ({', '.join(changed)})" if changed else ""


def data_of(run):  # what --resume compares: other dev sets would have best.pt chosen across two
    dev_sha1 = [hashlib.sha1(np.asarray(d)).hexdigest() for d in run.dev_ids]
    return {"n_tokens": run.n_tokens, "dev_sha1": dev_sha1}


def restore_checkpoint(run, ckpt):
    """Model, optimizer, progress, this rank's RNGs; log.jsonl cut back to the checkpoint's."""
    same_data = all(ckpt["data"].get(k, v) == v for k, v in data_of(run).items())
    if ckpt["tokenizer"] != run.tok.to_dict() or not same_data:
        raise InputError(f"--resume: the data in {run.data_dir} are not {run.ckpt_path}'s "
                         "(training or dev sets)")
    if len(ckpt["rng"]) != run.world_size:  # every rank goes on from its own RNG states
        raise InputError(f"--resume: {run.ckpt_path} goes on with {len(ckpt['rng'])} processes "
                         "only")
    run.raw_model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt["scaler"] and run.scaler.is_enabled():  # empty when the run was not fp16
        run.scaler.load_state_dict(ckpt["scaler"])
    for k in PROGRESS:  # a checkpoint from before best_step and left_plateau_at: its step
        setattr(run, k, ckpt.get(k, ckpt["step"]))
    if not exists(join(run.args.out, "best.pt")) and run.best_ppl < math.inf:
        run.log(f"note: no best.pt in {run.args.out} (its {run.langs[0]} dev ppl: "
                f"{run.best_ppl:.2f}); a new one from step {run.step}")
        run.best_ppl = math.inf
    run.saved_step = run.step
    rng = ckpt["rng"][run.rank]
    run.sampler.load_state_dict(rng["sampler"])
    run.mask_rng.set_state(rng["mask"])
    torch.set_rng_state(rng["torch"])
    if run.device_type == "cuda" and rng["cuda"] is not None:
        torch.cuda.set_rng_state(rng["cuda"])
    log_bytes = ckpt.get("log_bytes", math.inf)  # an earlier release's: the log as it is
    if run.master and exists(run.log_path) and getsize(run.log_path) > log_bytes:
        os.truncate(run.log_path, log_bytes)
        run.log(f"{run.log_path}: records after step {run.step} dropped (they are redone from the "
                "checkpoint)")


def save_checkpoint(run):
    """checkpoint.pt, with every rank's RNGs from before the micro-batch drawn ahead."""
    t0 = time.time()
    cuda_rng = torch.cuda.get_rng_state() if run.device_type == "cuda" else None
    mine = dict(zip(("sampler", "mask"), run.rng_before_next), torch=torch.get_rng_state(),
                cuda=cuda_rng)
    rngs = [mine]
    if run.ddp:  # every rank's
        rngs = [None] * run.world_size
        dist.all_gather_object(rngs, mine)
    if run.master:
        log_bytes = getsize(run.log_path) if exists(run.log_path) else 0
        save_run_file(run, run.ckpt_path, optimizer=run.optimizer.state_dict(),
                      scaler=run.scaler.state_dict(), **{k: getattr(run, k) for k in PROGRESS},
                      rng=rngs, data={"dir": run.data_dir, **data_of(run)}, log_bytes=log_bytes)
    run.saved_step = run.step
    seconds = time.time() - t0
    if run.ddp and seconds > 10 and not run.warned_slow_save:
        run.warned_slow_save = True
        run.log(f"warning: writing {run.ckpt_path} took {seconds:.0f} s: torchrun kills its "
                "workers 30 s after forwarding a SIGTERM, so a stop may keep only the checkpoint "
                "before it (see --save-every)")


def save_run_file(run, path, **extra):
    """best.pt, step{N}.pt, checkpoint.pt: the model, its tokenizer, flags and count models."""
    with write_errors(path):  # save_model writes its own temp file, then renames it
        save_model(path, run.raw_model, tokenizer=run.tok.to_dict(), langs=run.langs,
                   args=vars(run.args), count_models=run.count_models, **extra)


def log_json(run, record):  # a line of log.jsonl, by the master, with the time
    if run.master:
        with write_errors(run.log_path), open(run.log_path, "a") as f:
            f.write(json.dumps({**record, "time": round(time.time(), 1)}) + "\n")


def evaluate(run):
    """The dev perplexities; best.pt when English improves (§3.1), step{N}.pt; -> all finite."""
    args = run.args
    en = run.langs[0]
    finite = True
    if run.master:
        ppl = {lang: evaluate_ppl(run.raw_model, run.dev_ids[j], j, run.vocab_sizes[j], args.bptt,
                                  run.device, run.amp) for j, lang in enumerate(run.langs)}
        finite = all(math.isfinite(v) for v in ppl.values())
        improved = finite and ppl[en] < run.best_ppl
        # on the unigram plateau: not below the left-bigram count model (README "Stalls")
        plateau = not ppl[en] < run.count_models[en]["left"]
        if not plateau and run.left_plateau_at is None:
            run.left_plateau_at = run.step
        listed = ", ".join(f"{lang} dev ppl {v:.2f}" for lang, v in ppl.items())
        mark = " (best)" if improved else ""
        run.log(f"eval step {run.step} | epoch {run.current_epoch} | {listed}{mark}")
        log_json(run, {"step": run.step, "epoch": run.current_epoch, "dev_ppl": ppl,
                       "best": improved, "plateau": plateau})  # before checkpoint.pt
        names = []
        if improved:
            run.best_ppl = ppl[en]
            run.best_step = run.step
            names.append("best.pt")
        if finite and run.step in args.snapshots:
            names.append(f"step{run.step}.pt")
        for name in names:
            save_run_file(run, join(args.out, name), step=run.step, dev_ppl=ppl,
                          count_ppl=run.count_models)
    if run.ddp:  # the master's verdict: every rank stops after the same update
        flag = torch.tensor([float(not finite)], device=run.device)
        dist.all_reduce(flag)
        finite = not flag.item()
    return finite

# -----------------------------------------------------------------------------
# setup: device, data (the toy world, bpe.prepare), model and optimizer, DDP; then main

def write_toy_world(args, langs, master):
    """The master writes OUT/toy once (OUT/toy.json: its knobs); the other ranks wait."""
    knobs = {"langs": langs if len(langs) > 1 else ["en", "fr"], **TOY_SIZES[args.toy_size]}
    for k in ("overlap", "order", "domain_shift", "cyrillic", "seed"):
        knobs[k] = getattr(args, f"toy_{k}")
    record = join(args.out, "toy.json")

    def read():
        return json.load(open(record)) if exists(record) else None

    if master and read() not in (None, knobs):
        if not args.overwrite:
            raise InputError(f"{args.data} was written with other --toy-* flags; add "
                             "--overwrite, or use another --out")
        for d in (args.data, join(args.out, "data")):  # the old world, its prepared data
            shutil.rmtree(d, ignore_errors=True)
    if master and read() != knobs:
        print(f"writing the toy world to {args.data}")
        try:
            write_world(args.data, force=True, **knobs)
        except OSError as e:  # a full disk, an unwritable directory
            raise SystemExit(f"error: cannot write the toy world: {e.filename or args.data}: "
                             f"{e.strerror or e}")
        write_text(record, json.dumps(knobs))
    while read() != knobs:  # the other ranks: until the master has written it
        time.sleep(2)


def load_data(run):
    args = run.args
    langs = run.langs
    files = None
    if args.train_files:
        files = {l: {"train": args.train_files[l], "dev": args.dev_files[l]} for l in langs}
    run.data_dir = prepare(langs, args.prep_dir, args.data, files, mode=args.bpe,
                           merges=args.merges, separate_vocab=args.sep_tok,
                           lowercase=args.lowercase, seed=args.seed, code_switch=args.code_switch,
                           workers=args.workers, master=run.master,
                           allow_overlap=args.allow_overlap)
    try:
        run.tok = Tokenizer.load(join(run.data_dir, "tokenizer.json"))
        train = [load_bin(join(run.data_dir, f"{l}.train")) for l in langs]
        run.train_ids = [ids for ids, _ in train]
        run.dev_ids = [load_bin(join(run.data_dir, f"{l}.dev"))[0] for l in langs]
        run.vocab_sizes = [run.tok.vocab_size(l) for l in langs]
    except (OSError, ValueError, KeyError) as e:  # KeyError: a tokenizer without one of --langs
        raise InputError(f"cannot read the prepared data in {run.data_dir}: {e}") from None
    run.n_tokens = [len(ids) for ids in run.train_ids]
    smallest, lang = min(zip(run.n_tokens, langs))
    same = [l for l, t, d in zip(langs, run.train_ids, run.dev_ids) if np.array_equal(t, d)]
    if same and not args.allow_overlap:  # --dev-files equal to --train-files, or copies in --data
        raise InputError(f"the {same[0]} dev set is its training text: the dev perplexity, and "
                         "best.pt chosen on it, would measure what is trained on; give another dev "
                         "set, or --allow-overlap if it is meant")
    if args.batch_size * args.bptt > smallest:  # every batch mostly `</s>` (a 10^9 typo: no memory)
        raise InputError(f"--batch-size {args.batch_size} x --bptt {args.bptt} is more than the "
                         f"{lang} training data ({smallest} tokens); lower --batch-size")
    n_batches = [n_stream_batches(n, args.batch_size, args.bptt) for n in run.n_tokens]
    probs = sampling_probs([meta["n_sentences"] for _, meta in train])
    run.sampler = StreamSampler(n_batches, probs, seed=[args.seed, run.rank])


# fused on the CPU too: the default's loop was 7 % of a --toy update
def build_adam(params, lr, device_type):
    fused = True if device_type in ("cuda", "cpu") else None
    return torch.optim.Adam(params, lr=lr, fused=fused, **ADAM)


def setup(run, argv):
    args = run.args
    # "cuda" -> "cuda:LOCAL_RANK" (or cuda:0): set_device and DDP need the index
    local_rank = int(os.environ["LOCAL_RANK"]) if run.ddp else None
    run.device, dtype, backend = pick_device(args.device, args.dtype, local_rank)
    if run.device_type == "cuda":
        torch.cuda.set_device(run.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    run.stop = StopSignal(lambda: how_to_go_on(run, argv))
    found = run_files(args.out)
    if found and not (args.resume or args.overwrite):
        resume = "--resume to continue it, " if "checkpoint.pt" in found else ""
        raise InputError(f"--out {args.out} holds {', '.join(found)} of an earlier run; pass "
                         f"{resume}--overwrite to start again, or another --out")
    ckpt = None
    if args.resume:
        ckpt, changed = read_checkpoint(run.ckpt_path, args, argv)
    if args.toy_world:
        write_toy_world(args, run.langs, run.master)
    load_data(run)
    # the model (alike on every rank), Adam, autocast, GradScaler; per-rank masking, dropout seeds
    torch.manual_seed(args.seed)
    shape = {k: getattr(args, k) for k in ("n_layers", "n_heads", "dim", "ffn_dim", "dropout",
                                           "attention_dropout", "lang_emb", "sep_emb", "sep_tok",
                                           "sep_pos", "sep_layers")}
    config = ModelConfig(vocab_size=max(run.vocab_sizes), n_langs=len(run.langs), **shape,
                         vocab_sizes=run.vocab_sizes if args.sep_tok else (),
                         max_positions=max(512, args.bptt, args.pos_offsets))
    run.raw_model = MLM(config).to(run.device)
    run.model = run.raw_model
    run.params = list(run.raw_model.parameters())
    run.optimizer = build_adam(run.params, args.lr, run.device_type)
    run.amp = autocast(run.device, dtype)
    run.scaler = torch.amp.GradScaler(run.device_type, enabled=(dtype == "float16"))
    run.mask_rng = torch.Generator().manual_seed(args.seed * 1000 + run.rank + 1)
    torch.manual_seed(args.seed * 1000 + run.rank + 2)
    if ckpt:
        restore_checkpoint(run, ckpt)
        run.log(f"resumed from {run.ckpt_path} at step {run.step}, epoch {run.current_epoch}"
                f"{changed}")
        # --snapshots at updates passed without their file: they can no longer be written
        missed = [f"step{n}.pt" for n in args.snapshots
                  if n <= run.step and f"step{n}.pt" not in found]
        if missed:
            run.log(f"note: --snapshots: {run.ckpt_path} is at step {run.step}; "
                    f"{', '.join(missed)} can no longer be written")
    if run.master and args.overwrite:  # a new run: no file of the earlier one is mixed in
        for name in found:
            os.remove(join(args.out, name))
    # the flags of this run; the count models of its dev sets (the plateau's measure)
    if run.master:
        args_path = join(args.out, "args.json")
        with write_errors(args_path):  # write_text: a temp file, then renamed
            write_text(args_path, json.dumps(vars(args), indent=1))
        run.count_models = {}
        for l, t, d in zip(run.langs, run.train_ids, run.dev_ids):
            c = dict(zip(("unigram", "left", "both"), count_baselines(t, d)))
            run.count_models[l] = c
            run.log(f"count models of the dev set ({l}): unigram {c['unigram']:.1f}, left bigram "
                    f"{c['left']:.1f}, both neighbours {c['both']:.1f}")
    if run.ddp:  # the other ranks wait for the master's evaluation and checkpoint in a collective
        # the other ranks wait while the master evaluates and saves (NCCL's 10 minutes: too short)
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=60))
        device_ids = [local_rank] if run.device_type == "cuda" else None
        run.ddp_model = DDP(run.raw_model, device_ids=device_ids)
        run.model = run.ddp_model
        # DDP's gradient buckets follow its first backward (--sep: the language drawn): one of
        # language 0 on <s> <s> (no RNG, gradients dropped) fixes them for a resumed run too
        x = torch.zeros((1, 2), dtype=torch.long, device=run.device)
        run.raw_model.eval()
        (run.ddp_model(x, 0, x)[1] + zero_term(run.raw_model, 0)).backward()
        run.raw_model.train()
        run.optimizer.zero_grad(set_to_none=True)
    if args.compile:  # after DDP: the graph is split at its gradient buckets (all-reduce overlaps)
        run.model = torch.compile(run.model)
    run.log(f"languages {run.langs} (sampling p = {np.round(run.sampler.probs, 3).tolist()}), "
            f"vocab sizes {run.vocab_sizes}, train tokens {run.n_tokens}\n"
            f"model: {sum(p.numel() for p in run.params):,} parameters, sep={args.sep or 'none'}, "
            f"bpe={args.bpe}, dtype {dtype}, device {run.device}; {run.tokens_per_update:,} tokens "
            f"per update ({args.batch_size} streams x {args.bptt} x {args.accumulate} accumulation"
            f" x {run.world_size} processes)")


def say_verdict(run):
    """Where the run ends against the count models of the English dev set (README "Stalls")."""
    en = run.langs[0]
    counts = run.count_models[en]
    best = run.best_ppl
    if best > counts["left"]:
        run.log(f"warning: the MLM has not left the unigram plateau: {en} dev ppl {best:.2f} is "
                f"above the left-bigram count model's {counts['left']:.1f} (unigram "
                f"{counts['unigram']:.1f}); its scores would measure an unconverged model: train "
                "longer (--max-steps) or try another --seed")
        return
    where = (f"left the unigram plateau at update {run.left_plateau_at:,}; {en} dev ppl {best:.2f} "
             f"at {run.best_step:,}")
    if best > counts["both"]:
        run.log(f"note: {where}, above the both-neighbour count model's {counts['both']:.1f}: the "
                "MLM has not yet used more than the two neighbours of a masked token")
    else:
        run.log(f"converged: {where}, below the both-neighbour model's {counts['both']:.1f}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    t0 = time.time()
    parser = build_parser()
    # a bad input: one `error: ...` line (a flag's: after the usage line, code 2)
    with reported(parser):
        args = get_args(argv, parser)
        run = Run(args=args, langs=args.langs.split(","), rank=int(os.environ.get("RANK", 0)),
                  world_size=int(os.environ.get("WORLD_SIZE", 1)), ddp="RANK" in os.environ)
        with locked(args.out, "pretrain.py", [args.prep_dir], run.master):
            setup(run, argv)
            ending = train(run)
    for sig, handler in run.stop.old.items():  # the handlers from before the run
        signal.signal(sig, handler)
    if run.ddp:  # the ranks' weights compared (a collective: no rank leaves before checkpoint.pt)
        digests = [None] * run.world_size  # a checksum per tensor
        mine = [float(t.double().sum()) for t in run.raw_model.state_dict().values()]
        dist.all_gather_object(digests, mine)
        # its reducer holds gloo work: destroying the group first aborted 3 of 25 runs
        run.model = None
        run.ddp_model = None
        gc.collect()
        dist.destroy_process_group()
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        if odd:
            raise SystemExit(f"error: ranks {odd} hold other weights than rank 0" if run.master
                             else 1)
        run.log(f"ranks agree: the {run.world_size} processes hold the same weights")
    if ending.signum:
        run.log(f"stopped by {ending.by} after step {run.step}: saved {run.ckpt_path}; to go on, "
                f"run {command(argv, '--resume')}", file=sys.stderr)
        sys.exit(128 + ending.signum)  # the shell's code for a process ended by that signal
    if ending.diverged:
        advice = how_to_go_on(run, argv, lr=args.lr / 2)
        raise SystemExit(f"error: {ending.diverged}; {advice}" if run.master else 1)
    if run.master:
        say_verdict(run)
    inputs = [f for f in ("args.json", "toy.json", "toy/", "data/") if exists(join(args.out, f))]
    files = ", ".join(inputs + run_files(args.out))
    run.log(f"done: {ending.by} reached at step {run.step}, epoch {run.current_epoch}, in "
            f"{timedelta(seconds=round(time.time() - t0))}; {files} in {args.out}")


if __name__ == "__main__":
    main()
