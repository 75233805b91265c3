"""cka.py: linear CKA (known answer, Gram-form equality, invariances, bad input) and the Fig. 7 CLI.

Run: python -m pytest -q tests/test_cka.py
"""
import sys

import numpy as np
import pytest

import cka


def test_known_answer_from_the_cka_demo():
    """Kornblith et al.'s demo notebook: this seed gives linear CKA 0.55761."""
    np.random.seed(1337)
    X = np.random.randn(100, 10)
    Y = np.random.randn(100, 10) + X
    assert round(cka.linear_cka(X, Y), 5) == 0.55761
    assert abs(cka.linear_cka(X, Y) - cka.linear_cka_gram(X, Y)) < 1e-12


@pytest.mark.parametrize("n, d1, d2", [(50, 5, 7), (200, 30, 3), (8, 20, 40)])  # n < d: Gram branch
def test_feature_form_equals_gram_form(n, d1, d2):
    rng = np.random.default_rng(n + d1)
    X = rng.standard_normal((n, d1)) + 5.0                       # uncentred on purpose
    Y = X[:, :1] * rng.standard_normal((1, d2)) + rng.standard_normal((n, d2))
    assert abs(cka.linear_cka(X, Y) - cka.linear_cka_gram(X, Y)) < 1e-10


def test_properties():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 16))
    Y = X @ rng.standard_normal((16, 16)) + 0.5 * rng.standard_normal((300, 16))
    Q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    assert abs(cka.linear_cka(X, X) - 1) < 1e-12
    base = cka.linear_cka(X, Y)
    assert 0 < base < 1
    assert abs(cka.linear_cka(X @ Q, Y) - base) < 1e-12            # orthogonal transform
    assert abs(cka.linear_cka(3.7 * X, Y) - base) < 1e-12          # isotropic scaling
    assert abs(cka.linear_cka(X + 11.0, Y - 2.0) - base) < 1e-12   # translation (columns are centred)
    A = np.diag(np.linspace(0.05, 20, 16))                          # a general invertible linear map
    assert abs(cka.linear_cka(X @ A, Y) - base) > 1e-3
    assert abs(cka.linear_cka(X, Y) - cka.linear_cka(Y, X)) < 1e-12
    assert cka.linear_cka(X, rng.standard_normal((300, 16))) < 0.15  # unrelated: small
    assert isinstance(base, float)


def test_float32_inputs_are_computed_in_float64():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1000, 8)) + 1e3                       # large offset: float32 centring hurts
    Y = X + rng.standard_normal((1000, 8))
    assert abs(cka.linear_cka(X.astype(np.float32), Y.astype(np.float32))
               - cka.linear_cka(X.astype(np.float32).astype(np.float64),
                                Y.astype(np.float32).astype(np.float64))) < 1e-12


@pytest.mark.parametrize("X, Y, msg", [
    (np.ones((5, 2)), np.ones((6, 2)), "5 rows but Y has 6"),
    (np.array([[1., 2.], [np.nan, 1.]]), np.ones((2, 2)), "X contains NaN"),
    (np.ones(5), np.ones((5, 2)), "2-D"),
    (np.ones((5, 2)), np.arange(10.).reshape(5, 2), "X has zero variance"),
])
def test_bad_input(X, Y, msg):
    with pytest.raises(ValueError, match=msg):
        cka.linear_cka(X, Y)


# ----------------------------------------------------------------------------------------------------
# the Fig. 7 CLI on tiny random-init checkpoints (no pretrain.py needed)

torch = pytest.importorskip("torch")


def test_cli_table_bilingual_monolingual_random(toy_world, tmp_path, capsys, monkeypatch):
    import bpe
    import model as M
    torch.set_num_threads(1)
    mono = lambda l: str(toy_world / f"mono/{l}.train.txt")
    paths = {}
    for name, files in (("bi", {"en": mono("en"), "fr": mono("fr")}), ("fr", {"fr": mono("fr")})):
        tok = bpe.Tokenizer.build(files, num_merges=200, verbose=False)
        torch.manual_seed(len(name))
        cfg = M.ModelConfig(vocab_size=tok.vocab_size(tok.langs[0]), n_langs=len(files), n_layers=2,
                            n_heads=2, dim=16, ffn_dim=32, max_positions=64)
        paths[name] = str(tmp_path / f"{name}.pt")
        M.save_model(paths[name], M.MLM(cfg), tokenizer=tok.to_dict(), langs=list(files))
    args = cka.build_parser().parse_args(["--toy", "--data", str(toy_world), "--ckpt", paths["bi"],
                                          "--ckpt2", paths["fr"],
                                          "--max-sents", "50", "--seed", "7"])
    header, rows = cka.cka_table(args)
    out = capsys.readouterr().out
    assert header == ["layer", "bilingual", "monolingual", "random"]
    assert [r[0] for r in rows] == ["L0", "L1", "L2", "avg"] and "| avg |" in out
    for c in range(1, 4):
        assert all(0 < r[c] <= 1 for r in rows)
        assert abs(rows[-1][c] - np.mean([r[c] for r in rows[:-1]])) < 1e-12
    # the random baseline is its own untrained model: it differs from both trained(-like) columns
    assert all(abs(r[3] - r[1]) > 1e-6 and abs(r[3] - r[2]) > 1e-6 for r in rows[:-1])
    # the bilingual column equals CKA computed by hand from the shared sentence vectors
    mdl, extra = M.load_model(paths["bi"])
    tok, _ = bpe.checkpoint_tokenizer(extra, paths["bi"])
    en, fr = bpe.read_parallel(args.src_file, args.tgt_file, 50)
    Es = M.pool_sentences(mdl, [tok.encode(s, "en") for s in en], 0)
    Et = M.pool_sentences(mdl, [tok.encode(s, "fr") for s in fr], 1)
    assert abs(cka.linear_cka(Es[2], Et[2]) - rows[2][1]) < 1e-9
    # a monolingual French checkpoint alone has no model for fr: clear error
    args = cka.build_parser().parse_args(["--ckpt", paths["fr"], "--src", "fr", "--tgt", "en",
                                          "--src-file", args.tgt_file, "--tgt-file", args.src_file])
    with pytest.raises(ValueError, match="no model for 'en'"):
        cka.cka_table(args)
    # the paper's en-en': two models of one language on one file is a measurement; one model alone is not
    same = ["--src", "fr", "--tgt", "fr", "--src-file", args.src_file, "--tgt-file", args.src_file, "--max-sents", "50"]
    _, rows = cka.cka_table(cka.build_parser().parse_args(["--ckpt", paths["bi"], "--ckpt2", paths["fr"]] + same))
    assert all(0 < r[1] < 1 for r in rows)   # the monolingual column: two different fr models
    with pytest.raises(ValueError, match="both 'fr' in one model"):
        cka.cka_table(cka.build_parser().parse_args(["--ckpt", paths["bi"]] + same))
    # the sentence encoding draws its bars on stderr when it is a terminal (and nothing otherwise, as above)
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr("sys.stderr", Terminal())
    cka.cka_table(cka.build_parser().parse_args(["--ckpt", paths["bi"], "--ckpt2", paths["fr"]] + same))
    assert "encode fr" in sys.stderr.getvalue() and "sent/s" in sys.stderr.getvalue()


def test_one_vector_for_every_sentence_is_one_error_line(toy_world, tiny_ckpt, tmp_path):
    """Identical source lines give every pair the same vector: CKA is undefined (zero variance). That is the input's
    doing, so one `error:` line (model.analysis_run no longer makes every ValueError one: a bug's is a traceback)."""
    fr = (toy_world / "tatoeba/tatoeba.fr-en.fr").read_text().splitlines()[:4]
    en = (toy_world / "tatoeba/tatoeba.fr-en.en").read_text().splitlines()[:1] * 4
    (tmp_path / "same.en").write_text("\n".join(en) + "\n")
    (tmp_path / "four.fr").write_text("\n".join(fr) + "\n")
    argv = ["--ckpt", str(tiny_ckpt), "--src-file", str(tmp_path / "same.en"), "--tgt-file", str(tmp_path / "four.fr"),
            "--batch-size", "1"]  # one sentence per forward pass: the same line, bit for bit the same vector
    with pytest.raises(SystemExit, match=r"^error: linear CKA of \S*same\.en \(X\) and \S*four\.fr \(Y\): X has "
                       r"zero variance \(all rows identical\): CKA is undefined$"):
        cka.main(argv)


def test_plot_is_checked_before_any_work(tmp_path, monkeypatch):
    """--plot without matplotlib (not a requirement) fails at once with how to install it, in cka.py
    and align.py alike; nothing is loaded or encoded first (the checkpoint path does not even exist)."""
    import align
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    world = tmp_path / "w"
    (world / "tatoeba").mkdir(parents=True)
    for side in ("en", "fr"):
        (world / f"tatoeba/tatoeba.fr-en.{side}").write_text("a b\nc d\n")
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        cka.main(["--toy", "--data", str(world), "--ckpt", str(tmp_path / "x.pt"), "--plot", str(tmp_path / "c.png")])
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        align.main(["sentences", "--toy", "--data", str(world), "--ckpt", str(tmp_path / "x.pt"),
                    "--plot", str(tmp_path / "s.png")])
    assert not list(tmp_path.glob("*.png"))


def test_plot_layers_draws_the_float_columns(tmp_path):
    """model.plot_layers: one line per float column (int counts and '-' cells are not drawn)."""
    pytest.importorskip("matplotlib", reason="matplotlib is optional (only --plot needs it)")
    import matplotlib.pyplot as plt
    import model as M
    drawn = {}
    real = plt.Axes.plot
    def spy(ax, *a, **k):
        drawn[k["label"]] = list(a[1])
        return real(ax, *a, **k)
    plt.Axes.plot = spy
    try:
        M.plot_layers(str(tmp_path / "p.png"), "t", ["layer", "a", "n", "b"],
                      [["L0", 0.5, 10, "-"], ["L1", 0.25, 12, 0.75]], "y")
    finally:
        plt.Axes.plot = real
    assert drawn == {"a": [0.5, 0.25], "b": [0.75]}
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG" and not list(tmp_path.glob("*.tmp*"))
    # the --plot check before any work: a writable directory passes and draws nothing
    assert M.check_plot(str(tmp_path / "q.png")) is None and not (tmp_path / "q.png").exists()


def test_plot_path_is_checked_with_or_without_matplotlib(tmp_path, monkeypatch):
    """A --plot path that cannot be written is refused as such, before matplotlib is looked for."""
    import model as M
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a fresh machine: not installed
    with pytest.raises(ValueError, match="no such directory"):
        M.check_plot(str(tmp_path / "no" / "q.png"))
    with pytest.raises(ValueError, match="cannot write a file there"):  # a directory where the file would go
        M.check_plot(str(tmp_path))


@pytest.mark.parametrize("flag, value", [("--max-sents", "1"), ("--batch-size", "0"), ("--batch-size", "x")])
def test_bad_counts_are_refused_in_one_line(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        cka.main([flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}: expected one integer in [" in err and repr(value) in err


@pytest.fixture(scope="module")
def pair_ckpts(toy_world, tmp_path_factory):
    """Tiny random-init checkpoints with one en+fr tokenizer: two models of 2 layers, one of 3, and
    the first one's weights again in another file (as best.pt and checkpoint.pt of one run)."""
    import bpe
    import model as M
    mono = lambda l: str(toy_world / f"mono/{l}.train.txt")
    tok = bpe.Tokenizer.build({"en": mono("en"), "fr": mono("fr")}, num_merges=200, verbose=False)
    d = tmp_path_factory.mktemp("pair_ckpts")
    paths = {}
    for name, n_layers, seed in (("a", 2, 1), ("b", 2, 2), ("deep", 3, 3)):
        torch.manual_seed(seed)
        cfg = M.ModelConfig(vocab_size=tok.vocab_size("en"), n_layers=n_layers, n_heads=2, dim=16,
                            ffn_dim=32, max_positions=64)
        paths[name] = str(d / f"{name}.pt")
        M.save_model(paths[name], M.MLM(cfg), tokenizer=tok.to_dict(), langs=["en", "fr"])
    model, extra = M.load_model(paths["a"])
    paths["a_again"] = str(d / "checkpoint.pt")
    M.save_model(paths["a_again"], model, **extra, step=7)  # other bytes, the same weights
    return paths


def test_ckpt2_with_the_same_weights_in_another_file_is_refused(toy_world, pair_ckpts):
    """Issue 48: --ckpt2 naming another file of the --ckpt model (best.pt and checkpoint.pt) passed
    the file digest and compared a model with itself; the weights tell."""
    argv = ["--toy", "--data", str(toy_world), "--ckpt", pair_ckpts["a"], "--max-sents", "20"]
    with pytest.raises(SystemExit, match=r"^error: --ckpt2 \S*checkpoint\.pt holds the same weights "
                       r"as --ckpt \S*a\.pt"):
        cka.main(argv + ["--ckpt2", pair_ckpts["a_again"]])


def test_models_of_different_depths_are_refused(toy_world, pair_ckpts):
    """Issue 48: layer i of one model against layer i of the other needs as many layers (a 3-layer
    --ckpt2 was paired by index with the first 3 of 4 rows, a shallower one was an IndexError)."""
    argv = ["--toy", "--data", str(toy_world), "--max-sents", "20"]
    for first, second, n in (("a", "deep", (2, 3)), ("deep", "a", (3, 2))):
        with pytest.raises(SystemExit, match=rf"^error: --ckpt \S*{first}\.pt has {n[0]} layers but "
                           rf"--ckpt2 \S*{second}\.pt {n[1]}"):
            cka.main(argv + ["--ckpt", pair_ckpts[first], "--ckpt2", pair_ckpts[second]])


def test_one_language_on_both_sides_has_no_bilingual_column(toy_world, pair_ckpts, capsys):
    """Issue 48: with --src fr --tgt fr and two models the "bilingual" column encoded one text with
    one model on both sides (1.000 everywhere); it is left out, with a note."""
    fr = str(toy_world / "tatoeba/tatoeba.fr-en.fr")
    header, rows = cka.main(["--ckpt", pair_ckpts["a"], "--ckpt2", pair_ckpts["b"], "--src", "fr",
                             "--tgt", "fr", "--src-file", fr, "--tgt-file", fr, "--max-sents", "20"])
    assert header == ["layer", "monolingual", "random"]
    assert all(0 < r[1] < 1 for r in rows)
    assert "no bilingual column" in capsys.readouterr().out


def test_a_stalled_checkpoint_gets_a_note_naming_it(toy_world, pair_ckpts, tmp_path, capsys):
    """Issue 48: a checkpoint whose MLM stalled (its English dev ppl above the left-bigram count
    model that pretrain.py stores in best.pt) is named under the table; a converged one is not."""
    import model as M
    model, extra = M.load_model(pair_ckpts["b"])
    counts = {"en": {"unigram": 150.0, "left": 20.0, "both": 12.0}}
    stalled = str(tmp_path / "stalled.pt")
    M.save_model(stalled, model, **extra, dev_ppl={"en": 140.5, "fr": 150.0}, count_models=counts)
    converged = str(tmp_path / "converged.pt")
    M.save_model(converged, model, **extra, dev_ppl={"en": 9.5, "fr": 9.9}, count_models=counts)
    argv = ["--toy", "--data", str(toy_world), "--ckpt", pair_ckpts["a"], "--max-sents", "60"]
    cka.main(argv + ["--ckpt2", stalled])
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "stalled" in line]
    assert notes == [f"note: {stalled}: its MLM stalled (en dev ppl 140.50 above the left-bigram "
                     "count model's 20.0); its scores measure an unconverged model"]
    assert out.index("| avg |") < out.index(notes[0])  # under the table
    cka.main(argv + ["--ckpt2", converged])
    assert "stalled" not in capsys.readouterr().out


def test_many_unk_tokens_get_a_note_with_the_rate_and_the_language(toy_world, pair_ckpts,
                                                                   tmp_path, capsys):
    """Issue 48: a side in another script (Cyrillic for a Latin-trained tokenizer) is mostly <unk>:
    a note gives the rate and the language; the toy text itself has none."""
    en = toy_world / "tatoeba/tatoeba.fr-en.en"
    fr = (toy_world / "tatoeba/tatoeba.fr-en.fr").read_text().splitlines()
    cyrillic = tmp_path / "ru.txt"
    cyrillic.write_text("".join(f"{line} Вчера в Москве шёл снег\n" for line in fr))
    argv = ["--ckpt", pair_ckpts["a"], "--src-file", str(en), "--max-sents", "60"]
    cka.main(argv + ["--tgt-file", str(cyrillic)])
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "<unk>" in line]
    assert len(notes) == 1, out
    rate = float(notes[0].split()[1])
    assert 5 < rate < 100
    assert notes[0] == (f"note: {rate:.1f} % of the fr tokens are <unk> ({pair_ckpts['a']}'s "
                        "vocabulary was learned on other text); the CKA means little")
    cka.main(argv + ["--tgt-file", str(toy_world / "tatoeba/tatoeba.fr-en.fr")])
    assert "<unk>" not in capsys.readouterr().out


def test_fewer_than_50_sentences_get_a_note(toy_world, pair_ckpts, capsys):
    """Issue 48: the CKA of a handful of points means little: under 50 pairs, a note says so."""
    argv = ["--toy", "--data", str(toy_world), "--ckpt", pair_ckpts["a"], "--ckpt2",
            pair_ckpts["b"], "--max-sents"]
    cka.main(argv + ["49"])
    out = capsys.readouterr().out
    assert "note: 49 sentence pairs: the CKA of fewer than 50 points means little" in out
    assert out.index("| avg |") < out.index("note: 49 sentence pairs")
    cka.main(argv + ["50"])
    assert "sentence pairs: the CKA" not in capsys.readouterr().out


def test_the_notes_are_kept_in_the_figure(toy_world, pair_ckpts, tmp_path, monkeypatch):
    """The --plot figure carries the notes printed under the table (under its title)."""
    import model as M
    drawn = []
    monkeypatch.setattr(M, "check_plot", lambda path: None)  # matplotlib is not a requirement
    monkeypatch.setattr(M, "plot_layers", lambda path, title, *rest: drawn.append(title))
    argv = ["--toy", "--data", str(toy_world), "--ckpt", pair_ckpts["a"], "--ckpt2",
            pair_ckpts["b"], "--plot", str(tmp_path / "c.png"), "--max-sents"]
    cka.main(argv + ["20"])
    cka.main(argv + ["50"])
    assert drawn == ["Linear CKA en-fr per layer\nnote: 20 sentence pairs: the CKA of fewer than 50 "
                     "points means little", "Linear CKA en-fr per layer"]
