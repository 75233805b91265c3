"""The official distributions as unpacked (README "Real data"): every format is written here by the test itself, read
to exactly the examples of the equivalent simple-format file, and a wrong file is answered with file:line."""
import glob
import json
import os
import re
import shutil

import pytest

import bpe
import finetune as ft

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
needs_data = pytest.mark.skipif(not os.path.isdir(DATA), reason="../shared/data not present")

BOM = "\ufeff"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


# -----------------------------------------------------------------------------
# a UTF-8 byte order mark is stripped once, by the reader (failing-first: it used to stay on the first line)

def test_bom_is_stripped_by_read_lines(tmp_path):
    p = write(tmp_path / "a.txt", BOM + "Hello world\n" + BOM + "keeps a second one\n")
    assert list(bpe.read_lines(p)) == ["Hello world", BOM + "keeps a second one"]  # only the file's first bytes


def test_bom_never_becomes_a_vocabulary_token(tmp_path):
    files = {lang: write(tmp_path / f"{lang}.txt", BOM + "the cat sat on the mat\nthe dog sat\n" * 3)
             for lang in ("en", "fr")}
    tok = bpe.Tokenizer.build(files, num_merges=20, verbose=False)
    assert not any(BOM in t for lang in tok.langs for t in tok.vocabs[lang].tokens)


def test_conllu_with_bom_reads(tmp_path):
    text = "# sent_id = 1\n1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n2\t!\t!\tPUNCT\t_\t_\t1\tpunct\t_\t_\n\n"
    with_bom, without = write(tmp_path / "bom.conllu", BOM + text), write(tmp_path / "a.conllu", text)
    assert ft.read_conllu(with_bom) == ft.read_conllu(without)


# -----------------------------------------------------------------------------
# model.flops_per_token: the cost table's FLOPs, checked against torch's own count of a training step

@pytest.mark.parametrize("sep", ["", "emb,1"])
def test_flops_per_token_equals_torch_flop_counter(sep):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    import model as M
    extra = M.parse_sep(sep, 2) | ({"vocab_sizes": (100, 90)} if sep else {})
    c = M.ModelConfig(vocab_size=100, n_layers=2, dim=32, n_heads=2, ffn_dim=64, **extra)
    m = M.MLM(c)
    B, T = 4, 20
    idx = torch.randint(14, 90, (B, T))
    targets = torch.full((B, T), -1)
    targets[:, :5] = idx[:, :5]  # a quarter of the positions are targets
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # MATH: attention as matmuls
        m(idx, 1, targets)[1].backward()
    assert counter.get_total_flops() == B * T * M.flops_per_token(c, T, target_frac=0.25, lang=1)


# -----------------------------------------------------------------------------
# the official trees, written from examples; the same examples in the simple (toydata.py) layout beside them

XNLI_1_0_COLUMNS = ("language gold_label sentence1_binary_parse sentence2_binary_parse sentence1_parse sentence2_parse "
                    "sentence1 sentence2 promptID pairID genre label1 label2 label3 label4 label5 sentence1_tokenized "
                    "sentence2_tokenized match").split()
TREEBANKS = {"en": "UD_English-EWT/en_ewt", "fr": "UD_French-GSD/fr_gsd"}


def xnli_1_0_row(lang, premise, hypothesis, label, k):
    cells = dict(language=lang, gold_label=label, sentence1=premise, sentence2=hypothesis, promptID=str(k // 3),
                 pairID=str(k), genre="fiction", label1=label, match="True")
    return "\t".join(cells.get(c, "( x )") for c in XNLI_1_0_COLUMNS) + "\n"


def tagged_text(sentences, prefix=""):
    return "".join("".join(f"{prefix}{w}\t{t}\n" for w, t in zip(*s)) + "\n" for s in sentences)


def conllu_text(sentences):
    return "".join("".join(f"{i}\t{w}\t_\t_\t_\t_\t{h}\t{r}\t_\t_\n" for i, (w, h, r) in
                           enumerate(zip(s["words"], s["heads"], s["rels"]), 1)) + "\n" for s in sentences)


def cut_examples(world, n):
    """{(task, lang, split): the first n examples} of a toydata.py world (en: train, dev, test; fr: dev, test)."""
    readers = {"xnli": ("xnli", "tsv", ft.read_xnli), "ner": ("ner", "tsv", ft.read_ner),
               "parse": ("ud", "conllu", ft.read_conllu)}
    return {(task, lang, split): reader(str(world / d / f"{lang}.{split}.{ext}"))[:n]
            for task, (d, ext, reader) in readers.items()
            for lang, splits in (("en", ("train", "dev", "test")), ("fr", ("dev", "test"))) for split in splits}


def write_simple(ex, root):
    """The toydata.py layout (xnli/{lang}.{split}.tsv, ner/..., ud/{lang}.{split}.conllu)."""
    for (task, lang, split), e in ex.items():
        if task == "xnli":
            write(root / "xnli" / f"{lang}.{split}.tsv", "".join(f"{p}\t{h}\t{y}\n" for p, h, y in e))
        elif task == "ner":
            write(root / "ner" / f"{lang}.{split}.tsv", tagged_text(e))
        else:
            write(root / "ud" / f"{lang}.{split}.conllu", conllu_text(e))
    return root


def write_official(ex, root):
    """The official distributions as unpacked: XNLI 1.0 (all languages in one file per split, a German row to be
    skipped), XNLI-MT 1.0's English train, raw PAN-X, UD 2.3 (a UD_French-FTB beside the paper's French-GSD, a BOM
    in one file)."""
    for split in ("dev", "test"):
        rows = [(lang, *x) for lang in ("en", "fr") for x in ex["xnli", lang, split]]
        rows.insert(1, ("de", "Ein Satz.", "Noch einer.", "neutral"))
        write(root / "XNLI-1.0" / f"xnli.{split}.tsv", "\t".join(XNLI_1_0_COLUMNS) + "\n"
              + "".join(xnli_1_0_row(*r, k) for k, r in enumerate(rows)))
    write(root / "XNLI-MT-1.0/multinli/multinli.train.en.tsv", "premise\thypo\tlabel\n" + "".join(
        f"{p}\t{h}\t{'contradictory' if y == 'contradiction' else y}\n" for p, h, y in ex["xnli", "en", "train"]))
    for (task, lang, split), e in ex.items():
        if task == "ner":
            write(root / "panx_dataset" / lang / split, tagged_text(e, prefix=f"{lang}:"))
        elif task == "parse":
            bom = BOM * (lang == "fr" and split == "test")
            write(root / "ud-treebanks-v2.3" / f"{TREEBANKS[lang]}-ud-{split}.conllu", bom + conllu_text(e))
            write(root / "ud-treebanks-v2.3" / f"UD_French-FTB/fr_ftb-ud-{split}.conllu", conllu_text(e[:1]))
    return root


@pytest.fixture(scope="module")
def trees(toy_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("trees")
    ex = cut_examples(toy_world, 24)
    return ex, write_simple(ex, root / "simple"), write_official(ex, root / "official")


def read_all(task, data, **kw):
    files = ft.resolve_files(task, str(data), "en", ["fr"], **kw)
    return files, {"train": ft.read_split(task, files["train"], "en"), "dev": ft.read_split(task, files["dev"], "en"),
                   "test": ft.read_split(task, files["test"]["fr"], "fr")}


@pytest.mark.parametrize("task", ["xnli", "ner", "parse"])
def test_official_tree_reads_to_the_simple_examples(trees, task):
    ex, simple, official = trees
    files, got = read_all(task, official)
    assert got == read_all(task, simple)[1] == {s: ex[task, "en" if s != "test" else "fr", s] for s in got}
    names = {"xnli": ("XNLI-MT-1.0/multinli/multinli.train.en.tsv", "XNLI-1.0/xnli.dev.tsv", "XNLI-1.0/xnli.test.tsv"),
             "ner": ("panx_dataset/en/train", "panx_dataset/en/dev", "panx_dataset/fr/test"),
             "parse": ("UD_English-EWT/en_ewt-ud-train.conllu", "UD_English-EWT/en_ewt-ud-dev.conllu",
                       "UD_French-GSD/fr_gsd-ud-test.conllu")}[task]  # the paper's French treebank, not FTB
    assert [files["train"], files["dev"], files["test"]["fr"]] == [os.path.join(official, "ud-treebanks-v2.3", n)
                                                                   if task == "parse" else os.path.join(official, n)
                                                                   for n in names]


def test_treebank_flag_picks_another_treebank_of_the_language(trees):
    ex, _, official = trees
    files, got = read_all("parse", official, treebanks={"fr": "FTB"})
    assert files["test"]["fr"].endswith("UD_French-FTB/fr_ftb-ud-test.conllu")
    assert got["test"] == ex["parse", "fr", "test"][:1]
    with pytest.raises(bpe.InputError, match=r"--treebank fr=Sequoia: no such treebank for fr under --data .* "
                                         r"\(found FTB, GSD\)"):
        read_all("parse", official, treebanks={"fr": "Sequoia"})


def test_a_language_with_several_treebanks_and_no_default_is_refused(tmp_path):
    for tb in ("GSD", "HDT"):
        for split in ("train", "dev", "test"):
            write(tmp_path / f"ud-treebanks-v2.3/UD_German-{tb}/de_{tb.lower()}-ud-{split}.conllu", "")
    with pytest.raises(bpe.InputError, match="several UD treebanks for de under --data .*: GSD, HDT; pick one with "
                                         "--treebank de=NAME"):
        ft.resolve_files("parse", str(tmp_path), "de", [])
    files = ft.resolve_files("parse", str(tmp_path), "de", [], treebanks={"de": "HDT"})
    assert files["dev"].endswith("UD_German-HDT/de_hdt-ud-dev.conllu")


def test_xtreme_panx_multinli_and_a_train_file_by_its_name(trees, tmp_path):
    ex, _, official = trees
    sents = ex["ner", "fr", "dev"]
    p = write(tmp_path / "panx" / "dev-fr.tsv", tagged_text(sents))  # XTREME: the prefix already stripped
    assert ft.read_split("ner", p, "fr") == sents
    pairs = ex["xnli", "en", "train"]
    rows = [dict(gold_label=y, sentence1=a, sentence2=b, pairID=str(k)) for k, (a, b, y) in enumerate(pairs)]
    rows.insert(2, dict(gold_label="-", sentence1="No majority.", sentence2="Skipped.", pairID="x"))
    jsonl = write(tmp_path / "multinli_1.0" / "multinli_1.0_train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert ft.read_split("xnli", jsonl, "en") == pairs
    shutil.copytree(os.path.join(official, "XNLI-1.0"), tmp_path / "XNLI-1.0")  # dev and test
    assert ft.resolve_files("xnli", str(tmp_path), "en", [])["train"] == jsonl  # found under --data by its name
    mt = os.path.join(official, "XNLI-MT-1.0/multinli/multinli.train.en.tsv")
    assert ft.read_split("xnli", str(mt), "en") == pairs  # --train-file: the format by the file's name


BAD = [  # (file under --data, its text, the task, the language, the message after "path:")
    ("XNLI-1.0/xnli.dev.tsv", "A.\tB.\tneutral\n", "xnli", "en", "1: expected the XNLI 1.0 header"),
    ("XNLI-1.0/xnli.test.tsv", "\t".join(XNLI_1_0_COLUMNS) + "\n" + xnli_1_0_row("en", "A.", "B.", "neutral", 0)
     + xnli_1_0_row("en", "C.", "D.", "", 1), "xnli", "en", "3: no label (column gold_label is empty)"),
    ("XNLI-1.0/xnli.test.tsv", "\t".join(XNLI_1_0_COLUMNS) + "\n" + xnli_1_0_row("en", "A.", "B.", "neutral", 0),
     "xnli", "ru", " no rows of language 'ru'"),
    ("XNLI-MT-1.0/multinli/multinli.train.en.tsv", "A.\tB.\tneutral\n", "xnli", "en",
     "1: expected the XNLI-MT header premise<TAB>hypo<TAB>label"),
    ("multinli_1.0/multinli_1.0_train.jsonl", '{"gold_label": "neutral", "sentence1": "A", "sentence2": "B"}\nA\tB\n',
     "xnli", "en", "2: expected a JSON object"),
    ("panx_dataset/fr/test", "fr:Paris\tB-LOC\n\nen:London\tB-LOC\n", "ner", "fr",
     "3: PAN-X prefix 'en:' is not this file's language 'fr'"),
    ("panx_dataset/en/train", "Paris\tB-LOC\n", "ner", "en", "1: expected lang:token<TAB>tag (raw PAN-X)"),
    ("ner/en.train.tsv", "\nen:Paris\tB-LOC\nen:is\tO\n", "ner", "en", "2: every token starts with 'en:': raw PAN-X"),
    ("panx/train-en.tsv", "en:Paris\tB-LOC\n", "ner", "en", "1: every token starts with 'en:': raw PAN-X"),
    ("ud-treebanks-v2.3/UD_English-EWT/en_ewt-ud-train.conllu", "Paris\tB-LOC\n", "parse", "en",
     "1: expected 10 tab-separated CoNLL-U columns, got 2"),
]


@pytest.mark.parametrize("name, text, task, lang, message", BAD, ids=[b[0] for b in BAD])
def test_a_wrong_file_in_a_known_layout_is_named_with_its_line(tmp_path, name, text, task, lang, message):
    path = write(tmp_path / name, text)
    with pytest.raises(ValueError) as e:
        ft.read_split(task, path, lang)
    assert str(e.value).startswith(f"{path}:{message}")


def test_a_missing_split_names_what_was_looked_for(trees, tmp_path):
    _, _, official = trees
    with pytest.raises(bpe.InputError, match=r"ner: no de test file under --data (\S+) \(looked for \1/ner/de.test.tsv, "
                                         r"\1/wikiann_panx/heldout-from-dev-de.tsv, \1/panx_dataset/de/test, "
                                         r"\1/panx/test-de.tsv\)"):
        ft.resolve_files("ner", str(official), "en", ["de"])
    with pytest.raises(bpe.InputError, match=r"xnli: no en train file under --data "):
        ft.resolve_files("xnli", str(tmp_path), "en", [])


@needs_data
@pytest.mark.parametrize("task", ["xnli", "ner", "parse"])
def test_our_evaluation_directory_reads_as_before(task):
    """The old layout of ../shared/data: the same files, read by the simple readers (the paper's zh treebank, GSD)."""
    langs = ["fr", "ru", "zh"]
    want = {"xnli": ("xnli/dev-en.tsv", "xnli/dev-en.tsv", "xnli/test-{}.tsv"),
            "ner": ("wikiann_panx/train-en.tsv", "wikiann_panx/dev-en.tsv", "wikiann_panx/heldout-from-dev-{}.tsv"),
            "parse": ("ud/UD_English-EWT/en_ewt-ud-train.first3000.conllu", "ud/UD_English-EWT/en_ewt-ud-dev.conllu",
                      "ud/UD_{}-GSD/{}_gsd-ud-test.conllu")}[task]
    names = {"fr": "French", "ru": "Russian", "zh": "Chinese"}
    train_file = os.path.join(DATA, want[0]) if task == "xnli" else None  # no NLI train set there
    files = ft.resolve_files(task, DATA, "en", langs, train_file=train_file)
    expect = {"train": want[0], "dev": want[1]} | {
        lang: want[2].format(*((names[lang], lang) if task == "parse" else (lang,))) for lang in langs}
    got = {"train": files["train"], "dev": files["dev"]} | files["test"]
    assert got == {k: os.path.join(DATA, v) for k, v in expect.items()}
    simple = ft.LAYOUTS[task][0].reader  # the simple format
    for k, path in got.items():
        assert ft.read_split(task, path, k if k in langs else "en") == simple(path)


# -----------------------------------------------------------------------------
# Wikipedia through WikiExtractor: <doc> lines dropped, titles kept, dev lines held out of a seeded shuffle

def write_wikiextractor(root, lines, per_doc=20, per_file=4):
    """`lines` as WikiExtractor writes them: documents of a title line, an empty line and per_doc text lines,
    per_file documents per file AA/wiki_00, AA/wiki_01, ... -> (root, the titles)."""
    docs = [lines[k:k + per_doc] for k in range(0, len(lines), per_doc)]
    titles = [f"Article {k}" for k in range(len(docs))]
    for f in range(0, len(docs), per_file):
        write(root / "AA" / f"wiki_{f // per_file:02d}", "".join(
            f'<doc id="{k}" url="https://en.wikipedia.org/wiki?curid={k}" title="{titles[k]}">\n{titles[k]}\n\n'
            + "".join(line + "\n" for line in docs[k]) + "</doc>\n" for k in range(f, min(f + per_file, len(docs)))))
    return root, titles


def prepared(out):
    (d,) = [p for p in glob.glob(os.path.join(out, "*")) if os.path.isdir(p)]
    return d


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_wikiextractor_directory_with_held_out_dev(tmp_path):
    text = {lang: [f"{lang} line {k} " + " ".join(["word"] * (k % 5)) for k in range(200)] for lang in ("en", "fr")}
    dirs = {lang: write_wikiextractor(tmp_path / "wiki" / lang, lines)[0] for lang, lines in text.items()}
    lines = list(bpe.read_wikiextractor(str(dirs["en"])))
    assert lines[:2] == ["Article 0", "en line 0 "] and len(lines) == 200 + 10  # titles kept; <doc>, blanks dropped
    spec = ",".join(f"{lang}={d}" for lang, d in dirs.items())
    bpe.main(["prepare", "--train-files", spec, "--merges", "20", "--prep-dir", str(tmp_path / "a")])
    bpe.main(["prepare", "--train-files", spec, "--merges", "20", "--prep-dir", str(tmp_path / "b"), "--seed", "3"])
    a, b = prepared(tmp_path / "a"), prepared(tmp_path / "b")
    train, dev = read(os.path.join(a, "en.train.txt")), read(os.path.join(a, "en.dev.txt"))
    assert len(dev) == 21 and sorted(train + dev) == sorted(lines)  # a tenth held out, nothing lost, never trained on
    assert train != lines[21:] and set(dev) != set(lines[:21])  # shuffled
    assert read(os.path.join(b, "en.dev.txt")) == dev  # the same split whatever --seed
    assert json.loads("\n".join(read(os.path.join(a, "recipe.json"))))["dev_lines"] == bpe.DEV_LINES


def test_shuffle_split_over_several_buckets_is_a_permutation(tmp_path, monkeypatch):
    monkeypatch.setattr(bpe, "SHUFFLE_BUCKET_BYTES", 100)
    lines = [f"line {k}" for k in range(500)]
    assert bpe.shuffle_split(iter(lines), 5000, str(tmp_path / "tmp"), str(tmp_path / "t.txt")) == (500, 0)
    out = read(tmp_path / "t.txt")
    assert sorted(out) == sorted(lines) and out != lines and not (tmp_path / "tmp").exists()


@pytest.mark.parametrize("text, message", [
    ("stray text\n", "AA/wiki_00:1: text outside <doc ...> ... </doc> (not WikiExtractor output)"),
    ('<doc id="1">\nTitle\n', "AA/wiki_00:1: <doc> never closed by </doc>"),
    ('<doc id="1">\nA\n<doc id="2">\n', "AA/wiki_00:3: <doc> inside the <doc> of line 1"),
])
def test_a_directory_that_is_not_wikiextractor_output_is_named_with_its_line(tmp_path, capsys, text, message):
    for d in ("w", "w2"):  # two directories: one given for both languages is refused before it is read
        write(tmp_path / d / "AA" / "wiki_00", text)
    with pytest.raises(SystemExit) as e:
        bpe.main(["prepare", "--train-files", f"en={tmp_path / 'w'},fr={tmp_path / 'w2'}", "--prep-dir", str(tmp_path / "p")])
    assert f"{tmp_path / 'w'}/{message}" in str(e.value)


# -----------------------------------------------------------------------------
# end to end on the CPU: WikiExtractor text -> bpe.py prepare -> pretrain.py (the paper's flags, a tiny model) ->
# finetune.py on the official tree, all three tasks -> align.py (MUSE, Tatoeba names) and cka.py

def test_end_to_end_from_the_official_downloads(toy_world, trees, tmp_path, capsys):
    import signal

    import align
    import cka
    import pretrain
    ex, simple, official = trees
    wiki = {lang: write_wikiextractor(tmp_path / "wiki" / lang, read(toy_world / "mono" / f"{lang}.train.txt")[:600])[0]
            for lang in ("en", "fr")}
    bpe.main(["prepare", "--train-files", ",".join(f"{lang}={d}" for lang, d in wiki.items()), "--merges", "300",
              "--prep-dir", str(tmp_path / "prep")])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        pretrain.main(["--data", prepared(tmp_path / "prep"), "--langs", "en,fr", "--out", str(tmp_path / "pt"),
                       "--merges", "300", "--dim", "32", "--n-layers", "2", "--n-heads", "2", "--ffn-dim", "64", "--bptt", "32",
                       "--batch-size", "8", "--max-steps", "20", "--warmup", "5", "--lr", "3e-3", "--device", "cpu",
                       "--threads", "1"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    ckpt = str(tmp_path / "pt" / "best.pt")
    grid = ["--epochs", "1", "--epoch-size", "0", "--batch-size", "8", "--lr", "1e-3", "--threads", "1", "--device", "cpu", "--eval-langs", "fr"]
    capsys.readouterr()
    for task in ("xnli", "ner", "parse"):
        ft.main(["--task", task, "--ckpt", ckpt, "--data", str(official), "--out", str(tmp_path / task)] + grid
                + ["--head-lr", "1e-3"] * (task == "xnli"))  # XNLI's grid only
    printed = capsys.readouterr().out
    for line in ("xnli: en train 24 from", "XNLI-MT-1.0/multinli/multinli.train.en.tsv", "xnli: fr test 24 from",
                 "ner: fr test 24 from", "panx_dataset/fr/test", "parse: fr test 24 from",
                 "UD_French-GSD/fr_gsd-ud-test.conllu"):
        assert line in printed
    ft.main(["--task", "ner", "--ckpt", ckpt, "--data", str(simple), "--out", str(tmp_path / "ner-simple")] + grid)
    scores = [json.loads("\n".join(read(tmp_path / d / "results.json")))["test"] for d in ("ner", "ner-simple")]
    assert scores[0] == scores[1]  # the same examples, the same scores

    muse, tatoeba = tmp_path / "dictionaries", tmp_path / "tatoeba"
    tatoeba.mkdir()
    for name, src in (("en-fr.0-5000.txt", "en-fr.train.txt"), ("en-fr.5000-6500.txt", "en-fr.test.txt")):
        write(muse / name, "\n".join(read(toy_world / "dict" / src)) + "\n")
    for new, old in (("fra", "fr"), ("eng", "en")):
        shutil.copy(toy_world / "tatoeba" / f"tatoeba.fr-en.{old}", tatoeba / f"tatoeba.fra-eng.{new}")
    common = ["--ckpt", ckpt, "--src", "en", "--tgt", "fr", "--device", "cpu", "--max-sents", "60"]
    align.main(["words"] + common + ["--train-dict", str(muse / "en-fr.0-5000.txt"),
                                     "--test-dict", str(muse / "en-fr.5000-6500.txt"),
                                     "--src-corpus", str(wiki["en"] / "AA" / "wiki_00"),
                                     "--tgt-corpus", str(wiki["fr"] / "AA" / "wiki_00")])
    align.main(["sentences"] + common + ["--test-src", str(tatoeba / "tatoeba.fra-eng.eng"),
                                         "--test-tgt", str(tatoeba / "tatoeba.fra-eng.fra")])
    cka.main(common + ["--src-file", str(tatoeba / "tatoeba.fra-eng.eng"),
                       "--tgt-file", str(tatoeba / "tatoeba.fra-eng.fra")])
    printed = capsys.readouterr().out
    assert "P@1" in printed and "CKA" in printed


def test_treebank_flag_mistakes_are_one_line(trees, tmp_path):
    ex, simple, official = trees
    base = ["--ckpt", str(tmp_path / "none.pt"), "--data", str(official), "--out", str(tmp_path / "o")]
    for flags, message in [(["--task", "ner", "--treebank", "fr=FTB"], "--treebank picks UD treebanks: it needs --task "
                                                                        "parse"),
                           (["--task", "parse", "--treebank", "fr"], "--treebank fr: expected LANG=NAME,..."),
                           (["--task", "parse", "--treebank", "fr=FTB,fr=GSD"], "(each language once)")]:
        with pytest.raises(SystemExit, match=re.escape(message)):
            ft.main(base + flags)
    with pytest.raises(bpe.InputError, match="--treebank: ru is not the train language or one of --eval-langs"):
        ft.resolve_files("parse", str(official), "en", ["fr"], treebanks={"ru": "GSD"})
    with pytest.raises(bpe.InputError, match=r"--treebank fr=GSD: the fr test file under --data is not in a UD release "
                                         r"tree \(ud/fr.test.conllu\)"):
        ft.resolve_files("parse", str(simple), "en", ["fr"], treebanks={"fr": "GSD"})


def test_code_switching_reads_wikiextractor_directories(toy_world, tmp_path, capsys):
    """--code-switch checks its dictionary against the text, and a WikiExtractor directory is text too: it is
    read as prepare reads it (a traceback reading the directory as a file before)."""
    wiki = {lang: write_wikiextractor(tmp_path / "wiki" / lang, read(toy_world / "mono" / f"{lang}.train.txt")[:400])[0]
            for lang in ("en", "fr")}
    bpe.main(["prepare", "--train-files", ",".join(f"{lang}={d}" for lang, d in wiki.items()), "--merges", "50",
              "--code-switch", str(toy_world / "dict" / "en-fr.txt"), "--prep-dir", str(tmp_path / "p")])
    out = capsys.readouterr().out
    assert "code-switching dictionary" in out and "code-switching en:" in out
