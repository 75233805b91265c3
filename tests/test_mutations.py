"""Tests written against one-line bugs of a mutation pass over the paper parts that the other test
files let through; each docstring names the bug. Public functions only, CPU, tiny sizes."""
import argparse
import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import align
import bpe
import finetune as ft
import pretrain
from bpe import EOS_ID
from conftest import csls_dense, sgd_run
from model import MLM, ModelConfig, encode_batch

torch.set_num_threads(1)  # tiny tensors: extra threads only spin on a shared 2-core machine


def tiny_model(seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=40, n_layers=2, n_heads=2, dim=8, ffn_dim=16, max_positions=32)
    return MLM(config).eval()

# -----------------------------------------------------------------------------
# bpe.py


def test_a_merge_listed_twice_keeps_its_first_rank():
    """Bug: a repeated pair takes its last rank. subword-nmt keeps the first: (b, c</w>) is merge
    0, before (a, b), so 'abc' -> a + bc; by the last rank (2) it would be ab + c."""
    codes = bpe.BPE([("b", "c</w>"), ("a", "b"), ("b", "c</w>")])
    assert codes.segment("abc") == ["a", "bc"]


def test_code_switching_cap_is_the_floor_of_the_fraction():
    """Bug: the cap rounded (or ceiled), not floored: 10 words at max_frac 0.19 -> at most 1
    replaced, although all 4 dictionary words are picked (p = 1)."""
    words = ["a", "cat", "and", "a", "dog", "see", "the", "bird", "on", "fish"]
    dictionary = {"cat": ["chat"], "dog": ["chien"], "bird": ["oiseau"], "fish": ["poisson"]}
    for seed in range(5):
        out = bpe.code_switch(words, dictionary, np.random.default_rng(seed), p=1.0, max_frac=0.19)
        assert sum(a != b for a, b in zip(words, out)) == 1


def test_joint_bpe_samples_the_larger_corpus_without_replacement(tmp_path):
    """Bug: the down-sampled lines drawn with replacement (fewer distinct lines). en: 20 lines
    'ab'; fr: 19 lines, 18 of them 'pq'. 19 distinct en lines: (a, b</w>) counts 19 against
    (p, q</w>)'s 18 and is the first merge."""
    en = tmp_path / "en.txt"
    fr = tmp_path / "fr.txt"
    en.write_text("ab\n" * 20)
    fr.write_text("pq\n" * 18 + "zy\n")
    for seed in range(3):
        tok = bpe.Tokenizer.build({"en": str(en), "fr": str(fr)}, "joint", num_merges=1,
                                  seed=seed, verbose=False)
        assert tok.bpes["en"].merges == [("a", "b</w>")]

# -----------------------------------------------------------------------------
# pretrain.py


def test_random_replacements_are_uniform_over_the_whole_vocabulary():
    """Bug: random ids from randint(vocab_size - 1), the last id never drawn. Every position but
    0 selected and replaced (probs 0 / 0 / 1): ids uniform over [0, 20), the last one included."""
    x = torch.full((200, 50), 7)
    g = torch.Generator().manual_seed(0)
    inputs, targets = pretrain.mask_tokens(x, 20, g, mask_prob=1.0, probs=(0.0, 0.0, 1.0))
    assert (targets[:, 1:] == 7).all()
    counts = torch.bincount(inputs[:, 1:].flatten(), minlength=20)
    assert len(counts) == 20
    assert counts.min() > 0.8 * counts.float().mean()


class ModeMLM(torch.nn.Module):
    """MLM.forward's signature; records whether each forward ran in training mode."""

    def __init__(self):
        super().__init__()
        self.modes = []

    def forward(self, idx, lang, targets=None):
        self.modes.append(self.training)
        return None, torch.tensor(1.0)


def test_dev_perplexity_is_measured_in_eval_mode():
    """Bug: evaluate_ppl leaves the model in training mode (dropout on in evaluation). Every
    forward in eval mode; the caller's mode restored."""
    model = ModeMLM().train()
    ids = np.random.default_rng(0).integers(14, 100, size=500)
    pretrain.evaluate_ppl(model, ids, 0, 100, 16, "cpu", contextlib.nullcontext())
    assert model.modes and not any(model.modes)
    assert model.training


def test_an_update_moves_the_own_parameters_of_the_batch_language():
    """Bug: under --sep the gradients of the languages the batch WAS in are dropped (the test of
    `used` inverted), so no language-specific table ever trains. Every batch is of language 1:
    its own parameters move, language 0's stay."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=40, n_layers=1, n_heads=2, dim=8, ffn_dim=16, max_positions=32,
                         sep_emb=True, dropout=0.0, attention_dropout=0.0)
    model = MLM(config)
    run = sgd_run(model, accumulate=1, probs=[0.0, 1.0])
    run.next_batch = pretrain.next_micro_batch(run, 0)
    own = [model.lang_specific_parameters(lang) for lang in (0, 1)]
    before = [[p.detach().clone() for p in params] for params in own]
    assert pretrain.update(run).stepped
    assert all(torch.equal(b, p) for b, p in zip(before[0], own[0]))
    assert all(not torch.equal(b, p) for b, p in zip(before[1], own[1]))

# -----------------------------------------------------------------------------
# align.py


def test_iterative_normalisation_length_normalises_before_centring():
    """Bug: each round centres first, then length-normalises. Zhang et al. 2019 (Algorithm 1):
    unit length, then zero mean; the result ends on unit length. One round on rows of very
    different lengths: unit(centre(unit(X)))."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((40, 5)) * rng.uniform(0.1, 10, (40, 1)) + 2.0

    def unit(A):
        return A / np.linalg.norm(A, axis=1, keepdims=True)
    U = unit(X)
    expected = unit(U - U.mean(axis=0))
    wrong = unit(X - X.mean(axis=0))
    assert not np.allclose(expected, wrong, atol=1e-3), "the check needs rows of unequal length"
    np.testing.assert_allclose(align.iterative_normalize(X, n_iter=1), expected, atol=1e-7)


def test_word_translation_retrieves_by_csls_not_nearest_neighbour():
    """Bug: P@1 retrieved by plain cosine nearest neighbour. §5.1.1 (MUSE): CSLS. Gold = CSLS's own
    choice on data with hubs, where the nearest neighbour chooses otherwise."""
    rng = np.random.default_rng(5)
    u = rng.standard_normal(6)
    X = rng.standard_normal((60, 6)) + u
    Y = rng.standard_normal((50, 6))
    Y[:8] = u + 0.5 * rng.standard_normal((8, 6))  # hubs near every query
    gold = csls_dense(X, Y, 10)
    nearest = (X / np.linalg.norm(X, axis=1, keepdims=True)) @ Y.T
    assert (nearest.argmax(axis=1) != gold).sum() > 5, "the check needs NN and CSLS to differ"
    p_at_1 = align.word_translation_accuracy(X, Y, np.arange(60), gold)
    assert p_at_1 == (1.0, 60)

# -----------------------------------------------------------------------------
# finetune.py


class ScriptedTask(ft.Task):
    """English dev scores scripted per epoch."""
    name = "scripted"
    metric = "acc"

    def __init__(self, dev_scores):
        super().__init__([])
        self.dev_scores = list(dev_scores)
        self.n_dev = 0

    def label_set(self, train_examples):
        return ["x"]

    def run(self, model, head, batch, lang, predict=False):
        h = encode_batch(model, [ids for ids, _ in batch], lang)[0][-1][:, 0]
        if predict:
            return [0] * len(batch)
        return head(h).pow(2).mean()

    def score(self, examples, preds):
        self.n_dev += 1
        return {"acc": self.dev_scores[self.n_dev - 1]}


def test_of_tied_dev_scores_the_earliest_epoch_is_kept():
    """Bug: `>=` in the epoch choice keeps the last of tied epochs; XLM keeps the first (a strict
    improvement is needed): dev 0.5, 0.9, 0.9 -> epoch 2."""
    model = tiny_model()
    task = ScriptedTask([0.5, 0.9, 0.9])
    feats = [([20 + k, 21, 22], 0) for k in range(4)]
    data = {"lang_id": 0, "train": (feats, feats), "dev": (feats, feats), "test": {}}
    hp = {"batch_size": 2, "lr": 1e-2, "head_lr": None}
    args = argparse.Namespace(seed=0, train_lang="en", head_dropout=0.0, epoch_size=0, epochs=3,
                              bf16=False, clip=0.0)
    record = ft.finetune_one(task, model, dict(model.state_dict()), data, hp, args,
                             log=lambda *a: None)
    assert record["best_epoch"] == 2


def test_fine_tuning_starts_every_set_from_the_pretrained_weights():
    """Bug: finetune_one does not restore the pretrained weights first, so a set starts from the
    one before it. The same set run twice on one model gives the same weights."""
    model = tiny_model()
    task = ScriptedTask([0.5, 0.5])
    feats = [([20 + k, 21, 22], 0) for k in range(4)]
    data = {"lang_id": 0, "train": (feats, feats), "dev": (feats, feats), "test": {}}
    hp = {"batch_size": 2, "lr": 1e-2, "head_lr": None}
    args = argparse.Namespace(seed=0, train_lang="en", head_dropout=0.0, epoch_size=0, epochs=1,
                              bf16=False, clip=0.0)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    weights = []
    for _ in range(2):
        ft.finetune_one(task, model, init, data, hp, args, log=lambda *a: None)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    assert not all(torch.equal(init[k], weights[0][k]) for k in init), "the weights must move"
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in init)


def test_evaluation_switches_the_heads_dropout_off():
    """Bug: evaluate puts the encoder in eval mode but not the head: its dropout (0.5 here) stays
    on at test time. Labels = the predictions without dropout: accuracy 1."""
    model = tiny_model()
    task = ft.XNLITask([])
    torch.manual_seed(2)
    head = task.head(8, 0.5)
    feats = [([EOS_ID, 14 + k % 20, 20 + k % 7, EOS_ID, 30 + k % 9, EOS_ID], 0) for k in range(60)]
    with torch.no_grad():
        states = encode_batch(model, [ids for ids, _ in feats], 0)[0][-1]
        preds = head.eval()(states[:, 0]).argmax(-1).tolist()
    examples = [("p", "h", ft.XNLI_LABELS[p]) for p in preds]
    head.train()
    assert ft.evaluate(task, model, head, feats, examples, 0) == {"acc": 1.0}


def test_xnli_head_reads_the_state_at_position_0():
    """Bug: the XNLI classifier on the last position (padding in a padded batch, the closing </s>
    otherwise), not on position 0, the first </s> (XLM's xnli.py)."""
    model = tiny_model()
    task = ft.XNLITask([])
    torch.manual_seed(1)
    head = task.head(8, 0.0).eval()
    batch = [([EOS_ID, 20, 21, EOS_ID, 22, EOS_ID], 0),
             ([EOS_ID, 23, EOS_ID, 24, 25, 26, EOS_ID], 2)]
    with torch.no_grad():
        states = encode_batch(model, [ids for ids, _ in batch], 0)[0][-1]
        logits = head(states[:, 0])
        loss = task.run(model, head, batch, 0)
        preds = task.run(model, head, batch, 0, predict=True)
    expected = F.cross_entropy(logits, torch.tensor([0, 2]))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert preds == logits.argmax(-1).tolist()
