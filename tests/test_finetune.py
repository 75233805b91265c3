"""finetune.py: readers, BIO repair + span F1, attachment scores, MST, biaffine parser, end-to-end toy runs.

Run: python -m pytest -q tests/test_finetune.py
"""
import argparse
import glob
import itertools
import io
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

import finetune as ft
from conftest import is_tree
from model import encode_states, windows

torch.set_num_threads(1)  # tiny tensors: extra threads only spin on a shared 2-core machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "..", "shared", "data")
needs_data = pytest.mark.skipif(not os.path.isdir(DATA), reason="../shared/data not present")

# -----------------------------------------------------------------------------
# repair_bio


@pytest.mark.parametrize("tags, expected", [
    # the paper's two examples (Wu & Dredze 2019, used in §3.2)
    (["I-PER"], ["B-PER"]),                                   # standalone I-X -> B-X
    (["B-PER", "I-LOC", "I-ORG"], ["B-ORG", "I-ORG", "I-ORG"]),  # B-X I-Y I-Z -> B-Z I-Z I-Z
    # edge cases
    ([], []),
    (["O", "O"], ["O", "O"]),
    (["O", "I-LOC", "I-LOC"], ["O", "B-LOC", "I-LOC"]),
    (["B-PER", "I-PER", "I-LOC"], ["B-LOC", "I-LOC", "I-LOC"]),  # whole run takes the final type
    (["B-PER", "I-LOC", "O", "I-ORG"], ["B-LOC", "I-LOC", "O", "B-ORG"]),
    (["B-PER", "I-LOC", "B-ORG", "I-ORG"], ["B-LOC", "I-LOC", "B-ORG", "I-ORG"]),  # B starts a new run
    (["I-PER", "I-LOC"], ["B-LOC", "I-LOC"]),                # both rules in one run
    (["B-PER", "B-PER", "I-PER"], ["B-PER", "B-PER", "I-PER"]),  # valid input unchanged
])
def test_repair_bio(tags, expected):
    assert ft.repair_bio(tags) == expected
    assert ft.repair_bio(expected) == expected  # idempotent


@pytest.mark.parametrize("bad", [["X-PER"], ["B-"], ["B"], ["o"]])
def test_repair_bio_rejects_malformed_tags(bad):
    with pytest.raises(ValueError, match="position 0"):
        ft.repair_bio(bad)


# -----------------------------------------------------------------------------
# span_f1


def test_span_f1_known_answer():
    """Gold spans: PER(0,2) LOC(3,4) | ORG(0,1) = 3. Pred after repair: PER(0,2) ORG(3,4) | ORG(0,1)
    (the standalone I-ORG becomes B-ORG) = 3. Matches: PER(0,2), ORG(0,1) -> tp 2: P = R = F = 2/3."""
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["I-ORG", "O"]]
    assert ft.span_f1(gold, pred) == pytest.approx((2 / 3, 2 / 3, 2 / 3))


def test_span_f1_uses_the_paper_repair():
    """B-LOC I-PER is repaired to B-PER I-PER = the gold span, so F1 = 1 (plain conlleval chunking
    would see LOC(0,1) + PER(1,2) and score 0)."""
    assert ft.span_f1([["B-PER", "I-PER", "O"]], [["B-LOC", "I-PER", "O"]]) == (1.0, 1.0, 1.0)


def test_span_f1_known_answer_unequal_p_r():
    """Gold: PER(0,1) LOC(2,4) ORG(5,6) = 3 spans. Pred: PER(0,1) LOC(2,3) = 2 spans; LOC(2,3) has the
    wrong end. tp 1: P = 1/2, R = 1/3, F = 2 * (1/6) / (5/6) = 2/5."""
    gold = [["B-PER", "O", "B-LOC", "I-LOC", "O", "B-ORG"]]
    pred = [["B-PER", "O", "B-LOC", "O", "O", "O"]]
    assert ft.span_f1(gold, pred) == pytest.approx((1 / 2, 1 / 3, 2 / 5))


def test_span_f1_degenerate_cases():
    assert ft.span_f1([["O", "O"]], [["O", "O"]]) == (0.0, 0.0, 0.0)
    assert ft.span_f1([["B-PER"]], [["O"]]) == (0.0, 0.0, 0.0)
    assert ft.span_f1([], []) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="sentence 0"):
        ft.span_f1([["O"]], [["O", "O"]])


def test_span_f1_equals_a_plain_recount():
    """Random sequences: span_f1 equals a recount from an independent chunker on the repaired tags
    (a chunk ends before anything that is not I- of its own type)."""
    def chunks(tags):
        out, i = [], 0
        while i < len(tags):
            if tags[i] == "O":
                i += 1
                continue
            typ, j = tags[i][2:], i + 1
            while j < len(tags) and tags[j] == "I-" + typ:
                j += 1
            out.append((typ, i, j))
            i = j
        return out

    rng = np.random.default_rng(0)
    T = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    gold = [[T[k] for k in rng.integers(0, 7, size=rng.integers(0, 9))] for _ in range(200)]
    pred = [[T[k] for k in rng.integers(0, 7, size=len(g))] for g in gold]
    tp = ng = npr = 0
    for g, p in zip(gold, pred):
        G, P = chunks(ft.repair_bio(g)), chunks(ft.repair_bio(p))
        tp, ng, npr = tp + len(set(G) & set(P)), ng + len(G), npr + len(P)
    p, r, f = ft.span_f1(gold, pred)
    assert (p, r) == pytest.approx((tp / npr, tp / ng))
    assert f == pytest.approx(2 * p * r / (p + r))


# -----------------------------------------------------------------------------
# attachment_scores


def test_attachment_scores_hand_made():
    """Sentence 1 (4 words): w1 head ok, nsubj vs nsubj:pass -> same after stripping (LAS ok); w2 ok;
    w3 head ok, obj vs iobj (LAS wrong); w4 punctuation with a wrong head (counted: UAS/LAS wrong).
    Sentence 2: one word, right. UAS = 4/5, LAS = 3/5."""
    gold_h = [[2, 0, 2, 2], [0]]
    gold_r = [["nsubj", "root", "obj", "punct"], ["root"]]
    pred_h = [[2, 0, 2, 3], [0]]
    pred_r = [["nsubj:pass", "root", "iobj", "punct"], ["root"]]
    assert ft.attachment_scores(gold_h, gold_r, pred_h, pred_r) == pytest.approx((4 / 5, 3 / 5))


def test_attachment_scores_subtypes_both_sides():
    """`nmod:poss` = `nmod` = `nmod:tmod`, but a wrong head is wrong whatever the label."""
    assert ft.attachment_scores([[0, 1]], [["root", "nmod:poss"]], [[0, 1]], [["root", "nmod"]]) == (1.0, 1.0)
    assert ft.attachment_scores([[0, 1]], [["root", "nmod:poss"]], [[0, 1]], [["root", "nmod:tmod"]]) == (1.0, 1.0)
    assert ft.attachment_scores([[0, 1]], [["root", "nmod"]], [[2, 0]], [["root", "nmod"]]) == (0.0, 0.0)
    with pytest.raises(ValueError):
        ft.attachment_scores([[0, 1]], [["root", "x"]], [[0]], [["root"]])


# -----------------------------------------------------------------------------
# MST decoding


def test_tree_check_used_by_these_tests():
    assert is_tree([0]) and is_tree([2, 0, 2]) and is_tree([0, 1, 2, 3])
    assert not is_tree([0, 0])          # two roots
    assert not is_tree([2, 1])          # a cycle and no root
    assert not is_tree([0, 3, 2])       # a root and a cycle beside it
    assert not is_tree([0, 5])          # a head outside the sentence


def _is_tree_with_one_root(heads):
    """heads[0] = -1 (the ROOT position); heads[1:] form one tree with exactly one word on ROOT."""
    return heads[0] == -1 and is_tree(list(heads[1:]))


def _brute_force(S):
    n, best = len(S) - 1, (-np.inf, None)
    for hs in itertools.product(range(n + 1), repeat=n):
        heads = [-1, *hs]
        if any(heads[i] == i for i in range(1, n + 1)) or not _is_tree_with_one_root(heads):
            continue
        score = sum(S[i, heads[i]] for i in range(1, n + 1))
        if score > best[0]:
            best = (score, heads)
    return best


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_mst_matches_brute_force(n):
    rng = np.random.default_rng(n)
    for trial in range(30):
        S = rng.normal(size=(n + 1, n + 1)) * rng.choice([0.1, 1.0, 10.0])
        if trial % 3 == 0:
            S[1:, 0] += 5.0  # every word prefers ROOT: the unconstrained MST would have several roots
        heads = ft.mst_decode(S)
        assert _is_tree_with_one_root(list(heads))
        score = sum(S[i, heads[i]] for i in range(1, n + 1))
        assert score == pytest.approx(_brute_force(S)[0])


def test_mst_larger_random_is_a_tree():
    rng = np.random.default_rng(1)
    for n in (10, 40):
        S = np.log(rng.dirichlet(np.ones(n + 1), size=n + 1))
        assert _is_tree_with_one_root(list(ft.mst_decode(S)))


# -----------------------------------------------------------------------------
# BiaffineParser


def test_biaffine_parser_shapes_loss_and_decode():
    torch.manual_seed(0)
    B, T, d, R = 2, 6, 16, 5
    p = ft.BiaffineParser(d, R)  # Dozat & Manning's sizes by default
    assert p.arc_dep[0].out_features == 500 and p.rel_dep[0].out_features == 100
    assert p.arc_dep[1].negative_slope == 0.1 and p.arc_dep[2].p == 0.33
    p = ft.BiaffineParser(d, R, arc_mlp=32, rel_mlp=16)  # small, so fitting below is fast
    h = torch.randn(B, T, d)
    # sentence 0: ROOT + words at positions 1, 2, 4 (3 = a non-first subword); sentence 1: words 1, 2
    cand = torch.tensor([[1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    heads = torch.tensor([[-1, 2, 0, -1, 2, -1], [-1, 0, 1, -1, -1, -1]])
    rels = torch.tensor([[-1, 1, 0, -1, 3, -1], [-1, 0, 2, -1, -1, -1]])
    s_arc, s_rel = p(h, cand)
    assert s_arc.shape == (B, T, T) and s_rel.shape == (B, T, T, R)
    assert torch.isinf(s_arc[0, 1, 3]) and torch.isfinite(s_arc[0, 1, 0])
    loss = ft.BiaffineParser.loss(s_arc, s_rel, heads, rels)
    loss.backward()
    assert torch.isfinite(loss) and p.arc_attn.weight.grad.abs().sum() > 0
    # a few steps of training on this batch must fit it (the head can learn)
    opt = torch.optim.Adam(p.parameters(), lr=1e-2)
    p.eval()
    for _ in range(40):
        opt.zero_grad()
        ft.BiaffineParser.loss(*p(h, cand), heads, rels).backward()
        opt.step()
    words = cand.clone()
    words[:, 0] = False
    pred_heads, pred_rels = ft.BiaffineParser.decode(*p(h, cand), words)
    assert pred_heads == [[2, 0, 2], [0, 1]]  # CoNLL numbering: word k, 0 = ROOT
    assert pred_rels == [[1, 0, 3], [0, 2]]


# -----------------------------------------------------------------------------
# readers: every file of ../shared/data/{xnli,wikiann_panx,ud}, counted independently


def _blocks(path):
    """Blank-line separated non-empty blocks, counted without the reader."""
    with open(path, encoding="utf-8") as f:
        return [b for b in re.split(r"\n\s*\n", f.read().replace("\r\n", "\n")) if b.strip()]


@needs_data
@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "xnli", "*-*.tsv"))))
def test_read_xnli_real(path):
    with open(path, encoding="utf-8", newline="\n") as f:  # test files have a stray \r before the label
        n = sum(1 for line in f if line.strip())
    ex = ft.read_xnli(path)
    assert len(ex) == n
    assert {label for _, _, label in ex} == set(ft.XNLI_LABELS)
    assert not any("\r" in p or "\r" in h for p, h, _ in ex)


@needs_data
@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "wikiann_panx", "*.tsv"))))
def test_read_ner_real(path):
    blocks = _blocks(path)
    sents = ft.read_ner(path)
    assert len(sents) == len(blocks)
    assert sum(len(w) for w, _ in sents) == sum(len(b.strip().split("\n")) for b in blocks)
    assert {t for _, ts in sents for t in ts} <= {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"}


@needs_data
@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(DATA, "ud", "*", "*.conllu"))))
def test_read_conllu_real(path):
    blocks = _blocks(path)
    sents = ft.read_conllu(path)
    assert len(sents) == len(blocks)
    n_words = sum(1 for b in blocks for line in b.split("\n") if re.match(r"^\d+\t", line))
    assert sum(len(s["words"]) for s in sents) == n_words
    for s in sents[:200]:
        assert sum(h == 0 for h in s["heads"]) >= 1 and len(s["heads"]) == len(s["rels"]) == len(s["words"])


def test_read_ner_and_errors(tmp_path):
    p = tmp_path / "panx.tsv"
    p.write_text("Paris\tB-LOC\nis\tO\n\n12:30\tO\n")
    assert ft.read_ner(str(p)) == [(["Paris", "is"], ["B-LOC", "O"]), (["12:30"], ["O"])]
    p.write_text("Paris\tB-LOC\nis O\n")
    with pytest.raises(ValueError, match=re.escape(f"{p}:2")):
        ft.read_ner(str(p))
    p.write_text("Paris\tLOC\n")
    with pytest.raises(ValueError, match=":1: tag 'LOC'"):
        ft.read_ner(str(p))
    p.write_text("\n\n")
    with pytest.raises(ValueError, match="empty split"):
        ft.read_ner(str(p))


def test_read_xnli_errors(tmp_path):
    p = tmp_path / "x.tsv"
    p.write_text("A man.\tA person.\tentailment\r\n\nB.\tC.\tcontradiction\n")
    assert ft.read_xnli(str(p)) == [("A man.", "A person.", "entailment"), ("B.", "C.", "contradiction")]
    p.write_text("A man.\tA person.\tentailment\nno tabs here\n")
    with pytest.raises(ValueError, match=re.escape(f"{p}:2")):
        ft.read_xnli(str(p))


CONLLU = """# sent_id = 1
# text = I can't go.
1\tI\tI\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tcan't\t_\t_\t_\t_\t_\t_\t_\t_
2\tca\tcan\tAUX\t_\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\t_\t_\t4\tadvmod\t_\t_
4\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_
4.1\tgone\tgo\tVERB\t_\t_\t_\t_\t4:conj\t_
5\t.\t.\tPUNCT\t_\t_\t4\tpunct\t_\t_

1\tYes\tyes\tINTJ\t_\t_\t0\troot\t_\t_
"""


def test_read_conllu_skips_comments_ranges_empty_nodes(tmp_path):
    p = tmp_path / "t.conllu"
    p.write_text(CONLLU)
    s = ft.read_conllu(str(p))
    assert len(s) == 2
    assert s[0]["words"] == ["I", "ca", "n't", "go", "."] and s[0]["heads"] == [4, 4, 4, 0, 4]
    assert s[0]["rels"][1] == "aux" and s[0]["rels"][4] == "punct" and s[1]["words"] == ["Yes"]
    p.write_text(CONLLU.replace("4\tgo\tgo\tVERB\t_\t_\t0", "4\tgo\tgo\tVERB\t_\t_\tx"))
    with pytest.raises(ValueError, match=re.escape(f"{p}:7")):
        ft.read_conllu(str(p))
    p.write_text(CONLLU.replace("5\t.\t.\tPUNCT\t_\t_\t4", "5\t.\t.\tPUNCT\t_\t_\t9"))
    with pytest.raises(ValueError, match="head 9 outside"):
        ft.read_conllu(str(p))
    p.write_text("1\tI\tI\n")
    with pytest.raises(ValueError, match=":1: expected 10"):
        ft.read_conllu(str(p))


# -----------------------------------------------------------------------------
# windows and encoding


def test_windows_known_answer_and_cover():
    assert windows(10, 4) == [(0, 4, 0), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    assert windows(3, 4) == [(0, 3, 0)]
    for n in range(1, 40):
        for size in (2, 3, 5, 8):
            ws = windows(n, size)
            taken = [k for s, e, keep in ws for k in range(keep, e)]
            assert taken == list(range(n))  # every subword exactly once, in order
            assert all(e - s <= size and s <= keep for s, e, keep in ws)
            assert all(keep - s in (0, size // 2) for s, e, keep in ws)


@pytest.fixture(scope="module")
def tiny_model():
    from model import MLM, ModelConfig
    torch.manual_seed(0)
    return MLM(ModelConfig(vocab_size=50, n_layers=2, n_heads=2, dim=16, ffn_dim=32, max_positions=16)).eval()


def test_encode_states_equals_direct_run_and_stitches_windows(tiny_model):
    from bpe import EOS_ID
    m = tiny_model
    seqs = [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
    with torch.no_grad():
        out = encode_states(m, seqs, 0, max_len=14)  # both fit: one window each
        for b, ids in enumerate(seqs):
            direct = m.hidden_states(torch.tensor([[EOS_ID] + ids + [EOS_ID]]), 0)[-1][0]
            assert torch.allclose(out[b, :1 + len(ids)], direct[:1 + len(ids)], atol=1e-5)
        assert out[0, 4:].abs().sum() == 0  # padding after the short sentence
        out = encode_states(m, seqs, 0, max_len=4)  # the long one: windows (0,4,0) (2,6,4) (4,8,6) (6,10,8)
        ids = seqs[1]
        for s, e, keep in windows(len(ids), 4):
            h = m.hidden_states(torch.tensor([[EOS_ID] + ids[s:e] + [EOS_ID]]), 0)[-1][0]
            for k in range(keep, e):
                assert torch.allclose(out[1, 1 + k], h[1 + k - s], atol=1e-5)
        assert torch.allclose(out[1, 0], m.hidden_states(torch.tensor([[EOS_ID] + ids[:4] + [EOS_ID]]), 0)[-1][0, 0],
                              atol=1e-5)


# -----------------------------------------------------------------------------
# protocol


def test_mean_of_best_two():
    """Dev scores .5 .8 .7 .8: the best two are sets 1 and 3 (tie on .8 kept in grid order); their test
    scores .2 and .6 average to .4. One set only: its own scores."""
    recs = [{"dev": {"f1": d}, "test": {"fr": {"f1": t, "precision": t}}}
            for d, t in [(.5, .9), (.8, .2), (.7, .9), (.8, .6)]]
    top, dev, test = ft.mean_of_best_two(recs, "f1")
    assert top == [1, 3] and dev == {"f1": pytest.approx(.8)}
    assert test == {"fr": {"f1": pytest.approx(.4), "precision": pytest.approx(.4)}}
    assert ft.mean_of_best_two(recs[:1], "f1")[1:] == ({"f1": .5}, {"fr": {"f1": .9, "precision": .9}})


def test_grid_orders_and_sizes():
    a = argparse.Namespace(batch_size=[4, 8], lr=[1.0, 2.0, 3.0], head_lr=[5.0, 6.0, 7.0])
    assert len(ft.grid("xnli", a)) == 18 and len(ft.grid("ner", a)) == 6
    assert ft.grid("ner", a)[1] == {"batch_size": 4, "lr": 2.0, "head_lr": None}
    assert ft.NERTask.paper["lr"] == [2e-5, 3e-5, 5e-5] and ft.XNLITask.paper["batch_size"] == [4, 8]


def test_warmup_linear():
    assert ft.warmup_linear(0, 100) == 0.0 and ft.warmup_linear(5, 100) == 0.5
    assert ft.warmup_linear(10, 100) == 1.0 and ft.warmup_linear(55, 100) == 0.5 and ft.warmup_linear(100, 100) == 0.0


@needs_data
def test_resolve_files_real_layout():
    f = ft.resolve_files("ner", DATA, "en", ["fr", "zh"])
    assert f["train"].endswith("train-en.tsv") and f["dev"].endswith("dev-en.tsv")
    assert f["test"]["fr"].endswith("heldout-from-dev-fr.tsv")  # labelled test stand-in
    f = ft.resolve_files("parse", DATA, "en", ["ru"])
    assert f["train"].endswith("en_ewt-ud-train.first3000.conllu") and f["test"]["ru"].endswith("ru_gsd-ud-test.conllu")
    f = ft.resolve_files("xnli", DATA, "en", ["fr"], train_file=f["train"])
    assert f["dev"].endswith("dev-en.tsv") and f["test"]["fr"].endswith("test-fr.tsv")
    with pytest.raises(ft.InputError, match=r"xnli: no en train file under --data .*; pass --train-file"):
        ft.resolve_files("xnli", DATA, "en", ["fr"])
    with pytest.raises(ft.InputError, match="ner: no xx test file under --data"):
        ft.resolve_files("ner", DATA, "en", ["xx"])


def test_help_shows_groups_required_flags_and_an_example():
    """--help (issue 49): the flags in groups; the usage names the flags each kind of run requires, with
    no deprecated spelling in it; the epilog's example parses; --align-layer says what it freezes and adds."""
    import shlex
    parser = ft.build_parser()
    text = parser.format_help()
    usage = text.split("\n\n")[0]
    assert "--task {ner,parse,xnli} --ckpt CKPT --data DIR --out DIR" in usage
    assert "--toy --data WORLD --ckpt CKPT --out DIR" in usage and "--table OUT_DIR" in usage
    assert "[DIR]" not in usage and "--batch-size N" not in usage and "--lr LR" not in usage
    for title, flags in (("data", ["--data", "--toy", "--eval-langs"]), ("model", ["--ckpt", "--align-layer"]),
                         ("fine-tuning", ["--epochs", "--lrs", "--batch-size"]), ("run", ["--out", "--device"])):
        group = next(g for g in parser._action_groups if g.title == title)
        assert set(flags) <= {f for a in group._group_actions for f in a.option_strings}, title
    example = next(line for line in text.splitlines() if line.strip().startswith("python finetune.py"))
    args = parser.parse_args(shlex.split(example)[2:])
    assert args.task == "ner" and args.ckpt and args.data and args.out
    align = next(a.help for a in parser._actions if "--align-layer" in a.option_strings)
    assert "0 = the embeddings" in align and "4 new Transformer layers" in align and "frozen" in align


# -----------------------------------------------------------------------------
# end to end on the toy world with a tiny random-init checkpoint (pretrain.py not needed)


def test_toy_end_to_end_parse_beats_chance(toy_world, toy_ckpt, tmp_path, capsys):
    """Random-init encoder, tiny biaffine fine-tune: English dev UAS far above a random head (~1/len)."""
    out = tmp_path / "parse"
    ft.main(["--task", "parse", "--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--epochs", "3",
             "--batch-size", "16", "--lrs", "1e-3,3e-4", "--out", str(out)])
    import json
    res = json.loads((out / "results.json").read_text())
    assert len(res["configs"]) == 2 and sorted(res["best_two"]) == [0, 1]
    assert res["dev"]["uas"] == pytest.approx(np.mean([c["dev"]["uas"] for c in res["configs"]]))
    assert all(c["dev"]["las"] == max(c["dev_curve"]) for c in res["configs"])  # epoch chosen by en dev
    sents = ft.read_conllu(str(toy_world / "ud/en.dev.conllu"))
    chance = np.mean([1 / len(s["words"]) for s in sents])
    assert res["dev"]["uas"] > 3 * chance and res["dev"]["uas"] > 0.3
    assert set(res["test"]) == {"fr"} and 0 <= res["test"]["fr"]["las"] <= res["test"]["fr"]["uas"] <= 1
    text = capsys.readouterr().out
    assert re.search(r"lang +split +las +uas\n", text) and "wrote" in text
    ft.main(["--table", str(out)])
    lines = capsys.readouterr().out.splitlines()
    las = f"{100 * res['test']['fr']['las']:.1f}"
    assert lines[0].split() == ["model", "seeds", "stalled", "Parse", "fr", "avg", "Δ"]
    assert lines[1].split() == ["parse", "1", "0", las, las, "+0.0"]
    with pytest.raises(SystemExit, match="is given twice"):  # one run is one seed, never two
        ft.main(["--table", str(out), str(out)])
    twin = out.parent / "parse-s1"
    shutil.copytree(out, twin)  # the same run under another seed's name: still one seed
    with pytest.raises(SystemExit, match="hold the same run"):
        ft.main(["--table", str(out), str(twin)])
    mixed = out.parent / "mixed"  # one row's seed from two models (was one row, silently)
    for task, metric, ckpt in (("parse", "las", res["job"]["ckpt"]), ("ner", "f1", "sha256:" + "1" * 16)):
        (mixed / task).mkdir(parents=True)
        (mixed / task / "results.json").write_text(json.dumps({**res, "task": task, "metric": metric, "test": {
            "fr": {metric: 0.5}}, "job": {**res["job"], "ckpt": ckpt}}))
    with pytest.raises(SystemExit, match="mixed holds the results of 2 checkpoints"):
        ft.main(["--table", str(mixed)])
    shutil.copy(out / "results.json", mixed / "results.json")  # parse twice in one run folder: counted once
    with pytest.raises(SystemExit, match="mixed/parse/results.json and .*mixed/results.json hold the same run"):
        ft.main(["--table", str(mixed)])


def _load(ckpt):
    import bpe
    from model import load_model
    m, extra = load_model(str(ckpt))
    return m, bpe.Tokenizer.from_dict(extra["tokenizer"])


def test_ner_long_sentences_and_frozen_lang_specific(toy_world, toy_ckpt):
    """A sentence far longer than the model's 24 positions gets a tag for every word (windows); after
    fine-tuning, the language-specific layer-1 copies are unchanged and the shared parts moved."""
    m, tok = _load(toy_ckpt)
    train = ft.read_ner(str(toy_world / "ner/en.train.tsv"))[:64]
    long_words = [w for ws, _ in train[:12] for w in ws]
    long_tags = [t for _, ts in train[:12] for t in ts]
    dev = train[:8] + [(long_words, long_tags)]
    task = ft.NERTask(train, max_len=22)
    data = {"lang_id": 0, "train": (train, task.featurize(train, tok, "en", 24)),
            "dev": (dev, task.featurize(dev, tok, "en", 24)), "test": {}}
    assert len(data["dev"][1][-1][0]) > 3 * 24  # subwords of the long sentence
    args = argparse.Namespace(seed=0, head_dropout=0.1, epoch_size=0, epochs=1, max_len=22, clip=5.0, bf16=False,
                              train_lang="en")
    init = {k: v.clone() for k, v in m.state_dict().items()}
    rec = ft.finetune_one(task, m, init, data, {"batch_size": 16, "lr": 1e-3, "head_lr": None}, args, log=lambda s: None)
    assert rec["best_epoch"] == 1 and 0 <= rec["dev"]["f1"] <= 1
    after = m.state_dict()
    specific = {k for k in after if k.startswith("blocks.0.")}  # layer 1: one copy per language
    assert specific and all(torch.equal(after[k], init[k]) for k in specific)
    assert not torch.equal(after["blocks.1.0.ffn.lin1.weight"], init["blocks.1.0.ffn.lin1.weight"])
    head = task.head(m.config.dim, 0.1)
    preds = task.run(m.eval(), head.eval(), data["dev"][1][-1:], 0, predict=True)
    assert len(preds[0]) == len(long_words)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_only_on_a_terminal(toy_world, toy_ckpt, monkeypatch, tty):
    """A set's bar (steps, rate, ETA) goes to stderr when it is a terminal, and nothing when it is not (CI, logs)."""
    m, tok = _load(toy_ckpt)
    train = ft.read_ner(str(toy_world / "ner/en.train.tsv"))[:32]
    task = ft.NERTask(train, max_len=22)
    feats = task.featurize(train, tok, "en", 24)
    data = {"lang_id": 0, "train": (train, feats), "dev": (train[:8], feats[:8]), "test": {}}
    args = argparse.Namespace(seed=0, head_dropout=0.1, epoch_size=0, epochs=2, max_len=22, clip=5.0, bf16=False,
                              train_lang="en")
    err = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    init = {k: v.clone() for k, v in m.state_dict().items()}
    ft.finetune_one(task, m, init, data, {"batch_size": 16, "lr": 1e-3, "head_lr": None}, args, log=lambda s: None)
    out = err.getvalue()
    assert ("ner bs 16 lr 0.001" in out and "4/4" in out and "step/s" in out) if tty else out == ""


def test_bad_inputs(toy_world, toy_ckpt, tmp_path):
    from model import load_model, save_model
    m, _ = load_model(str(toy_ckpt))
    bare = tmp_path / "bare.pt"
    save_model(bare, m, langs=["en", "fr"])
    with pytest.raises(SystemExit, match=re.escape("--data DIR is required")):
        ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="no tokenizer"):
        ft.main(["--task", "ner", "--ckpt", str(bare), "--toy", "--data", str(toy_world), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--eval-langs de: not one of the checkpoint's languages"):
        ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--eval-langs", "de",
                 "--out", str(tmp_path / "o")])
    shutil.copytree(toy_world / "xnli", tmp_path / "data" / "xnli")
    bad = tmp_path / "data" / "xnli" / "en.dev.tsv"  # XNLI's labels are fixed: read_xnli refuses any other
    bad.write_text("A man.\tA person.\tentailment\nA man.\tA dog.\tmaybe\n")
    with pytest.raises(SystemExit, match=re.escape(f"error: {bad}:2: unknown XNLI label 'maybe'")):
        ft.main(["--task", "xnli", "--ckpt", str(toy_ckpt), "--data", str(tmp_path / "data"),
                 "--out", str(tmp_path / "o")])


def test_labels_unseen_in_english_train_are_named_and_scored_as_errors(toy_world, toy_ckpt, tmp_path, capsys):
    """A target test tag that English train never has (B-MISC) cannot be predicted: the run names it, and its
    gold span can only be missed (recall below 1)."""
    shutil.copytree(toy_world / "ner", tmp_path / "w" / "ner")
    test = tmp_path / "w" / "ner" / "fr.test.tsv"
    test.write_text(test.read_text().replace("\tO\n", "\tB-MISC\n", 1))
    ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(tmp_path / "w"), "--epochs", "1",
             "--batch-size", "32", "--lr", "1e-3", "--out", str(tmp_path / "o")])
    assert f"ner: {test}: labels never seen in the en train set: B-MISC" in capsys.readouterr().out
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert "B-MISC" not in res["labels"] and 0 <= res["test"]["fr"]["recall"] < 1


def test_the_dev_language_is_the_training_language(toy_world, toy_ckpt, tmp_path, capsys):
    """--train-lang fr (issue 49): every epoch line and the selection line name fr dev, never en dev."""
    ft.main(["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(toy_world), "--train-lang", "fr",
             "--eval-langs", "en", "--epochs", "2", "--batch-size", "32", "--lrs", "1e-3,3e-4", "--out",
             str(tmp_path / "o")])
    text = capsys.readouterr().out
    epochs = [line for line in text.splitlines() if line.strip().startswith("epoch ")]
    assert len(epochs) == 4 and all("  fr dev f1 " in line for line in epochs)
    assert "sets by fr dev" in text and "en dev" not in text


def test_overlap_with_the_train_file_is_found_by_content(toy_world, toy_ckpt, tmp_path, capsys):
    """Issue 48: an English test file that is the train file with a space after each token was not seen
    (examples compared by repr): it is refused now. A partial overlap (40 % of the fr test sentences taken from
    English train) runs, its count printed beside the scores and kept in results.json."""
    world = tmp_path / "w"
    shutil.copytree(toy_world / "ner", world / "ner")
    train = (world / "ner/en.train.tsv").read_text().strip().split("\n\n")
    spaced = ["\n".join(line.replace("\t", " \t") for line in block.split("\n")) for block in train]
    (world / "ner/en.test.tsv").write_text("\n\n".join(spaced) + "\n")
    argv = ["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(world), "--epochs", "1",
            "--batch-size", "32", "--lr", "1e-3"]
    with pytest.raises(SystemExit, match="holds 300 of the 300 examples of the en test file"):
        ft.main(argv + ["--eval-langs", "en", "--out", str(tmp_path / "a")])
    fr = (world / "ner/fr.test.tsv").read_text().strip().split("\n\n")
    (world / "ner/fr.test.tsv").write_text("\n\n".join(fr[:72] + spaced[:48]) + "\n")
    ft.main(argv + ["--eval-langs", "fr", "--out", str(tmp_path / "b")])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fr "))
    assert row.endswith("48 of its 120 examples are in the train file")
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["notes"] == {"fr test": "48 of its 120 examples are in the train file"}


def test_aligned_transfer_routes_target_through_its_model_and_map(toy_world, toy_ckpt, tmp_path, capsys):
    """--align-layer 1 with a "target model" that is the same weights with language 0 renamed fr, an
    identity map, and the ENGLISH dev file copied as the fr test file: the fr input then takes exactly the
    English path (same layer-1 copy, same map-free states), so fr test must equal English dev."""
    import json
    from model import load_model, save_model
    m, extra = load_model(str(toy_ckpt))
    target = tmp_path / "target.pt"  # the same weights, but its language 0 is called fr: a "monolingual fr model"
    save_model(target, m, tokenizer=extra["tokenizer"], langs=["fr", "en"])
    maps = tmp_path / "maps.npz"
    eye = np.stack([np.eye(m.config.dim, dtype=np.float32)] * (m.config.n_layers + 1))
    np.savez(maps, src_to_tgt=eye, tgt_to_src=eye, src="en", tgt="fr")
    shutil.copytree(toy_world / "ner", tmp_path / "world" / "ner")
    shutil.copy(toy_world / "ner" / "en.dev.tsv", tmp_path / "world" / "ner" / "fr.test.tsv")
    argv = ["--task", "ner", "--ckpt", str(toy_ckpt), "--toy", "--data", str(tmp_path / "world"), "--eval-langs", "fr",
            "--epochs", "1", "--batch-size", "32",
            "--lr", "1e-3", "--align-layer", "1", "--target-ckpt", str(target), "--align-maps", str(maps)]
    out = tmp_path / "aligned"
    ft.main(argv + ["--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    assert res["test"]["fr"] == pytest.approx(res["dev"])  # same path, same weights, same sentences
    assert "records no checkpoint digests (an older align.py): unchecked" in capsys.readouterr().out
    # maps that record the digests of the two checkpoints they were fitted on (align.py): checked, no note
    np.savez(maps, src_to_tgt=eye, tgt_to_src=eye, src="fr", tgt="en", src_ckpt_digest=ft.digest(str(target)),
             tgt_ckpt_digest=ft.digest(str(toy_ckpt)))
    ft.maps_origin(argparse.Namespace(align_maps=str(maps), train_lang="en", eval_langs=["fr"], ckpt=str(toy_ckpt),
                                      target_ckpt=str(target)))
    assert capsys.readouterr().out == ""
    np.savez(maps, src_to_tgt=eye, tgt_to_src=eye, src="en", tgt="ru")
    with pytest.raises(SystemExit, match="maps are for en->ru, not fr->en"):
        ft.main(argv + ["--out", str(tmp_path / "other")])


def test_toy_runs_all_three_tasks(toy_world, toy_ckpt, tmp_path, capsys):
    """--toy without --task: XNLI, NER and parsing each write out/TASK/results.json (1 epoch, 1 set)."""
    import json
    ft.main(["--toy", "--data", str(toy_world), "--ckpt", str(toy_ckpt), "--epochs", "1", "--batch-size", "32",
             "--lr", "1e-3", "--head-lr", "1e-3", "--out", str(tmp_path)])
    for task, metric in [("xnli", "acc"), ("ner", "f1"), ("parse", "las")]:
        res = json.loads((tmp_path / task / "results.json").read_text())
        assert res["task"] == task and res["metric"] == metric and len(res["configs"]) == 1
        assert 0 <= res["dev"][metric] <= 1 and 0 <= res["test"]["fr"][metric] <= 1
    text = capsys.readouterr().out
    assert text.count("the one hyper-parameter set") == 3  # a one-set grid is said as such
    # the score of a guess under each table (issue 38): XNLI's majority label per split, about 0 for F1 and LAS
    labels = [lab for _, _, lab in ft.read_xnli(str(toy_world / "xnli/fr.test.tsv"))]
    share = 100 * max(labels.count(x) for x in set(labels)) / len(labels)
    assert re.search(r"chance \(always the majority label\): dev \d+\.\d, fr test " + f"{share:.1f}\n", text)
    assert "chance: f1 of a guess is about 0" in text and "chance: las of a guess is about 0" in text


def test_table1_layout_means_seeds_and_delta(tmp_path, capsys):
    """--table: rows are models (NAME-sSEED folded into NAME), cells the mean (± std) test score in %,
    avg over the columns and Δ against the first row; checked against numbers worked out by hand."""
    def write(run, task, metric, score):
        d = tmp_path / run / task
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps({"task": task, "metric": metric, "test": {"fr": {metric: score}}}))
    for run, (acc, f1) in {"default-s0": (0.60, 0.40), "default-s1": (0.70, 0.50), "sep-s0": (0.40, 0.10)}.items():
        write(run, "xnli", "acc", acc)
        write(run, "ner", "f1", f1)
    ft.main(["--table"] + [str(tmp_path / r) for r in ("default-s0", "default-s1", "sep-s0")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["model", "seeds", "stalled", "XNLI", "fr", "NER", "fr", "avg", "Δ"]
    # default: XNLI (60, 70) -> 65 ± 5; NER (40, 50) -> 45 ± 5; avg per seed 50, 60 -> 55 ± 5
    assert lines[1].split() == ["default", "2", "0", "65.0", "±5.0", "45.0", "±5.0", "55.0", "±5.0", "+0.0"]
    # sep: 40, 10 -> avg 25, Δ = 25 - 55 = -30
    assert lines[2].split() == ["sep", "1", "0", "40.0", "10.0", "25.0", "-30.0"]
    assert lines[-1] == "chance: XNLI 33.3 (three balanced labels), NER span F1 about 0"
    with pytest.raises(SystemExit, match="no results.json"):
        ft.main(["--table", str(tmp_path / "missing")])


def test_table_rows_per_model_and_update(tmp_path, capsys):
    """--table over NAME-sSEED-stepN directories: one row per (NAME, N) in update order, seeds averaged, the
    snapshot's dev perplexity beside the test scores, avg and Δ against the first row."""
    def write(run, task, metric, score, ppl):
        d = tmp_path / run / task
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps({"task": task, "metric": metric, "test": {"fr": {metric: score}},
                                                    "pretrain": {"step": 0, "dev_ppl": {"en": ppl, "fr": ppl}}}))
    for run, (f1, las, ppl) in {"default-s0-step1000": (0.50, 0.70, 20.0), "default-s1-step1000": (0.60, 0.80, 30.0),
                                "default-s0-step500": (0.10, 0.20, 90.0), "sep-s0-step500": (0.01, 0.02, 95.0)}.items():
        write(run, "ner", "f1", f1, ppl)
        write(run, "parse", "las", las, ppl)
    dirs = [str(tmp_path / r) for r in ("default-s0-step1000", "default-s1-step1000", "default-s0-step500",
                                        "sep-s0-step500")]
    lines = ft.results_table(dirs).splitlines()
    assert lines[0].split() == ["model", "updates", "seeds", "stalled", "dev", "ppl", "en", "dev", "ppl", "fr", "NER",
                                "fr", "Parse", "fr", "avg", "Δ"]
    assert lines[1].split() == ["default", "500", "1", "0", "90.0", "90.0", "10.0", "20.0", "15.0", "+0.0"]
    # seeds: NER 50, 60; LAS 70, 80; avg per seed 60, 70 -> 65 ± 5, Δ = 65 - 15 = +50
    assert lines[2].split() == ["default", "1000", "2", "0", "25.0", "±5.0", "25.0", "±5.0", "55.0", "±5.0", "75.0",
                                "±5.0", "65.0", "±5.0", "+50.0"]
    assert lines[3].split() == ["sep", "500", "1", "0", "95.0", "95.0", "1.0", "2.0", "1.5", "-13.5"]


def test_table_leaves_a_stalled_seed_out_and_marks_thin_cells(tmp_path, capsys):
    """A seed whose checkpoint's English dev perplexity is above the left-bigram count model pretrain.py recorded
    (a stall on the unigram plateau) is left out of the means and counted apart, unless --with-stalled; a cell
    over fewer seeds than its row's is marked *."""
    def write(run, task, score, ppl):
        d = tmp_path / run / task
        d.mkdir(parents=True)
        count = {"en": {"unigram": 150.0, "left": 24.0, "both": 13.0}}
        (d / "results.json").write_text(json.dumps({"task": task, "metric": "f1", "test": {"fr": {"f1": score}},
                                                    "pretrain": {"dev_ppl": {"en": ppl}, "count_ppl": count}}))
    write("m-s0", "ner", 0.80, 10.0)
    write("m-s1", "ner", 0.60, 12.0)
    write("m-s2", "ner", 0.10, 94.5)  # stalled
    dirs = [str(tmp_path / f"m-s{i}") for i in range(3)]
    lines = ft.results_table(dirs).splitlines()
    assert lines[1].split()[:4] == ["m", "2", "1", "11.0"] and lines[1].split()[5] == "70.0"
    assert "1 seed(s) whose MLM stalled" in lines[-1]
    assert ft.results_table(dirs, with_stalled=True).splitlines()[1].split()[:3] == ["m", "3", "1"]
    with pytest.raises(SystemExit, match="--with-stalled goes with --table"):  # alone it would change nothing
        ft.main(["--with-stalled", "--ckpt", "x.pt", "--out", str(tmp_path / "o")])
    for flags, named in ((["--allow-overlap"], "--allow-overlap"), (["--overwrite", "--seed", "1"], "--seed, --overwrite")):
        with pytest.raises(SystemExit, match=f"--table only reads finished runs: {named} would change nothing"):
            ft.main(["--table", *dirs] + flags)  # a training flag changed nothing in the table (was accepted)
    (tmp_path / "m-s1" / "xnli").mkdir()
    (tmp_path / "m-s1" / "xnli" / "results.json").write_text(json.dumps(
        {"task": "xnli", "metric": "acc", "test": {"fr": {"acc": 0.5}}}))
    table = ft.results_table(dirs)
    assert "50.0*" in table and "* averaged over fewer seeds" in table
    count = tmp_path / "m-s2" / "ner" / "results.json"  # a hand-edited count model: not a stall (was a TypeError)
    count.write_text(count.read_text().replace("24.0", '"x"'))
    assert ft.results_table(dirs).splitlines()[1].split()[:3] == ["m", "3", "0"]


def test_table_plot_draws_learning_curves(tmp_path):
    """--table over NAME-sSEED-stepN dirs with --plot draws the curves (mean over seeds per NAME and N); --plot
    without -stepN dirs, or without --table, is refused in one line."""
    pytest.importorskip("matplotlib", reason="matplotlib is optional (only --plot needs it)")
    dirs = []
    for name, scale in (("default", 1.0), ("no-anchors", 0.6)):
        for seed in (0, 1):
            for n in (500, 2000, 8000):
                d = tmp_path / f"{name}-s{seed}-step{n}"
                (d / "ner").mkdir(parents=True)
                (d / "ner" / "results.json").write_text(json.dumps(
                    {"task": "ner", "metric": "f1", "test": {"fr": {"f1": scale * (0.3 + n / 16000 + 0.05 * seed)}},
                     "pretrain": {"dev_ppl": {"en": 1000 / n ** 0.5}}}))
                dirs.append(str(d))
    png = tmp_path / "curves.png"
    ft.main(["--table", *dirs, "--plot", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob("*.tmp.png"))
    _, groups, _ = ft.read_table(dirs)
    assert list(groups) == [(m, s) for m in ("default", "no-anchors") for s in (500, 2000, 8000)]
    assert [c[("ner", "fr")] for c in groups["default", 8000]] == pytest.approx([80.0, 85.0])
    with pytest.raises(SystemExit, match="so there is no curve"):
        plain = tmp_path / "default-s0"
        shutil.copytree(tmp_path / "default-s0-step500", plain)
        ft.main(["--table", str(plain), "--plot", str(png)])
    with pytest.raises(SystemExit, match="--plot goes with --table"):
        ft.main(["--plot", str(png)])
