"""Tests for toydata.py: the synthetic world is deterministic, every file parses, the ground truth is right.

Run: python -m pytest -q tests/test_toydata.py
The format checks here are small hand-written readers (the real ones live in finetune.py).
"""
import collections
import json
import os
import random
import re
import subprocess
import sys

import pytest

import toydata
from conftest import TOY_WORLD_SIZES, is_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPOS = {"NOUN", "PROPN", "VERB", "ADJ", "ADV", "ADP", "DET", "PUNCT"}
DEPRELS = {"root", "nsubj", "obj", "obl", "nmod", "amod", "det", "case", "advmod", "flat", "punct"}
SPLITS = ("train", "dev", "test")


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def read_dict(path):
    """MUSE `src tgt` lines -> list of pairs."""
    pairs = [l.split(" ") for l in lines(path)]
    assert all(len(p) == 2 and all(p) for p in pairs), path
    return pairs


def read_conllu(path):
    """List of (comments, rows) with rows = 10-column lists; checks the block structure on the way."""
    sents, comments, rows = [], [], []
    for k, l in enumerate(lines(path) + [""]):
        if l.startswith("#"):
            comments.append(l)
        elif l == "":
            if rows:
                sents.append((comments, rows))
            comments, rows = [], []
        else:
            cols = l.split("\t")
            assert len(cols) == 10, f"{path}:{k + 1}: {len(cols)} columns"
            rows.append(cols)
    return sents


def read_ner(path):
    text = open(path, encoding="utf-8").read()
    assert text.endswith("\n\n"), "every sentence ends with a blank line"
    sents = []
    for block in text.strip("\n").split("\n\n"):
        pairs = [l.split("\t") for l in block.split("\n")]
        assert all(len(p) == 2 and p[0] and " " not in p[0] for p in pairs), block
        sents.append(pairs)
    return sents


def translate(words, d):
    return [d[w] for w in words]


# -----------------------------------------------------------------------------
# layout, determinism, bad input

def expected_files(l0="en", l1="fr"):
    files = ["world.json", f"dict/{l0}-{l1}.txt", f"dict/{l0}-{l1}.train.txt", f"dict/{l0}-{l1}.test.txt",
             f"parallel/{l0}-{l1}.train.{l0}", f"parallel/{l0}-{l1}.train.{l1}",
             f"tatoeba/tatoeba.{l1}-{l0}.{l1}", f"tatoeba/tatoeba.{l1}-{l0}.{l0}"]
    for lang in (l0, l1):
        for s in SPLITS:
            files += [f"mono/{lang}.{s}.txt", f"ner/{lang}.{s}.tsv", f"ud/{lang}.{s}.conllu", f"xnli/{lang}.{s}.tsv"]
    return sorted(files)


def all_files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def test_layout_and_sizes(toy_world):
    assert all_files(toy_world) == expected_files()
    s = TOY_WORLD_SIZES
    assert len(lines(toy_world / "mono/en.train.txt")) == s["n_train"]
    assert len(lines(toy_world / "mono/fr.dev.txt")) == s["n_dev"]
    assert len(lines(toy_world / "parallel/en-fr.train.fr")) == s["n_parallel"]
    assert len(lines(toy_world / "tatoeba/tatoeba.fr-en.en")) == s["n_tatoeba"]
    assert len(lines(toy_world / "xnli/fr.test.tsv")) == s["n_task_eval"]
    assert len(read_conllu(toy_world / "ud/en.train.conllu")) == s["n_task_train"]
    meta = json.load(open(toy_world / "world.json"))
    assert meta["langs"] == ["en", "fr"] and meta["seed"] == 0 and meta["shared"] == 0


def test_deterministic_for_a_seed(tmp_path):
    small = dict(n_train=300, n_dev=20, n_test=20, n_parallel=30, n_tatoeba=20, n_task_train=30, n_task_eval=15)
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        toydata.write_world(tmp_path / name, seed=seed, overlap=0.2, domain_shift=0.3, order="vso", **small)
    files = all_files(tmp_path / "a")
    assert files == all_files(tmp_path / "b")
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a/mono/en.train.txt").read_bytes() != (tmp_path / "c/mono/en.train.txt").read_bytes()


def test_refuses_non_empty_out_unless_forced(tmp_path):
    small = dict(n_train=20, n_dev=5, n_test=5, n_parallel=5, n_tatoeba=5, n_task_train=6, n_task_eval=6)
    (tmp_path / "mono").mkdir()
    (tmp_path / "mono" / "de.train.txt").write_text("old file\n")
    with pytest.raises(FileExistsError):
        toydata.write_world(tmp_path, **small)
    toydata.write_world(tmp_path, force=True, **small)
    assert all_files(tmp_path) == expected_files()          # the stale file is gone, nothing else mixed in
    r = subprocess.run([sys.executable, os.path.join(ROOT, "toydata.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "not empty" in r.stderr


@pytest.mark.parametrize("stray", ["ud/UD_English-EWT/en_ewt-ud-train.conllu", "XNLI-1.0/xnli.test.tsv", "notes.txt"])
def test_force_refuses_a_folder_that_is_not_a_toy_world(tmp_path, stray):
    """--force replaces a toy world only: in a folder that holds a file toydata.py does not write (a UD release in
    ud/, another download beside), nothing is removed and the refusal is one line (it deleted the subfolders)."""
    (tmp_path / stray).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / stray).write_text("keep me\n")
    (tmp_path / "ud" / "en.train.conllu").parent.mkdir(exist_ok=True)
    (tmp_path / "ud" / "en.train.conllu").write_text("old\n")
    with pytest.raises(SystemExit, match=f"^error: --force: {re.escape(str(tmp_path))} is not a toy world .it holds "
                       + re.escape(stray.split("/")[0] + "/" * ("/" in stray))):
        toydata.main(["--out", str(tmp_path), "--size", "tiny", "--force"])
    assert (tmp_path / stray).read_text() == "keep me\n" and (tmp_path / "ud" / "en.train.conllu").exists()


def test_force_replaces_only_what_it_wrote_follows_no_link_and_marks_a_cut_world(tmp_path, monkeypatch):
    """Issue 48: --force refuses a toy world whose mono/ is a link to a user's folder (it wrote into that folder)
    or that holds a file of another shape (mono/notes.txt was deleted); an interrupted rewrite leaves no world.json
    (the old one said the world was complete)."""
    small = dict(n_train=20, n_dev=5, n_test=5, n_parallel=5, n_tatoeba=5, n_task_train=6, n_task_eval=6)
    world = tmp_path / "w"
    toydata.write_world(world, **small)
    (world / "mono" / "notes.txt").write_text("keep me\n")
    with pytest.raises(FileExistsError, match="it holds mono/notes.txt"):
        toydata.write_world(world, force=True, **small)
    (world / "mono" / "notes.txt").unlink()
    user = tmp_path / "user"
    (world / "mono").rename(user)
    (world / "mono").symlink_to(user, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in user.iterdir()}
    with pytest.raises(SystemExit, match="is not a toy world .it holds mono/, a link.; nothing was removed"):
        toydata.main(["--out", str(world), "--size", "tiny", "--force"])
    assert {p.name: p.read_bytes() for p in user.iterdir()} == before and (world / "world.json").exists()
    (world / "mono").unlink()

    def cut(out_dir, name, text):  # Ctrl-C at the first file
        raise KeyboardInterrupt
    monkeypatch.setattr(toydata, "_write", cut)
    with pytest.raises(KeyboardInterrupt):
        toydata.write_world(world, force=True, **small)
    assert not (world / "world.json").exists()


@pytest.mark.parametrize("flag, value", [("--overlap", "1.5"), ("--order", "xyz"), ("--domain-shift", "-0.1"),
                                         ("--langs", "en"), ("--langs", "en,"), ("--langs", "en,fr,de"),
                                         ("--size", "huge"), ("--overlap", "abc")])
def test_cli_rejects_bad_values(tmp_path, flag, value):
    """One line `toydata.py: error: ...` naming the flag and the bad value, no traceback, nothing written."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "toydata.py"), "--out", str(tmp_path / "w"), flag, value],
                       capture_output=True, text=True)
    last = r.stderr.splitlines()[-1]
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert last.startswith("toydata.py: error: ") and value in last, r.stderr
    assert flag[2:].replace("-", "_") in last.replace("-", "_"), r.stderr     # e.g. domain_shift for --domain-shift
    assert not (tmp_path / "w").exists()


def test_cli_main_writes_a_world(tmp_path, capsys):
    s = toydata.main(["--out", str(tmp_path / "w"), "--size", "tiny", "--overlap", "0.3", "--seed", "3"])
    assert s["out_dir"] == str(tmp_path / "w") and s["overlap"] == 0.3 and s["seed"] == 3
    assert "wrote " in capsys.readouterr().out
    assert all_files(tmp_path / "w") == expected_files()
    assert len(lines(tmp_path / "w/mono/en.train.txt")) == toydata.SIZES["tiny"]["n_train"]
    assert len(lines(tmp_path / "w/xnli/fr.test.tsv")) == toydata.SIZES["tiny"]["n_task_eval"]


def test_parse_order():
    assert toydata.parse_order("svo")["obj"][0] == 1
    assert toydata.parse_order("sov-na-post")["obj"][0] == -1
    assert toydata.parse_order("svo-na")["amod"][0] == 1
    assert toydata.parse_order("svo-post")["case"][0] == 1
    for bad in ("", "sov-", "xyz", "svo-pre-na", "SVO", "svo-an-an"):
        with pytest.raises(ValueError):
            toydata.parse_order(bad)
    with pytest.raises(ValueError):
        toydata.write_world("/nonexistent-never-written", overlap=1.5)
    with pytest.raises(ValueError, match="two distinct codes"):   # bilingual worlds only
        toydata.write_world("/nonexistent-never-written", langs=("en", "fr", "de"))


# -----------------------------------------------------------------------------
# every output parses

def check_tree(rows, where):
    n = len(rows)
    assert [int(r[0]) for r in rows] == list(range(1, n + 1)), where
    heads = [int(r[6]) for r in rows]
    assert all(0 <= h <= n for h in heads), where
    assert is_tree(heads), f"{where}: not one tree (a cycle or not exactly one root)"
    assert rows[heads.index(0)][7] == "root", where
    for r in rows:
        assert r[3] in UPOS and r[7] in DEPRELS, (where, r)
        assert r[1] and " " not in r[1], where


@pytest.mark.parametrize("world", ["toy_world", "toy_world_overlap"])
def test_conllu_valid_trees(world, request):
    d = request.getfixturevalue(world)
    for lang in ("en", "fr"):
        for s in SPLITS:
            for k, (comments, rows) in enumerate(read_conllu(d / f"ud/{lang}.{s}.conllu")):
                where = f"ud/{lang}.{s}.conllu sentence {k + 1}"
                check_tree(rows, where)
                text = [c for c in comments if c.startswith("# text = ")]
                assert text == ["# text = " + " ".join(r[1] for r in rows)], where


def test_ner_iob2(toy_world_overlap):
    types = collections.Counter()
    for lang in ("en", "fr"):
        for s in SPLITS:
            for sent in read_ner(toy_world_overlap / f"ner/{lang}.{s}.tsv"):
                prev = "O"
                for _, tag in sent:
                    assert tag == "O" or tag[:2] in ("B-", "I-") and tag[2:] in ("PER", "LOC", "ORG"), tag
                    if tag.startswith("I-"):
                        assert prev[2:] == tag[2:], sent        # IOB2: I-X only after B-X or I-X
                    prev = tag
                    types[tag] += 1
                assert any(t != "O" for _, t in sent), "every PAN-X sentence has an entity"
    assert all(types[p + t] > 0 for p in ("B-", "I-") for t in ("PER", "LOC", "ORG")), types


def test_xnli_format_and_balance(toy_world):
    for lang in ("en", "fr"):
        for s in SPLITS:
            rows = [l.split("\t") for l in lines(toy_world / f"xnli/{lang}.{s}.tsv")]
            assert all(len(r) == 3 and r[0] and r[1] for r in rows)
            counts = collections.Counter(r[2] for r in rows)
            assert set(counts) == set(toydata.LABELS)
            assert max(counts.values()) - min(counts.values()) <= 1, counts
            assert all(r[0] != r[1] for r in rows)


def test_nli_label_follows_from_meaning_and_alignment():
    """Entailment drops a modifier, neutral adds one, contradiction swaps subject and object or changes
    an argument: the label follows from how the words of the two sentences line up, never from a
    single-word lexical relation (no antonym, no hypernym)."""
    world = toydata.World(0)
    rng = random.Random(0)
    bag = lambda t: collections.Counter(n[0] for n in t)
    role = lambda t, r: [n[0] for n in t if n[1] == 0 and n[2] == r]
    swaps = changes = 0
    for _ in range(300):
        p, h = toydata.sample_nli(world, rng, "entailment")
        assert bag(h) < bag(p) and not toydata._new_concepts(p, h)
        p, h = toydata.sample_nli(world, rng, "neutral")
        assert bag(p) < bag(h) and toydata._new_concepts(p, h)
        p, h = toydata.sample_nli(world, rng, "contradiction")
        if bag(p) == bag(h):     # same words, the roles exchanged
            assert role(p, "nsubj") == role(h, "obj") and role(p, "obj") == role(h, "nsubj") != []
            swaps += 1
        else:                    # one argument (a noun or an entity's tokens) replaced, nothing else
            assert len(p) == len(h) and h[0][0] == p[0][0]
            diff = [i for i in range(len(p)) if p[i][0] != h[i][0]]
            assert diff and all(p[i][2] in ("nsubj", "obj", "flat") for i in diff)
            changes += 1
        for t in (p, h):
            assert sum(n[1] == -1 for n in t) == 1 and any(n[2] == "nsubj" for n in t)
    assert swaps > 50 and changes > 50


def test_mono_parallel_tatoeba_are_plain_text(toy_world):
    for f in all_files(toy_world):
        if f.startswith(("mono/", "parallel/", "tatoeba/")):
            for l in lines(toy_world / f):
                assert l and l == l.strip() and "  " not in l and "\t" not in l, f


# -----------------------------------------------------------------------------
# the ground truth: dictionary, overlap, order, domain

def test_dictionary_is_the_translation(toy_world_overlap):
    d = toy_world_overlap
    full = read_dict(d / "dict/en-fr.txt")
    src = [a for a, _ in full]
    assert len(set(src)) == len(src) and len({b for _, b in full}) == len(full)   # one form per concept
    train, test = read_dict(d / "dict/en-fr.train.txt"), read_dict(d / "dict/en-fr.test.txt")
    assert not {a for a, _ in train} & {a for a, _ in test}
    assert sorted(train + test) == sorted(full) and len(test) > 50
    t = dict(full)
    for a, b in (("parallel/en-fr.train.en", "parallel/en-fr.train.fr"),
                 ("tatoeba/tatoeba.fr-en.en", "tatoeba/tatoeba.fr-en.fr")):
        for x, y in zip(lines(d / a), lines(d / b), strict=True):
            assert sorted(translate(x.split(), t)) == sorted(y.split())
    # the NLI and UD sets are the same meanings in both languages too
    for x, y in zip(lines(d / "xnli/en.test.tsv"), lines(d / "xnli/fr.test.tsv"), strict=True):
        x, y = x.split("\t"), y.split("\t")
        assert x[2] == y[2] and sorted(translate(x[0].split(), t)) == sorted(y[0].split())


def test_same_order_gives_word_by_word_translation(toy_world):
    t = dict(read_dict(toy_world / "dict/en-fr.txt"))
    for x, y in zip(lines(toy_world / "tatoeba/tatoeba.fr-en.en"), lines(toy_world / "tatoeba/tatoeba.fr-en.fr")):
        assert translate(x.split(), t) == y.split()


def test_order_knob(toy_world_overlap):
    """fr is 'sov-na': the verb ends the clause and adjectives follow their noun; en is SVO with Adj N."""
    for lang, verb_last, adj_after in (("en", False, False), ("fr", True, True)):
        n_verb_last = 0
        sents = read_conllu(toy_world_overlap / f"ud/{lang}.test.conllu")
        for _, rows in sents:
            root = next(int(r[0]) for r in rows if r[7] == "root")
            n_verb_last += root == len(rows) - 1          # last before the full stop
            for r in rows:
                if r[7] == "amod":
                    assert (int(r[6]) < int(r[0])) == adj_after
        assert (n_verb_last == len(sents)) == verb_last


def test_mono_corpora_are_not_parallel(toy_world):
    t = dict(read_dict(toy_world / "dict/en-fr.txt"))
    en, fr = lines(toy_world / "mono/en.train.txt"), lines(toy_world / "mono/fr.train.txt")
    same = sum(translate(x.split(), t) == y.split() for x, y in zip(en, fr))
    assert same < 0.05 * len(en)


def vocab(d, lang):
    return {w for l in lines(d / f"mono/{lang}.train.txt") for w in l.split()}


def test_overlap_zero_gives_disjoint_vocabularies(toy_world):
    assert not vocab(toy_world, "en") & vocab(toy_world, "fr")
    full = read_dict(toy_world / "dict/en-fr.txt")
    assert not {a for a, _ in full} & {b for _, b in full}


def test_overlap_fraction(toy_world_overlap):
    full = read_dict(toy_world_overlap / "dict/en-fr.txt")
    shared = sum(a == b for a, b in full) / len(full)
    assert abs(shared - 0.3) < 0.01
    en, fr = vocab(toy_world_overlap, "en"), vocab(toy_world_overlap, "fr")
    assert 0.2 < len(en & fr) / len(fr) < 0.4          # on the corpora: rare words may be missing


def test_cyrillic_and_vocabulary_size(tmp_path):
    small = dict(n_train=500, n_dev=5, n_test=5, n_parallel=5, n_tatoeba=5, n_task_train=6, n_task_eval=6)
    s = toydata.write_world(tmp_path, langs=("en", "ru"), cyrillic=True, **small)
    assert 300 <= s["vocab_sizes"]["en"] <= 5000
    ru = vocab(tmp_path, "ru")
    assert all(any("\u0400" <= ch <= "\u04ff" for ch in w) for w in ru if w != "。")
    assert all_files(tmp_path) == expected_files("en", "ru")


def unigram(d, lang, to_en=None):
    c = collections.Counter(w for l in lines(d / f"mono/{lang}.train.txt") for w in l.split())
    if to_en:
        c = collections.Counter({to_en[w]: n for w, n in c.items()})
    total = sum(c.values())
    return {w: n / total for w, n in c.items()}


def test_zipf_and_domain_shift(tmp_path):
    small = dict(n_train=4000, n_dev=5, n_test=5, n_parallel=5, n_tatoeba=5, n_task_train=6, n_task_eval=6)
    tv = {}
    for shift in (0.0, 1.0):
        d = tmp_path / str(shift)
        toydata.write_world(d, domain_shift=shift, **small)
        back = {b: a for a, b in read_dict(d / "dict/en-fr.txt")}
        p, q = unigram(d, "en"), unigram(d, "fr", back)
        tv[shift] = 0.5 * sum(abs(p.get(w, 0) - q.get(w, 0)) for w in set(p) | set(q))
        # Zipf inside classes: the 10 % most frequent word types cover most tokens
        f = sorted(p.values(), reverse=True)
        assert sum(f[: len(f) // 10]) > 0.5
    assert tv[0.0] < 0.08 and tv[1.0] > tv[0.0] + 0.08, tv


def test_selectional_restrictions():
    """A verb's subject always comes from the groups its frame allows."""
    world = toydata.World(0)
    rng = random.Random(0)
    for _ in range(500):
        tree = toydata.sample_tree(world, rng)
        subj_groups = world.verb_frame[tree[0][0]][0]
        s = next(n[0] for n in tree if n[2] == "nsubj")
        if world.kind[s] == "noun":
            assert world.noun_group[s] in subj_groups
        else:
            typ = world.name[s].split(".")[0]
            assert toydata.ENTITY_GROUP[typ] in subj_groups


def test_project_readers_parse_toy_world(toy_world):
    """finetune.py's readers (the ones that also read ../data) accept every toy task file."""
    finetune = pytest.importorskip("finetune")
    for lang in ("en", "fr"):
        ud = finetune.read_conllu(toy_world / f"ud/{lang}.test.conllu")
        ner = finetune.read_ner(toy_world / f"ner/{lang}.test.tsv")
        nli = finetune.read_xnli(toy_world / f"xnli/{lang}.test.tsv")
        assert len(ud) == len(ner) == len(nli) == TOY_WORLD_SIZES["n_task_eval"]
        assert {lab for _, _, lab in nli} == set(toydata.LABELS)


def test_name_overlap_redraws_anchors_among_entity_names_only():
    """--name-overlap sets the share of identical entity name parts on its own; every other concept keeps the
    anchor status --overlap gave it, and leaving it unset changes nothing."""
    world = toydata.World(0)
    names = [c for c in range(world.n_concepts) if world.kind[c] == "name"]
    others = [c for c in range(world.n_concepts) if world.kind[c] != "name"]

    def same(forms, cs):
        return {c for c in cs if forms[0][c] == forms[1][c]}

    base = toydata.make_lexicon(world, overlap=0.3, seed=0)
    assert base == toydata.make_lexicon(world, overlap=0.3, seed=0, name_overlap=None)
    assert 0 < len(same(base, names)) < len(names)          # the plain 30 % draw includes some name parts
    for share in (0.0, 1.0):
        forms = toydata.make_lexicon(world, overlap=0.3, seed=0, name_overlap=share)
        assert len(same(forms, names)) == round(share * len(names))
        assert same(forms, others) == same(base, others)     # the other anchors are untouched
    with pytest.raises(ValueError, match="name_overlap"):
        toydata.write_world("/nonexistent-never-written", name_overlap=1.5)


def test_scale_multiplies_the_open_classes_only(tmp_path):
    """--scale k: k times the nouns, verbs, adjectives, adverbs, name parts and entities of each class; the
    prepositions, determiners, place prefixes and organisation suffixes stay; 1 is the world as it was."""
    def counts(world):
        return collections.Counter(world.kind), collections.Counter(t for t, _ in world.entities)
    (k1, e1), (k3, e3) = counts(toydata.World(0)), counts(toydata.World(0, scale=3))
    assert k1 == counts(toydata.World(0, scale=1))[0] and sum(k1.values()) == 944
    for kind in ("noun", "verb", "adv"):
        assert k3[kind] == 3 * k1[kind], kind
    assert k3["adj"] >= 3 * 120 and k3["adp"] == k1["adp"] and k3["det"] == k1["det"] and k3["punct"] == 1
    assert k3["name"] == 3 * (k1["name"] - 10) + 10          # 4 place prefixes and 6 organisation suffixes
    assert e3 == {t: 3 * n for t, n in e1.items()}
    s = toydata.write_world(tmp_path / "w", scale=2, **toydata.SIZES["tiny"])
    assert s["scale"] == 2 and s["n_concepts"] > 1.9 * 944
    assert "scale" not in toydata.write_world(tmp_path / "v", **toydata.SIZES["tiny"])   # older worlds' bytes
    with pytest.raises(ValueError, match="scale"):
        toydata.write_world(tmp_path / "x", scale=0)


def test_one_writer_per_folder(tmp_path):
    """Issue 48: a second toydata.py writing into the same --out is refused in one line while the first holds
    OUT/.lock (two writers mixed their files); the lock goes with the writer, a stale one is replaced."""
    import fcntl
    small = dict(n_train=20, n_dev=5, n_test=5, n_parallel=5, n_tatoeba=5, n_task_train=6, n_task_eval=6)
    out = tmp_path / "w"
    out.mkdir()
    with open(out / ".lock", "w") as f:                         # the first writer, pid 4242
        f.write("4242\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SystemExit, match=f"^error: --out {re.escape(str(out))} is in use by another toydata.py "
                           r"\(pid 4242\); wait for it to end, or use another --out$"):
            toydata.main(["--out", str(out), "--size", "tiny"])
        assert os.listdir(out) == [".lock"]
    toydata.write_world(out, **small)                           # the first one is gone: its stale .lock is no stray
    assert not (out / ".lock").exists() and all_files(out) == expected_files()
    (out / ".lock").write_text("999999\n")                      # left by a writer that was killed
    toydata.write_world(out, force=True, **small)
    assert not (out / ".lock").exists() and all_files(out) == expected_files()


def test_a_killed_writer_says_so_and_leaves_no_world_json(tmp_path):
    """Issue 48: SIGTERM while a world is written ended with no message; now one line, and no world.json (the
    readers refuse a world without it)."""
    import signal
    import time
    out = tmp_path / "w"
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "toydata.py"), "--out", str(out), "--size", "full",
                          "--scale", "4"], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (out / "mono").exists() and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 1 and err.strip() == f"toydata.py: interrupted; {out} is incomplete (write it again with --force)", err
    assert not (out / "world.json").exists() and not (out / ".lock").exists()
