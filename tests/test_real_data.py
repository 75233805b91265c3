"""The official distributions as unpacked (README "Real data"): every format is written here by the test itself, read
to exactly the examples of the equivalent simple-format file, and a wrong file is answered with file:line."""
import glob
import json
import os
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
    assert ft.read_conllu(write(tmp_path / "bom.conllu", BOM + text)) == ft.read_conllu(write(tmp_path / "a.conllu", text))


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
    assert files["test"]["fr"].endswith("UD_French-FTB/fr_ftb-ud-test.conllu") and got["test"] == ex["parse", "fr", "test"][:1]
    with pytest.raises(SystemExit, match=r"--treebank fr=Sequoia: no such treebank for fr under --data .* \(found FTB, GSD\)"):
        read_all("parse", official, treebanks={"fr": "Sequoia"})


def test_a_language_with_several_treebanks_and_no_default_is_refused(tmp_path):
    for tb in ("GSD", "HDT"):
        for split in ("train", "dev", "test"):
            write(tmp_path / f"ud-treebanks-v2.3/UD_German-{tb}/de_{tb.lower()}-ud-{split}.conllu", "")
    with pytest.raises(SystemExit, match="several UD treebanks for de under --data .*: GSD, HDT; pick one with "
                                         "--treebank de=NAME"):
        ft.resolve_files("parse", str(tmp_path), "de", [])
    assert ft.resolve_files("parse", str(tmp_path), "de", [], treebanks={"de": "HDT"})["dev"].endswith("de_hdt-ud-dev.conllu")


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
    with pytest.raises(SystemExit, match=r"error: ner: no de test file under --data .*: looked for ner/de.test.tsv, "
                                         r"wikiann_panx/heldout-from-dev-de.tsv, panx_dataset/de/test, panx/test-de.tsv"):
        ft.resolve_files("ner", str(official), "en", ["de"])
    with pytest.raises(SystemExit, match=r"xnli: no en train file under --data .* \(pass --train-file\)"):
        ft.resolve_files("xnli", str(tmp_path), "en", [])
