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
import signal
import sys
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from bpe import (EOS_ID, MASK_ID, MODES, Tokenizer, atomic_write, load_bin, make_dir, parse_lang_files, prepare,
                 write_text)
from model import MLM, ModelConfig, autocast, parse_sep, pick_device, save_model
from toydata import SIZES as TOY_SIZES, parse_order, write_world

MASK_PROB = 0.15              # paper §3.1 / BERT: 15 % of the positions are predicted
PRED_PROBS = (0.8, 0.1, 0.1)  # of those: MASK, kept, random id (XLM word_mask_keep_rand)
ALPHA = 0.7                   # language sampling exponent (XLM lg_sampling_factor)
ADAM = dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)  # D3: XLM's adam_inverse_sqrt, no weight decay

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
        return {"rng": self.rng.bit_generator.state, "pos": list(self.pos),
                "order": [torch.from_numpy(o.astype(np.int64)) for o in self.order]}

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
    for start in tqdm(range(0, n, windows_per_forward), desc=f"eval lang {lang}", leave=False, mininterval=2):
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
# chosen on the Default model only (README "Calibrating the --toy preset") and frozen; streams at random offsets in
# positions 0..47 train every position a toy fine-tuning input uses
TOY = dict(n_layers=8, dim=64, n_heads=4, ffn_dim=256, batch_size=64, bptt=16, pos_offsets=48, lr=2e-3,
           warmup=500, schedule="linear", epoch_size=32000, max_steps=8000, eval_every=0, log_every=500, threads=1)
MERGES = {"paper": (80000, 40000), "toy": (2000, 1000)}  # (joint, per language for separate/prefixed)
# may differ on --resume (data are compared by vocabulary and token counts; --lr, --warmup: a diverged run goes on)
RESUME_MAY_CHANGE = {"resume", "max_steps", "snapshots", "epochs", "log_every", "eval_every", "device", "compile",
                     "workers", "threads", "out", "data", "train_files", "dev_files", "prep_dir", "overwrite",
                     "lr", "warmup", "max_bad_steps"}
RANGES = [("> 0", lambda v: v > 0, "n_layers dim n_heads batch_size bptt accumulate epoch_size epochs max_steps "
                                   "lr merges log_every max_bad_steps workers threads"),
          (">= 0", lambda v: v >= 0, "warmup eval_every clip seed toy_seed pos_offsets"),
          ("in [0, 1)", lambda v: 0 <= v < 1, "dropout attention_dropout"),
          ("in [0, 1]", lambda v: 0 <= v <= 1, "toy_overlap toy_domain_shift")]


def get_args(argv=None):
    """The flags, presets filled in, every value checked before any work (one usage line each); resolves --sep."""
    p = argparse.ArgumentParser(prog="pretrain.py", description=__doc__.split("\n\n")[0])
    a = p.add_argument

    def preset(flag, typ, what, **kw):  # unset: PAPER's value, or TOY's with --toy
        k = flag[2:].replace("-", "_")
        a(flag, type=typ, help=f"{what}: paper {PAPER[k]}" + (f"; --toy {TOY[k]}" if k in TOY else ""), **kw)

    a("--out", required=True, help="run directory: checkpoint.pt, best.pt, log.jsonl (and toy/, data/)")
    a("--toy", action="store_true", help="CPU-sized preset, on the synthetic world of toydata.py unless --data")
    a("--data", help="directory of {lang}.{train,dev}.txt (or toydata's mono/), or one bpe.py prepared")
    a("--train-files", metavar="LANG=PATH,...", help="text per language instead of --data, e.g. en=a.txt,fr=b.txt")
    a("--dev-files", metavar="LANG=PATH,...", help="dev text per language (with --train-files)")
    a("--langs", default="en,fr", help="comma-separated; the first is 'English' (model selection, paper: en,xx)")
    a("--resume", action="store_true", help="continue from OUT/checkpoint.pt (--lr, schedule and length may change)")
    a("--overwrite", action="store_true", help="start a new run in an --out holding an earlier run's files")
    a("--seed", type=int, default=0, help="seed for init, data order, masking, dropout")
    # data preparation (bpe.prepare)
    a("--bpe", choices=MODES, default="joint", help="joint: Default; separate: Default anchors; prefixed: No anchors")
    a("--merges", type=int, help="BPE merges: paper 80000 joint, 40000 per language; --toy 2000 / 1000")
    a("--code-switch", metavar="DICT", help="MUSE dictionary to code-switch the text with (Extra anchors, D11), or toy")
    a("--lowercase", action="store_true", help="lowercase and strip accents (XLM-15 style; off, D5)")
    a("--prep-dir", help="cache for prepared data (default OUT/data)")
    a("--workers", type=int, default=1, help="processes for binarising text")
    # toy world (toydata.py)
    a("--toy-size", choices=list(TOY_SIZES), default="full", help="toy world size (tiny is for tests)")
    a("--toy-overlap", type=float, default=0.0, help="toy: fraction of shared word forms (anchors)")
    a("--toy-order", default="svo", help="toy: word order of the second language, e.g. sov-na-post (toydata.py)")
    a("--toy-domain-shift", type=float, default=0.0, help="toy: topic shift between the languages (Wiki-CC: 1.0)")
    a("--toy-cyrillic", action="store_true", help="toy: write the second language in Cyrillic letters")
    a("--toy-seed", type=int, default=0, help="toy: world seed")
    # model (model.ModelConfig)
    a("--sep", default="", help="language-specific parts (Table 1): emb, 1-3, 1-6, emb,1-3, emb,1-6; also tok, pos")
    a("--lang-emb", action="store_true", help="add language embeddings (off, as mBERT/XLM-100; D1)")
    preset("--n-layers", int, "layers")
    preset("--dim", int, "hidden size")
    preset("--n-heads", int, "attention heads")
    preset("--ffn-dim", int, "feed-forward size")
    preset("--dropout", float, "dropout")
    preset("--attention-dropout", float, "attention dropout (D4)")
    # optimisation
    preset("--batch-size", int, "streams per GPU per micro-batch (x 8 GPUs in the paper)")
    preset("--bptt", int, "tokens per stream")
    preset("--pos-offsets", int, "N: each stream starts at a random position in [0, N - bptt] (off: N <= bptt)")
    a("--accumulate", type=int, help="micro-batches per update (default 1; on 1 GPU, 8 = the paper's 8 GPUs)")
    preset("--lr", float, "peak learning rate")
    preset("--warmup", int, "linear warm-up updates from 1e-7")
    preset("--schedule", None, "after warm-up: inverse_sqrt (XLM) or linear to 0", choices=["inverse_sqrt", "linear"])
    a("--clip", type=float, default=5.0, help="gradient clipping norm, 0 = off (D3)")
    preset("--epoch-size", int, "streams per GPU per epoch (D2)")
    preset("--epochs", int, "epochs")
    a("--max-steps", type=int, help="stop after this many updates (paper: none; --toy 8000)")
    a("--eval-every", type=int, help="also evaluate and save every N updates (default 0: once per epoch)")
    a("--snapshots", default="", metavar="STEP,...", help="also keep the model at these updates as OUT/step{N}.pt")
    preset("--log-every", int, "progress line every N updates")
    a("--max-bad-steps", type=int, default=5, help="stop after this many NaN/inf losses in a row")
    # system
    a("--device", default="auto", help="auto, cpu, cuda (cuda:LOCAL_RANK under torchrun), cuda:N, mps")
    a("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
      help="autocast: auto = bf16 on GPUs that support it, else fp16 with a GradScaler; fp32 on CPU and MPS")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--threads", type=int, help="CPU threads for torch (default torch's; --toy 1)")
    args = p.parse_args(argv)
    for k, v in {**PAPER, **(TOY if args.toy else {})}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.merges is None:
        args.merges = MERGES["toy" if args.toy else "paper"][args.bpe != "joint"]

    def need(ok, message):
        if not ok:
            p.error(message)

    def parsed(prefix, parse, *a):  # a parser's ValueError -> one usage line
        try:
            return parse(*a)
        except ValueError as e:
            p.error(prefix + str(e))

    langs = args.langs.split(",")
    need(not (args.overwrite and args.resume), "--overwrite starts a new run; it cannot be combined with --resume")
    need(all(map(str.isalpha, langs)) and len(set(langs)) == len(langs),
         f"--langs {args.langs}: expected distinct languages, each a code of letters, e.g. en,fr")
    for what, ok, names in RANGES:
        for k in names.split():
            v = getattr(args, k)  # None: not given (--threads)
            need(v is None or ok(v) and math.isfinite(v), f"--{k.replace('_', '-')} must be {what}, got {v}")
    need(args.dim % args.n_heads == 0, f"--dim {args.dim} is not divisible by --n-heads {args.n_heads}")
    snapshots = args.snapshots.replace(",", " ").split()
    need(all(x.isdigit() and int(x) > 0 for x in snapshots), f"--snapshots {args.snapshots}: expected e.g. 500,1000")
    args.snapshots = sorted({int(x) for x in snapshots})
    vars(args).update(parsed("", parse_sep, args.sep, args.n_layers))  # sep_emb, sep_tok, sep_pos, sep_layers
    if args.toy:  # toydata.py's own check, before anything is written
        parsed("--toy-order: ", parse_order, args.toy_order)
    # the data: --data, --train-files/--dev-files or the toy world in OUT/toy; prepared in --prep-dir
    need((args.train_files is None) == (args.dev_files is None), "--train-files and --dev-files go together")
    if args.train_files:
        need(args.data is None, "give either --data or --train-files/--dev-files, not both")
        args.train_files = parsed("", parse_lang_files, "--train-files", args.train_files, langs)
        args.dev_files = parsed("", parse_lang_files, "--dev-files", args.dev_files, langs)
    args.prep_dir = args.prep_dir or os.path.join(args.out, "data")
    args.toy_world = args.toy and args.data is None and not args.train_files
    if args.toy_world:
        need(len(langs) <= 2, f"--langs {args.langs}: the toy world is bilingual (toydata.py); give one or two")
        args.data = os.path.join(args.out, "toy")
    need(args.data is not None or args.train_files, "--data (or --train-files/--dev-files, or --toy) is required")
    if args.code_switch:
        need(not args.sep_tok, "--code-switch needs one shared vocabulary; it cannot be combined with --sep emb or tok")
        need(len(langs) == 2, "--code-switch needs exactly two --langs (the dictionary's source and target)")
        toy_dict = os.path.join(args.data or "", "dict", f"{langs[0]}-{langs[1]}.txt")  # written with the toy world
        args.code_switch = toy_dict if args.code_switch == "toy" else args.code_switch
        need(os.path.isfile(args.code_switch) or args.toy_world and args.code_switch == toy_dict,
             f"--code-switch {args.code_switch}: no such file (for 'toy': --toy, or --data a toydata.py world)")
    return args

# -----------------------------------------------------------------------------
# main: device, run directory, data, model and optimiser, training loop with evaluation and checkpoints

def main(argv=None):
    args = get_args(argv)
    langs = args.langs.split(",")
    ddp = int(os.environ.get("RANK", -1)) != -1  # under torchrun
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    master = rank == 0  # the master evaluates and writes the files
    try:  # "cuda" -> "cuda:LOCAL_RANK" (or cuda:0): set_device and DDP need the index
        device, dtype, backend = pick_device(args.device, args.dtype, int(os.environ["LOCAL_RANK"]) if ddp else None)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    device_type = torch.device(device).type  # cuda, cpu or mps
    if device_type == "cuda":
        torch.cuda.set_device(device)
    if args.threads:
        torch.set_num_threads(args.threads)
    log = print if master else (lambda *a, **k: None)
    ckpt_path, log_path = os.path.join(args.out, "checkpoint.pt"), os.path.join(args.out, "log.jsonl")

    # SIGTERM (a preempted job) or Ctrl-C during training only sets a flag (the handler may interrupt a print): the
    # loop finishes the update, saves checkpoint.pt and exits 128 + signal. Before training, or a second time: at once
    stop_signal, training = None, False

    def on_signal(signum, frame):
        nonlocal stop_signal
        if not training or stop_signal is not None:
            raise SystemExit(f"error: stopped by {signal.Signals(signum).name} without saving; run the same command")
        stop_signal = signum

    old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    # the run directory: a new run refuses an earlier run's files unless --overwrite (toy/ and data/ are reused);
    # --resume reads checkpoint.pt, refused unless made with the same flags (RESUME_MAY_CHANGE aside)
    found = [f for f in ("checkpoint.pt", "best.pt", "log.jsonl") if os.path.exists(os.path.join(args.out, f))]
    if found and not (args.resume or args.overwrite):
        raise SystemExit(f"error: --out {args.out} holds {', '.join(found)} of an earlier run; pass --resume to "
                         "continue it (with its checkpoint.pt), --overwrite to start again, or another --out")
    if args.resume:
        try:
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        except Exception as e:  # no such file, or a damaged one
            raise SystemExit(f"error: --resume: cannot read {ckpt_path}: {e}")
        if not isinstance(ckpt, dict) or not {"args", "model", "optimizer", "rng"} <= set(ckpt):
            raise SystemExit(f"error: --resume: {ckpt_path} is not a checkpoint written by pretrain.py")
        old, new = ckpt["args"], vars(args)
        diff = "".join(f"\n  --{k.replace('_', '-')}: {old.get(k)!r} in the checkpoint, {new[k]!r} now"
                       for k in sorted(new) if k not in RESUME_MAY_CHANGE and old.get(k) != new[k])
        if diff:
            raise SystemExit(f"error: --resume: {ckpt_path} was made with different flags:{diff}")
        changed = ", ".join(f"--{k} {old.get(k)} -> {new[k]}" for k in ("lr", "warmup") if old.get(k) != new[k])
    make_dir("--out", args.out)

    # data: the toy world (the master writes it; OUT/toy.json records its knobs, then refuses others), then bpe.prepare
    # (inputs checked first; the master prepares, the other ranks wait), then what it wrote: tokenizer and ids
    if args.toy_world:
        knobs = {"langs": langs if len(langs) > 1 else ["en", "fr"], "overlap": args.toy_overlap,
                 "order": args.toy_order, "domain_shift": args.toy_domain_shift, "cyrillic": args.toy_cyrillic,
                 "seed": args.toy_seed, **TOY_SIZES[args.toy_size]}
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
    n_tokens, probs = [len(ids) for ids in train], sampling_probs([m["n_sentences"] for m in meta])

    # model, optimiser (D3), AMP: autocast (none for float32) and a GradScaler for float16
    torch.manual_seed(args.seed)  # same init on every rank (DDP broadcasts rank 0's anyway)
    config = ModelConfig(vocab_size=max(vocab_sizes), n_langs=len(langs), n_layers=args.n_layers,
                         n_heads=args.n_heads, dim=args.dim, ffn_dim=args.ffn_dim, dropout=args.dropout,
                         attention_dropout=args.attention_dropout, max_positions=max(512, args.bptt, args.pos_offsets),
                         lang_emb=args.lang_emb, sep_emb=args.sep_emb, sep_tok=args.sep_tok, sep_pos=args.sep_pos,
                         sep_layers=tuple(args.sep_layers), vocab_sizes=tuple(vocab_sizes) if args.sep_tok else ())
    raw_model = MLM(config).to(device)
    params = list(raw_model.parameters())
    optimizer = torch.optim.Adam(params, lr=args.lr, **ADAM)
    ctx = autocast(device, dtype)
    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))

    # per-rank randomness: data order (numpy), masking (torch CPU generator), dropout (torch global); then --resume
    sampler = StreamSampler([n_stream_batches(n, args.batch_size, args.bptt) for n in n_tokens], probs,
                            seed=[args.seed, rank])
    mask_gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    torch.manual_seed(args.seed * 1000 + rank + 2)
    step, epoch, n_streams, best_ppl, bad_steps = 0, 0, 0, float("inf"), 0
    saved_step = None  # the step checkpoint.pt holds
    if args.resume:
        if ckpt["tokenizer"] != tok.to_dict() or ckpt["data"]["n_tokens"] != n_tokens:
            raise SystemExit(f"error: --resume: the data in {data_dir} are not the ones {ckpt_path} was trained on")
        if len(ckpt["rng"]) != world_size:  # every rank goes on from its own RNG states
            raise SystemExit(f"error: --resume: {ckpt_path} goes on with {len(ckpt['rng'])} processes only")
        raw_model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt["scaler"] and scaler.is_enabled():  # empty when the run was not fp16
            scaler.load_state_dict(ckpt["scaler"])
        step, epoch, n_streams, best_ppl = ckpt["step"], ckpt["epoch"], ckpt["n_streams"], ckpt["best_ppl"]
        saved_step, r = step, ckpt["rng"][rank]
        sampler.load_state_dict(r["sampler"])
        mask_gen.set_state(r["mask"])
        torch.set_rng_state(r["torch"])
        if device_type == "cuda" and r.get("cuda") is not None:
            torch.cuda.set_rng_state(r["cuda"])
        log(f"resumed from {ckpt_path} at step {step}, epoch {epoch}" + (f" ({changed})" if changed else ""))
        if master and os.path.exists(log_path) and os.path.getsize(log_path) > ckpt["log_bytes"]:
            os.truncate(log_path, ckpt["log_bytes"])  # what was logged after the checkpoint is done again
            log(f"{log_path}: records after step {step} dropped (they are redone from the checkpoint)")
        del ckpt
    if master and args.overwrite:  # a new run: no file of the earlier one is mixed in
        for name in found:
            os.remove(os.path.join(args.out, name))

    model = torch.compile(raw_model) if args.compile else raw_model
    if ddp:
        dist.init_process_group(backend=backend)
        model = DDP(model, device_ids=[torch.device(device).index] if device_type == "cuda" else None)
    tokens_per_update = args.batch_size * args.bptt * args.accumulate * world_size
    log(f"languages {langs} (sampling p = {np.round(probs, 3).tolist()}), vocab sizes {vocab_sizes}, "
        f"train tokens {n_tokens}")
    log(f"model: {sum(p.numel() for p in params):,} parameters, sep={args.sep or 'none'}, bpe={args.bpe}; "
        f"{tokens_per_update:,} tokens per update ({args.batch_size} streams x {args.bptt} x {args.accumulate} "
        f"accumulation x {world_size} processes), dtype {dtype}, device {device}")

    def log_json(obj):  # log.jsonl, written by the master
        try:
            if master:
                with open(log_path, "a") as f:
                    f.write(json.dumps(obj) + "\n")
        except OSError as e:
            raise SystemExit(f"error: cannot write {log_path}: {e.strerror}")

    # -------------------------------------------------------------------------
    # training loop: one update = `accumulate` micro-batches, each one language (XLM src/trainer.py mlm_step)
    stopped_by, diverged = 0, None
    training = True  # from now on a signal stops the run after the current update (on_signal)
    t0 = time.time()
    while step < args.max_steps and epoch < args.epochs and not stopped_by:
        lr = get_lr(step, args.lr, args.warmup, schedule=args.schedule, max_steps=args.max_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum, micro_langs = torch.zeros((), device=device), []
        for micro in range(args.accumulate):
            lang, i = sampler.next()
            micro_langs.append(langs[lang])
            x = torch.from_numpy(get_batch(train[lang], i, args.batch_size, args.bptt))
            inputs, targets = (t.to(device, non_blocking=True) for t in mask_tokens(x, vocab_sizes[lang], mask_gen))
            offset = None
            if args.pos_offsets > args.bptt:  # --pos-offsets: each stream starts at a random position
                offset = torch.randint(args.pos_offsets - args.bptt + 1, (args.batch_size,), generator=mask_gen)
                offset = offset.to(device, non_blocking=True)
            if ddp:  # sync gradients only on the last micro-batch
                model.require_backward_grad_sync = micro == args.accumulate - 1
            with ctx:
                _, loss = model(inputs, lang, targets, pos_offset=offset)
                # + 0 * one element of every parameter: with --sep, DDP sees every parameter used (no
                # find_unused_parameters) and 1 GPU with --accumulate k does k GPUs' arithmetic (drop_unused_lang_grads)
                loss = loss + sum(p.view(-1)[0] for p in params) * 0.0
            scaler.scale(loss / args.accumulate).backward()
            loss_sum += loss.detach().float()
            n_streams += args.batch_size
        loss_avg = loss_sum / args.accumulate
        if ddp:  # every rank must agree whether to skip
            dist.all_reduce(loss_avg, op=dist.ReduceOp.AVG)
        loss_value = float(loss_avg)
        if raw_model.has_lang_specific():  # which languages did this update see, on any rank?
            used = torch.zeros(len(langs), device=device)
            used[[langs.index(l) for l in micro_langs]] = 1.0
            if ddp:
                dist.all_reduce(used, op=dist.ReduceOp.MAX)
            drop_unused_lang_grads(raw_model, used.tolist())
        grad_norm, stepped = float("nan"), False
        if math.isfinite(loss_value):
            scaler.unscale_(optimizer)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, args.clip if args.clip > 0 else math.inf))
        if math.isfinite(loss_value) and (math.isfinite(grad_norm) or scaler.is_enabled()):
            # fp16: a non-finite grad norm is an overflow; scaler.step skips the update, update() lowers the scale
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            stepped, bad_steps = scaler.get_scale() >= scale, 0
            step += int(stepped)
        else:
            bad_steps += 1
            log(f"step {step}: non-finite loss {loss_value} / grad norm {grad_norm}, update skipped "
                f"({bad_steps} in a row)")
            log_json({"step": step, "skipped": True, "loss": loss_value, "grad_norm": grad_norm})
            if bad_steps >= args.max_bad_steps:
                diverged = f"{bad_steps} non-finite losses in a row at step {step}"
                break
        optimizer.zero_grad(set_to_none=True)
        if stepped and step % args.log_every == 0:
            tok_s, t0 = tokens_per_update * args.log_every / (time.time() - t0), time.time()
            log(f"step {step} | epoch {epoch} | loss {loss_value:.4f} | lr {lr:.2e} | grad norm {grad_norm:.2f} | "
                f"{tok_s:,.0f} tok/s")
            log_json({"step": step, "epoch": epoch, "lang": ",".join(micro_langs), "loss": loss_value, "lr": lr,
                      "grad_norm": grad_norm, "tok_per_s": tok_s})

        # evaluation (master) at the end of an epoch and of the run, every --eval-every and at --snapshots: best.pt
        # when English improves (paper §3.1), step{N}.pt; a non-finite perplexity stops the run, overwriting nothing
        evaluate = (n_streams >= args.epoch_size or step >= args.max_steps
                    or stepped and (args.eval_every and step % args.eval_every == 0 or step in args.snapshots))
        if n_streams >= args.epoch_size:  # the epoch counter moves on (XLM)
            n_streams, epoch = 0, epoch + 1
        ok = True
        if evaluate and master:
            ppl = {l: evaluate_ppl(raw_model, dev[j], j, vocab_sizes[j], args.bptt, device, ctx)
                   for j, l in enumerate(langs)}
            ok = all(math.isfinite(v) for v in ppl.values())
            improved = ok and ppl[langs[0]] < best_ppl
            log(f"eval step {step} epoch {epoch}: dev ppl " + ", ".join(f"{l} {v:.2f}" for l, v in ppl.items())
                + (" (best)" if improved else ""))
            log_json({"step": step, "epoch": epoch, "dev_ppl": ppl, "best": improved})  # before checkpoint.pt
            best_ppl = ppl[langs[0]] if improved else best_ppl
            names = (["best.pt"] if improved else []) + ([f"step{step}.pt"] if ok and step in args.snapshots else [])
            for name in names:
                atomic_write(os.path.join(args.out, name), lambda tmp: save_model(
                    tmp, raw_model, tokenizer=tok.to_dict(), langs=langs, args=vars(args), step=step, dev_ppl=ppl))

        # a signal on any rank, or the master's non-finite dev perplexity: every rank stops after the same update
        halt = torch.tensor([float(stop_signal or 0), float(not ok)], device=device)
        if ddp:
            dist.all_reduce(halt, op=dist.ReduceOp.MAX)
        stopped_by, ok = int(halt[0]), not halt[1]
        if not ok:
            log(f"warning: step {step}: dev ppl is not finite; checkpoint.pt and best.pt were not overwritten")
            diverged = f"the dev perplexity is not finite at step {step}"
            break
        if evaluate or stopped_by:
            # checkpoint.pt: everything needed to go on bit for bit, every rank's RNG states included (a collective)
            rngs = [{"sampler": sampler.state_dict(), "mask": mask_gen.get_state(), "torch": torch.get_rng_state(),
                     "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None}]
            if ddp:
                rngs, mine = [None] * world_size, rngs[0]
                dist.all_gather_object(rngs, mine)
            if master:
                ck = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                      "scaler": scaler.state_dict(), "config": asdict(config), "args": vars(args),
                      "tokenizer": tok.to_dict(), "langs": langs, "step": step, "epoch": epoch, "n_streams": n_streams,
                      "best_ppl": best_ppl, "rng": rngs, "data": {"dir": data_dir, "n_tokens": n_tokens},
                      "log_bytes": os.path.getsize(log_path) if os.path.exists(log_path) else 0}
                atomic_write(ckpt_path, lambda tmp: torch.save(ck, tmp))
            saved_step = step
    for sig, handler in old_handlers.items():
        signal.signal(sig, handler)
    if ddp:
        dist.barrier()  # no rank leaves before the master has written checkpoint.pt (torchrun kills the rest)
        # free the DDP wrapper (its reducer holds gloo work) first: with torch 2.13 + gloo, destroying the group while
        # it lived aborted 3 of 25 two-process runs ("terminate called without an active exception"), 0 of 30 after
        del model
        gc.collect()
        dist.destroy_process_group()
    if stopped_by:
        log(f"stopped by {signal.Signals(stopped_by).name} after step {step}: saved {ckpt_path}; to go on, "
            "run the same command with --resume", file=sys.stderr)
        sys.exit(128 + stopped_by)  # the shell's code for a process ended by that signal
    if diverged:
        raise SystemExit(1 if not master else f"error: {diverged}; " + (
            "nothing was saved: start again with a lower --lr (and --overwrite)" if saved_step is None else
            f"{ckpt_path} holds step {saved_step}: the same command plus --resume --lr X (lower) or --dtype float32"))
    log(f"done: step {step}, epoch {epoch}, best {langs[0]} dev ppl {best_ppl:.2f}; files in {args.out}")


if __name__ == "__main__":
    main()
