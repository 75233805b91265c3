"""Tests for bpe.py: exact BPE (== subword-nmt), the three vocabulary regimes, code-switching, binarisation.

Known answers marked "subword-nmt" were produced once by subword-nmt 0.3.8 (`pip install subword-nmt`,
`learn_bpe.learn_bpe(..., is_dict=True)` on the word-count table shown, and `apply_bpe.BPE(codes)
.process_line(line)`) and pasted here as literals; the tests do not import it. tests/bench_bpe.py
repeats the comparison on all of ../shared/data/monolingual (10k merges).
"""
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import bpe
from bpe import BPE, EOS_ID, MASK_ID, N_SPECIAL, UNK_ID, Tokenizer, Vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MONO = os.path.join(ROOT, "..", "shared", "data", "monolingual")


def unbpe(text):
    """Undo BPE.apply: remove '@@ ' (and a trailing '@@'), as XLM's restore_segmentation."""
    return re.sub(r"@@ |@@ ?$", "", text)


def decode(tok, ids, lang):
    """ids -> text: language marks and '@@ ' removed, special ids dropped but <unk>."""
    toks = [tok.vocabs[lang].tokens[i] for i in map(int, ids) if i >= N_SPECIAL or i == UNK_ID]
    return unbpe(" ".join(t.split(":", 1)[1] if tok.mode == "prefixed" and ":" in t else t for t in toks))

# -----------------------------------------------------------------------------
# learn_bpe


SENNRICH = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
SENNRICH_MERGES = [("s", "t</w>"), ("e", "st</w>"), ("l", "o"), ("w", "est</w>"), ("n", "e"),
                   ("ne", "west</w>"), ("lo", "w</w>"), ("w", "i"), ("wi", "d"), ("wid", "est</w>"),
                   ("w", "e"), ("we", "r</w>"), ("lo", "wer</w>")]


def test_learn_known_answer_sennrich():
    """Sennrich et al. (2016) Fig. 1 table. Start: l o w</w> x5, l o w e r</w> x2,
    n e w e s t</w> x6, w i d e s t</w> x3. Pair counts: (e,s)=6+3=9, (s,t</w>)=9, (w,e)=2+6=8,
    (l,o)=7, (n,e)=(e,w)=6, (o,w</w>)=5 ...
    1. (e,s) and (s,t</w>) tie at 9; the larger pair wins: ('s','t</w>') since 's' > 'e'.
    2. (e,st</w>)=9.  3. (w,e) fell to 2 (newest is now n e w est</w>), so (l,o)=7.
    4. (w,est</w>), (n,e), (e,w) tie at 6: ('w','est</w>').  ... 13 merges until all counts are 1
    (min_freq=2 stops there). Identical to subword-nmt's output."""
    for learn in (bpe.learn_bpe_simple, bpe.learn_bpe):
        assert learn(SENNRICH, 100) == SENNRICH_MERGES
        assert learn(SENNRICH, 4) == SENNRICH_MERGES[:4]


# (word counts, num_merges, min_freq, merges subword-nmt 0.3.8 wrote)
SUBWORD_NMT_CASES = [
    # ties: (a,b)=(b,a)=(a,b</w>)=2; max over pairs picks ('b','a')
    ({"abab": 2}, 10, 1, [("b", "a"), ("ba", "b</w>"), ("a", "bab</w>")]),
    # '</w>' is glued to the last char: 'a</w>' > 'a' (a prefix sorts first), so (a,a</w>) wins the tie
    ({"aaa": 3}, 10, 1, [("a", "a</w>"), ("a", "aa</w>")]),
    # overlapping pairs merge left to right: a a a a</w> -> aa a a</w>
    ({"aaaa": 1, "aaa": 1}, 10, 1, [("a", "a"), ("aa", "a</w>"), ("aa", "a"), ("aaa", "a</w>")]),
    # min_freq: (a,b</w>)=1 < 2 stops learning
    ({"ab": 1, "cd": 3}, 10, 2, [("c", "d</w>")]),
    # ties compare code points: 'é' (U+00E9) > 'z'
    ({"zy": 2, "éy": 2}, 1, 1, [("é", "y</w>")]),
    # the same symbol 'bcd</w>' / 'abcd</w>' reachable in several ways
    ({"xabc": 2, "abcd": 2, "bc": 3}, 20, 1,
     [("b", "c</w>"), ("x", "a"), ("xa", "bc</w>"), ("c", "d</w>"), ("b", "cd</w>"), ("a", "bcd</w>")]),
    # astral code points, Cyrillic with a combining acute, CJK
    ({"🙂🙂": 2, "е́е": 2, "中文": 2}, 10, 1,
     [("🙂", "🙂</w>"), ("中", "文</w>"), ("е", "\u0301"), ("е\u0301", "е</w>")]),
]


@pytest.mark.parametrize("counts,n,min_freq,expected", SUBWORD_NMT_CASES)
def test_learn_matches_subword_nmt(counts, n, min_freq, expected):
    assert bpe.learn_bpe_simple(counts, n, min_freq) == expected
    assert bpe.learn_bpe(counts, n, min_freq) == expected


def test_fast_learn_bpe_gives_the_simple_versions_merges_on_random_tables():
    """learn_bpe (incremental, heap) == learn_bpe_simple (recount every pair after every merge)."""
    rng = random.Random(0)
    for _ in range(150):
        alphabet = rng.choice(["ab", "abc", "aab", "xyzé"])
        counts = Counter()
        for _ in range(rng.randint(1, 12)):
            counts["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))] += rng.randint(1, 5)
        n, min_freq = rng.randint(1, 25), rng.choice([1, 2, 3])
        assert bpe.learn_bpe(counts, n, min_freq) == bpe.learn_bpe_simple(counts, n, min_freq), counts


@pytest.mark.skipif(not os.path.isdir(MONO), reason="../shared/data not available")
def test_learn_and_apply_match_subword_nmt_on_real_text():
    """First 2000 lines of the English Leipzig sample, words = str.split(), 40 merges; the merges and
    the segmented line are what subword-nmt 0.3.8 gives for the same table and codes."""
    path = os.path.join(MONO, "en.leipzig_wikipedia_2016_10K.txt")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")[:2000]
    counts = Counter(w for line in lines for w in line.split())
    expected = [("t", "h"), ("i", "n"), ("th", "e</w>"), ("a", "n"), ("e", "r"), ("t", "i"),
                ("r", "e"), ("o", "n"), ("e", "n"), ("a", "r"), ("e", "d</w>"), ("o", "f</w>"),
                ("o", "r"), ("an", "d</w>"), ("e", "r</w>"), ("i", "t"), ("t", "o</w>"), ("a", "l"),
                ("o", "n</w>"), ("s", "t"), ("o", "u"), ("in", "g</w>"), ("i", "n</w>"), ("a", "t"),
                ("r", "o"), ("a", "s</w>"), ("e", "s"), ("e", "s</w>"), ("i", "s</w>"), ("i", "c"),
                ("a", "c"), ("e", "l"), ("e", "c"), ("o", "m"), ("a", "l</w>"), ("a", "ti"),
                ("o", "r</w>"), ("a", "n</w>"), ("i", "s"), ("i", "l")]
    merges = bpe.learn_bpe(counts, 40)
    assert merges == expected
    line = " ".join(lines[5].split()[:12])
    assert BPE(merges).apply(line) == ("1@@ 9@@ 7@@ 0@@ s F@@ r@@ an@@ k@@ en@@ h@@ e@@ i@@ m@@ er "
                                       "f@@ o@@ l@@ l@@ o@@ w@@ ed th@@ is w@@ it@@ h I W@@ al@@ k "
                                       "the L@@ in@@ e in 1@@ 9@@ 7@@ 0@@ .")


@pytest.mark.parametrize("counts,n,min_freq,match", [
    ({}, 10, 2, "empty corpus"),
    ({"a": 0}, 10, 2, "empty corpus"),
    ({"ab": 3}, 0, 2, "num_merges"),
    ({"ab": 3}, -5, 2, "num_merges"),
    ({"ab": 3}, 5, 0, "min_freq"),
    ({"a b": 3}, 5, 2, "whitespace"),
    ({"a\u00a0b": 3}, 5, 2, "whitespace"),
])
def test_learn_bad_input(counts, n, min_freq, match):
    with pytest.raises(ValueError, match=match):
        bpe.learn_bpe(counts, n, min_freq)


def test_learn_stops_when_nothing_to_merge():
    # one-character words have no pairs (subword-nmt crashes on max() of an empty dict here)
    assert bpe.learn_bpe({"a": 5, "b": 2}, 5, 1) == []
    assert bpe.learn_bpe({"ab": 5}, 5, 1) == [("a", "b</w>")]


# -----------------------------------------------------------------------------
# BPE apply / segment / decode / codes files

CODES = BPE(SENNRICH_MERGES)


@pytest.mark.parametrize("line,expected", [  # right-hand sides: subword-nmt apply-bpe
    ("lowest newer wider low", "lo@@ west ne@@ wer wid@@ e@@ r low"),
    ("  lowest   lower ", "lo@@ west lower"),  # subword-nmt's segment(): spaces collapse
    ("a", "a"),
    ("ester", "e@@ s@@ t@@ e@@ r"),
    ("lo\tw", "lo@@ \t@@ w"),  # only ' ' separates words, a tab is a character
    ("", ""),
])
def test_apply_matches_subword_nmt(line, expected):
    assert CODES.apply(line) == expected


def test_segment_known_answer():
    """'lowest' -> l o w e s t</w>; lowest-rank pair present each round: (s,t</w>) rank 0, (e,st</w>) 1,
    (l,o) 2, (w,est</w>) 3 -> lo west</w>. (lo,w</w>) never applies: w is not final any more."""
    assert CODES.segment("lowest") == ["lo", "west"]
    assert CODES.segment("low") == ["low"]
    assert CODES.segment("") == []



def test_fast_segment_equals_the_plain_rule_on_random_codes():
    """BPE._merge (one occurrence: only the neighbours' ranks change) against the rule it implements, merge_pair
    of the lowest-rank pair present, on words full of repeated and overlapping pairs (a a a, a b a b) and codes
    with duplicates and merges of merged symbols; apply, apply_words and segment agree with it."""
    rng = random.Random(0)
    for _ in range(30):
        alphabet = "ab" if rng.random() < 0.5 else "abc"
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(40)]
        symbols = list(alphabet) + [c + bpe.EOW for c in alphabet]
        merges = []
        for _ in range(rng.randint(1, 25)):
            a, b = rng.choice(symbols[:-len(alphabet)] or symbols), rng.choice(symbols)
            if not a.endswith(bpe.EOW):
                merges.append((a, b))
                symbols.insert(0, a + b)
        codes = BPE(merges)
        for word in words:
            w = list(word[:-1]) + [word[-1] + bpe.EOW]
            while len(w) > 1:
                best = min(zip(w, w[1:]), key=lambda p: codes.ranks.get(p, len(merges)))
                if best not in codes.ranks:
                    break
                w = bpe.merge_pair(w, *best)
            expected = w[:-1] + [w[-1][:-len(bpe.EOW)]]
            assert codes.segment(word) == expected, (word, merges)
            assert codes.apply(word) == " ".join(p + "@@" for p in expected[:-1]) + " " * (len(expected) > 1) + expected[-1]
        assert codes.apply_words(words) == [p for w in words for p in BPE(merges).apply(w).split(" ")]
    # every occurrence of the lowest pair at once: merging only the first 'a bc' would make (abc, a), rank 2, and
    # give abca bc d (subword-nmt merges a bigram everywhere before it looks at the new pairs)
    codes = BPE([("b", "c"), ("x", "y"), ("abc", "a"), ("a", "bc")])
    assert codes.segment("abcabcd") == ["abc", "abc", "d"]
    assert codes.apply("abcabcd abcabcd") == "abc@@ abc@@ d abc@@ abc@@ d"

MIXED = ["", "x", "hello world", "Привет мир", "中文 字符 测试", "مرحبا بالعالم", "emoji 🙂 👍🏽 🇫🇷",
         "combining e\u0301te\u0301 n\u0303", "mixed Москва 東京 القاهرة café 42"]


@pytest.mark.parametrize("text", MIXED)
def test_apply_decode_round_trip(text):
    merges = bpe.learn_bpe(Counter(" ".join(MIXED * 3).split()), 30, 1)
    codes = BPE(merges)
    out = codes.apply(text)
    assert unbpe(out) == text
    assert all(p for p in out.split(" ")) or text == ""


def test_codes_save_load(tmp_path):
    path = str(tmp_path / "codes")
    CODES.save(path)
    with open(path, encoding="utf-8") as f:
        assert f.readline() == "#version: 0.2\n"
        assert f.readline() == "s t</w>\n"
    assert BPE.load(path).merges == SENNRICH_MERGES
    assert os.listdir(tmp_path) == ["codes"]  # no temporary file left


def test_fastbpe_codes_load(tmp_path):
    """fastBPE's codes (what XLM's released models come with): 'left right count', no header; the same merges."""
    path = tmp_path / "codes_enfr"
    path.write_text("".join(f"{a} {b} {100 - i}\n" for i, (a, b) in enumerate(SENNRICH_MERGES)), encoding="utf-8")
    assert BPE.load(str(path)).merges == SENNRICH_MERGES


@pytest.mark.parametrize("content,line", [
    ("#version: 0.2\na b\nc d e\n", 3),      # subword-nmt codes with a 3-field line
    ("#version: 0.2\na b\n\nc d\n", 3),      # blank line inside
    ("a b\nc d\n", 1),                       # no header: v0.1 / unknown
    ("#version: 0.1\na b\n", 1),             # other version
    ("a b 7\nc d x\n", 2),                   # fastBPE codes with a count that is no number
    ('{"format": "bpe.Tokenizer/1", "bpes": [' + "x" * 5000 + "]}", 1),  # a tokenizer.json: one long line
])
def test_bad_codes_file_names_file_and_line(tmp_path, content, line):
    path = tmp_path / "bad.codes"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"bad\.codes:{line}:") as e:
        BPE.load(str(path))
    assert len(str(e.value)) < 300, "one readable line"


# -----------------------------------------------------------------------------
# pretokenize


@pytest.mark.parametrize("line,lang,expected", [
    ("Hello, world!", "en", ["Hello", ",", "world", "!"]),
    ("l'homme well-known 1,000.5 km.", "fr", ["l'homme", "well-known", "1,000.5", "km", "."]),
    ("我们2020年abc", "zh", ["我", "们", "2020", "年", "abc"]),
    ("我们", "en", ["我们"]),
    ("Привет, мир", "ru", ["Привет", ",", "мир"]),
    ("مرحبا، بالعالم", "ar", ["مرحبا", "،", "بالعالم"]),
    ("ok 👍🏽!", "en", ["ok", "👍🏽", "!"]),
    ("e\u0301te\u0301", "fr", ["e\u0301te\u0301"]),
    ("<s> x </s>", "en", ["<", "s", ">", "x", "<", "/", "s", ">"]),
    ("a\u00a0b\u3000c\td", "en", ["a", "b", "c", "d"]),
    ("", "en", []),
])
def test_pretokenize(line, lang, expected):
    assert bpe.pretokenize(line, lang) == expected


def test_lowercase_and_strip_accents():
    assert bpe.lowercase_and_strip_accents("Été à NOËL, Москва́") == "ete a noel, москва"


# -----------------------------------------------------------------------------
# Vocab and Tokenizer

EN = ["the cat sleeps on the mat .", "the dog eats meat 42 .", "a cat and a dog play in Paris .",
      "the mat is red and the dog is old ."]
FR = ["le chat dort sur le tapis .", "le chien mange de la viande 42 .",
      "un chat et un chien jouent à Paris .", "le tapis est rouge et le chien est vieux ."]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    paths = {}
    for lang, lines in (("en", EN), ("fr", FR)):
        paths[lang] = str(d / f"{lang}.train.txt")
        with open(paths[lang], "w", encoding="utf-8") as f:
            f.write("\n".join(lines * 5) + "\n")
    return paths


def test_vocab_layout():
    v = Vocab(["the", "cat@@"], [10, 3])
    assert v.tokens[:4] == ["<s>", "</s>", "<pad>", "<unk>"] and v.tokens[MASK_ID] == "<special1>"
    assert len(v) == N_SPECIAL + 2 and v.index["the"] == 14 and v.index["cat@@"] == 15
    assert v.tokens[UNK_ID] == "<unk>" and "unseen" not in v.index and v.counts[N_SPECIAL:] == [10, 3]
    with pytest.raises(ValueError, match="twice"):
        Vocab(["a", "a"])


@pytest.mark.parametrize("mode", bpe.MODES)
def test_tokenizer_modes(files, mode):
    tok = Tokenizer.build(files, mode, num_merges=40, verbose=False)
    assert tok.vocabs["en"] is tok.vocabs["fr"]
    en_tokens = {t for line in EN for t in tok.tokenize(line, "en")}
    fr_tokens = {t for line in FR for t in tok.tokenize(line, "fr")}
    vocab_tokens = set(tok.vocabs["en"].tokens[N_SPECIAL:])
    assert vocab_tokens == en_tokens | fr_tokens
    # sorted by count, descending (XLM's dictionary check)
    counts = tok.vocabs["en"].counts[N_SPECIAL:]
    assert counts == sorted(counts, reverse=True)
    if mode == "prefixed":
        # no anchors: the only ids both languages use are specials
        assert not en_tokens & fr_tokens and not tok.anchors
        assert all(t.startswith("en:") for t in en_tokens) and all(t.startswith("fr:") for t in fr_tokens)
        en_ids = {i for line in EN for i in tok.encode(line, "en")}
        fr_ids = {i for line in FR for i in tok.encode(line, "fr")}
        assert all(i < N_SPECIAL for i in en_ids & fr_ids)
    else:
        # anchors are exactly the identical strings both languages produce ('42', '.', 'Paris', ...)
        assert tok.anchors == en_tokens & fr_tokens
        assert "." in tok.anchors
    for lang, lines in (("en", EN), ("fr", FR)):
        for line in lines:
            ids = tok.encode(line, lang)
            assert UNK_ID not in ids and all(i >= N_SPECIAL for i in ids)
            assert decode(tok, ids, lang) == line


def test_separate_shares_exactly_identical_strings(files):
    """separate: per-language BPE; the union vocabulary holds each distinct string once, so the shared
    ids are exactly the strings produced in both languages."""
    tok = Tokenizer.build(files, "separate", num_merges=40, verbose=False)
    assert tok.bpes["en"] is not tok.bpes["fr"]
    en = {t: tok.vocabs["en"].index[t] for line in EN for t in tok.tokenize(line, "en")}
    fr = {t: tok.vocabs["fr"].index[t] for line in FR for t in tok.tokenize(line, "fr")}
    assert set(en.values()) & set(fr.values()) == {en[t] for t in set(en) & set(fr)}
    assert len(tok.vocabs["en"]) == N_SPECIAL + len(set(en) | set(fr))


def test_separate_vocab_gives_language_local_ids(files):
    tok = Tokenizer.build(files, "joint", num_merges=40, separate_vocab=True, verbose=False)
    assert tok.vocabs["en"] is not tok.vocabs["fr"]
    en_tokens = {t for line in EN for t in tok.tokenize(line, "en")}
    assert set(tok.vocabs["en"].tokens[N_SPECIAL:]) == en_tokens
    assert tok.vocab_size("en") == N_SPECIAL + len(en_tokens)
    assert decode(tok, tok.encode(FR[0], "fr"), "fr") == FR[0]


def test_joint_build_samples_equal_lines_and_is_seeded(tmp_path):
    en, fr = tmp_path / "en.txt", tmp_path / "fr.txt"
    en.write_text("\n".join(EN * 20) + "\n")
    fr.write_text("\n".join(FR * 2) + "\n")
    a = Tokenizer.build({"en": str(en), "fr": str(fr)}, "joint", 30, verbose=False, seed=1)
    b = Tokenizer.build({"en": str(en), "fr": str(fr)}, "joint", 30, verbose=False, seed=1)
    assert a.to_dict() == b.to_dict()
    assert decode(a, a.encode(EN[1], "en"), "en") == EN[1]


def test_tokenizer_dict_round_trip(files):
    tok = Tokenizer.build(files, "prefixed", num_merges=30, separate_vocab=True, verbose=False)
    d = tok.to_dict()

    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, list):
            return all(plain(v) for v in x)
        return isinstance(x, (str, int, float, bool)) or x is None

    assert plain(d)
    tok2 = Tokenizer.from_dict(json.loads(json.dumps(d)))
    assert tok2.to_dict() == d
    for lang, lines in (("en", EN), ("fr", FR)):
        for line in lines + ["unseen wörds 🙂"]:
            assert tok2.encode(line, lang) == tok.encode(line, lang)
    torch = pytest.importorskip("torch")
    path = os.path.join(str(files["en"]) + ".pt")
    torch.save({"tokenizer": d}, path)
    assert torch.load(path, weights_only=True)["tokenizer"] == d


def test_tokenizer_load_refuses_other_files(files, tmp_path):
    """A codes file, a text file or other JSON given as a tokenizer.json: one ValueError naming the file."""
    CODES.save(str(tmp_path / "codes"))
    (tmp_path / "list.json").write_text("[1, 2]")
    for path, reason in (("codes", "not JSON"), ("list.json", "TypeError")):
        with pytest.raises(ValueError, match=rf"{path}: not a tokenizer.json written by bpe.py \({reason}"):
            Tokenizer.load(str(tmp_path / path))
    with pytest.raises(ValueError, match=r"en.train.txt: not a tokenizer.json written by bpe.py \(not JSON"):
        Tokenizer.load(files["en"])


def test_encode_words_and_special_literals(files):
    tok = Tokenizer.build(files, "joint", num_merges=40, verbose=False)
    words = "the cat sleeps on Paris .".split()
    per_word = tok.encode_words(words + [""], "en")
    assert sum(per_word[:-1], []) == tok.encode(" ".join(words), "en")
    assert per_word[-1] == [UNK_ID]
    # literal special tokens in text are plain characters, never special ids
    ids = tok.encode("<s> the </s> <pad> <special1>", "en")
    assert all(i >= N_SPECIAL or i == UNK_ID for i in ids)


def test_a_word_longer_than_max_word_is_cut(tmp_path, monkeypatch):
    """Issue 37: a 1 MB token stalled BPE learning for minutes (every merge it holds rebuilt the whole word). Words of
    more than MAX_WORD characters are cut into words of MAX_WORD, for learning and for encoding alike."""
    n = bpe.MAX_WORD
    assert bpe.cap_words(["ab", "x" * (2 * n + 1)]) == ["ab", "x" * n, "x" * n, "x"]
    rng = random.Random(0)
    blob = "".join(rng.choice("abcdefghij") for _ in range(100_000))
    (tmp_path / "en.txt").write_text("the cat sleeps\n" * 50 + f"a {blob} b\n")
    longest = []
    learn = bpe.learn_bpe
    monkeypatch.setattr(bpe, "learn_bpe", lambda counts, *a, **k: longest.append(max(map(len, counts))) or learn(
        counts, *a, **k))
    tok = Tokenizer.build({"en": str(tmp_path / "en.txt")}, num_merges=50, verbose=False)
    assert longest == [n]
    ids = tok.encode(f"a {blob} b", "en")
    assert decode(tok, ids, "en").replace(" ", "") == f"a{blob}b" and UNK_ID not in ids


def test_build_empty_corpus(tmp_path):
    (tmp_path / "en.txt").write_text("\n\n")
    (tmp_path / "fr.txt").write_text("le chat\n")
    with pytest.raises(ValueError, match="en.txt: empty corpus"):
        Tokenizer.build({"en": str(tmp_path / "en.txt"), "fr": str(tmp_path / "fr.txt")}, verbose=False)


# -----------------------------------------------------------------------------
# code-switching


def test_code_switch_rate_seeded():
    """Every word is in the dictionary: p=0.3 and no cap gives ~30 % switched (binomial, n=20000:
    sd 0.3 %, tolerance 1.5 %); the cap max_frac=0.15 with p=1 keeps exactly floor(0.15 n) per line."""
    d = {f"w{i}": [f"t{i}"] for i in range(50)}
    rng = random.Random(0)
    words = [f"w{i % 50}" for i in range(100)]
    switched = sum(sum(a != b for a, b in zip(words, bpe.code_switch(words, d, rng, 0.3, 1.0)))
                   for _ in range(200))
    assert abs(switched / 20000 - 0.3) < 0.015
    rng = np.random.default_rng(0)
    for _ in range(20):
        out = bpe.code_switch(words, d, rng, p=1.0, max_frac=0.15)
        changed = [i for i, (a, b) in enumerate(zip(words, out)) if a != b]
        assert len(changed) == 15 and all(out[i] == "t" + words[i][1:] for i in changed)
    # words outside the dictionary never change; Titlecase falls back to the lowercase entry
    assert bpe.code_switch(["x", "Chat"], {"chat": ["cat"]}, random.Random(0), 1.0, 1.0) == ["x", "Cat"]


def test_read_dictionary_and_uniform_choice(tmp_path):
    path = tmp_path / "en-fr.txt"
    path.write_text("cat chat\ndog chien\n\ncat\tmatou\n")
    assert bpe.read_dictionary(str(path)) == [("cat", "chat"), ("dog", "chien"), ("cat", "matou")]
    rng = random.Random(0)
    picks = Counter(bpe.code_switch(["cat"], {"cat": ["chat", "matou"]}, rng, 1.0, 1.0)[0] for _ in range(4000))
    assert abs(picks["chat"] / 4000 - 0.5) < 0.03
    for bad in ("cat chat\ncat\n", "cat chat\ncat chat 3\n"):  # one column, or MUSE's two plus a third
        (tmp_path / "bad.txt").write_text(bad)
        with pytest.raises(ValueError, match=r"bad\.txt:2: expected 'source target'"):
            bpe.read_dictionary(str(tmp_path / "bad.txt"))


# -----------------------------------------------------------------------------
# binarize


def test_binarize_round_trip(files, tmp_path):
    tok = Tokenizer.build(files, "joint", num_merges=40, verbose=False)
    text = tmp_path / "fr.test.txt"
    lines = FR + ["", "chat inconnu 🙂"]
    text.write_text("\n".join(lines) + "\n")
    meta = bpe.binarize(str(text), tok, "fr", str(tmp_path / "fr.test"), verbose=False)
    assert meta == {"dtype": "uint16", "n_tokens": meta["n_tokens"], "n_sentences": len(lines),
                    "n_words": sum(len(bpe.pretokenize(line, "fr")) for line in lines),
                    "n_unk": sum(tok.encode(line, "fr").count(UNK_ID) for line in lines),
                    "vocab_size": tok.vocab_size("fr"), "lang": "fr"}
    assert meta["n_unk"] > 0
    data, meta2 = bpe.load_bin(str(tmp_path / "fr.test"))
    assert meta2 == meta and len(data) == meta["n_tokens"] and data[-1] == EOS_ID
    sents = np.split(np.asarray(data), np.flatnonzero(data == EOS_ID) + 1)[:-1]
    assert len(sents) == len(lines)
    for ids, line in zip(sents, lines):
        assert list(ids[:-1]) == tok.encode(line, "fr")
    assert [decode(tok, ids, "fr") for ids in sents[:len(FR)]] == FR
    assert sorted(os.listdir(tmp_path)) == ["fr.test.bin", "fr.test.json", "fr.test.txt"]
    # several processes give the same file
    old = bpe.CHUNK_LINES
    bpe.CHUNK_LINES = 2
    try:
        bpe.binarize(str(text), tok, "fr", str(tmp_path / "fr.w2"), workers=2, verbose=False)
    finally:
        bpe.CHUNK_LINES = old
    assert np.array_equal(bpe.load_bin(str(tmp_path / "fr.w2"))[0], data)


def test_binarize_bad_bytes_and_empty(files, tmp_path):
    tok = Tokenizer.build(files, "joint", num_merges=20, verbose=False)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"le chat\nle \xff chien\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: not valid UTF-8"):
        bpe.binarize(str(bad), tok, "fr", str(tmp_path / "bad"), verbose=False)
    assert sorted(os.listdir(tmp_path)) == ["bad.txt"]  # nothing half-written
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty corpus"):
        bpe.binarize(str(tmp_path / "empty.txt"), tok, "fr", str(tmp_path / "empty"), verbose=False)


def test_binarize_code_switch(files, tmp_path):
    tok = Tokenizer.build(files, "separate", num_merges=40, verbose=False)
    text = tmp_path / "en.txt"
    text.write_text("the cat sleeps on the mat .\n")
    d = {"cat": ["chat"], "mat": ["tapis"]}
    bpe.binarize(str(text), tok, "en", str(tmp_path / "cs"), code_switch=d, p=1.0, max_frac=1.0,
                 verbose=False)
    ids = list(bpe.load_bin(str(tmp_path / "cs"))[0])
    expected = (tok.encode("the", "en") + tok.encode("chat", "fr") + tok.encode("sleeps on the", "en")
                + tok.encode("tapis", "fr") + tok.encode(".", "en") + [EOS_ID])
    assert ids == expected


# -----------------------------------------------------------------------------
# command line


def test_cli_prepare(files, tmp_path):
    """python bpe.py prepare: the directory it prints holds the tokenizer and the ids; the same command reuses it."""
    spec = ",".join(f"{lang}={path}" for lang, path in files.items())
    cmd = [sys.executable, os.path.join(ROOT, "bpe.py"), "prepare", "--train-files", spec, "--dev-files", spec,
           "--merges", "30", "--allow-overlap", "--prep-dir", str(tmp_path / "prep")]  # dev = train
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    prepared = r.stdout.strip().splitlines()[-1]
    tok = Tokenizer.load(os.path.join(prepared, "tokenizer.json"))
    ids, meta = bpe.load_bin(os.path.join(prepared, "fr.train"))
    assert meta["n_sentences"] == len(FR) * 5
    assert list(ids[:len(tok.encode(FR[0], "fr")) + 1]) == tok.encode(FR[0], "fr") + [EOS_ID]
    assert r.stderr == ""  # not a terminal: no progress bar
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))  # the same command reuses it
    assert r.returncode == 0 and "using prepared data" in r.stdout and r.stdout.strip().splitlines()[-1] == prepared
