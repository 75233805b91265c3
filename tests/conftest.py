"""Shared pytest set-up: keep the tests on few threads so the suite is fast on 2 cores."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest


def is_tree(heads):
    """heads[k] = head of word k+1 (1-based ids, 0 = ROOT): exactly one word on ROOT, every word reaches it."""
    n = len(heads)
    if sum(h == 0 for h in heads) != 1 or not all(0 <= h <= n for h in heads):
        return False
    for k in range(1, n + 1):
        v, steps = k, 0
        while v != 0 and steps <= n:
            v, steps = heads[v - 1], steps + 1
        if v != 0:
            return False
    return True


# The small synthetic world every test shares (toydata.py). Sizes are tiny so it is written in about a second.
TOY_WORLD_SIZES = dict(n_train=2000, n_dev=200, n_test=200, n_parallel=300, n_tatoeba=200,
                       n_task_train=300, n_task_eval=120)


@pytest.fixture(scope="session")
def toy_world(tmp_path_factory):
    """Directory (pathlib.Path) of a small en-fr toy world: disjoint vocabularies, same word order, seed 0."""
    import toydata
    out = tmp_path_factory.mktemp("toy_world")
    toydata.write_world(out, langs=("en", "fr"), seed=0, **TOY_WORLD_SIZES)
    return out


@pytest.fixture(scope="session")
def toy_world_overlap(tmp_path_factory):
    """Like toy_world but 30 % of the word forms are shared (anchors) and fr is SOV with adjectives after nouns."""
    import toydata
    out = tmp_path_factory.mktemp("toy_world_overlap")
    toydata.write_world(out, langs=("en", "fr"), overlap=0.3, order="sov-na", seed=0, **TOY_WORLD_SIZES)
    return out


# The smoke preset every pretraining test starts from: the toy preset shrunk to a 2-layer, d=32 model on
# 32-token streams (each test adds its own batch size, merges and length).
SMOKE = ["--toy", "--n-layers", "2", "--dim", "32", "--n-heads", "2", "--ffn-dim", "64", "--bptt", "32"]
# A tiny pretrained model for the tests of finetune.py / align.py / cka.py.
TINY_PRETRAIN = SMOKE + ["--batch-size", "8", "--merges", "500", "--max-steps", "30", "--lr", "3e-3", "--warmup", "5",
                         "--log-every", "10"]


@pytest.fixture(scope="session")
def tiny_ckpt(toy_world, tmp_path_factory):
    """Path (pathlib.Path) of best.pt from a 30-update pretraining run on toy_world (2 layers, d=32, joint
    BPE, langs en,fr); load it with model.load_model. Runs pretrain.main in this process (a few seconds)."""
    import signal

    import pretrain
    out = tmp_path_factory.mktemp("tiny_ckpt")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        pretrain.main(["--data", str(toy_world), "--out", str(out)] + TINY_PRETRAIN)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return out / "best.pt"


@pytest.fixture(scope="module")
def toy_ckpt(toy_world, tmp_path_factory):
    """A tiny random-init checkpoint with a tokenizer, one per test module (2 layers, d 32, Sep L1)."""
    import torch

    import bpe
    from model import MLM, ModelConfig, save_model
    tok = bpe.Tokenizer.build({l: str(toy_world / f"mono/{l}.train.txt") for l in ("en", "fr")},
                              num_merges=300, verbose=False)
    torch.manual_seed(0)
    m = MLM(ModelConfig(vocab_size=tok.vocab_size("en"), n_layers=2, n_heads=2, dim=32, ffn_dim=64,
                        max_positions=24, sep_layers=(1,)))
    path = tmp_path_factory.mktemp("ft_ckpt") / "best.pt"
    save_model(path, m, tokenizer=tok.to_dict(), langs=["en", "fr"])
    return path


def sgd_run(model, accumulate, probs):
    """A pretrain.Run built by hand around `model` for pretrain.update: plain SGD at lr 1 (a
    parameter moves by exactly its gradient), no AMP, no clipping, two languages of ids 14..39 in
    streams of 2 x 8, languages drawn with `probs`; the caller draws run.next_batch."""
    import argparse
    import contextlib

    import numpy as np
    import torch

    import pretrain
    ids = np.arange(14, 40).repeat(3)
    args = argparse.Namespace(accumulate=accumulate, batch_size=2, bptt=8, pos_offsets=0,
                              pos_offsets_from=0, clip=0.0)
    run = pretrain.Run(args=args, langs=["en", "fr"], stop=argparse.Namespace(signum=None))
    run.raw_model = model
    run.model = model
    run.params = list(model.parameters())
    run.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    run.amp = contextlib.nullcontext()
    run.scaler = torch.amp.GradScaler("cpu", enabled=False)
    run.train_ids = [ids, ids]
    run.vocab_sizes = [40, 40]
    run.sampler = pretrain.StreamSampler([4, 4], probs, seed=0)
    run.mask_rng = torch.Generator().manual_seed(0)
    return run


def csls_dense(X, Y, k):
    """Conneau et al. 2018 eq. 6 written out: argmax_y 2 cos(x, y) - r_T(x) - r_S(y)."""
    import numpy as np
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    Y = Y / np.linalg.norm(Y, axis=1, keepdims=True)
    S = X @ Y.T
    r_T = -np.sort(-S, axis=1)[:, :k].mean(axis=1)
    r_S = -np.sort(-S.T, axis=1)[:, :k].mean(axis=1)
    return np.argmax(2 * S - r_T[:, None] - r_S[None, :], axis=1)
