"""pretrain.py: masking, schedule, sampling, streams (pure functions), then short CPU runs of the CLI:
loss goes down, exact resume, a 2-process torchrun run, and every Table 1 row's flags."""
import copy
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from bpe import EOS_ID, MASK_ID, PAD_ID
from conftest import SMOKE
from pretrain import StreamSampler, get_batch, get_lr, mask_tokens, n_stream_batches, sampling_probs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# the canonical smoke flags (README uses the same): tiny model, a few steps; TINY_WORLD: a tiny toy world
# written to OUT/toy (the --toy-* flags are refused with --data)
TINY = SMOKE + ["--batch-size", "4", "--merges", "300", "--log-every", "1"]
TINY_WORLD = TINY + ["--toy-size", "tiny"]

# -----------------------------------------------------------------------------
# masking (paper §3.1, BERT; XLM src/trainer.py mask_out)


def test_mask_statistics_15_percent_and_80_10_10():
    g = torch.Generator().manual_seed(0)
    V = 1000
    x = torch.randint(14, V, (400, 256), generator=g)  # 102,400 positions, no MASK id in the input
    inputs, targets = mask_tokens(x, V, g)
    sel = targets != -1
    assert not sel[:, 0].any(), "position 0 of a stream is never predicted (XLM)"
    frac = sel[:, 1:].float().mean().item()
    assert abs(frac - 0.15) < 0.005
    assert torch.equal(targets[sel], x[sel]) and (targets[~sel] == -1).all()
    assert torch.equal(inputs[~sel], x[~sel]), "unselected positions are untouched"
    n = sel.sum().item()
    masked = (inputs[sel] == MASK_ID).float().sum().item() / n
    kept = (inputs[sel] == x[sel]).float().sum().item() / n  # includes random draws that hit the same id (~0.1 %)
    assert abs(masked - 0.8) < 0.01
    assert abs(kept - 0.1) < 0.01
    assert abs((1 - masked - kept) - 0.1) < 0.01


def test_mask_random_ids_come_from_the_batch_language_vocab():
    g = torch.Generator().manual_seed(1)
    x = torch.full((200, 128), 40, dtype=torch.long)
    inputs, targets = mask_tokens(x, 50, g, probs=(0.0, 0.0, 1.0))
    rand = inputs[targets != -1]
    assert rand.min() >= 0 and rand.max() < 50
    assert len(rand.unique()) > 40, "uniform over [0, V) including the specials, as XLM"


def test_mask_eval_mode_masks_everything_and_is_deterministic():
    x = torch.randint(14, 100, (8, 16))
    a = mask_tokens(x, 100, torch.Generator().manual_seed(0), probs=(1.0, 0.0, 0.0), at_least_one=True)
    b = mask_tokens(x, 100, torch.Generator().manual_seed(0), probs=(1.0, 0.0, 0.0), at_least_one=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    sel = a[1] != -1
    assert (a[0][sel] == MASK_ID).all() and sel.any(dim=1).all()

# -----------------------------------------------------------------------------
# schedule and language sampling


@pytest.mark.parametrize("step, lr", [(0, 1e-7), (15000, 5.005e-5), (30000, 1e-4), (120000, 5e-5)])
def test_get_lr_paper_schedule(step, lr):
    """1e-7 + 15000 * (1e-4 - 1e-7) / 30000 = 5.005e-5; 1e-4 * sqrt(30000 / 120000) = 5e-5."""
    assert get_lr(step) == pytest.approx(lr, rel=1e-9)


@pytest.mark.parametrize("step, lr", [(0, 1e-7), (50, 1e-7 + 50 * (1e-3 - 1e-7) / 100), (100, 1e-3),
                                      (600, 5e-4), (1050, 5e-5), (1100, 0.0), (1200, 0.0)])
def test_get_lr_linear_schedule(step, lr):
    """--schedule linear (the toy preset): same warm-up, then straight down to 0 at max_steps."""
    assert get_lr(step, 1e-3, 100, schedule="linear", max_steps=1100) == pytest.approx(lr, rel=1e-9, abs=1e-15)


def test_sampling_probs():
    assert sampling_probs([900, 100], alpha=0.5) == pytest.approx([0.75, 0.25])
    p = sampling_probs([1000, 10])
    q = np.array([1000, 10]) / 1010
    assert p == pytest.approx(q ** 0.7 / (q ** 0.7).sum())
    assert p[1] > q[1], "alpha < 1 up-samples the small language"
    assert sampling_probs([5, 5]) == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError):
        sampling_probs([10, 0])

# -----------------------------------------------------------------------------
# streams (XLM src/data/dataset.py StreamDataset)


def xlm_stream_data(S, bs, bptt):
    """XLM StreamDataset literally: left-pad with </s>, reshape to bs columns, add a </s> row on top."""
    N = len(S)
    n_batches = math.ceil(N / (bs * bptt))
    T = n_batches * bptt * bs
    buf = np.concatenate([np.full(T - N, EOS_ID), S]).reshape(bs, n_batches * bptt).T
    return np.vstack([np.full((1, bs), EOS_ID), buf]), n_batches


@pytest.mark.parametrize("N, bs, bptt", [(1000, 3, 16), (96, 2, 8), (5, 1, 4), (4097, 4, 64)])
def test_get_batch_equals_xlm_stream_dataset(N, bs, bptt):
    rng = np.random.default_rng(N)
    S = rng.integers(14, 200, N).astype(np.uint16)
    S[rng.random(N) < 0.1] = EOS_ID
    data, n_batches = xlm_stream_data(S, bs, bptt)
    assert n_stream_batches(N, bs, bptt) == n_batches
    for i in range(n_batches):
        got = get_batch(S, i, bs, bptt)
        assert got.shape == (bs, bptt) and got.dtype == np.int64
        assert np.array_equal(got, data[i * bptt:(i + 1) * bptt].T)


def test_streams_are_contiguous_text_with_eos_separators_and_no_padding():
    # sentences "10 11 12 </s> 20 21 </s> ...": every window is a contiguous slice of the corpus
    sents = [[100 + 10 * k + j for j in range(1 + k % 5)] for k in range(60)]
    S = np.array([t for s in sents for t in s + [EOS_ID]], dtype=np.uint16)
    text = " ".join(map(str, S.tolist()))
    seen = 0
    for i in range(n_stream_batches(len(S), 2, 8)):
        b = get_batch(S, i, 2, 8)
        assert not (b == PAD_ID).any()
        for row in b:
            body = row[row != EOS_ID]
            seen += len(body)
            row = row.tolist()
            while row and row[0] == EOS_ID:  # leading </s> = the extra top row or XLM's left padding
                row = row[1:]
            assert " ".join(map(str, row)) in text
    assert seen == (S != EOS_ID).sum(), "every corpus token appears exactly once per pass"
    assert get_batch(S, 0, 1, 8)[0, 0] == EOS_ID, "the stream starts with </s> (XLM's extra row)"


def test_sampler_one_language_per_batch_each_pass_a_permutation_and_resumable():
    s = StreamSampler([5, 3], [0.6, 0.4], seed=[0, 0])
    draws = [s.next() for _ in range(40)]
    for lang, n in ((0, 5), (1, 3)):
        idx = [i for l, i in draws if l == lang]
        for k in range(0, len(idx) - n + 1, n):  # every full pass visits every batch once
            assert sorted(idx[k:k + n]) == list(range(n))
    state = s.state_dict()
    a = [s.next() for _ in range(20)]
    t = StreamSampler([5, 3], [0.6, 0.4], seed=[9, 9])
    t.load_state_dict(state)
    assert [t.next() for _ in range(20)] == a
    other_rank = StreamSampler([5, 3], [0.6, 0.4], seed=[0, 1])
    assert [other_rank.next() for _ in range(40)] != draws

# -----------------------------------------------------------------------------
# the CLI, on a tiny toy world (in-process through runpy where possible: no torch start-up per run)


def run(argv):
    """python pretrain.py ARGV, in this process."""
    import signal

    import pretrain
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        pretrain.main([str(a) for a in argv])
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    finally:
        for s, h in handlers.items():  # pretrain.py's own (SIGTERM/Ctrl-C save a checkpoint) stay in it
            signal.signal(s, h)


def read_log(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(l) for l in f]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny toy world (raw text) and its joint-BPE preparation (left by a 1-update run), shared by the runs below."""
    out = tmp_path_factory.mktemp("prep")
    run(TINY_WORLD + ["--out", out, "--max-steps", 1])
    (prepared,) = [d for d in (out / "data").iterdir() if d.is_dir()]
    return {"raw": out / "toy", "joint": prepared, "cache": out / "data"}


def test_tiny_run_loss_goes_down_and_leaves_best_checkpoint_log(world, tmp_path):
    from bpe import Tokenizer
    from model import load_model
    out = tmp_path / "run"
    run(TINY + ["--data", world["joint"], "--out", out, "--max-steps", 40, "--lr", 3e-3, "--warmup", 5,
                "--eval-every", 20])
    log = read_log(out)
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 40
    assert np.mean(losses[-8:]) < np.mean(losses[:8]) - 0.5
    evals = [r for r in log if "dev_ppl" in r]
    assert [r["step"] for r in evals] == [20, 40]
    assert evals[-1]["dev_ppl"]["en"] < evals[0]["dev_ppl"]["en"]
    model, extra = load_model(out / "best.pt")
    assert extra["langs"] == ["en", "fr"] and extra["step"] == 40
    tok = Tokenizer.from_dict(extra["tokenizer"])
    assert tok.vocab_size("en") == model.config.vocab_size
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ck["step"] == 40 and set(ck) >= {"model", "optimizer", "scaler", "rng", "args", "config", "tokenizer"}
    assert os.path.getsize(out / "best.pt") < os.path.getsize(out / "checkpoint.pt")
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


def test_resume_is_bit_exact_and_refuses_other_flags(world, tmp_path):
    flags = TINY + ["--data", world["joint"], "--eval-every", 5, "--epoch-size", 28, "--sep", "1",
                    "--pos-offsets-from", 10]
    run(flags + ["--out", tmp_path / "straight", "--max-steps", 20])  # the split at 10: where the offsets start
    run(flags + ["--out", tmp_path / "split", "--max-steps", 10])
    run(flags + ["--out", tmp_path / "split", "--max-steps", 20, "--resume"])
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 20 and a["epoch"] == b["epoch"] >= 2  # epochs of 7 updates crossed
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for s, t in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(s[k], t[k]) for k in s)
    assert a["rng"][0]["sampler"]["pos"] == b["rng"][0]["sampler"]["pos"]
    la = [r for r in read_log(tmp_path / "straight") if "loss" in r]
    lb = [r for r in read_log(tmp_path / "split") if "loss" in r]
    assert [r["loss"] for r in la] == [r["loss"] for r in lb]
    # a resume with different training flags is refused and leaves the checkpoint alone
    before = (tmp_path / "split" / "checkpoint.pt").read_bytes()
    with pytest.raises(SystemExit, match="different flags"):
        run(flags + ["--out", tmp_path / "split", "--max-steps", 30, "--resume", "--dropout", 0.2])
    with pytest.raises(SystemExit, match="pass --resume"):
        run(flags + ["--out", tmp_path / "split", "--max-steps", 30])
    assert (tmp_path / "split" / "checkpoint.pt").read_bytes() == before
    ckpt = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)  # as written before the flag existed:
    del ckpt["args"]["pos_offsets_from"]  # read as offsets from update 0
    torch.save(ckpt, tmp_path / "split" / "checkpoint.pt")
    with pytest.raises(SystemExit, match="^error: [^\n]*different flags: --pos-offsets-from 0 in the checkpoint, 10 "
                       "now$"):
        run(flags + ["--out", tmp_path / "split", "--max-steps", 30, "--resume"])


def test_a_checkpoint_of_an_earlier_release_resumes_with_its_defaults_or_is_refused_in_one_line(world, tmp_path,
                                                                                                capsys):
    """issue 48: a checkpoint from before --schedule, --pos-offsets(-from), --toy-cyrillic and --sep tok/pos existed
    resumes as its release ran (inverse_sqrt, no offsets), and a flag its release's preset set otherwise (here
    --epoch-size) is the checkpoint's unless given; it was refused as "different flags: --schedule None". Given
    against that default, or from before a flag the table does not know: one line."""
    out = tmp_path / "run"
    flags = TINY + ["--data", world["joint"], "--out", out]
    run(flags + ["--max-steps", 2])
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    for k in ("schedule", "pos_offsets", "pos_offsets_from", "toy_cyrillic", "sep_tok", "sep_pos"):
        del ckpt["args"][k]
    ckpt["args"]["epoch_size"] = 640  # its release's --toy preset
    del ckpt["log_bytes"]
    torch.save(ckpt, out / "checkpoint.pt")
    with pytest.raises(SystemExit, match="^error: --resume: [^\n]*different flags: --schedule 'inverse_sqrt' in the "
                       "checkpoint, 'linear' now$"):
        run(flags + ["--max-steps", 3, "--resume", "--schedule", "linear"])
    capsys.readouterr()
    run(flags + ["--max-steps", 3, "--resume"])
    assert ("(--epoch-size 640, --pos-offsets 0, --pos-offsets-from 0, --schedule inverse_sqrt as in the "
            "checkpoint)") in capsys.readouterr().out
    args = json.loads((out / "args.json").read_text())
    assert (args["schedule"], args["pos_offsets"], args["epoch_size"], args["sep_tok"]) == ("inverse_sqrt", 0, 640,
                                                                                            False)
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 3
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    del ckpt["args"]["lang_emb"]
    torch.save(ckpt, out / "checkpoint.pt")
    with pytest.raises(SystemExit, match="^error: --resume: [^\n]* is of a pretrain.py from before --lang-emb; this "
                       "one cannot go on from it: start again with python pretrain.py [^\n]*--overwrite$"):
        run(flags + ["--max-steps", 4, "--resume"])


def test_tok_per_s_after_resume_counts_the_resumed_updates_only(world, tmp_path):
    """Resumed at step 9 with --log-every 10: the first line covers 1 update, not 10 (it read 10 x too high)."""
    flags = TINY + ["--data", world["joint"], "--out", tmp_path, "--log-every", 10]
    run(flags + ["--max-steps", 9])
    run(flags + ["--max-steps", 40, "--resume"])
    speed = [r["tok_per_s"] for r in read_log(tmp_path) if "tok_per_s" in r]
    assert len(speed) == 4 and speed[0] < 3 * np.median(speed[1:]), speed


def python_count_baselines(train, dev, vocab_size):
    """Known answer: tests/bench_baselines.py's first version, a plain python loop over every dev token."""
    from collections import Counter, defaultdict

    def witten_bell(counts, lower):
        totals = {h: (sum(c.values()), len(c)) for h, c in counts.items()}

        def p(h, w, *lower_args):
            pl = lower(w, *lower_args)
            if h not in totals:
                return pl
            n, t = totals[h]
            return (counts[h].get(w, 0) + t * pl) / (n + t)
        return p

    train, dev = np.asarray(train, dtype=np.int64), np.asarray(dev, dtype=np.int64)
    uni = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    uni /= uni.sum()
    left, both = defaultdict(Counter), defaultdict(Counter)
    for a, w, b in zip(train[:-2].tolist(), train[1:-1].tolist(), train[2:].tolist()):
        left[a][w] += 1
        both[(a, b)][w] += 1
    p_left = witten_bell(left, lambda w: uni[w])
    p_both = witten_bell(both, lambda w, a: p_left(a, w))
    nll = np.zeros(3)
    d = dev.tolist()
    for t in range(1, len(d) - 1):
        a, w, b = d[t - 1], d[t], d[t + 1]
        nll += [-math.log(uni[w]), -math.log(p_left(a, w)), -math.log(p_both((a, b), w, a))]
    return np.exp(nll / (len(d) - 2))


@pytest.mark.parametrize("seed", [0, 1])
def test_count_baselines_equal_the_python_loop(seed):
    from pretrain import count_baselines
    rng = np.random.default_rng(seed)
    train = rng.zipf(1.5, 5000) % 60  # a skewed stream of 60 ids, some of them never in dev or train
    dev = np.concatenate([rng.zipf(1.5, 700) % 60, [61]])  # an id unseen in training
    want = python_count_baselines(train, dev, 62)
    assert count_baselines(train, dev) == pytest.approx(want, rel=1e-12)


def test_a_run_on_the_unigram_plateau_says_so(world, tmp_path, capsys):
    """2 updates: the English dev ppl is far above the left-bigram count model: a warning at the end, "plateau" in the
    eval records, the count models in best.pt (finetune.py --table reads them) and checkpoint.pt; args.json."""
    from model import load_model
    out = tmp_path / "run"
    run(TINY + ["--data", world["joint"], "--out", out, "--max-steps", 2, "--eval-every", 1])
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert re.search(r"^count models of the dev set \(en\): unigram [\d.]+, left bigram [\d.]+, both neighbours",
                     printed, re.M)
    assert re.fullmatch(r"done: --max-steps reached at step 2, epoch 1, in 0:00:\d\d; args.json, checkpoint.pt, "
                        r"best.pt, log.jsonl in .*", lines[-1])
    assert lines[-2].startswith("warning: the MLM has not left the unigram plateau: en dev ppl ")
    assert lines[-2].endswith("train longer (--max-steps) or try another --seed")
    log = read_log(out)
    assert [r.get("plateau") for r in log if "dev_ppl" in r] == [True, True]
    assert all(isinstance(r["time"], float) and abs(r["time"] - time.time()) < 600 for r in log)
    count = load_model(out / "best.pt")[1]["count_ppl"]
    assert set(count) == {"en", "fr"} and set(count["en"]) == {"unigram", "left", "both"}
    assert torch.load(out / "checkpoint.pt", weights_only=True)["count_models"] == count
    assert [r for r in log if "dev_ppl" in r][-1]["dev_ppl"]["en"] > count["en"]["left"]
    with open(out / "args.json") as f:
        assert json.load(f)["max_steps"] == 2


@pytest.mark.parametrize("best, verdict", [
    (30.0, "warning: the MLM has not left the unigram plateau: en dev ppl 30.00 is above the left-bigram "
           "count model's 24.3 (unigram 155.9); its scores would measure an unconverged model"),
    (12.5, "note: left the unigram plateau at update 2,500; en dev ppl 12.50 at 8,000, above the "
           "both-neighbour count model's 11.4: the MLM has not yet used more than the two neighbours"),
    (9.44, "converged: left the unigram plateau at update 2,500; en dev ppl 9.44 at 8,000, below the "
           "both-neighbour model's 11.4")])
def test_the_verdict_places_the_run_against_its_count_models(capsys, best, verdict):
    """Every run ends with a verdict: above the left bigram (still on the unigram plateau), between it and the
    both-neighbour model, or below both (converged), with the update that left the plateau and the best one."""
    from types import SimpleNamespace
    from pretrain import Run, say_verdict
    counts = {"en": {"unigram": 155.9, "left": 24.3, "both": 11.4}}
    say_verdict(Run(args=SimpleNamespace(), langs=["en", "fr"], best_ppl=best, best_step=8000,
                    left_plateau_at=2500, count_models=counts))
    assert capsys.readouterr().out.startswith(verdict)


def test_count_models_record_plateau_at_every_evaluation_and_a_converged_run(world, tmp_path, monkeypatch,
                                                                             capsys):
    """log.jsonl opens with one record of the count models (the keys a plot reads), written once: a resumed run
    adds none; every evaluation says "plateau" true or false; the update that left the plateau (the first
    evaluation below the left bigram) survives --resume. Count models made huge here: every evaluation is
    below them."""
    import pretrain
    from model import load_model
    monkeypatch.setattr(pretrain, "count_baselines", lambda t, d: (3e9, 2e9, 1e9))
    out = tmp_path / "run"
    flags = TINY + ["--data", world["joint"], "--out", out, "--eval-every", 2]
    run(flags + ["--max-steps", 2])
    run(flags + ["--max-steps", 5, "--resume"])
    lines = capsys.readouterr().out.splitlines()
    log = read_log(out)
    models = {"unigram": 3e9, "left": 2e9, "both": 1e9}
    assert set(log[0]) == {"count_models", "time"} and log[0]["count_models"] == {"en": models, "fr": models}
    assert [r for r in log if "count_models" in r] == log[:1]
    assert [(r["step"], r["plateau"]) for r in log if "dev_ppl" in r] == [(2, False), (4, False), (5, False)]
    assert re.fullmatch(r"converged: left the unigram plateau at update 2; en dev ppl [\d.]+ at [245], below "
                        r"the both-neighbour model's 1000000000.0", lines[-2]), lines[-2]
    assert load_model(out / "best.pt")[1]["count_models"] == {"en": models, "fr": models}


def test_one_epoch_numbering_the_end_record_and_the_last_line(tmp_path, capsys):
    """Epochs are counted from 1, alike in the progress line, the evaluation line and log.jsonl for the same
    update (an epoch's last update is in it); the evaluation names each perplexity's language; log.jsonl ends
    with what ended the run; the last line names the limit and every file written in --out (the toy world's
    too)."""
    out = tmp_path / "toy"
    run(TINY_WORLD + ["--out", out, "--epochs", 2, "--epoch-size", 12, "--log-every", 1, "--eval-every", 1])
    printed = capsys.readouterr().out.splitlines()
    progress, evals = {}, {}
    for line in printed:
        if m := re.match(r"step (\d+) \| epoch (\d+) \| loss", line):
            progress[int(m[1])] = int(m[2])
        if m := re.fullmatch(r"eval step (\d+) \| epoch (\d+) \| en dev ppl [\d.]+, fr dev ppl [\d.]+( \(best\))?",
                             line):
            evals[int(m[1])] = int(m[2])
    assert progress == evals == {1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2}  # 3 updates of 4 streams an epoch
    log = read_log(out)
    assert {r["step"]: r["epoch"] for r in log if "loss" in r} == progress
    assert {r["step"]: r["epoch"] for r in log if "dev_ppl" in r} == progress
    assert {k: v for k, v in log[-1].items() if k != "time"} == {"ended_by": "--epochs", "step": 6, "epoch": 2}
    assert re.fullmatch(r"done: --epochs reached at step 6, epoch 2, in 0:\d\d:\d\d; args.json, toy.json, toy/, "
                        r"data/, checkpoint.pt, best.pt, log.jsonl in " + re.escape(str(out)), printed[-1])


def test_help_groups_every_flag_and_shows_the_commands():
    """--help for a newcomer: the required --out first in the usage line, every flag in one of four groups, the
    toy command and the paper's torchrun command at the end."""
    import pretrain
    parser = pretrain.build_parser()
    groups = {g.title: [a.option_strings[-1] for a in g._group_actions] for g in parser._action_groups}
    assert [t for t, flags in groups.items() if flags] == ["options", "data", "model", "training", "run"]
    assert groups["options"] == ["--help"]
    assert {"--toy", "--data", "--langs", "--bpe", "--toy-overlap"} <= set(groups["data"])
    assert {"--sep", "--n-layers", "--dim", "--dropout"} <= set(groups["model"])
    assert {"--lr", "--warmup", "--batch-size", "--max-steps", "--epochs"} <= set(groups["training"])
    assert {"--out", "--resume", "--device", "--snapshots"} <= set(groups["run"])
    text = parser.format_help()
    assert text.startswith("usage: pretrain.py --out DIR [--toy] [--data DIR | --train-files")
    assert "\n  python pretrain.py --toy --out runs/toy " in text
    assert "\n  torchrun --standalone --nproc_per_node 8 pretrain.py --data DIR --langs en,fr --sep emb,1-3" in text


# paper Table 1, one row = one set of flags (README lists the same)
TABLE1 = {
    "default": [],
    "no_anchors": ["--bpe", "prefixed"],
    "default_anchors": ["--bpe", "separate"],
    "extra_anchors": ["--code-switch", "DICT"],
    "sep_emb": ["--sep", "emb"],
    "sep_l1_3": ["--sep", "1-3"],
    "sep_l1_6": ["--sep", "1-6"],
    "sep_emb_l1_3": ["--sep", "emb,1-3"],
    "sep_emb_l1_6": ["--sep", "emb,1-6"],
    "sep_tok": ["--sep", "tok"],  # beyond the paper: the two halves of Sep Emb
    "sep_pos": ["--sep", "pos"],
    "domain_shift": ["--toy-domain-shift", "1.0"],
    "extra_anchors_toy_dict": ["--code-switch", "toy"],
    "extra_anchors_toy_dict_data": ["--code-switch", "toy"],  # --data is a toydata.py world: its dict/
    "monolingual_fr": ["--langs", "fr"],  # §5: monolingual models of the same world, for alignment / CKA
}
OWN_WORLD = {"domain_shift", "extra_anchors_toy_dict", "monolingual_fr"}  # these rows write their own tiny world


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_only_on_a_terminal(world, tmp_path, monkeypatch, capsys, tty):
    """The updates' bar (count, rate, loss) and the evaluation's go to stderr on a terminal, above which the log lines
    are printed; off a terminal (CI, logs) stderr stays empty and stdout holds the log lines alone."""
    err = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    run(TINY + ["--data", world["joint"], "--out", tmp_path / "bar", "--max-steps", 3, "--log-every", 2])
    bar, out = err.getvalue(), capsys.readouterr().out
    assert "step 2 | epoch 1 | loss" in out and "pretrain" not in out and "eval lang" not in out
    if tty:
        assert "pretrain: 100%" in bar and "3/3" in bar and "update/s" in bar and "loss=" in bar
        assert "eval lang 0" in bar
    else:
        assert bar == ""


def test_snapshots_keep_the_model_at_the_given_updates(world, tmp_path):
    """--snapshots 2,3: step2.pt and step3.pt beside best.pt, each the model at that update with its dev ppl."""
    out = tmp_path / "snap"
    run(TINY + ["--data", world["raw"], "--prep-dir", world["cache"], "--out", out, "--max-steps", 4,
                "--snapshots", "2,3"])
    assert sorted(p.name for p in out.glob("step*.pt")) == ["step2.pt", "step3.pt"]
    from model import load_model
    m2, extra2 = load_model(out / "step2.pt")
    m3, extra3 = load_model(out / "step3.pt")
    assert (extra2["step"], extra3["step"]) == (2, 3) and set(extra2["dev_ppl"]) == {"en", "fr"}
    evals = {r["step"]: r["dev_ppl"] for r in read_log(out) if "dev_ppl" in r}
    assert evals[2] == extra2["dev_ppl"] and evals[3] == extra3["dev_ppl"]
    assert not torch.equal(m2.state_dict()["ln_emb.weight"], m3.state_dict()["ln_emb.weight"])


def test_save_every_writes_checkpoint_at_evaluations_n_updates_apart_and_at_the_end(world, tmp_path, monkeypatch):
    import pretrain
    saved, save = [], pretrain.save_checkpoint
    monkeypatch.setattr(pretrain, "save_checkpoint", lambda r: (saved.append(r.step), save(r)))
    run(TINY + ["--data", world["raw"], "--prep-dir", world["cache"], "--out", tmp_path / "a", "--max-steps", 7,
                "--eval-every", 1, "--save-every", 3])
    assert saved == [3, 6, 7]
    assert len([r for r in read_log(tmp_path / "a") if "dev_ppl" in r]) == 7, "evaluation is not thinned"


def test_pos_offsets_train_position_rows_beyond_bptt(world, tmp_path):
    """--bptt 8 --pos-offsets 24: position rows 8..23 are trained too (without the flag they keep their init);
    --pos-offsets-from 2: the first 2 updates start every stream at 0 (the run without offsets), the third draws."""
    rows = {}
    for name, extra in (("off", ["--pos-offsets", "0"]), ("on", ["--pos-offsets", "24", "--pos-offsets-from", "0"]),
                        ("from2", ["--pos-offsets", "24", "--pos-offsets-from", "2"])):
        out = tmp_path / name
        run(TINY + ["--data", world["raw"], "--prep-dir", world["cache"], "--out", out, "--max-steps", 3,
                    "--bptt", "8", "--dropout", "0", "--snapshots", "2,3"] + extra)
        rows[name] = [torch.load(out / f"step{n}.pt", weights_only=True)["model"]["pos_emb.0.weight"] for n in (2, 3)]
    assert torch.equal(rows["off"][1][24:], rows["on"][1][24:])  # never reached: both still at the same init
    assert not torch.allclose(rows["on"][1][8:24], rows["off"][1][8:24])  # reached only with --pos-offsets
    assert torch.equal(rows["from2"][0], rows["off"][0])  # updates 1-2: no offsets, the same model
    assert not torch.allclose(rows["from2"][1][8:24], rows["off"][1][8:24])  # update 3 drew them


@pytest.mark.parametrize("row", list(TABLE1))
def test_table1_row_builds_and_trains(world, tmp_path, row):
    flags = [str(world["raw"] / "dict" / "en-fr.txt") if f == "DICT" else f for f in TABLE1[row]]
    data = ["--toy-size", "tiny"] if row in OWN_WORLD else ["--data", world["raw"], "--prep-dir", world["cache"]]
    out = tmp_path / row
    run(TINY + data + flags + ["--n-layers", 6, "--out", out, "--max-steps", 2])
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ck["step"] == 2 and all(math.isfinite(r["loss"]) for r in read_log(out) if "loss" in r)
    cfg = ck["config"]
    if "emb" in " ".join(flags):
        assert cfg["sep_emb"] and "tok_emb.1.weight" in ck["model"]
    if row in ("sep_tok", "sep_pos"):
        assert (cfg["sep_tok"], cfg["sep_pos"], cfg["sep_emb"]) == (row == "sep_tok", row == "sep_pos", False)
        assert ("tok_emb.1.weight" in ck["model"], "pos_emb.1.weight" in ck["model"]) == (
            row == "sep_tok", row == "sep_pos")
    if "1-6" in flags[-1:]:
        assert tuple(cfg["sep_layers"]) == (1, 2, 3, 4, 5, 6)
    if row in ("extra_anchors", "extra_anchors_toy_dict_data"):  # default tokenizer, code-switched text
        from bpe import Tokenizer, load_bin
        data_dir = ck["data"]["dir"]
        assert ck["tokenizer"] == Tokenizer.load(world["joint"] / "tokenizer.json").to_dict()
        switched, _ = load_bin(os.path.join(data_dir, "en.train"))
        plain, _ = load_bin(os.path.join(world["joint"], "en.train"))
        assert not np.array_equal(np.asarray(switched), np.asarray(plain))
    assert ck["tokenizer"] and ck["langs"] == (["fr"] if row == "monolingual_fr" else ["en", "fr"])
    # each row's own effect, not only that it trains
    tok = ck["tokenizer"]
    if row in ("default", "no_anchors", "default_anchors"):
        from bpe import N_SPECIAL, load_bin
        ids = {l: set(np.asarray(load_bin(os.path.join(ck["data"]["dir"], f"{l}.train"))[0]).tolist())
               for l in ("en", "fr")}
        shared = {i for i in ids["en"] & ids["fr"] if i >= N_SPECIAL}  # token ids both languages' text uses
        assert (len(tok["bpes"]), tok["mode"]) == {"default": (1, "joint"), "no_anchors": (2, "prefixed"),
                                                   "default_anchors": (2, "separate")}[row]
        if row == "no_anchors":  # prefixed: no shared token but the specials
            assert not shared and tok["bpe_of"]["en"] != tok["bpe_of"]["fr"]
        else:  # joint / separate: identical strings are anchors
            assert shared
        if row == "default_anchors":  # separate: one BPE learned per language
            assert tok["bpe_of"]["en"] != tok["bpe_of"]["fr"] and tok["bpes"][0] != tok["bpes"][1]
    if row in ("sep_l1_3", "sep_emb_l1_3"):  # layers 1-3 have a copy per language, layer 4 one
        keys = ck["model"]
        assert "blocks.0.1.attn.qkv.weight" in keys and "blocks.2.1.attn.qkv.weight" in keys
        assert "blocks.3.0.attn.qkv.weight" in keys and "blocks.3.1.attn.qkv.weight" not in keys
    if row == "domain_shift":  # the world's topic mix differs, so its corpora differ from the shared world's
        with open(out / "toy.json") as f:
            assert json.load(f)["domain_shift"] == 1.0
        shifted = (out / "toy" / "mono" / "en.train.txt").read_text(encoding="utf-8")
        assert shifted != (world["raw"] / "mono" / "en.train.txt").read_text(encoding="utf-8")


def test_bpe_prepare_cli_is_pretrains_preparation(world, capsys):
    """`python bpe.py prepare` with pretrain.py's flags finds the very directory pretrain.py prepared (same recipe)."""
    import bpe
    bpe.main(["prepare", "--data", str(world["raw"]), "--merges", "300", "--prep-dir", str(world["cache"])])
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(world["joint"])


def test_bad_input_is_a_clear_error(world, tmp_path):
    with pytest.raises(SystemExit) as e:
        run(TINY + ["--data", world["joint"], "--out", tmp_path / "a", "--sep", "emb,2-9"])
    assert e.value.code == 2
    with pytest.raises(SystemExit, match="de.train.txt"):
        run(TINY + ["--data", world["raw"], "--langs", "en,de", "--out", tmp_path / "b"])
    empty = tmp_path / "empty"
    empty.mkdir()
    for l in ("en", "fr"):
        shutil.copy(world["raw"] / "mono" / f"{l}.dev.txt", empty / f"{l}.dev.txt")
        (empty / f"{l}.train.txt").write_text("" if l == "fr" else (world["raw"] / "mono" / "en.train.txt").read_text())
    with pytest.raises(SystemExit, match="empty"):
        run(TINY + ["--data", empty, "--out", tmp_path / "c"])
    with pytest.raises(SystemExit) as e:  # --code-switch toy on a --data folder that is no toy world
        run(TINY + ["--data", empty, "--out", tmp_path / "d", "--code-switch", "toy"])
    assert e.value.code == 2


def test_explicit_train_and_dev_files(world, tmp_path, capsys):
    """--train-files/--dev-files take files of any name (e.g. the Leipzig samples) without a --data layout."""
    from model import load_model
    mono = world["raw"] / "mono"
    files = {}
    for l in ("en", "fr"):  # names pretrain.py could not guess
        for s in ("train", "dev"):
            files[l, s] = tmp_path / f"{l}.corpus_{s}_sample.txt"
            shutil.copy(mono / f"{l}.{s}.txt", files[l, s])
    spec = lambda s: ",".join(f"{l}={files[l, s]}" for l in ("en", "fr"))  # noqa: E731
    out = tmp_path / "run"
    run(TINY + ["--train-files", spec("train"), "--dev-files", spec("dev"), "--out", out, "--max-steps", 4])
    model, extra = load_model(out / "best.pt")
    assert extra["langs"] == ["en", "fr"] and extra["step"] == 4
    (prep,) = [d for d in (out / "data").iterdir() if d.is_dir()]
    with open(prep / "recipe.json") as f:
        sources = json.load(f)["sources"]
    assert sources["fr"]["dev"][0] == os.path.abspath(files["fr", "dev"])
    assert not (out / "toy").exists()  # no toy world is written when files are given
    bad = [(["--train-files", spec("train")], "--train-files and --dev-files go together"),
           (["--train-files", f"en={files['en', 'train']},fr=/nonexistent.txt", "--dev-files", spec("dev")],
            "/nonexistent.txt: no such file"),
           (["--train-files", f"en={files['en', 'train']}", "--dev-files", spec("dev")], "do not match --langs"),
           (["--train-files", "en", "--dev-files", spec("dev")], "expected LANG=PATH")]
    for i, (flags, message) in enumerate(bad):
        with pytest.raises(SystemExit) as e:
            run(TINY + flags + ["--out", tmp_path / f"bad{i}"])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_non_finite_losses_skip_the_update_then_stop(world, tmp_path):
    with pytest.raises(SystemExit, match="non-finite losses in a row"):
        run(TINY + ["--data", world["joint"], "--out", tmp_path, "--lr", 1e30, "--warmup", 0, "--max-steps", 10,
                    "--max-bad-steps", 3])
    skipped = [r for r in read_log(tmp_path) if r.get("skipped")]
    assert len(skipped) == 3 and all(r["step"] == skipped[0]["step"] for r in skipped)


def test_torchrun_two_processes_with_separate_parts(world, tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(ROOT, "pretrain.py")] + TINY + [
        "--data", world["raw"], "--prep-dir", world["cache"], "--sep", "emb,1-3", "--n-layers", 4,
        "--max-steps", 3, "--out", out]
    r = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ck["step"] == 3 and len(ck["rng"]) == 2
    assert "2 processes" in r.stdout and "ranks agree: the 2 processes hold the same weights" in r.stdout


def tiny_run(clip=5.0, sep=False):
    """A Run of a tiny model on a made-up stream of two languages, as setup() fills it in, for update()."""
    from contextlib import nullcontext
    from types import SimpleNamespace
    from model import MLM, ModelConfig
    from pretrain import Run, next_micro_batch
    torch.manual_seed(0)
    m = MLM(ModelConfig(vocab_size=40, n_layers=2, n_heads=2, dim=16, ffn_dim=32, max_positions=16, sep_emb=sep,
                        sep_layers=(1,) if sep else (), dropout=0.0, attention_dropout=0.0))
    ids = np.arange(14, 40).repeat(3)
    run = Run(args=SimpleNamespace(accumulate=1, batch_size=2, bptt=8, pos_offsets=0, clip=clip), langs=["en", "fr"],
              stop=SimpleNamespace(signum=None), raw_model=m, model=m, params=list(m.parameters()),
              optimizer=torch.optim.Adam(m.parameters(), lr=1e-2), amp=nullcontext(),
              scaler=torch.amp.GradScaler("cpu", enabled=False), train_ids=[ids, ids], vocab_sizes=[40, 40],
              sampler=StreamSampler([n_stream_batches(len(ids), 2, 8)] * 2, [0.5, 0.5], seed=0),
              mask_rng=torch.Generator().manual_seed(0))
    run.next_batch = next_micro_batch(run, run.step)
    return run


def test_private_parameters_of_an_unseen_language_do_not_move():
    """--sep: after an fr update gives Adam momentum to fr's private tables, an en update with the zero gradients of
    DDP's zero term must leave them exactly where they are (update() sets them to None); shared ones move."""
    from pretrain import next_micro_batch, update
    run = tiny_run(sep=True)
    m = run.raw_model
    for lang in (1, 0):  # fr: its private parameters now carry Adam moments; then en
        run.sampler.probs = np.eye(2)[lang]
        run.next_batch = next_micro_batch(run, run.step)
        before = [p.detach().clone() for p in m.lang_specific_parameters(1)]
        shared_before = m.blocks[1][0].ln2.weight.detach().clone()  # layer 2 is shared
        for q in m.lang_specific_parameters(1) if lang == 0 else ():  # what DDP's zero term leaves: zero gradients
            q.grad = torch.zeros_like(q)
        assert update(run)[4]
    assert all(torch.equal(b, p) for b, p in zip(before, m.lang_specific_parameters(1)))
    assert not torch.equal(shared_before, m.blocks[1][0].ln2.weight)


def test_one_read_gives_loss_languages_and_gradient_norm_and_the_gradients_are_clipped():
    """update() reads the loss, the languages and the gradient norm (before clipping) in one host-device sync, then
    clips at --clip before Adam's step; --clip 0 clips nothing."""
    from pretrain import update

    def grad_norm(params):
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))

    for clip in (0.01, 0.0):
        run = tiny_run(clip)
        lang, (inputs, targets, where, offset) = run.next_batch
        twin = copy.deepcopy(run.raw_model)  # the same micro-batch through a copy: the norm and loss to expect
        _, want_loss = twin(inputs, lang, targets)
        want_loss.backward()
        want, seen_by_step, step = grad_norm(list(twin.parameters())), [], run.optimizer.step
        run.optimizer.step = lambda *a, **k: (seen_by_step.append(grad_norm(run.params)), step(*a, **k))[1]
        loss, norm, langs, stop, stepped, skipped = update(run)
        assert loss == pytest.approx(float(want_loss.detach()), rel=1e-6) and langs == [lang] and stop == 0
        assert norm == pytest.approx(want, rel=1e-5) and want > 0.05 and stepped and not skipped
        assert seen_by_step[0] == pytest.approx(clip if clip else want, rel=1e-4)


def test_float16_unscales_and_clips_only_a_finite_loss():
    """float16 (a GradScaler, here on the CPU): a NaN loss skips the update before unscale_ (an unscale_ must be
    followed by the scaler's step, or the next update's unscale_ would fail); a finite one is unscaled, its gradient
    norm reported unscaled and the gradients clipped at --clip before Adam's step."""
    from pretrain import update
    run = tiny_run(clip=0.01)
    run.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    m, seen_by_step, step = run.raw_model, [], run.optimizer.step
    run.optimizer.step = lambda *a, **k: (seen_by_step.append(
        float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in run.params if p.grad is not None])))),
        step(*a, **k))[1]
    run.model = lambda *a, **k: (None, m(*a, **k)[1] * math.nan)
    loss, norm, _, _, stepped, skipped = update(run)
    assert math.isnan(loss) and skipped and not stepped and not seen_by_step
    run.model = m
    lang, (inputs, targets, _, _) = run.next_batch
    twin = copy.deepcopy(m)
    twin(inputs, lang, targets)[1].backward()
    want = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in twin.parameters()])))
    loss, norm, _, _, stepped, skipped = update(run)
    assert stepped and not skipped and run.scaler.get_scale() == 2.0 ** 10
    assert norm == pytest.approx(want, rel=1e-4) and seen_by_step == [pytest.approx(0.01, rel=1e-3)]


def test_gpu_benchmark_runs_tiny_on_the_cpu(capsys):
    """tests/bench_gpu.py (the paper config on a GPU) at a tiny size on the CPU: every number it reports is printed."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import bench_gpu
    threads = torch.get_num_threads()
    try:
        bench_gpu.main(["--tiny", "--device", "cpu", "--batch-size", "4", "--bptt", "32", "--vocab", "200", "--steps",
                        "2", "--warmup-steps", "1", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "MFU against this CPU's fp32 matmul rate" in out
    line = [l for l in out.splitlines() if l.startswith("eager")][0]
    for what in ("tok/s", "MFU", "peak memory", "split forward", "backward", "optimizer"):
        assert what in line, line
