"""Known-answer and property tests of the paper parts (each file above its first `# ====` line), written
against one-line bugs that the other test files let through: each test names the bug it catches."""
import argparse
import contextlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import align
import cka
import finetune as ft
import pretrain
from bpe import MASK_ID, Tokenizer
from model import MLM, ModelConfig

# -----------------------------------------------------------------------------
# finetune.py: the biaffine parser (Dozat & Manning), its loss and its MST decoding


def _with_one(x):
    return torch.cat([x, torch.ones(1)])


def _biaffine_by_loop(weight, dep, head):
    """s[b, i, j, o] = [dep_i ; 1]^T W_o [head_j (; 1)], the formula written out, one (i, j) at a time."""
    B, T, _ = dep.shape
    n_out, _, n_head = weight.shape
    s = torch.zeros(B, T, T, n_out)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                y = head[b, j] if n_head == head.size(-1) else _with_one(head[b, j])
                for o in range(n_out):
                    s[b, i, j, o] = _with_one(dep[b, i]) @ weight[o] @ y
    return s


def test_biaffine_scores_head_j_for_dependent_i():
    """Bug: the einsum transposed (s[i, j] the score of dependent j under head i)."""
    torch.manual_seed(0)
    parser = ft.BiaffineParser(6, 3, arc_mlp=5, rel_mlp=4).eval()
    for biaffine in (parser.arc_attn, parser.rel_attn):
        torch.nn.init.normal_(biaffine.weight)  # the zero init would make every score 0
    h = torch.randn(2, 4, 6)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    with torch.no_grad():
        s_arc, s_rel = parser(h, mask)
        arc = _biaffine_by_loop(parser.arc_attn.weight, parser.arc_dep(h), parser.arc_head(h))[..., 0]
        rel = _biaffine_by_loop(parser.rel_attn.weight, parser.rel_dep(h), parser.rel_head(h))
    arc = arc.masked_fill(~mask[:, None, :], float("-inf"))  # column j = a head that is no candidate
    assert not torch.allclose(arc, arc.transpose(1, 2)), "the check needs scores that are not symmetric"
    torch.testing.assert_close(s_arc, arc)
    torch.testing.assert_close(s_rel, rel)


def test_label_loss_is_taken_at_the_gold_head():
    """Bug: the label cross-entropy at the predicted head (argmax of s_arc) instead of the gold head."""
    torch.manual_seed(1)
    T, R = 4, 3
    heads = torch.tensor([[-1, 2, 0, 2]])
    rels = torch.tensor([[-1, 1, 0, 2]])
    s_arc = torch.randn(1, T, T)
    s_arc[0, 1:, 3] += 10.0  # every word's best head is word 3, never the gold one
    s_rel = torch.randn(1, T, T, R) * 3
    assert (s_arc[0, 1:].argmax(-1) != heads[0, 1:]).all()
    arc_terms = [-F.log_softmax(s_arc[0, i], -1)[heads[0, i]] for i in (1, 2, 3)]
    rel_terms = [-F.log_softmax(s_rel[0, i, heads[0, i]], -1)[rels[0, i]] for i in (1, 2, 3)]
    expected = sum(arc_terms) / 3 + sum(rel_terms) / 3
    loss = ft.BiaffineParser.loss(s_arc, s_rel, heads, rels)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_decoding_maximises_summed_log_probabilities_not_probabilities():
    """Bug: MST on softmax probabilities. Rows of P are dependents 1..3, columns heads ROOT, 1, 2, 3.
    Best tree by sum log p: 1<-2, 2<-ROOT, 3<-1 (0.8 * 0.35 * 0.25 = 0.070; sum of p 1.40).
    Best tree by sum p:      1<-2, 2<-3, 3<-ROOT (0.8 * 0.10 * 0.60 = 0.048; sum of p 1.50)."""
    P = torch.tensor([[0.25, 0.25, 0.25, 0.25],
                      [0.05, 0.00, 0.80, 0.15],
                      [0.35, 0.55, 0.00, 0.10],
                      [0.60, 0.25, 0.15, 0.00]])
    s_arc = P.log()[None]  # log_softmax(log P) = log P
    s_rel = torch.zeros(1, 4, 4, 2)
    s_rel[0, 3, 1, 1] = 1.0  # the label of word 3 at head 1: 1; everywhere else 0
    heads, labels = ft.BiaffineParser.decode(s_arc, s_rel, torch.ones(1, 4, dtype=torch.bool))
    assert heads == [[2, 0, 1]]
    assert labels == [[0, 0, 1]]


# -----------------------------------------------------------------------------
# pretrain.py: evaluation masking, the random ids of --sep emb


class RecordingMLM(torch.nn.Module):
    """MLM.forward's signature; the loss is the fraction of target positions whose input is MASK, or k / 10 for
    k targets in the forward (k_loss). Every (inputs, targets) it is given is kept."""

    def __init__(self, k_loss=False):
        super().__init__()
        self.k_loss = k_loss
        self.seen = []

    def forward(self, idx, lang, targets=None):
        self.seen.append((idx.clone(), targets.clone()))
        where = targets != -1
        if self.k_loss:
            return None, torch.tensor(where.sum().item() / 10)
        return None, (idx[where] == MASK_ID).double().mean()


def test_evaluate_ppl_feeds_mask_at_every_target():
    """Bug: evaluation with training's 80/10/10 masking instead of every target -> MASK (XLM evaluate_mlm)."""
    ids = np.random.default_rng(0).integers(14, 100, size=3000)
    model = RecordingMLM()
    ppl = pretrain.evaluate_ppl(model, ids, 0, 100, 16, "cpu", contextlib.nullcontext())
    assert ppl == pytest.approx(math.e)  # every forward's loss is 1.0
    n_windows = pretrain.n_stream_batches(len(ids), 1, 16)
    stream = np.concatenate([pretrain.get_batch(ids, i, 1, 16) for i in range(n_windows)])
    inputs = torch.cat([x for x, _ in model.seen])
    targets = torch.cat([y for _, y in model.seen])
    where = targets != -1
    assert where.any(dim=1).all(), "at least one target per window"
    assert (inputs[where] == MASK_ID).all()
    assert torch.equal(inputs[~where], torch.from_numpy(stream)[~where])
    assert torch.equal(targets[where], torch.from_numpy(stream)[where])


def test_evaluate_ppl_weights_each_forward_by_its_targets():
    """exp(sum of CE / number of targets): a forward's mean loss counts once per target it has."""
    ids = np.random.default_rng(1).integers(14, 100, size=2000)
    model = RecordingMLM(k_loss=True)
    ppl = pretrain.evaluate_ppl(model, ids, 0, 100, 16, "cpu", contextlib.nullcontext(), windows_per_forward=3)
    k = np.array([(y != -1).sum().item() for _, y in model.seen], dtype=np.float64)
    assert len(k) > 2 and len(set(k)) > 1
    assert ppl == pytest.approx(math.exp((k * k / 10).sum() / k.sum()))


def test_random_ids_under_sep_emb_come_from_the_batch_languages_own_vocabulary(monkeypatch):
    """Bug: under --sep emb, random replacement ids drawn from language 0's vocabulary. Language 1 (30 ids)
    is drawn every time; language 0's vocabulary is a million ids."""
    sizes = [10**6, 30]
    rng = np.random.default_rng(2)
    train_ids = [rng.integers(14, n, size=4096) for n in sizes]
    args = argparse.Namespace(batch_size=32, bptt=16, pos_offsets=0, pos_offsets_from=0)
    run = pretrain.Run(args=args, langs=["en", "fr"])
    run.sampler = pretrain.StreamSampler([8, 8], [0.0, 1.0], seed=0)
    run.mask_gen = torch.Generator().manual_seed(0)
    run.train_ids = train_ids
    run.vocab_sizes = sizes
    masked = []
    mask_tokens = pretrain.mask_tokens

    def recording_mask_tokens(x, *args, **kwargs):
        inputs, targets = mask_tokens(x, *args, **kwargs)
        masked.append((x, inputs, targets))
        return inputs, targets
    monkeypatch.setattr(pretrain, "mask_tokens", recording_mask_tokens)
    for step in range(4):
        pretrain.next_micro_batch(run, step)
    x = torch.cat([m[0] for m in masked])
    inputs = torch.cat([m[1] for m in masked])
    targets = torch.cat([m[2] for m in masked])
    replaced = (targets != -1) & (inputs != MASK_ID) & (inputs != x)
    assert x.max() < 30 and replaced.sum() > 20
    assert inputs.max() < 30


# -----------------------------------------------------------------------------
# bpe.py: the joint BPE learns on equal numbers of lines per language


def test_joint_bpe_learns_on_equal_lines_per_language(tmp_path):
    """Bug: joint BPE learned on all lines. en: 400 lines 'xy' (the pair x y counts 400 on all lines, 10 on
    10 lines); fr: 10 lines 'pq pq' (the pair p q counts 20). One merge: p q, which only fr makes frequent."""
    en, fr = tmp_path / "en.txt", tmp_path / "fr.txt"
    en.write_text("xy\n" * 400)
    fr.write_text("pq pq\n" * 10)
    tok = Tokenizer.build({"en": str(en), "fr": str(fr)}, "joint", num_merges=1, verbose=False)
    assert tok.bpes["en"].merges == [("p", "q</w>")]
    assert tok.tokenize("pq xy", "fr") == ["pq", "x@@", "y"]


# -----------------------------------------------------------------------------
# align.py: word translation P@1 (MUSE: right if ANY gold translation is retrieved)


def test_p_at_1_counts_the_first_of_several_gold_translations():
    """Bug: only the last gold translation of a source word counted. One-hot rows: source 0 retrieves target 3
    (golds 3, 7: the first), source 1 retrieves 5 (golds 2, 5, 9: the middle), source 2 retrieves 8 (gold 6)."""
    E = np.eye(10)
    src_idx = np.array([0, 0, 1, 1, 1, 2])
    tgt_idx = np.array([3, 7, 2, 5, 9, 6])
    assert align.word_translation_accuracy(E[[3, 5, 8]], E, src_idx, tgt_idx) == (pytest.approx(2 / 3), 3)
