"""align.py: Procrustes, iterative normalisation, CSLS, P@1, fast_align (numpy part), and the CLIs.

Run: python -m pytest -q tests/test_align.py
"""
from pathlib import Path

import numpy as np
import pytest

import align
import bpe

# the real data sits beside the repository (../shared/data); located from this file, not the working directory
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "tatoeba").is_dir() or not (DATA / "muse_dictionaries").is_dir(),
                                reason=f"real data not present at {DATA} (a bare clone): skipped")


def random_rotation(d, rng):
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    return Q * np.sign(np.diag(R))


# ----------------------------------------------------------------------------------------------------
# Procrustes


def test_procrustes_known_answer():
    """Expected W from SciPy 1.17.1 `orthogonal_procrustes(X, Y)[0]` (computed once, SciPy is not a
    dependency). U Vᵀ of the SVD of XᵀY = [[3,5,6],[3,3,7],[7,2,3]]."""
    X = np.array([[1., 2., 0.], [0., 1., 3.], [2., 0., 1.], [1., 1., 1.]])
    Y = np.array([[0., 1., 2.], [3., 0., 1.], [1., 2., 0.], [1., 0., 1.]])
    W_scipy = np.array([[0.04266454017883087, 0.9961867088848984, 0.07610373218445102],
                        [0.00333055685815968, -0.0763144809982023, 0.9970782353361192],
                        [0.9990839025839335, -0.04228641662577699, -0.00657377871605853]])
    np.testing.assert_allclose(align.procrustes(X, Y), W_scipy, atol=1e-12)


def test_procrustes_recovers_planted_rotation_and_is_optimal():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 16))
    R = random_rotation(16, rng)
    np.testing.assert_allclose(align.procrustes(X, X @ R), R, atol=1e-10)
    Y = X @ R + 0.1 * rng.standard_normal(X.shape)       # noisy: still orthogonal, still the best
    W = align.procrustes(X, Y)
    np.testing.assert_allclose(W.T @ W, np.eye(16), atol=1e-10)
    best = np.linalg.norm(X @ W - Y)
    for _ in range(20):                                   # no random rotation does better
        assert np.linalg.norm(X @ random_rotation(16, rng) - Y) > best


@pytest.mark.parametrize("bad, msg", [
    ((np.ones((3, 2)), np.ones((4, 2))), "rows"),
    ((np.array([[1., np.nan]]), np.ones((1, 2))), "NaN"),
    ((np.ones((3, 2)), np.ones((3, 3))), "dimension"),
    ((np.ones((0, 2)), np.ones((0, 2))), "empty"),
    ((np.ones(3), np.ones(3)), "2-D"),
])
def test_procrustes_bad_input(bad, msg):
    with pytest.raises(ValueError, match=msg):
        align.procrustes(*bad)


# ----------------------------------------------------------------------------------------------------
# iterative normalisation


def test_iterative_normalize_unit_norm_and_zero_mean():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((500, 20)) * rng.uniform(0.1, 10, (500, 1)) + 3.0   # far from centred
    Z = align.iterative_normalize(X)
    np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1.0, atol=1e-7)
    assert np.abs(Z.mean(axis=0)).max() < 1e-3
    # one round is not enough: the mean is visibly non-zero, which is why the method iterates
    assert np.abs(align.iterative_normalize(X, n_iter=1).mean(axis=0)).max() > \
        10 * np.abs(Z.mean(axis=0)).max()


# ----------------------------------------------------------------------------------------------------
# retrieval: CSLS in chunks equals a dense brute force


def brute_force_csls(X, Y, k):
    """Written out from the MUSE definition, O(n m) memory, no shortcut."""
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    Y = Y / np.linalg.norm(Y, axis=1, keepdims=True)
    S = X @ Y.T
    r_T = np.sort(S, axis=1)[:, ::-1][:, :k].mean(axis=1)       # queries' neighbourhoods in Y
    r_S = np.sort(S.T, axis=1)[:, ::-1][:, :k].mean(axis=1)     # candidates' neighbourhoods in X
    return np.argmax(2 * S - r_T[:, None] - r_S[None, :], axis=1), 2 * S - r_T[:, None] - r_S[None, :]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_csls_chunked_equals_dense_brute_force(dtype):
    rng = np.random.default_rng(2)
    u = rng.standard_normal(12)                          # a direction every query leans towards
    X = (rng.standard_normal((300, 12)) + u).astype(dtype)
    Y = rng.standard_normal((250, 12))
    Y[:5] = u + 0.3 * rng.standard_normal((5, 12))       # plant 5 hubs: near every query
    Y = Y.astype(dtype)
    expected, _ = brute_force_csls(X.astype(np.float64), Y.astype(np.float64), k=10)
    got = align.csls_knn(X, Y, k=10, chunk_bytes=4096)   # force many small chunks
    assert (got == expected).mean() > 0.99 if dtype == np.float32 else (got == expected).all()
    # CSLS and NN differ on data with hubs: CSLS retrieves the hubs less often
    nn = align.nn_knn(X, Y, chunk_bytes=4096)
    assert np.isin(nn, np.arange(5)).sum() > np.isin(got, np.arange(5)).sum()


def test_csls_k_larger_than_candidates_and_nn():
    rng = np.random.default_rng(3)
    Y = rng.standard_normal((4, 6))
    X = Y[[2, 0, 3]] + 1e-3 * rng.standard_normal((3, 6))
    assert align.csls_knn(X, Y, k=10).tolist() == [2, 0, 3]
    assert align.nn_knn(X, Y).tolist() == [2, 0, 3]


def test_word_translation_p_at_1_any_gold_rule():
    """Rotated copies with noise: Procrustes on train pairs, P@1 on test words, several golds."""
    rng = np.random.default_rng(4)
    d, V = 20, 400
    X = rng.standard_normal((V, d))
    R = random_rotation(d, rng)
    Yt = X @ R + 0.05 * rng.standard_normal((V, d))
    src_idx, tgt_idx = np.arange(V), np.arange(V)
    W = align.procrustes(X[:300], Yt[:300])
    p1, n = align.word_translation_accuracy(X, Yt, src_idx[300:], tgt_idx[300:], W)
    assert n == 100 and p1 == 1.0
    p0, _ = align.word_translation_accuracy(X, Yt, src_idx[300:], tgt_idx[300:], None)
    assert p0 < 0.2                                       # without the map: near chance
    # a source word with a wrong and a right gold counts as right; one with only wrong golds as wrong:
    # one-hot rows, source word 0 retrieves target 7 (golds 3, 7), source word 1 retrieves 8 (gold 9)
    E = np.eye(10)
    assert align.word_translation_accuracy(E[[7, 8]], E, np.array([0, 0, 1]), np.array([3, 7, 9])) == (0.5, 2)


def test_dictionary_reading_and_errors(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("The le\nthe la\n\ncat chat\n")
    pairs = align.read_muse_dictionary(str(p))
    assert pairs == [("the", "le"), ("the", "la"), ("cat", "chat")]
    s, t = align.dictionary_indices(pairs, ["cat", "the"], ["la", "chat"])
    assert s.tolist() == [1, 0] and t.tolist() == [0, 1]
    with pytest.raises(ValueError, match="none of its 3 pairs"):
        align.dictionary_indices(pairs, ["dog"], ["chien"], name=str(p))
    (tmp_path / "e.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="e.txt: the dictionary is empty"):
        align.read_muse_dictionary(str(tmp_path / "e.txt"))
    (tmp_path / "b.txt").write_text("a b\nonlyone\n")
    with pytest.raises(ValueError, match="b.txt:2"):
        align.read_muse_dictionary(str(tmp_path / "b.txt"))


@needs_data
def test_real_muse_dictionary_format():
    pairs = align.read_muse_dictionary(str(DATA / "muse_dictionaries" / "en-fr.5000-6500.reconstructed.txt"))
    assert len(pairs) > 1000 and all(len(p) == 2 for p in pairs)


def test_read_parallel_names_both_files(tmp_path):
    a, b = tmp_path / "x.en", tmp_path / "x.fr"
    a.write_text("a\nb\nc\n")
    b.write_text("A\nB\n")
    with pytest.raises(ValueError, match=r"x\.en has 3 lines, .*x\.fr has 2"):
        bpe.read_parallel(str(a), str(b))


# ----------------------------------------------------------------------------------------------------
# fast_align


def test_digamma_known_values():
    euler = 0.5772156649015329
    np.testing.assert_allclose(align.digamma([1.0, 0.5, 2.0, 10.0]),
                               [-euler, -euler - 2 * np.log(2), 1 - euler,
                                sum(1 / k for k in range(1, 10)) - euler], rtol=0, atol=1e-10)


def planted_corpus(n_sents, rng, V=60):
    """Source words s0..s59 translate one-to-one into t0..t59; the target side reorders adjacent
    pairs at random (near-diagonal, as fast_align assumes) and sometimes adds an unaligned word."""
    S, T, gold = [], [], []
    for _ in range(n_sents):
        n = int(rng.integers(4, 12))
        ws = rng.integers(0, V, n)
        perm = np.arange(n)
        for a in range(0, n - 1, 3):
            if rng.random() < 0.5:
                perm[a], perm[a + 1] = perm[a + 1], perm[a]
        tgt = [f"t{ws[p]}" for p in perm]
        links = {(int(p), j) for j, p in enumerate(perm)}
        if rng.random() < 0.3:                              # a target word with no source (-> NULL)
            tgt.append("junk")
        S.append(" ".join(f"s{w}" for w in ws))
        T.append(" ".join(tgt))
        gold.append(links)
    return S, T, gold


def test_fast_align_recovers_planted_alignment():
    rng = np.random.default_rng(5)
    S, T, gold = planted_corpus(600, rng)
    for name, L in (("forward", align.ibm2_align(S, T)), ("symmetrised", align.fast_align(S, T))):
        tp = sum(len(set(l) & g) for l, g in zip(L, gold))
        prec, rec = tp / sum(map(len, L)), tp / sum(map(len, gold))
        assert prec > 0.97 and rec > 0.97, (name, prec, rec)


def test_fast_align_small_cases():
    # one-word sentences: the only link; empty sides: no links; reverse links are (src, tgt) too
    assert align.fast_align(["a", "", "b c"], ["x", "y", ""]) == [[(0, 0)], [], []]
    S = ["the cat sleeps", "the dog sleeps", "a cat eats", "a dog eats"] * 5
    T = ["le chat dort", "le chien dort", "un chat mange", "un chien mange"] * 5
    assert align.fast_align(S, T)[0] == [(0, 0), (1, 1), (2, 2)]
    with pytest.raises(ValueError, match="3 source but 2 target"):
        align.fast_align(["a"] * 3, ["b"] * 2)


def test_grow_diag_final_and():
    # the intersection (0,0); (1,1) from the union touches it diagonally -> grown; (2,2) likewise
    # after (1,1); (3,0) is not a neighbour of anything and 0 is aligned already -> not added by
    # "final-and"; (4,5) is in fwd only and both words are unaligned -> added by "final-and".
    fwd = [(0, 0), (1, 1), (4, 5), (3, 0)]
    rev = [(0, 0), (2, 2)]
    assert align.grow_diag_final_and(fwd, rev) == [(0, 0), (1, 1), (2, 2), (4, 5)]


def test_one_to_one_pairs():
    links = [(0, 0), (1, 1), (1, 2), (2, 3), (3, 4)]
    src, tgt = ["a", "b", "c", "Paris"], ["A", "B", "B2", "C", "Paris"]
    assert align.one_to_one_pairs(links, src, tgt) == [(0, 0), (2, 3)]


def test_fast_align_on_the_toy_world(toy_world):
    """The toy world's parallel sentences render the same concepts: the one-to-one links should mostly
    be dictionary translations (the ground truth the world writes in dict/en-fr.txt)."""
    S, T = bpe.read_parallel(str(toy_world / "parallel/en-fr.train.en"), str(toy_world / "parallel/en-fr.train.fr"))
    gold = set(align.read_muse_dictionary(str(toy_world / "dict/en-fr.txt")))
    S, T = [s.split() for s in S], [t.split() for t in T]
    pairs = [(S[k][i].lower(), T[k][j].lower()) for k, ln in enumerate(align.fast_align(S, T))
             for i, j in align.one_to_one_pairs(ln, S[k], T[k])]
    in_dict = [p in gold for p in pairs]
    assert len(pairs) > 3 * len(S) and np.mean(in_dict) > 0.8, (len(pairs), np.mean(in_dict))


# ----------------------------------------------------------------------------------------------------
# CLI part: a tiny random-init checkpoint on the toy world (pretrain.py is not needed)

torch = pytest.importorskip("torch")
TATOEBA = str(DATA / "tatoeba" / "tatoeba.fra-eng")
MUSE = str(DATA / "muse_dictionaries" / "en-fr")


def make_checkpoint(path, files, langs, seed=0):
    import bpe
    import model as M
    tok = bpe.Tokenizer.build(files, num_merges=200, verbose=False)
    torch.manual_seed(seed)
    cfg = M.ModelConfig(vocab_size=tok.vocab_size(langs[0]), n_langs=len(langs), n_layers=2, n_heads=2,
                        dim=16, ffn_dim=32, max_positions=64)
    M.save_model(str(path), M.MLM(cfg), tokenizer=tok.to_dict(), langs=list(langs))
    return str(path)


@pytest.fixture(scope="module")
def ckpts(toy_world, tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("ckpt")
    mono = lambda l: str(toy_world / f"mono/{l}.train.txt")
    return {"bi": make_checkpoint(d / "bi.pt", {"en": mono("en"), "fr": mono("fr")}, ["en", "fr"]),
            "fr": make_checkpoint(d / "fr.pt", {"fr": mono("fr")}, ["fr"], seed=1)}


def test_sentence_vectors_exclude_specials_and_ignore_batching(ckpts):
    import model as M
    mdl, extra = M.load_model(ckpts["bi"])
    tok, langs = bpe.checkpoint_tokenizer(extra, ckpts["bi"])
    sents = ["the", "a b c d e f g h", "", "x y"]
    E1 = M.pool_sentences(mdl, [tok.encode(s, "fr") for s in sents], 1, batch_size=1)
    E4 = M.pool_sentences(mdl, [tok.encode(s, "fr") for s in sents], 1, batch_size=4)
    assert len(E1) == mdl.config.n_layers + 1 and E1[0].shape == (4, 16)
    for a, b in zip(E1, E4):                                # padding does not leak into the means
        np.testing.assert_allclose(a, b, atol=1e-5)
    from bpe import EOS_ID
    ids = tok.encode(sents[1], "fr")
    with torch.no_grad():
        hs = mdl.hidden_states(torch.tensor([[EOS_ID] + ids + [EOS_ID]]), 1)
    for l, h in enumerate(hs):
        np.testing.assert_allclose(E1[l][1], h[0, 1:-1].mean(0).numpy(), atol=1e-5)
    # a word vector is the mean of its subwords: a one-word sentence's word = the sentence
    W, off = align.encode_word_tokens(mdl, tok, [["a", "b"], ["hello"]], 0, "en", batch_size=2)
    assert off.tolist() == [0, 2, 3]
    S = M.pool_sentences(mdl, [tok.encode("hello", "en")], 0)
    for l in range(len(W)):
        np.testing.assert_allclose(W[l][2], S[l][0], atol=1e-5)


@pytest.mark.parametrize("tty", [True, False])
def test_encoding_progress_bar_only_on_a_terminal(ckpts, monkeypatch, tty):
    """align.py's word-token encoding draws a bar (sentences, rate) on stderr when it is a terminal, else nothing."""
    import io

    import model as M

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    mdl, extra = M.load_model(ckpts["bi"])
    tok, _ = bpe.checkpoint_tokenizer(extra, ckpts["bi"])
    err = Terminal() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    align.encode_word_tokens(mdl, tok, [["a", "b"], ["hello"]], 0, "en", batch_size=1)
    assert ("encode en" in err.getvalue() and "sent/s" in err.getvalue()) if tty else err.getvalue() == ""


def run_cli(argv, capsys):
    rows = align.main(argv)
    return rows, capsys.readouterr().out


def test_cli_words_contextual_sentences_on_the_toy_world(ckpts, toy_world, tmp_path, capsys):
    toy = ["--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"]]
    rows, out = run_cli(["words"] + toy + ["--max-sents", "300"], capsys)
    assert [r[0] for r in rows] == ["emb (4a)", "L0 (4b)", "L1 (4b)", "L2 (4b)"]
    assert all(0 <= r[1] <= 1 and 0 <= r[2] <= 1 and r[4] > 0 for r in rows[1:]) and "| L2 (4b) |" in out
    maps = str(tmp_path / "maps.npz")
    rows, out = run_cli(["contextual"] + toy + ["--max-sents", "150", "--save-maps", maps], capsys)
    assert len(rows) == 3 and all(r[3] > 100 and r[4] > 10 for r in rows)
    z = np.load(maps)
    assert z["src_to_tgt"].shape == (3, 16, 16) and str(z["tgt"]) == "fr"
    for W in z["src_to_tgt"]:
        np.testing.assert_allclose(W @ W.T, np.eye(16), atol=1e-5)
    np.testing.assert_allclose(z["tgt_to_src"][1], z["src_to_tgt"][1].T)
    rows, out = run_cli(["sentences"] + toy + ["--max-sents", "60"], capsys)
    assert len(rows) == 3 and len(rows[0]) == 5 and "en->fr mapped" in out
    # two models: --ckpt2 encodes fr
    rows, _ = run_cli(["sentences"] + toy + ["--ckpt2", ckpts["fr"], "--max-sents", "40"], capsys)
    assert len(rows) == 3


@needs_data
def test_cli_on_real_tatoeba_and_muse_formats(ckpts, tmp_path, capsys):
    base = ["--ckpt", ckpts["bi"], "--src", "en", "--tgt", "fr", "--max-sents", "30"]
    rows, out = run_cli(["sentences"] + base + ["--test-src", TATOEBA + ".eng", "--test-tgt", TATOEBA + ".fra"], capsys)
    assert len(rows) == 3 and "30 pairs" in out
    corpus = ["--src-corpus", TATOEBA + ".eng", "--tgt-corpus", TATOEBA + ".fra", "--max-sents", "1000"]
    rows, out = run_cli(["words", "--ckpt", ckpts["bi"], "--train-dict", MUSE + ".0-5000.reconstructed.txt",
                         "--test-dict", MUSE + ".0-5000.reconstructed.txt", "--allow-overlap"] + corpus, capsys)
    assert rows[1][4] > 50                          # tatoeba's frequent words are in the dictionary
    rows, _ = run_cli(["contextual"] + base + ["--src-file", TATOEBA + ".eng", "--tgt-file", TATOEBA + ".fra"], capsys)
    assert len(rows) == 3


def test_cli_errors_name_the_input(ckpts, toy_world, tmp_path):
    a, b = tmp_path / "a.en", tmp_path / "b.fr"
    a.write_text("x\ny\n")
    b.write_text("x\n")
    with pytest.raises(SystemExit, match=r"a\.en has 2 lines, .*b\.fr has 1"):
        align.main(["sentences", "--ckpt", ckpts["bi"], "--test-src", str(a), "--test-tgt", str(b)])
    with pytest.raises(SystemExit, match=r"fr\.pt: language 'en' is not one of .*\['fr'\]"):
        align.main(["sentences", "--ckpt", ckpts["fr"], "--toy", "--data", str(toy_world)])
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(SystemExit, match="empty.txt: the dictionary is empty"):
        align.main(["words", "--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"], "--test-dict", str(empty)])
    with pytest.raises(SystemExit, match="missing --test-src"):
        align.main(["sentences", "--ckpt", ckpts["bi"]])


WORK_ERRORS = [  # (raised inside the work, the `error:` line, or None: it keeps its type and traceback)
    (ValueError("bug"), None), (RuntimeError("bug"), None), (OSError("bug"), None),  # an OSError without errno: ours
    (PermissionError(13, "Permission denied", "x.en"), "error: x.en: Permission denied"),
    (OSError(28, "No space left on device"), "error: No space left on device"),  # a write names no file
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
     "error: out of memory; try a smaller --batch-size (or --max-sents)"),
    (MemoryError(), "error: out of memory; try a smaller --batch-size (or --max-sents)")]


@pytest.mark.parametrize("error, line", WORK_ERRORS,
                         ids=[f"{type(e).__name__}-{'line' if l else 'raised'}" for e, l in WORK_ERRORS])
def test_only_input_errors_become_one_line(ckpts, toy_world, monkeypatch, error, line):
    """model.analysis_run turns out of memory and a file's OSError into one `error:` line; the helpers raise
    InputError themselves. Any other error inside the work is a bug: it surfaces as itself, with its traceback
    (it was an `error:` line for every ValueError and OSError, a bug's too)."""
    calls = []

    def nn_knn(*a, **k):  # the retrieval of align.py sentences, after the checkpoint and files are read
        calls.append(1)
        raise error
    monkeypatch.setattr(align, "nn_knn", nn_knn)
    argv = ["sentences", "--ckpt", ckpts["bi"], "--toy", "--data", str(toy_world), "--max-sents", "20"]
    with pytest.raises(SystemExit if line else type(error)) as e:
        align.main(argv)
    assert calls and (e.value.code == line if line else e.value is error)


@needs_data
def test_cli_error_when_no_dictionary_pair_is_in_the_vocabulary(ckpts, toy_world):
    with pytest.raises(SystemExit, match=r"5000-6500.reconstructed.txt \(emb \(4a\)\): none of its"):
        align.main(["words", "--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"], "--max-sents", "50",
                    "--test-dict", MUSE + ".5000-6500.reconstructed.txt"])


def test_sentence_encoding_progress_wraps_the_states_without_changing_them(ckpts, monkeypatch, capsys):
    """model.pool_sentences(progress=...) hands the states to a wrapper (a bar) with their total and returns the
    same vectors; align.py sentences draws its `encode` bars on a terminal only."""
    import io

    import model as M
    mdl, extra = M.load_model(ckpts["bi"])
    tok, _ = bpe.checkpoint_tokenizer(extra, ckpts["bi"])
    ids = [tok.encode(s, "en") for s in ("hello world", "a b", "")]
    seen = []

    def wrap(states, total):
        seen.append(total)
        yield from states
    plain, wrapped = M.pool_sentences(mdl, ids, 0, 2), M.pool_sentences(mdl, ids, 0, 2, progress=wrap)
    assert seen == [3] and all(np.array_equal(a, b) for a, b in zip(plain, wrapped))

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    pairs = ckpts["bi"] + ".pairs"
    for lang, text in (("en", "hello world\na b\n"), ("fr", "bonjour monde\nc d\n")):
        with open(f"{pairs}.{lang}", "w", encoding="utf-8") as f:
            f.write(text)
    for err in (Terminal(), io.StringIO()):
        monkeypatch.setattr("sys.stderr", err)
        align.main(["sentences", "--ckpt", ckpts["bi"], "--test-src", f"{pairs}.en", "--test-tgt", f"{pairs}.fr"])
        drawn = "encode en" in err.getvalue() and "encode fr" in err.getvalue()
        assert drawn if isinstance(err, Terminal) else err.getvalue() == ""


def test_train_pairs_that_are_test_pairs_are_left_out_of_the_fit(ckpts, toy_world, tmp_path, capsys):
    """Issue 37: MUSE's full dictionary holds its test pairs, a toy text can repeat a Tatoeba pair: such train pairs
    are left out of the fit with a note (a train set with nothing else is refused); --allow-overlap keeps them."""
    toy = ["--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"], "--max-sents", "200"]
    full = align.read_muse_dictionary(str(toy_world / "dict/en-fr.txt"))
    tested = {s for s, _ in align.read_muse_dictionary(str(toy_world / "dict/en-fr.test.txt"))}
    rows, out = run_cli(["words"] + toy + ["--train-dict", str(toy_world / "dict/en-fr.txt")], capsys)
    n_out = sum(s in tested for s, _ in full)
    assert f"note: {n_out} of the {len(full)} pairs of --train-dict {toy_world}/dict/en-fr.txt share a source" in out
    kept, _ = run_cli(["words"] + toy + ["--train-dict", str(toy_world / "dict/en-fr.txt"), "--allow-overlap"], capsys)
    assert rows[1][3] < kept[1][3]
    tat = {l: (toy_world / f"tatoeba/tatoeba.fr-en.{l}").read_text().splitlines()[:50] for l in ("en", "fr")}
    par = {l: (toy_world / f"parallel/en-fr.train.{l}").read_text().splitlines()[:30] for l in ("en", "fr")}
    for l in ("en", "fr"):
        (tmp_path / f"train.{l}").write_text("\n".join(tat[l][:10] + par[l]) + "\n")
    train = ["--train-src", str(tmp_path / "train.en"), "--train-tgt", str(tmp_path / "train.fr")]
    rows, out = run_cli(["sentences"] + toy[:-2] + ["--max-sents", "50"] + train, capsys)
    assert "note: 10 of the 40 pairs of --train-src/--train-tgt" in out and "maps fitted on 30 pairs" in out
    # issue 49: in a toy world's own files the overlap is the generator's repetition of short sentences
    world = tmp_path / "world"
    for l in ("en", "fr"):
        for name, text in ((f"tatoeba/tatoeba.fr-en.{l}", tat[l]), (f"parallel/en-fr.train.{l}", tat[l][:10] + par[l])):
            (world / name).parent.mkdir(parents=True, exist_ok=True)
            (world / name).write_text("\n".join(text) + "\n")
    (world / "world.json").write_text("{}\n")  # a whole world (toydata.py writes it last)
    rows, out = run_cli(["sentences", "--toy", "--data", str(world), "--ckpt", ckpts["bi"], "--max-sents", "50"], capsys)
    assert ("note: 10 of the 40 training pairs repeat a test pair (the toy generator repeats short sentences): left "
            "out of the fit" in out and "maps fitted on 30 pairs" in out)


def test_sentences_say_percent_chance_and_what_unmapped_columns_mean(ckpts, toy_world, capsys):
    """Issue 38: P@1 in % beside the chance level; two models without a parallel corpus get a note."""
    files = ["--test-src", str(toy_world / "tatoeba/tatoeba.fr-en.en"), "--test-tgt",
             str(toy_world / "tatoeba/tatoeba.fr-en.fr"), "--max-sents", "50"]
    rows, out = run_cli(["sentences", "--ckpt", ckpts["bi"]] + files, capsys)
    assert "P@1 in % (cosine NN; chance 100/50 = 2%) on 50 pairs" in out and "note:" not in out
    rows, out = run_cli(["sentences", "--ckpt", ckpts["bi"], "--ckpt2", ckpts["fr"]] + files, capsys)
    assert "note: the columns are without a map" in out and "--train-src/--train-tgt (a parallel corpus)" in out


def test_maps_record_and_check_their_checkpoints(ckpts, toy_world, tmp_path, capsys):
    """Issue 37: the .npz names the checkpoints (sha256 of the files) that encoded each side; load_map checks it."""
    import model as M
    maps = str(tmp_path / "maps.npz")
    run_cli(["contextual", "--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"], "--max-sents", "60",
             "--save-maps", maps], capsys)
    bi = M.file_digest(ckpts["bi"])
    assert bi.startswith("sha256:") and len(bi) == 23
    with np.load(maps) as z:
        assert str(z["src_ckpt_digest"]) == str(z["tgt_ckpt_digest"]) == bi
    W = align.load_map(maps, "fr", "en", 1, digests=bi)
    np.testing.assert_allclose(W, align.load_map(maps, "en", "fr", 1, digests=[bi, bi]).T)
    fr = M.file_digest(ckpts["fr"])
    with pytest.raises(align.InputError, match=f"maps fitted on the checkpoints \\['{bi}', '{bi}'\\], not \\['{fr}'"):
        align.load_map(maps, "fr", "en", 1, digests=fr)
    align.save_maps(tmp_path / "mixed.npz", [np.eye(2)], "en", "fr", [bi, fr])  # read the other way: swapped
    assert align.load_map(str(tmp_path / "mixed.npz"), "fr", "en", 0, digests=[fr, bi]).shape == (2, 2)
    np.savez(tmp_path / "old.npz", src_to_tgt=np.eye(2)[None], tgt_to_src=np.eye(2)[None], src="en", tgt="fr")
    with pytest.raises(align.InputError, match="written without checkpoint digests"):
        align.load_map(str(tmp_path / "old.npz"), "en", "fr", 0, digests=bi)
    assert align.load_map(str(tmp_path / "old.npz"), "en", "fr", 0).shape == (2, 2)  # nothing asked, nothing checked


def test_two_models_of_different_depths_are_refused_before_any_work(ckpts, toy_world, tmp_path):
    """Issue 48: a --ckpt2 with another number of layers is one line before any encoding (its layers were paired
    with the first model's as far as they went, or sentences ended in an IndexError after encoding everything)."""
    import model as M
    m, extra = M.load_model(ckpts["fr"])
    deep = str(tmp_path / "deep.pt")
    M.save_model(deep, M.MLM(M.replace(m.config, n_layers=3)), **extra)
    for command in ("words", "contextual", "sentences"):
        with pytest.raises(SystemExit, match=f"--ckpt .*bi.pt has 2 layers but --ckpt2 .*deep.pt 3: "):
            align.main([command, "--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"], "--ckpt2", deep,
                        "--max-sents", "20"])


def test_train_pairs_that_are_test_pairs_but_for_spaces_or_unicode_form(ckpts, toy_world, tmp_path):
    """Issue 48: a train pair that is a test pair after whitespace is collapsed and Unicode is NFC (a trailing
    space, a decomposed é) is a test pair: a train set of nothing else is refused (it was fitted on)."""
    import unicodedata
    for l in ("en", "fr"):
        tat = (toy_world / f"tatoeba/tatoeba.fr-en.{l}").read_text().splitlines()[:40]
        (tmp_path / f"train.{l}").write_text("".join(unicodedata.normalize("NFD", t) + " \t\n" for t in tat))
    assert "e\u0301" in (tmp_path / "train.fr").read_text()
    with pytest.raises(SystemExit, match="train.en: all its pairs are in --test-src/--test-tgt"):
        align.main(["sentences", "--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"], "--max-sents", "40",
                    "--train-src", str(tmp_path / "train.en"), "--train-tgt", str(tmp_path / "train.fr")])


def test_two_files_of_the_same_weights_are_one_model(ckpts, toy_world, tmp_path):
    """Issue 48: best.pt and checkpoint.pt of one run (other bytes, the same weights) were taken as two models;
    refused in one line before any encoding, as cka.py does."""
    import model as M
    m, extra = M.load_model(ckpts["bi"])
    copy = str(tmp_path / "checkpoint.pt")
    M.save_model(copy, m, **extra, step=7, optimizer={"lr": 1e-3})     # another file, the same weights
    assert M.file_digest(copy) != M.file_digest(ckpts["bi"])
    for command in ("words", "contextual", "sentences"):
        with pytest.raises(SystemExit, match=f"--ckpt2 {copy} holds the same weights as --ckpt .*bi.pt: "):
            align.main([command, "--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"], "--ckpt2", copy,
                        "--max-sents", "20"])


def test_a_note_on_small_fits_and_small_sets(ckpts, toy_world, tmp_path, capsys):
    """Issue 48: a map fitted on fewer pairs than dimensions (16 here), a score on fewer than 50 items: a note after
    the table, kept in --save-maps."""
    toy = ["--toy", "--data", str(toy_world), "--ckpt", ckpts["bi"]]
    rows, out = run_cli(["sentences"] + toy + ["--max-sents", "10"], capsys)
    assert ("note: the map is fitted on 10 pairs in 16 dimensions: underdetermined" in out
            and "note: 10 test pairs scored, fewer than 50: the score means little" in out)
    rows, out = run_cli(["sentences"] + toy + ["--max-sents", "60"], capsys)
    assert "note:" not in out
    for part, n in (("train", 10), ("test", 8)):
        lines = (toy_world / f"dict/en-fr.{part}.txt").read_text().splitlines()[:n]
        (tmp_path / f"{part}.txt").write_text("\n".join(lines) + "\n")
    rows, out = run_cli(["words"] + toy + ["--max-sents", "300", "--train-dict", str(tmp_path / "train.txt"),
                                           "--test-dict", str(tmp_path / "test.txt")], capsys)
    assert "note: L2 (4b): the map is fitted on" in out and "in 16 dimensions: underdetermined" in out
    assert f"note: L2 (4b): {rows[-1][4]} test words scored, fewer than 50" in out
    maps = str(tmp_path / "maps.npz")
    rows, out = run_cli(["contextual"] + toy + ["--max-sents", "30", "--save-maps", maps], capsys)
    line = f"{rows[0][4]} held-out pairs scored, fewer than 50: the score means little"
    assert f"note: {line}" in out and "underdetermined" not in out
    with np.load(maps) as z:
        assert line in z["notes"].tolist()


def test_a_note_on_many_unk_tokens(ckpts, toy_world, tmp_path, capsys):
    """Issue 48: a test side in another script (Cyrillic for a Latin-trained model) is mostly <unk>: a note."""
    cyr = str.maketrans("abdegiklmnoprstuvz", "абдегиклмнопрстувз")
    fr = (toy_world / "tatoeba/tatoeba.fr-en.fr").read_text().translate(cyr)
    (tmp_path / "cyr.fr").write_text(fr)
    files = ["--test-src", str(toy_world / "tatoeba/tatoeba.fr-en.en"), "--test-tgt", str(tmp_path / "cyr.fr")]
    rows, out = run_cli(["sentences", "--ckpt", ckpts["bi"], "--max-sents", "60"] + files, capsys)
    assert "% of the fr test tokens are <unk> (the vocabulary was learned on other text)" in out
    assert "of the en test tokens are <unk>" not in out


def test_a_note_on_a_stalled_checkpoint(ckpts, toy_world, tmp_path, capsys):
    """Issue 48: a checkpoint whose English dev ppl is above its left-bigram count model (best.pt records both)."""
    import model as M
    m, extra = M.load_model(ckpts["bi"])
    stalled = str(tmp_path / "stalled.pt")
    M.save_model(stalled, m, **extra, dev_ppl={"en": 80.0, "fr": 75.0}, count_models={"en": {"left": 20.0}})
    rows, out = run_cli(["sentences", "--toy", "--data", str(toy_world), "--ckpt", stalled, "--max-sents", "60"],
                        capsys)
    assert (f"note: {stalled}: its MLM stalled (en dev ppl 80.00 above the left-bigram count model's 20.0); its "
            "scores measure an unconverged model") in out


def test_a_world_cut_short_is_refused(ckpts, toy_world, tmp_path):
    """Issue 48: a toydata.py world without world.json (written last: the writer was interrupted) is refused."""
    import shutil
    world = tmp_path / "cut"
    shutil.copytree(toy_world, world)
    (world / "world.json").unlink()
    with pytest.raises(SystemExit, match=f"--data {world}: no world.json, not a whole toydata.py world"):
        align.main(["sentences", "--toy", "--data", str(world), "--ckpt", ckpts["bi"], "--max-sents", "20"])
