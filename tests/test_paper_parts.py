"""Known-answer and property tests of the paper parts (each file above its first `# ====` line).

Each test is written against a plausible one-line bug that the other test files let through; its
docstring names the bug. CPU only, a few seconds in all."""
import argparse
import collections
import contextlib
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import align
import bpe
import finetune as ft
import pretrain
import toydata
from bpe import EOS_ID, MASK_ID, Tokenizer
from conftest import csls_dense, sgd_run
from model import MLM, AlignedEncoder, ModelConfig, encode_batch

torch.set_num_threads(1)  # tiny tensors: extra threads only spin on a shared 2-core machine


def tiny_model(seed=0, **kw):
    """A 2-layer, d=8 MLM in eval mode, seeded."""
    torch.manual_seed(seed)
    config = dict(vocab_size=40, n_layers=2, n_heads=2, dim=8, ffn_dim=16, max_positions=32)
    config.update(kw)
    return MLM(ModelConfig(**config)).eval()

# -----------------------------------------------------------------------------
# finetune.py: the biaffine parser (Dozat & Manning), its loss, its MST decoding; LAS


def with_one(x):
    return torch.cat([x, torch.ones(1)])


def biaffine_by_loop(weight, dep, head):
    """s[b, i, j, o] = [dep_i ; 1]^T W_o [head_j (; 1)], written out one (i, j) at a time."""
    B, T, _ = dep.shape
    n_out = weight.size(0)
    head_has_bias = weight.size(2) == head.size(-1) + 1
    s = torch.zeros(B, T, T, n_out)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                y = with_one(head[b, j]) if head_has_bias else head[b, j]
                for o in range(n_out):
                    s[b, i, j, o] = with_one(dep[b, i]) @ weight[o] @ y
    return s


def test_biaffine_scores_head_j_for_dependent_i():
    """Bug: the einsum transposed (s[i, j] the score of word j under head i)."""
    torch.manual_seed(0)
    parser = ft.BiaffineParser(6, 3, arc_mlp=5, rel_mlp=4).eval()
    for biaffine in (parser.arc_attn, parser.rel_attn):
        torch.nn.init.normal_(biaffine.weight)  # the zero init gives every score 0
    h = torch.randn(2, 4, 6)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    with torch.no_grad():
        s_arc, s_rel = parser(h, mask)
        arc = biaffine_by_loop(parser.arc_attn.weight, parser.arc_dep(h), parser.arc_head(h))
        rel = biaffine_by_loop(parser.rel_attn.weight, parser.rel_dep(h), parser.rel_head(h))
    arc = arc[..., 0]
    assert not torch.allclose(arc, arc.transpose(1, 2)), "the check needs asymmetric scores"
    # column j is a head: a head that is no candidate scores -inf
    expected_arc = arc.masked_fill(~mask[:, None, :], float("-inf"))
    torch.testing.assert_close(s_arc, expected_arc, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s_rel, rel, rtol=1e-4, atol=1e-5)


def test_label_loss_is_taken_at_the_gold_head():
    """Bug: the label cross-entropy at the predicted head (argmax of s_arc), not the gold one."""
    torch.manual_seed(1)
    heads = torch.tensor([[-1, 2, 0, 2]])
    rels = torch.tensor([[-1, 1, 0, 2]])
    s_arc = torch.randn(1, 4, 4)
    s_arc[0, 1:, 3] += 10.0  # every word's best head is word 3, never its gold head
    s_rel = torch.randn(1, 4, 4, 3) * 3
    assert (s_arc[0, 1:].argmax(-1) != heads[0, 1:]).all()
    expected = 0.0
    for i in (1, 2, 3):
        h = heads[0, i]
        expected += -F.log_softmax(s_arc[0, i], -1)[h] / 3
        expected += -F.log_softmax(s_rel[0, i, h], -1)[rels[0, i]] / 3
    loss = ft.BiaffineParser.loss(s_arc, s_rel, heads, rels)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_decoding_maximises_summed_log_probabilities_not_probabilities():
    """Bug: MST on softmax probabilities. Rows of P: words 1..3; columns: heads ROOT, 1, 2, 3.
    Best tree by sum of log p: 1<-2, 2<-ROOT, 3<-1 (0.8 * 0.35 * 0.25 = 0.070, sum of p 1.40);
    best tree by sum of p:     1<-2, 2<-3, 3<-ROOT (0.8 * 0.10 * 0.60 = 0.048, sum of p 1.50).
    Labels are read at the chosen head: word 3's is 1 at head 1, every other is 0."""
    P = torch.tensor([[0.25, 0.25, 0.25, 0.25],
                      [0.05, 0.00, 0.80, 0.15],
                      [0.35, 0.55, 0.00, 0.10],
                      [0.60, 0.25, 0.15, 0.00]])
    s_arc = P.log()[None]  # log_softmax(log P) = log P
    s_rel = torch.zeros(1, 4, 4, 2)
    s_rel[0, 3, 1, 1] = 1.0
    mask = torch.ones(1, 4, dtype=torch.bool)
    heads, labels = ft.BiaffineParser.decode(s_arc, s_rel, mask)
    assert heads == [[2, 0, 1]]
    assert labels == [[0, 0, 1]]


def test_las_counts_a_punctuation_word_like_any_other():
    """CoNLL 2018: punctuation is scored as every word, its label too."""
    heads = [[0, 1, 1]]
    gold_rels = [["root", "punct", "obj"]]
    pred_rels = [["root", "obj", "punct"]]
    scores = ft.attachment_scores(heads, gold_rels, heads, pred_rels)
    assert scores == (1.0, pytest.approx(1 / 3))


def test_word_states_are_the_states_of_each_words_first_subword():
    """ROOT = the leading </s> (position 0); word k = position 1 + firsts[k] of `</s> ids </s>`."""
    model = tiny_model()
    seqs = [[20, 21, 22, 23, 24], [25, 26]]
    firsts = [[0, 2, 3], [0, 1]]
    rows = [[EOS_ID] + ids + [EOS_ID] for ids in seqs]
    with torch.no_grad():
        h, mask = ft.word_states(model, seqs, firsts, 0, 16, True)
        full = encode_batch(model, rows, 0)[0][-1]
    assert mask.tolist() == [[True] * 4, [True] * 3 + [False]]
    torch.testing.assert_close(h[0], full[0, [0, 1, 3, 4]])
    torch.testing.assert_close(h[1, :3], full[1, [0, 1, 2]])


class WordTokenizer:
    """One id per whitespace word: 100 + its position in the text."""

    def encode(self, line, lang):
        return [100 + k for k, _ in enumerate(line.split())]


def test_xnli_pair_is_cut_on_its_longer_side_to_fit_the_positions():
    """`</s> premise </s> hypothesis </s>` in 9 positions leaves 6 subwords: the 8-word premise
    is cut to 4, the 2-word hypothesis kept whole."""
    task = ft.XNLITask([])
    example = ("a b c d e f g h", "x y", "neutral")
    feats = task.featurize([example], WordTokenizer(), "en", 9)
    ids = [EOS_ID, 100, 101, 102, 103, EOS_ID, 100, 101, EOS_ID]
    assert feats == [(ids, ft.XNLI_LABELS.index("neutral"))]


class ScriptedTask(ft.Task):
    """English dev scores scripted per epoch; each dev evaluation records the weights it saw."""
    name = "scripted"
    metric = "acc"

    def __init__(self, dev_scores):
        super().__init__([])
        self.dev_scores = list(dev_scores)
        self.seen = []

    def label_set(self, train_examples):
        return ["x"]

    def run(self, model, head, batch, lang, predict=False):
        h = encode_batch(model, [ids for ids, _ in batch], lang)[0][-1][:, 0]
        if predict:
            self.seen.append([p.detach().clone() for p in model.parameters()])
            return [0] * len(batch)
        return head(h).pow(2).mean()

    def score(self, examples, preds):
        return {"acc": self.dev_scores[len(self.seen) - 1]}


def test_the_epoch_is_chosen_by_the_best_english_dev_score():
    """§3.2: the epoch with the best English dev score (2 of 3) is kept, its weights restored."""
    model = tiny_model()
    task = ScriptedTask([0.2, 0.9, 0.5])
    feats = [([20 + k, 21, 22], 0) for k in range(4)]
    data = {"lang_id": 0, "train": (feats, feats), "dev": (feats, feats), "test": {}}
    hp = {"batch_size": 2, "lr": 1e-2, "head_lr": None}
    args = argparse.Namespace(seed=0, train_lang="en", head_dropout=0.0, epoch_size=0, epochs=3, bf16=False,
                              clip=0.0)
    init = dict(model.state_dict())
    record = ft.finetune_one(task, model, init, data, hp, args, log=lambda *a: None)
    assert record["best_epoch"] == 2
    assert record["dev_curve"] == [0.2, 0.9, 0.5]
    assert record["dev"] == {"acc": 0.9}
    epoch_2 = task.seen[1]
    epoch_3 = task.seen[2]
    assert not all(torch.equal(a, b) for a, b in zip(epoch_2, epoch_3)), "the weights must move"
    assert all(torch.equal(a, b) for a, b in zip(epoch_2, model.parameters()))

def test_language_specific_parts_stay_frozen_in_fine_tuning():
    """§4.3 models (Sep Emb, Sep L1): every language's own parameters are frozen, the shared ones
    are trained, and exactly those are returned to the optimiser."""
    model = tiny_model(sep_emb=True, sep_layers=(1,))
    trainable = ft.freeze_lang_specific(model)
    own = {id(p) for lang in (0, 1) for p in model.lang_specific_parameters(lang)}
    shared = {id(p) for p in model.parameters()} - own
    assert own and shared
    assert {id(p) for p in trainable} == shared
    assert all(p.requires_grad == (id(p) in shared) for p in model.parameters())


# -----------------------------------------------------------------------------
# model.py: §5.1.2's aligned encoder maps the target's layer i by x @ W


def test_aligned_encoder_maps_the_target_layer_by_x_times_w():
    """x_target @ W ~ x_english: the target's layer-1 states times W enter the 4 new layers."""
    english = tiny_model(0)
    target = tiny_model(1)
    W = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(2)))[0]
    routes = {"en": (english, 0, None), "fr": (target, 1, W)}
    encoder = AlignedEncoder(routes, 1).eval()
    idx = torch.tensor([[1, 20, 21, 22, 1]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    with torch.no_grad():
        hs = encoder.hidden_states(idx, "fr", mask)
        torch.testing.assert_close(hs[0], target.hidden_states(idx, 1, mask)[1] @ W)
        english_hs = encoder.hidden_states(idx, "en", mask)
        torch.testing.assert_close(english_hs[0], english.hidden_states(idx, 0, mask)[1])
    assert len(hs) == 5  # layer i, then the 4 new layers

# -----------------------------------------------------------------------------
# pretrain.py: masking for evaluation and under --sep emb, perplexity, gradient accumulation


def test_at_least_one_target_per_row_and_never_position_0():
    """mask_prob 0 with at_least_one: each row's one forced target is not position 0 (XLM never
    predicts a stream's first token)."""
    x = torch.randint(14, 100, (50, 8), generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(0)
    _, targets = pretrain.mask_tokens(x, 100, g, mask_prob=0.0, at_least_one=True)
    where = targets != -1
    assert (where.sum(dim=1) == 1).all()
    assert not where[:, 0].any()


class RecordingMLM(torch.nn.Module):
    """MLM.forward's signature; keeps every (inputs, targets). Its loss: the fraction of targets
    whose input is MASK, or with k_loss k / 10 for the k targets of the forward."""

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
    """Bug: training's 80/10/10 masking in evaluation, not every target -> MASK (XLM
    evaluate_mlm)."""
    ids = np.random.default_rng(0).integers(14, 100, size=3000)
    model = RecordingMLM()
    ppl = pretrain.evaluate_ppl(model, ids, 0, 100, 16, "cpu", contextlib.nullcontext())
    assert ppl == pytest.approx(math.e)  # every forward's loss is 1
    n_windows = pretrain.n_stream_batches(len(ids), 1, 16)
    windows = [pretrain.get_batch(ids, i, 1, 16) for i in range(n_windows)]
    stream = torch.from_numpy(np.concatenate(windows))
    inputs = torch.cat([x for x, _ in model.seen])
    targets = torch.cat([y for _, y in model.seen])
    where = targets != -1
    assert where.any(dim=1).all(), "at least one target per window"
    assert (inputs[where] == MASK_ID).all()
    assert torch.equal(inputs[~where], stream[~where])
    assert torch.equal(targets[where], stream[where])


def test_evaluate_ppl_weights_each_forward_by_its_targets():
    """exp(sum of CE / number of targets): a forward's mean loss counts once per target."""
    ids = np.random.default_rng(1).integers(14, 100, size=2000)
    model = RecordingMLM(k_loss=True)
    ctx = contextlib.nullcontext()
    ppl = pretrain.evaluate_ppl(model, ids, 0, 100, 16, "cpu", ctx, windows_per_forward=3)
    k = np.array([(y != -1).sum().item() for _, y in model.seen], dtype=np.float64)
    assert len(k) > 2 and len(set(k)) > 1
    assert ppl == pytest.approx(math.exp((k * k / 10).sum() / k.sum()))


def test_random_ids_under_sep_emb_come_from_the_batch_languages_own_vocabulary(monkeypatch):
    """Bug: under --sep emb, random ids drawn from language 0's vocabulary. Every batch is of
    language 1 (30 ids); language 0's vocabulary has a million."""
    sizes = [10**6, 30]
    rng = np.random.default_rng(2)
    args = argparse.Namespace(batch_size=32, bptt=16, pos_offsets=0, pos_offsets_from=0)
    run = pretrain.Run(args=args, langs=["en", "fr"])
    run.sampler = pretrain.StreamSampler([8, 8], [0.0, 1.0], seed=0)
    run.mask_rng = torch.Generator().manual_seed(0)
    run.train_ids = [rng.integers(14, n, size=4096) for n in sizes]
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
    assert inputs.max() < 30, "a random id outside language 1's vocabulary"


def test_accumulated_micro_batches_give_the_mean_gradient(monkeypatch):
    """--accumulate 2: one update with the mean of the two micro-batches' gradients and losses.
    Plain SGD at lr 1 moves the parameters by exactly the gradient."""
    model = tiny_model(n_layers=1, dropout=0.0, attention_dropout=0.0)
    twin = tiny_model(n_layers=1, dropout=0.0, attention_dropout=0.0)
    run = sgd_run(model, accumulate=2, probs=[0.5, 0.5])
    drawn = []
    next_micro_batch = pretrain.next_micro_batch

    def recording_next_micro_batch(*args, **kwargs):
        drawn.append(next_micro_batch(*args, **kwargs))
        return drawn[-1]
    monkeypatch.setattr(pretrain, "next_micro_batch", recording_next_micro_batch)
    run.next_batch = pretrain.next_micro_batch(run, 0)
    before = [p.detach().clone() for p in model.parameters()]
    loss = pretrain.update(run)[0]
    losses = [twin(inputs, lang, targets)[1] for lang, (inputs, targets, _, _) in drawn[:2]]
    (sum(losses) / 2).backward()
    assert loss == pytest.approx(sum(x.item() for x in losses) / 2, rel=1e-5)
    for b, p, q in zip(before, model.parameters(), twin.parameters()):
        torch.testing.assert_close(b - p.detach(), q.grad, rtol=1e-4, atol=1e-6)

# -----------------------------------------------------------------------------
# bpe.py: the joint BPE learns on equal numbers of lines per language; code-switching's cap


def test_joint_bpe_learns_on_equal_lines_per_language(tmp_path):
    """Bug: joint BPE learned on all lines. en: 400 lines 'xy' (the pair x y counts 400 on all
    lines, 10 on 10 lines); fr: 10 lines 'pq pq' (p q counts 20). The one merge is p q."""
    en = tmp_path / "en.txt"
    fr = tmp_path / "fr.txt"
    en.write_text("xy\n" * 400)
    fr.write_text("pq pq\n" * 10)
    files = {"en": str(en), "fr": str(fr)}
    tok = Tokenizer.build(files, "joint", num_merges=1, verbose=False)
    assert tok.bpes["en"].merges == [("p", "q</w>")]
    assert tok.tokenize("pq xy", "fr") == ["pq", "x@@", "y"]


def test_code_switching_caps_a_fraction_of_the_sentence_not_of_the_dictionary_words():
    """§4.2: at most floor(max_frac * len(words)) words replaced: 10 words, 4 of them in the
    dictionary, max_frac 0.5 -> all 4."""
    words = ["a", "cat", "and", "a", "dog", "see", "the", "bird", "on", "fish"]
    dictionary = {"cat": ["chat"], "dog": ["chien"], "bird": ["oiseau"], "fish": ["poisson"]}
    out = bpe.code_switch(words, dictionary, np.random.default_rng(0), p=1.0, max_frac=0.5)
    assert out == ["a", "chat", "and", "a", "chien", "see", "the", "oiseau", "on", "poisson"]

# -----------------------------------------------------------------------------
# align.py: word translation P@1 (MUSE: right if ANY gold translation is retrieved); CSLS's k


def test_p_at_1_counts_the_first_of_several_gold_translations():
    """Bug: only a source word's last gold translation counted. One-hot rows: source 0 retrieves
    target 3 (golds 3, 7: the first), source 1 retrieves 5 (golds 2, 5, 9), source 2 retrieves 8
    (gold 6)."""
    E = np.eye(10)
    src_idx = np.array([0, 0, 1, 1, 1, 2])
    tgt_idx = np.array([3, 7, 2, 5, 9, 6])
    p_at_1 = align.word_translation_accuracy(E[[3, 5, 8]], E, src_idx, tgt_idx)
    assert p_at_1 == (pytest.approx(2 / 3), 3)


def test_csls_uses_k_10_neighbours_by_default():
    """MUSE's CSLS takes 10 neighbours; on data with hubs k = 5 retrieves other rows."""
    rng = np.random.default_rng(5)
    u = rng.standard_normal(6)
    X = rng.standard_normal((60, 6)) + u
    Y = rng.standard_normal((50, 6))
    Y[:8] = u + 0.5 * rng.standard_normal((8, 6))  # hubs near every query
    expected = csls_dense(X, Y, 10)
    assert (expected != csls_dense(X, Y, 5)).any(), "the check needs data on which k matters"
    assert (align.csls_knn(X, Y) == expected).all()

# -----------------------------------------------------------------------------
# toydata.py: each language's word order; the NLI entailment edit


@pytest.mark.parametrize("order, surface", [
    ("svo", (2, 3, 1, 0, 4, 5)),
    ("sov", (2, 3, 1, 4, 0, 5)),
    ("vso", (0, 2, 3, 1, 4, 5)),
    ("svo-na", (2, 1, 3, 0, 4, 5)),
])
def test_linearize_puts_the_farther_dependents_farther_from_their_head(order, surface):
    """Nodes: 0 verb (root), 1 subject noun, 2 its determiner, 3 its adjective, 4 object, 5 full
    stop. Before the noun the determiner comes first (farther), then the adjective; in SOV the
    subject is farther from the verb than the object."""
    shape = ((-1, "root"), (0, "nsubj"), (1, "det"), (1, "amod"), (0, "obj"), (0, "punct"))
    assert toydata.linearize(shape, order) == surface


def test_entailment_drops_a_modifier_with_its_whole_subtree():
    """The entailed hypothesis is the premise less one modifier and everything under it: still
    one tree (one root, every dependent after its head), its concepts a part of the premise's."""
    world = toydata.World(seed=0)
    rng = random.Random(0)
    sizes = []
    for _ in range(50):
        premise, hypothesis = toydata.sample_nli(world, rng, "entailment")
        heads = [h for _, h, _ in hypothesis]
        assert heads[0] == -1 and heads.count(-1) == 1
        assert all(0 <= h < k for k, h in enumerate(heads) if k)
        kept = collections.Counter(c for c, _, _ in hypothesis)
        assert not kept - collections.Counter(c for c, _, _ in premise)
        sizes.append(len(premise) - len(hypothesis))
    assert max(sizes) > 1, "the check needs a dropped modifier with dependents"
