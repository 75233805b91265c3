"""Byte-pair encoding, vocabularies and binarisation for bilingual masked language models.

Paper: Conneau et al., "Emerging Cross-lingual Structure in Pretrained Language Models" (ACL
2020), §3 (the XLM set-up: BPE over the union of the languages) and §4.2 (anchor points: a joint
vocabulary, language-specific vocabularies with and without shared strings, code-switching).
Above the `# ====` line, the paper's part: pre-tokenisation, BPE as Sennrich et al. state it and as
subword-nmt applies it, §4.2's vocabulary regimes, code-switching, binarisation; below, plumbing.
Run: python bpe.py prepare --data DIR --langs en,fr --mode joint --merges 80000 --prep-dir runs/prep
"""

import argparse
import errno
import fcntl
import functools
import glob
import hashlib
import heapq
import math
import multiprocessing
import os
import random
import sys
import time
import unicodedata
from collections import Counter, defaultdict
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from itertools import islice, product, repeat
from json import JSONDecodeError, dumps, load as json_load
from os import getpid, makedirs, remove
from os.path import abspath, basename, exists, getsize, isdir, isfile, join, relpath, samefile
from shutil import rmtree
from signal import (SIG_BLOCK, SIG_DFL, SIG_IGN, SIG_SETMASK, SIG_UNBLOCK, SIGINT, SIGTERM, Signals,
                    getsignal, pthread_sigmask, signal)

import numpy as np
import regex
from tqdm import tqdm

# -----------------------------------------------------------------------------
# XLM's special tokens (XLM src/data/dictionary.py): first in every vocabulary, in every regime
SPECIALS = ["<s>", "</s>", "<pad>", "<unk>"] + [f"<special{i}>" for i in range(10)]
# <s> (id 0) is never used: a stream starts with </s>
EOS_ID, PAD_ID, UNK_ID = 1, 2, 3
MASK_ID = 5  # <special1>; <special0> (id 4) is XLM's SEP
N_SPECIAL = len(SPECIALS)  # 14: the first BPE token has id 14
# the end-of-word marker used while learning, attached to the last character (codes v0.2)
EOW = "</w>"
# the continuation marker written after every non-final piece of a word (subword-nmt, fastBPE)
CONTINUE = "@@"
MODES = ("joint", "separate", "prefixed")  # the vocabulary regimes of paper §4.2

# -----------------------------------------------------------------------------
# 1. Pre-tokenisation

# Whitespace = what str.isspace() calls whitespace. A word never contains any, which also keeps
# learn_bpe equal to subword-nmt (its regex merge misbehaves on symbols with non-space whitespace).
_SPACE = r"\s\x1c-\x1f"
_TOKEN = (
    r"\p{N}+(?:[.,]\p{N}+)+"  # a number with separators: 1,000.50
    r"|[\p{L}\p{M}\p{N}]+(?:['’\-][\p{L}\p{M}\p{N}]+)*"  # a word; inner - and ' kept
    rf"|(?![{_SPACE}])\X"  # else one grapheme: punctuation, symbols, emoji
)
TOKEN_RE = regex.compile(_TOKEN)
# zh: every Han character is a token (the stand-in for the Stanford segmenter)
TOKEN_RE_ZH = regex.compile(
    r"(?V1)\p{Han}|" + _TOKEN.replace(r"[\p{L}\p{M}\p{N}]", r"[[\p{L}\p{M}\p{N}]--\p{Han}]"))
SPACE_RE = regex.compile(rf"[{_SPACE}]")


def lowercase_and_strip_accents(text):
    """'Été à Noël' -> 'ete a noel' (XLM's lowercase_and_remove_accent.py; off by default)."""
    text = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in text if unicodedata.category(c) != "Mn").lower()


def pretokenize(line, lang):
    """'Hello, world!' -> ['Hello', ',', 'world', '!']; zh: '我们2020年' -> ['我', '们', '2020',
    '年']. The stand-in for Moses; '<s>' in the text becomes '<', 's', '>', never a special token."""
    return (TOKEN_RE_ZH if lang == "zh" else TOKEN_RE).findall(line)

# -----------------------------------------------------------------------------
# 2. Learning BPE (Sennrich et al. 2016; subword-nmt learn_bpe.py, codes version 0.2)

def learn_bpe_simple(word_counts, num_merges, min_freq=2):
    """BPE as Sennrich et al. (2016) state it: count every adjacent pair (weighted by word count),
    merge the most frequent one everywhere, repeat until the best count is below `min_freq`. A word
    starts as its characters, the last one carrying '</w>'; ties go to the largest pair
    (subword-nmt's max over (count, pair)).
    Example (Sennrich et al. 2016, Fig. 1): {'low': 5, 'lower': 2, 'newest': 6, 'widest': 3}
      step 1: (e,s) and (s,t</w>) tie at 9; 's' > 'e', so ('s', 't</w>')
              -> n e w e st</w>, w i d e st</w>
      step 2: (e,st</w>) = 9 -> n e w est</w>, w i d est</w>
      step 3: (l,o) = 5 + 2 = 7 is now the best ((w,e) fell to 2) -> lo w</w>, lo w e r</w>
      ... 13 merges in all, the list subword-nmt writes (tests/test_bpe.py checks this and more)."""
    words = {(*w[:-1], w[-1] + EOW): c for w, c in word_counts.items() if w}  # symbols -> count
    merges = []
    for _ in range(num_merges):
        stats = Counter()  # (left, right) -> count
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                stats[pair] += c
        pair = max(stats, key=lambda p: (stats[p], p), default=None)
        if pair is None or stats[pair] < min_freq:
            break
        merges.append(pair)
        merged = Counter()
        for w, c in words.items():
            merged[tuple(merge_pair(w, *pair))] += c
        words = merged
    return merges


def merge_pair(symbols, a, b):
    """Every (a, b) in `symbols` merged, left to right, non-overlapping: a a a, (a, a) -> aa a."""
    out = []
    i = 0
    n = len(symbols)
    while i < n:
        if symbols[i] == a and i + 1 < n and symbols[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out

# -----------------------------------------------------------------------------
# 3. Applying BPE (subword-nmt apply_bpe.py; fastBPE applybpe)

class _Cache(dict):
    """BPE's per-word caches, word -> make(word): a new word is made at its first lookup."""
    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, word):
        self[word] = self.make(word)
        return self[word]


class BPE:
    """Merges -> segmentation. `BPE(merges)`: merges = [(left, right), ...] in learning order."""

    def __init__(self, merges):
        self.merges = [tuple(m) for m in merges]
        # One string object per symbol (`canon`), in the keys of ranks and in merged[rank] (what a
        # merge makes): _merge's usual case makes no new string, a rank lookup matches by identity.
        # A pair learned twice keeps its first (lowest) rank, as in subword-nmt.
        self.ranks = {}
        canon = {}
        for i, pair in enumerate(self.merges):
            if len(pair) != 2 or not all(pair):
                raise ValueError(f"merge {i} is not a pair of non-empty strings: {pair!r}")
            self.ranks.setdefault(tuple(canon.setdefault(s, s) for s in pair), i)
        self.merged = [canon.setdefault(a + b, a + b) for a, b in self.merges]
        # per-word caches: word -> pieces with '@@' (apply_words), word -> them joined (apply)
        self.pieces = _Cache(self._pieces)
        self.joined = _Cache(lambda word: (CONTINUE + " ").join(self._merge(word))[: -len(EOW)])

    def _merge(self, word):
        """'lowest' -> ['lo', 'west</w>']: from characters (the last + '</w>'), merge the
        lowest-rank pair, every occurrence left to right (subword-nmt's encode). rs[i]: the rank of
        (w[i], w[i + 1]); a rank names one pair: the lowest rank's positions are its occurrences."""
        if len(word) < 2:
            return [word + EOW]
        w = [*word[:-1], word[-1] + EOW]
        get = self.ranks.get
        no_merge = len(self.merges)  # a rank above every merge's: the pair is no merge
        merged = self.merged
        rs = list(map(get, zip(w, w[1:]), repeat(no_merge)))
        while rs and (r := min(rs)) != no_merge:
            i = rs.index(r)
            # the usual case: one occurrence, and only its neighbours' pairs change
            if rs.count(r) == 1:
                ab = merged[r]  # w[i] + w[i + 1]
                del w[i + 1]
                w[i] = ab
                if i + 1 < len(w):
                    rs[i] = get((ab, w[i + 1]), no_merge)
                    del rs[i + 1]
                else:
                    del rs[i]
                if i:
                    rs[i - 1] = get((w[i - 1], ab), no_merge)
                continue
            w = merge_pair(w, *self.merges[r])
            rs = list(map(get, zip(w, w[1:]), repeat(no_merge)))
        return w

    def _pieces(self, word):
        """word -> its pieces with '@@' on non-final ones: 'lowest' -> ('lo@@', 'west')."""
        if not word:
            return ()
        *first, last = self._merge(word)
        return tuple(p + CONTINUE for p in first) + (last[: -len(EOW)],)

    def segment(self, word):
        """'lowest' -> ['lo', 'west']: the pieces of one word, without '@@'."""
        pieces = self.pieces[word]
        return [p[: -len(CONTINUE)] for p in pieces[:-1]] + list(pieces[-1:])

    def apply_words(self, words):
        """['lowest', 'new'] -> ['lo@@', 'west', 'new']: pieces, '@@' on non-final ones."""
        return [p for w in words for p in self.pieces[w]]

    def apply(self, line):
        """'the lowest' -> 'the lo@@ west', as subword-nmt apply-bpe: words split on ' ' only."""
        line = line.strip("\r\n ")
        words = line.split(" ")
        if "  " in line:  # runs of ' ' give '' words
            words = [w for w in words if w]
        # a word met for the first time is merged by _Cache.__missing__ ('' gives '')
        return " ".join(map(self.joined.__getitem__, words))

    def save(self, path):  # a codes file of subword-nmt
        write_text(path, "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in self.merges))

    # subword-nmt's codes or fastBPE's (XLM's released models): read_codes, below the ruler
    @classmethod
    def load(cls, path):
        return cls(read_codes(path))

# -----------------------------------------------------------------------------
# 4. Vocabularies (XLM data/dictionary.py, fastBPE getvocab) and the three regimes of paper §4.2

class Vocab:
    """Token <-> id: `tokens` without the specials, which come first (tokens[0] gets id 14)."""

    def __init__(self, tokens, counts=None):
        self.tokens = SPECIALS + list(tokens)
        self.counts = [0] * N_SPECIAL + list(counts or [0] * len(tokens))
        self.index = {t: i for i, t in enumerate(self.tokens)}
        # one token per id, each fit for XLM's 'token count' dictionary files
        fit = all(t and not SPACE_RE.search(t) for t in self.tokens)
        if len(self.index) < len(self.tokens) or not fit:
            raise ValueError("Vocab: a token is empty, contains whitespace or appears twice")

    def __len__(self):
        return len(self.tokens)


class Tokenizer:
    """Text -> ids for one run: pretokenize (+ lowercasing), BPE, language marks, vocabulary.

    Regimes (paper §4.2, Table 1 "anchor points"):
      joint     one BPE learned on all languages (equal numbers of lines per language), one
                vocabulary: every identical string is one token (the default model, mBERT/XLM style)
      separate  one BPE per language; the union of the per-language vocabularies: strings that
                happen to be identical in both languages (digits, names, punctuation) are the only
                anchors
      prefixed  one BPE per language and every token marked with its language ('en:the', 'fr:le'):
                no shared token except the 14 specials ("no anchors")
    separate_vocab=True gives every language its own id space (separate embeddings, `--sep emb`)."""

    def __init__(self, langs, mode, bpes, vocabs, lowercase=False, separate_vocab=False):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.langs = list(langs)
        self.mode = mode
        self.lowercase = lowercase
        self.separate_vocab = separate_vocab
        self.bpes = bpes  # lang -> BPE (one for all in joint mode)
        self.vocabs = vocabs  # lang -> Vocab
        self.anchors = None  # tokens seen in more than one language; set by build()

    @classmethod
    def build(cls, train_files, mode="joint", num_merges=80000, separate_vocab=False,
              lowercase=False, max_lines=None, min_freq=2, seed=0, verbose=True):
        """Learn BPE and vocabularies from {lang: path} (paper: joint 80k merges, else 40k per
        language). joint learns on the same number of lines from every language (XLM samples 10M
        lines each with `shuf`): larger corpora are down-sampled, seeded; vocabularies count all."""
        tok = cls(train_files, mode, {}, {}, lowercase, separate_vocab)
        langs = tok.langs
        log = print if verbose else lambda *args: None
        counts = {}  # lang -> Counter of words
        n_lines = {}
        for lang in langs:
            counts[lang] = words = Counter()
            n = 0
            for n, line in enumerate(read_lines(train_files[lang], max_lines), 1):
                words.update(tok.words(line, lang))
            if not words:
                raise ValueError(f"{train_files[lang]}: empty corpus (no words in {n} lines)")
            n_lines[lang] = n
        if mode == "joint":
            n_min = min(n_lines.values())
            learn_counts = Counter()
            for k, lang in enumerate(langs):
                if n_lines[lang] == n_min:
                    learn_counts.update(counts[lang])
                    continue
                rng = np.random.default_rng([seed, k])
                keep = set(rng.choice(n_lines[lang], n_min, replace=False).tolist())
                for n, line in enumerate(read_lines(train_files[lang], max_lines)):
                    if n in keep:
                        learn_counts.update(tok.words(line, lang))
            log(f"joint BPE: learning {num_merges} merges on {n_min} lines per language")
            merges = learn_bpe(learn_counts, num_merges, min_freq, verbose=verbose)
            tok.bpes = dict.fromkeys(langs, BPE(merges))
        else:
            for lang in langs:
                log(f"{mode} BPE [{lang}]: learning {num_merges} merges on {n_lines[lang]} lines")
                tok.bpes[lang] = BPE(learn_bpe(counts[lang], num_merges, min_freq, verbose=verbose))
        token_counts = {lang: Counter() for lang in langs}  # every word's pieces x its count
        for lang in langs:
            for word, c in counts[lang].items():
                for piece in tok.pieces([word], lang):
                    token_counts[lang][piece] += c

        # fastBPE getvocab order: count descending, ties alphabetical
        def vocab(tc):
            return Vocab(*zip(*sorted(tc.items(), key=lambda kv: (-kv[1], kv[0]))))

        if separate_vocab:
            tok.vocabs = {lang: vocab(token_counts[lang]) for lang in langs}
        else:
            tok.vocabs = dict.fromkeys(langs, vocab(sum(token_counts.values(), Counter())))
        n_langs_of = Counter(t for tc in token_counts.values() for t in tc)
        tok.anchors = {t for t, n in n_langs_of.items() if n > 1}  # identical strings
        sizes = ", ".join(f"{lang} {tok.vocab_size(lang)}" for lang in langs)
        log(f"vocabulary ({mode}{', separate ids' if separate_vocab else ''}): {sizes}; "
            f"anchors (tokens seen in more than one language): {len(tok.anchors)}")
        return tok

    def vocab_size(self, lang):
        return len(self.vocabs[lang])

    def words(self, line, lang):
        """Pretokenised words of a raw line (lowercased if so), cut by cap_words."""
        if self.lowercase:
            line = lowercase_and_strip_accents(line)
        return cap_words(pretokenize(line, lang))

    def pieces(self, words, lang):
        """Words -> BPE pieces with '@@'; prefixed: 'hel@@' in en -> 'en:hel@@'."""
        pieces = self.bpes[lang].apply_words(words)
        return [f"{lang}:{p}" for p in pieces] if self.mode == "prefixed" else pieces

    def tokenize(self, line, lang):
        """'Hello, world!' -> ['Hel@@', 'lo', ',', 'world', '!'] (prefixed: ['en:Hel@@', ...])."""
        return self.pieces(self.words(line, lang), lang)

    def encode(self, line, lang):
        """A raw line -> ids (no </s> added). Pieces missing from the vocabulary become UNK_ID."""
        return [self.vocabs[lang].index.get(p, UNK_ID) for p in self.tokenize(line, lang)]

    def encode_words(self, words, lang):
        """Already-split words -> ids per word, as encode gives them ([UNK_ID] for none)."""
        return [self.encode(word, lang) or [UNK_ID] for word in words]

    def to_dict(self):
        """Plain types (torch.load(weights_only=True)); a shared BPE or Vocab is stored once."""
        langs = self.langs

        # {lang: value}'s distinct values in language order (by identity), each language's index
        def stored_once(of):
            distinct = list(dict.fromkeys(of[l] for l in langs))
            return distinct, {l: distinct.index(of[l]) for l in langs}
        bpes, bpe_of = stored_once(self.bpes)
        vocabs, vocab_of = stored_once(self.vocabs)
        return {"format": "bpe.Tokenizer/1", "langs": list(langs), "mode": self.mode,
                "lowercase": bool(self.lowercase), "separate_vocab": bool(self.separate_vocab),
                "bpes": [[list(m) for m in b.merges] for b in bpes], "bpe_of": bpe_of,
                "vocabs": [{"tokens": v.tokens[N_SPECIAL:], "counts": v.counts[N_SPECIAL:]}
                           for v in vocabs], "vocab_of": vocab_of}

    @classmethod
    def from_dict(cls, d):
        langs = d["langs"]
        bpes = [BPE(m) for m in d["bpes"]]
        vocabs = [Vocab(v["tokens"], v["counts"]) for v in d["vocabs"]]
        return cls(langs, d["mode"], {l: bpes[d["bpe_of"][l]] for l in langs},
                   {l: vocabs[d["vocab_of"][l]] for l in langs}, d.get("lowercase", False),
                   d.get("separate_vocab", False))

    def save(self, path):  # tokenizer.json: to_dict's record
        write_text(path, dumps(self.to_dict(), ensure_ascii=False))

    @classmethod
    def load(cls, path):
        """A tokenizer.json of save; else ValueError naming the file."""
        try:
            return cls.from_dict(read_json(path))
        except (KeyError, ValueError, TypeError, IndexError) as e:  # not UTF-8 or JSON, other JSON
            kind = "not JSON" if isinstance(e, JSONDecodeError) else type(e).__name__
            raise ValueError(f"{path}: not a tokenizer.json written by bpe.py ({kind}: "
                             f"{e})") from None

# -----------------------------------------------------------------------------
# 5. Code-switching: extra anchors (paper §4.2), applied once, when the training text is prepared

def code_switch(words, dictionary, rng, p=0.3, max_frac=0.15):
    """Extra anchors (paper §4.2): a word found in `dictionary` {word: [translations]} (else
    lowercased, as MUSE; Titlecase stays Titlecase) is picked with probability p,
    floor(max_frac * len(words)) at most, and replaced by one of its translations, uniformly.
    `rng`: random.Random or numpy Generator. Example:
    ['the', 'cat', 'sleeps'], {'cat': ['chat']}, p=1, max_frac=1 -> ['the', 'chat', 'sleeps']."""
    picked = []  # (position, translations)
    for i, word in enumerate(words):
        key = word if word in dictionary else word.lower()
        if key in dictionary and rng.random() < p:
            fix = str.capitalize if key != word and word[:1].isupper() else str
            picked.append((i, [fix(t) for t in dictionary[key]]))
    cap = int(max_frac * len(words))
    if len(picked) > cap:
        order = sorted(range(len(picked)), key=lambda k: rng.random())
        picked = [picked[k] for k in sorted(order[:cap])]
    out = list(words)
    for i, translations in picked:
        k = min(int(rng.random() * len(translations)), len(translations) - 1)
        out[i] = translations[k]
    return out

# -----------------------------------------------------------------------------
# 6. Binarisation: text -> ids -> one flat array with </s> after every sentence (XLM index_data)

CHUNK_LINES = 2000
_WORKER = {}  # binarize's arguments, here and in its Pool's workers


def _encode_chunk(chunk):
    """[(line number, line), ...] -> (uint32 ids, EOS_ID after each line; the chunk's bytes; its
    n_tokens, n_sentences, n_words, n_unk and n_switched, the words code-switched)."""
    opts = _WORKER
    tok = opts["tok"]
    lang = opts["lang"]
    ids = []
    n_words = 0
    n_switched = 0
    for n, line in chunk:
        words = tok.words(line, lang)
        n_words += len(words)
        if opts["code_switch"] is None:
            pieces = tok.pieces(words, lang)
        else:
            # the rng depends only on (seed, line number): the output is the same for any --workers
            rng = random.Random(opts["seed"] * 1_000_003 + n)
            switched = code_switch(words, opts["code_switch"], rng, opts["p"], opts["max_frac"])
            n_switched += sum(a != b for a, b in zip(words, switched))
            pieces = [p for a, b in zip(words, switched)
                      for p in tok.pieces([b], lang if a == b else opts["cs_lang"])]
        ids.extend(tok.vocabs[lang].index.get(p, UNK_ID) for p in pieces)
        ids.append(EOS_ID)
    ids = np.array(ids, dtype=np.uint32)
    n_bytes = sum(len(line.encode()) + 1 for _, line in chunk)
    counts = {"n_tokens": len(ids), "n_sentences": len(chunk), "n_words": n_words,
              "n_unk": int(np.count_nonzero(ids == UNK_ID)), "n_switched": n_switched}
    return ids, n_bytes, counts


def binarize(text_path, tok, lang, out_prefix, workers=1, code_switch=None, p=0.3, max_frac=0.15,
             seed=0, verbose=True):
    """A text file -> `out_prefix.bin` (flat ids, EOS_ID after every line; uint16 if the vocabulary
    fits) and `out_prefix.json`, streamed in chunks by `workers`. `code_switch`: a dictionary to
    code-switch the text with (paper §4.2, done here once); a replaced word gets the BPE of the
    other language and `lang`'s vocabulary, so this needs two languages and one shared id space."""
    if code_switch is not None and (tok.separate_vocab or len(tok.langs) != 2):
        raise ValueError("code-switching needs two languages and one shared vocabulary "
                         "(separate_vocab=False)")
    cs_lang = next((l for l in tok.langs if l != lang), None)  # the language of the translations
    vocab_size = tok.vocab_size(lang)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    lines = enumerate(read_lines(text_path), 1)  # (line number, line)
    chunks = iter(lambda: list(islice(lines, CHUNK_LINES)), [])
    totals = Counter()
    bar = tqdm(total=getsize(text_path), unit="B", unit_scale=True,
               desc=f"binarize {basename(text_path)}",
               disable=not verbose or not sys.stderr.isatty())
    _WORKER.update(tok=tok, lang=lang, code_switch=code_switch, cs_lang=cs_lang, p=p,
                   max_frac=max_frac, seed=seed)
    pool = _pool(workers, dict(_WORKER)) if workers > 1 else None
    try:
        results = pool.imap(_encode_chunk, chunks) if pool else map(_encode_chunk, chunks)
        with atomic_path(out_prefix + ".bin") as tmp, open(tmp, "wb") as f:
            for ids, n_bytes, counts in results:
                f.write(ids.astype(dtype).tobytes())
                totals.update(counts)
                bar.update(n_bytes)
            if totals["n_words"] == 0:  # blank lines alone would be a corpus of </s>
                raise ValueError(f"{text_path}: empty corpus (no words in {totals['n_sentences']} "
                                 "lines)")
    finally:
        bar.close()
        _WORKER.clear()
        if pool:
            pool.terminate()
    n_switched = totals.pop("n_switched")
    meta = {"dtype": dtype.__name__, **totals, "vocab_size": vocab_size, "lang": lang}
    if code_switch is not None:
        meta["n_switched"] = n_switched
    write_text(out_prefix + ".json", dumps(meta) + "\n")
    return meta

# ==================================================================================================
# Plumbing: the fast learner, files, the command-line helpers of every script, data preparation

# -----------------------------------------------------------------------------
# Speed: learn_bpe (learn_bpe_simple's merges, fast) and BPE.apply's per-word cache

def learn_bpe(word_counts, num_merges, min_freq=2, verbose=False):
    """Same merges as learn_bpe_simple, faster: a merge only touches the words that contain the
    pair (`where`), and a heap of (-count, key(left), key(right), pair) finds the best one. An
    out-of-date entry is re-pushed with its current count; counts only grow through a push, so a
    current top is the best."""
    if num_merges < 1 or min_freq < 1:
        raise ValueError(f"learn_bpe: num_merges and min_freq must be >= 1, got {num_merges} and "
                         f"{min_freq}")
    bad = [w for w in word_counts if not w or SPACE_RE.search(w)]
    if bad:
        raise ValueError(f"learn_bpe: word {bad[0]!r} is empty or contains whitespace; split lines "
                         "with pretokenize")
    words = [[*w[:-1], w[-1] + EOW] for w, f in word_counts.items() if f > 0]  # lists of symbols
    freqs = [int(f) for f in word_counts.values() if f > 0]
    if not words:
        raise ValueError("learn_bpe: empty corpus (no words with a positive count)")
    stats = defaultdict(int)  # pair -> count
    where = defaultdict(set)  # pair -> indices of the words that have it
    for j, (w, f) in enumerate(zip(words, freqs)):
        for pair in zip(w, w[1:]):
            stats[pair] += f
            where[pair].add(j)
    # heapq is a min-heap and ties go to the largest pair: key() sorts strings in reverse, a prefix
    # last: key('b') = (-98, 1) < key('ab') = (-97, -98, 1) < key('a') = (-97, 1)
    key = functools.cache(lambda s: tuple(-ord(c) for c in s) + (1,))
    heap = [(-c, key(a), key(b), (a, b)) for (a, b), c in stats.items()]
    heapq.heapify(heap)
    merges = []
    bar = tqdm(total=num_merges, desc="learn bpe", disable=not verbose or not sys.stderr.isatty(),
               mininterval=1)
    while len(merges) < num_merges:
        # pop stale entries until the top one is current (lazy deletion)
        while heap:
            negc, key_a, key_b, pair = heap[0]
            c = stats.get(pair, 0)
            if c == -negc:
                break
            if c > 0:
                heapq.heapreplace(heap, (-c, key_a, key_b, pair))
            else:
                heapq.heappop(heap)
        if not heap or -heap[0][0] < min_freq:  # else `pair` is the current top: the best pair
            break
        merges.append(pair)
        bar.update(1)
        a, b = pair
        ab = a + b
        grown = defaultdict(set)  # pair whose count went up -> the words that now have it
        for j in where.pop(pair):
            # merge_pair, moving neighbour counts: x a b y -> x ab y turns (x, a), (b, y) into
            # (x, ab), (ab, y); in a b a b -> ab ab, the second turns (b, a) into (ab, ab) alone
            w = words[j]
            f = freqs[j]
            new = []
            i = 0
            n = len(w)
            while i < n:
                if w[i] == a and i + 1 < n and w[i + 1] == b:
                    if new:
                        stats[w[i - 1], a] -= f
                        stats[new[-1], ab] += f
                        grown[new[-1], ab].add(j)
                    if i + 2 < n and not (w[i + 2] == a and i + 3 < n and w[i + 3] == b):
                        right = w[i + 2]
                        stats[b, right] -= f
                        stats[ab, right] += f
                        grown[ab, right].add(j)
                    new.append(ab)
                    i += 2
                else:
                    new.append(w[i])
                    i += 1
            if len(new) < n:  # else a stale index entry: the word lost the pair
                words[j] = new
        del stats[pair]
        for p, js in grown.items():  # pushed once, after all words are updated
            where[p] |= js
            heapq.heappush(heap, (-stats[p], key(p[0]), key(p[1]), p))
    bar.close()
    if verbose and len(merges) < num_merges:
        print(f"note: {len(merges)} merges learned, not the {num_merges} asked: no pair of symbols "
              f"is left that occurs {min_freq} times or more (min_freq)")
    return merges


# characters; far above a real word's length (a long German compound has some 40)
MAX_WORD = 100


def cap_words(words):
    """Words over MAX_WORD characters cut into words of MAX_WORD: BPE's time over a word grows with
    its length times its merges. subword-nmt, fastBPE and model.py's export cut nothing."""
    if max(map(len, words), default=0) <= MAX_WORD:
        return words
    return [w[i:i + MAX_WORD] for w in words for i in range(0, len(w), MAX_WORD)]


STOP_SIGNALS = (SIGINT, SIGTERM)  # Ctrl-C and kill: prepare stops cleanly


def _pool(workers, opts):
    """binarize's Pool: its workers ignore Ctrl-C and die of SIGTERM (pool.terminate's)."""
    blocked = pthread_sigmask(SIG_BLOCK, STOP_SIGNALS)
    try:
        return multiprocessing.Pool(workers, _pool_worker, (opts,))
    finally:
        pthread_sigmask(SIG_SETMASK, blocked)


def _pool_worker(opts):
    signal(SIGINT, SIG_IGN)
    signal(SIGTERM, SIG_DFL)
    pthread_sigmask(SIG_UNBLOCK, STOP_SIGNALS)
    _WORKER.update(opts)


# -----------------------------------------------------------------------------
# Files: atomic writes, UTF-8 lines, parallel text, codes, tokenizer.json, .bin headers, MUSE

@contextmanager
def atomic_path(path):
    """Yields path.PID.tmp to write, renamed to `path` at the end, removed by any failure."""
    tmp = f"{path}.{getpid()}.tmp"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            remove(tmp)
        raise


# a UTF-8 text file (a string, or strings one after another), through atomic_path
def write_text(path, text):
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines([text] if isinstance(text, str) else text)


def read_json(path):  # a UTF-8 JSON file's value
    with open(path, encoding="utf-8") as f:
        return json_load(f)


def read_lines(path, max_lines=None):
    """The first max_lines lines of a UTF-8 file, split on \\n only (XNLI test files have a stray
    \\r inside lines), a byte order mark at its start dropped (Windows editors write one); a bad
    byte raises InputError naming file:line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(islice(f, max_lines), 1):
            try:
                yield raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{n}: not valid UTF-8 ({e.reason} at byte "
                                 f"{e.start})") from None


def read_parallel(src_path, tgt_path, max_lines=None, same_ok=False):
    """Two line-aligned files -> their first max_lines lines; unequal, empty, one file: refused."""
    if not same_ok and isfile(src_path) and isfile(tgt_path) and samefile(src_path, tgt_path):
        raise InputError(f"parallel files {src_path} and {tgt_path} are the same file: both sides "
                         "would be one text")
    src = list(read_lines(src_path))
    tgt = list(read_lines(tgt_path))
    if not src and not tgt:
        raise InputError(f"parallel files {src_path} and {tgt_path} are empty")
    if len(src) != len(tgt):
        raise InputError(f"parallel files differ in length: {src_path} has {len(src)} lines, "
                         f"{tgt_path} has {len(tgt)}")
    return src[:max_lines], tgt[:max_lines]


def read_codes(path):
    """Codes of subword-nmt ('#version: 0.2', then 'left right' per line) or of fastBPE ('left right
    count', no header: XLM's codes_enfr) -> [(left, right), ...]: both put '</w>' on a word's last
    symbol, so one BPE serves both."""
    # as subword-nmt reads them: trailing newlines dropped, then one line per merge
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().rstrip("\n").split("\n")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a codes file (not valid UTF-8: {e.reason} at byte "
                         f"{e.start})") from None
    nmt = lines[0].split() in (["#version:", "0.2"], ["#version:", "0.2.0"])  # else fastBPE's
    expected = "'left right'" if nmt else ("'left right count' (fastBPE) or a first line "
                                           "'#version: 0.2' (subword-nmt)")
    merges = []
    for n, line in enumerate(lines[nmt:], 1 + nmt):
        parts = line.strip("\r\n ").split(" ")
        if len(parts) != 3 - nmt or not all(parts) or not (nmt or parts[2].isdigit()):
            raise InputError(f"{path}:{n}: expected {expected}, got {line[:60]!r}")
        merges.append((parts[0], parts[1]))
    return merges


# -> (read-only np.memmap of the ids, meta dict) for files written by binarize()
def load_bin(out_prefix):
    path = out_prefix + ".json"
    try:
        meta = read_json(path)
        if not (isinstance(meta, dict) and meta.get("dtype") in ("uint16", "uint32")
                and all(isinstance(meta.get(k), int) for k in ("n_tokens", "n_sentences"))):
            raise ValueError("no dtype, n_tokens and n_sentences")
    except ValueError as e:  # not UTF-8, not JSON, other JSON
        raise ValueError(f"{path}: not a header written by bpe.binarize ({e})") from None
    data = np.memmap(out_prefix + ".bin", dtype=meta["dtype"], mode="r")
    if len(data) != meta["n_tokens"]:
        raise ValueError(f"{out_prefix}.bin has {len(data)} ids, its .json says {meta['n_tokens']}")
    return data, meta


def read_dictionary(path):
    """A MUSE dictionary ('source target' per line) -> [(source, target), ...] in order."""
    pairs = []
    for n, line in enumerate(read_lines(path), 1):
        parts = line.split()
        if len(parts) == 2:
            pairs.append(tuple(parts))
        elif parts:
            raise InputError(f"{path}:{n}: expected 'source target', got {' '.join(parts)!r}")
    if not pairs:
        raise InputError(f"{path}: the dictionary is empty")
    return pairs


def checkpoint_tokenizer(extra, path, xlm_codes=None):
    """(Tokenizer, langs) of a checkpoint: best.pt's, or an XLM dictionary with fastBPE codes."""
    if "xlm_vocab" in extra:
        if not xlm_codes:
            raise InputError(f"{path}: an XLM checkpoint; give its fastBPE codes file with "
                             "--xlm-codes (codes_enfr)")
        words = list(extra["xlm_vocab"])[N_SPECIAL:]
        langs = list(extra["langs"])
        lowercase = all(w == w.lower() for w in words)  # no upper case: lowercased (XLM-15)
        codes = dict.fromkeys(langs, BPE.load(xlm_codes))  # one BPE
        vocabs = dict.fromkeys(langs, Vocab(words))
        return Tokenizer(langs, "joint", codes, vocabs, lowercase), langs
    if xlm_codes:
        raise InputError(f"--xlm-codes {xlm_codes}: {path} is not an XLM checkpoint (its own "
                         "tokenizer is inside)")
    if "tokenizer" not in extra or "langs" not in extra:
        raise InputError(f"{path}: the checkpoint has no tokenizer and languages (use "
                         "pretrain.py's best.pt)")
    return Tokenizer.from_dict(extra["tokenizer"]), list(extra["langs"])

# -----------------------------------------------------------------------------
# Command-line helpers shared by pretrain.py, finetune.py, align.py, cka.py

class InputError(ValueError):
    """A bad input, the whole message: a flag's value (code 2: usage) or a file and line (1)."""
    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.code = code


@contextmanager
def reported(parser):
    """Each main's one place for a bad input: an InputError (any file's) -> one line."""
    try:
        yield
    except ValueError as e:
        if type(e).__name__ != "InputError":
            raise
        if getattr(e, "code", 1) == 2 and parser:
            parser.error(str(e))
        raise SystemExit(f"error: {e}") from None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help: each flag's default after its help, unless its help says it, or None, or off."""
    def _get_help_string(self, action):
        if action.default is None or action.default is False or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def number(lo, hi=math.inf, cast=int, many=False, above=False, upto=False):
    """A finite number in [lo, hi) (`above`: (lo, `upto`: hi]); `many`: a comma list of them."""
    def parse(s):
        try:
            values = [cast(x) for x in s.split(",") if x.strip()] if many else [cast(s)]
        except ValueError:
            values = []
        in_range = all((lo < x if above else lo <= x) and (x <= hi if upto else x < hi)
                       and math.isfinite(x) for x in values)
        if not values or not in_range:
            kind = "integer" if cast is int else "number"
            raise argparse.ArgumentTypeError(
                f"expected {f'a comma list of {kind}s' if many else f'one {kind}'} in "
                f"{'(' if above else '['}{lo}, {hi}{']' if upto else ')'}, got {s!r}")
        if len(set(values)) < len(values):
            raise argparse.ArgumentTypeError(f"{s!r} gives a value twice: each value is one set of "
                                             "the grid")
        return values if many else values[0]
    return parse


def toy_data(args):
    """`--toy DIR` (deprecated) becomes `--toy --data DIR`, with a note -> the flag of the data."""
    if not isinstance(args.toy, str):
        return "--data"
    print(f"note: --toy {args.toy} is deprecated and will be removed; use --toy --data {args.toy}",
          file=sys.stderr)
    if args.data is not None:
        raise InputError(f"--toy {args.toy} and --data {args.data}: give one data directory (--toy "
                         "--data DIR)")
    args.data = args.toy
    args.toy = True
    return "--toy"


def check_src_tgt(args):
    """align.py and cka.py: --src and --tgt, codes of letters, differ unless --ckpt2."""
    for flag, code in (("--src", args.src), ("--tgt", args.tgt)):
        if not code.isalpha():
            raise InputError(f"{flag} {code!r}: expected a language code of letters, e.g. en")
    if args.src == args.tgt and not args.ckpt2:
        raise InputError(f"--src and --tgt are both {args.src!r} in one model: give two languages, "
                         "or --ckpt2 (en-en')")


def out_of_memory(e):
    """Whether an exception is running out of memory (CPU or GPU)."""
    return isinstance(e, MemoryError) or "out of memory" in str(e) or "allocate memory" in str(e)


def encode_bar(lang):
    """The "encode {lang}" bar for model.pool_sentences: (iterable, total) -> iterable."""
    return lambda it, total: tqdm(it, total=total, desc=f"encode {lang}", unit="sent", leave=False,
                                  mininterval=1, disable=not sys.stderr.isatty())


def parse_langs(langs):
    """'en,fr' or ['en', 'fr'] -> ['en', 'fr']: distinct codes of letters, else InputError."""
    langs = langs.split(",") if isinstance(langs, str) else list(langs)
    if not all(map(str.isalpha, langs)) or len(set(langs)) < len(langs):
        raise InputError(f"--langs {','.join(langs)}: expected distinct languages, each a code of "
                         "letters, e.g. en", 2)
    return langs


def parse_lang_files(flag, items, langs):
    """'en=a.txt,fr=b.txt' -> {'en': 'a.txt', 'fr': 'b.txt'}; errors name `flag`."""
    files = {}
    for item in items.split(","):
        lang, eq, path = item.partition("=")
        lang = lang.strip()
        if not eq or not lang or not path:
            raise InputError(f"{flag}: expected LANG=PATH, got {item!r}", 2)
        if lang in files:
            raise InputError(f"{flag}: language '{lang}' given twice", 2)
        if not isfile(path) and not isdir(path):  # a directory: WikiExtractor output
            raise InputError(f"{flag} {item}: no such file", 2)
        for other, other_path in files.items():
            if samefile(other_path, path):
                raise InputError(f"{flag}: {other} and {lang} are the same file {path}", 2)
        files[lang] = path
    if sorted(files) != sorted(langs):
        raise InputError(f"{flag}: languages {','.join(sorted(files))} do not match --langs "
                         f"{','.join(langs)}", 2)
    return files


def checkpoint_lang(langs, lang, head, tail=""):
    """The index of `lang` in a checkpoint's `langs`, or InputError "{head} not one of ..."."""
    if lang not in langs:
        raise InputError(f"{head} not one of the checkpoint's languages {list(langs)}{tail}")
    return list(langs).index(lang)


@contextmanager
def write_errors(path):
    """A failed write of `path` (a full disk too) stops the program in one line."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "unexpected pos" not in str(e):
            raise
        if isinstance(e, RuntimeError) or e.errno == errno.ENOSPC:
            raise SystemExit(f"error: no space left writing {path}") from None
        raise SystemExit(f"error: cannot write {path}: {e.strerror or e}") from None


def atomic_write(path, write):
    """write(tmp) writes `path` through atomic_path; a failure is one line (write_errors)."""
    with write_errors(path), atomic_path(path) as tmp:
        write(tmp)


def make_dir(flag, path):
    """os.makedirs, or one line saying why the directory of `flag` cannot be used."""
    try:
        makedirs(path, exist_ok=True)
    except FileExistsError:  # a file, not a directory
        raise InputError(f"{flag} {path}: exists and is not a directory") from None
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot create the directory: {e.filename}: "
                         f"{e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: the directory is not writable")


def _flock(path, busy):
    """`path` opened, flocked by this process and emptied; else InputError(busy(what it holds)).
    A holder removes the file before it lets go: a file removed so is locked anew."""
    while True:
        f = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with f:
                f.seek(0)
                raise InputError(busy(f.read().strip())) from None
        if os.fstat(f.fileno()).st_nlink:
            f.truncate(0)
            return f
        f.close()


@contextmanager
def locked(out, prog, made_too=(), master=True):
    """--out made and locked by one process of `prog` (OUT/.lock: its pid; under DDP the master's,
    for all ranks); on failure the empty dirs it made (--out, made_too) go again."""
    new = set()
    for path in map(abspath, [out, *made_too]):
        while not exists(path):
            new.add(path)
            path = os.path.dirname(path)
    make_dir("--out", out)
    lock = join(out, ".lock")

    def busy(pid):
        return (f"--out {out} is in use by another {prog} (pid {pid} in {lock}); wait for it to "
                "end, or use another --out")

    with _flock(lock, busy) if master else open(os.devnull, "w") as f:
        print(getpid(), file=f, flush=True)
        try:
            yield
        finally:
            if master:
                remove(lock)
            if sys.exc_info()[0]:  # failed: remove the new dirs, a child (a longer path) first
                for d in sorted(new, key=len, reverse=True):
                    with suppress(OSError):  # not empty: kept
                        os.rmdir(d)


# -----------------------------------------------------------------------------
# Data preparation for pretrain.py (nanoGPT's prepare.py): tokenizer + binarised splits; the CLI

# Wikipedia through WikiExtractor (XLM's get-data-wiki.sh): <doc> blocks, shuffled (XLM's shuf).
# XLM holds out 5000 valid (and 5000 test) lines per language; at most a tenth of a small corpus
DEV_LINES = 5000
# XLM's `get_seeded_random 42`; fixed, whatever --seed is, so that every run sees the same split
SHUFFLE_SEED = 42
# the shuffle holds one bucket of about this many bytes in memory at a time
SHUFFLE_BUCKET_BYTES = 1 << 28


def wikiextractor_files(path):
    """The text files of a WikiExtractor directory in order (AA/wiki_00, AA/wiki_01, ...)."""
    found = sorted(join(d, f) for d, _, names in os.walk(path) for f in names
                   if f.startswith("wiki_"))
    packed = [f for f in found if f.endswith(".bz2")]
    if packed:
        raise InputError(f"{packed[0]}: compressed WikiExtractor output (--compress); unpack it "
                         "with bunzip2 first")
    if not found:
        raise InputError(f"{path}: a directory without WikiExtractor files (AA/wiki_00, ...)")
    return found


def read_wikiextractor(path):
    """A WikiExtractor directory's lines but <doc>, </doc> and blank ones (get-data-wiki.sh)."""
    for name in wikiextractor_files(path):
        start = None  # the line of the open <doc>
        for n, line in enumerate(read_lines(name), 1):
            if line.startswith("<doc ") and line.endswith(">"):
                if start:
                    raise InputError(f"{name}:{n}: <doc> inside the <doc> of line {start} (not "
                                     "WikiExtractor output)")
                start = n
            elif line == "</doc>":
                if not start:
                    raise InputError(f"{name}:{n}: </doc> without <doc ...> (not WikiExtractor "
                                     "output)")
                start = None
            elif line.strip():
                if not start:
                    raise InputError(f"{name}:{n}: text outside <doc ...> ... </doc> (not "
                                     f"WikiExtractor output): {line[:60]!r}")
                yield line
        if start:
            raise InputError(f"{name}:{start}: <doc> never closed by </doc> (a truncated file?)")


def shuffle_split(lines, size, work_dir, train_path, dev_path=None, seed=SHUFFLE_SEED):
    """Non-empty `lines` (~`size` bytes) shuffled in bucket files to train_path, min(DEV_LINES,
    n // 10) of them to dev_path."""
    rng = np.random.default_rng(seed)
    n_buckets = 1 + size // SHUFFLE_BUCKET_BYTES
    makedirs(work_dir, exist_ok=True)
    buckets = [join(work_dir, f"bucket{k}.txt") for k in range(n_buckets)]
    n = 0
    try:
        with ExitStack() as files:
            outs = [files.enter_context(open(b, "w", encoding="utf-8", newline="\n"))
                    for b in buckets]
            lines = (line for line in lines if line.strip())
            for chunk in iter(lambda: list(islice(lines, 1 << 16)), []):
                for line, k in zip(chunk, rng.integers(n_buckets, size=len(chunk)).tolist()):
                    outs[k].write(line + "\n")
                n += len(chunk)
        n_dev = min(DEV_LINES, n // 10) if dev_path else 0

        def shuffled():  # bucket by bucket, each in a random order
            for b in buckets:
                with open(b, "rb") as f:
                    part = f.read().decode("utf-8").split("\n")[:-1]
                remove(b)
                yield from (part[i] + "\n" for i in rng.permutation(len(part)).tolist())
        order = shuffled()
        if n_dev:
            write_text(dev_path, islice(order, n_dev))
        write_text(train_path, order)
    finally:
        rmtree(work_dir, ignore_errors=True)
    return n - n_dev, n_dev


# a dev split with fewer words cannot measure a perplexity (best.pt is chosen on it)
MIN_DEV_WORDS = 20
# lines per language read to check a --code-switch dictionary against the text
CS_SAMPLE_LINES = 20000
# lines of each text whose letters are counted: Han-script text must be zh (_check_text)
CHECK_SCRIPT_LINES = 1000
# what a prepared folder records and a run must match: key -> (pretrain.py's flag, bpe.py's)
RECIPE_FLAGS = {"langs": ("--langs", "--langs"), "bpe": ("--bpe", "--mode"),
                "merges": ("--merges", "--merges"),
                "separate_vocab": ("--sep emb/tok", "--separate-vocab"),
                "lowercase": ("--lowercase", "--lowercase"),
                "code_switch_sha1": ("--code-switch", "--code-switch")}


# the sha1 of a --code-switch dictionary: a recipe names it by its contents
def file_sha1(path):
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha1").hexdigest()
    except OSError as e:
        why = {errno.ENOENT: "no such file", errno.EISDIR: "not a file"}.get(e.errno)
        raise InputError(f"--code-switch {path}: {why or 'cannot read: ' + e.strerror}") from None


def read_text(path, max_lines=None):  # the lines of a text file or of a WikiExtractor directory
    if isdir(path):
        return islice(read_wikiextractor(path), max_lines)
    return read_lines(path, max_lines)


# the files prepare writes in its folder (then `done`, last: the folder is complete)
def prepared_files(langs):
    return ["tokenizer.json", "recipe.json"] + [f"{l}.{s}.{x}" for l in langs
                                                for s in ("train", "dev") for x in ("bin", "json")]


def _missing(folder, langs):
    """What a prepared folder lacks: `done`, a file, or a .bin of the size `done` records."""
    done_path = join(folder, "done")
    if not isfile(done_path):
        return ["done"]
    sizes = {}  # .bin file -> its size; a `done` made by hand records none
    with suppress(ValueError, TypeError):
        sizes = dict(read_json(done_path))
    missing = []
    for name in prepared_files(langs):
        path = join(folder, name)
        if not isfile(path):
            missing.append(name)
        elif name in sizes and getsize(path) != sizes[name]:
            missing.append(f"the {name} of {sizes[name]} bytes it was written with "
                           f"({getsize(path)} now)")
    return missing


@contextmanager
def _preparing(out):
    """prepare's lock on out/lock (a second process is refused); a failure removes the folder."""
    make_dir("--prep-dir", out)
    path = join(out, "lock")
    f = _flock(path, lambda holder: f"{out} is being prepared by {holder or 'another process'} (it "
               f"holds {path}); wait for it to end, then run the same command: it uses that data")
    for p in glob.glob(join(glob.escape(out), "*.tmp")):  # what a killed process left
        if isdir(p):
            rmtree(p)
        else:
            remove(p)
    print(f"process {getpid()} on {os.uname().nodename}", file=f, flush=True)
    try:
        yield
    except BaseException as e:
        rmtree(out, ignore_errors=True)
        if isinstance(e, InputError) or not isinstance(e, (ValueError, OSError)):
            raise
        # a reader's ValueError names the file; a full disk's OSError none, or a temporary one
        why = e
        if isinstance(e, OSError):
            where = regex.sub(r"\.\d+\.tmp$", "", str(e.filename)) if e.filename else out
            why = f"{where}: {e.strerror or e}"
            if e.errno == errno.ENOSPC:
                why = f"no space left writing in {where}"
        raise InputError(f"data preparation failed: {why}") from None
    finally:
        with suppress(OSError):
            remove(path)
        f.close()


def _show(key, value):
    """A recipe's value as its flag gives it: 'en,fr', 'on', 'none', ..."""
    if key == "langs":
        return ",".join(value)
    if key == "code_switch_sha1" and value:
        return "a dictionary with sha1 " + value[:10]
    if value is None or isinstance(value, bool):
        return {None: "none", True: "on", False: "off"}[value]
    return str(value)


def _check_prepared(data, recipe, program):
    """A prepared --data folder: every file there, its recipe this run's choices; else one line."""
    missing = _missing(data, recipe["langs"])
    if missing:
        raise InputError(f"--data {data}: a prepared folder without {', '.join(missing)}; prepare "
                         "it again: bpe.py prepare on its text makes it anew (or give pretrain.py "
                         "the text)")
    path = join(data, "recipe.json")
    try:
        made = dict(read_json(path))  # else TypeError or ValueError: not a JSON object
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"--data {data}: cannot read {path}: "
                         f"{getattr(e, 'strerror', None) or e}") from None
    cs = made.get("code_switch")
    if "code_switch_sha1" not in made and cs:
        # a recipe from before the digest: the file it named, if unchanged
        unchanged = isfile(cs[0]) and _fingerprint(cs[0]) == cs
        made["code_switch_sha1"] = file_sha1(cs[0]) if unchanged else "unknown"
    diff = []
    for key, flags in RECIPE_FLAGS.items():
        if made.get(key) != recipe[key]:
            # the flag of the program that called
            diff.append(f"{flags[program == 'bpe.py']} {_show(key, made.get(key))} there, "
                        f"{_show(key, recipe[key])} here")
    if diff:
        raise InputError(f"--data {data} was prepared with other choices ({'; '.join(diff)}): give "
                         "the flags it was made with, or prepare the data for these flags (bpe.py "
                         "prepare, or the text as --data)")


def normal_text(text):
    """A text as content, the way a copy differs from it: whitespace collapsed, Unicode NFC."""
    return unicodedata.normalize("NFC", " ".join(text.split()))


def _check_text(path, lang, split, dev=None, allow_overlap=False):
    """A text input of prepare, read whole before anything is written: one line. As content
    (whitespace collapsed, Unicode NFC) -> a dev text's lines; a train text holding most of `dev`
    is refused (unless allow_overlap), some are counted."""
    n = han = letters = texts = words = 0
    found = []
    wanted = set(dev or ())
    # read_lines and wikiextractor_files name the file (and line) at fault
    try:
        for n, line in enumerate(read_text(path), 1):
            # read_lines splits on \n only: a CR left inside a line ends a line of its own
            if "\0" in line or "\r" in line:
                where = path if isdir(path) else f"{path}:{n}"
                if "\0" in line:
                    raise InputError(f"{where}: a NUL character, as in UTF-16 text (convert it to "
                                     "UTF-8, e.g. with iconv -f UTF-16 -t UTF-8)")
                raise InputError(f"{where}: a carriage return (CR) inside the line: lines that end "
                                 "in CR alone (old Mac) would be read glued together; convert them "
                                 f"first, e.g. tr '\\r' '\\n' < {path} > NEW")
            if not line.strip():
                continue
            texts += 1
            # as content (a dev text, or a train text compared with one)
            if split == "dev" or wanted:
                key = normal_text(line)
                if split == "dev" or key in wanted:
                    found.append(key)
            if words < MIN_DEV_WORDS:
                words += len(pretokenize(line, lang))
            if n <= CHECK_SCRIPT_LINES and lang != "zh":
                han += len(regex.findall(r"\p{Han}", line))
                letters += len(regex.findall(r"\p{L}", line))
    except OSError as e:
        raise InputError(f"cannot read {e.filename}: {e.strerror}") from None
    if han > letters / 2:
        raise InputError(f"{path}: Han-script text ({100 * han // max(letters, 1)} % of its "
                         f"letters) under the language code '{lang}': only zh text is split into "
                         "characters (a Chinese line would be one word); give this language as zh "
                         "in --langs")
    if split == "dev" and words < MIN_DEV_WORDS:
        raise InputError(f"{path}: a {lang} dev split of {words} words; at least {MIN_DEV_WORDS} "
                         "are needed to measure a perplexity")
    held_out = dev is None  # a train text: its dev lines are held out of it
    if split == "train" and texts < (10 if held_out else 1):
        why = "to hold out dev lines from (give a dev file)" if held_out else "for a corpus"
        raise InputError(f"{path}: {texts} line(s) of text, too few {why}")
    if not dev:  # a dev text, or a train text to hold dev lines out of
        return found
    found = set(found)
    shared = sum(key in found for key in dev)
    mostly = "" if shared == len(dev) else "mostly "
    if shared > len(dev) / 2 and not allow_overlap:
        raise InputError(f"the {lang} dev set is {mostly}its training text ({shared} of its "
                         f"{len(dev)} lines are training lines, whitespace collapsed, Unicode "
                         "NFC): the dev perplexity, and best.pt chosen on it, would measure what "
                         "is trained on; give another dev set, or --allow-overlap if it is meant")
    if shared:
        print(f"note: {shared} of the {len(dev)} {lang} dev lines are training lines too "
              f"(whitespace collapsed, Unicode NFC): {100 * shared / len(dev):.1f} %, short "
              "sentences that occur in both; a dev set mostly of training lines is refused")


def _code_switching(code_switch, files, langs, lowercase):
    """--code-switch's dictionary -> {lang: {word: [translations]}}; refused if it is wrong."""
    forward = {}
    try:
        for src, tgt in read_dictionary(code_switch):
            forward.setdefault(src, []).append(tgt)
    except ValueError as e:  # read_dictionary names the file and line
        raise InputError(f"--code-switch {e}") from None
    inverse = {}  # in forward's order
    for src, tgts in forward.items():
        for tgt in tgts:
            inverse.setdefault(tgt, []).append(src)
    switch = dict(zip(langs, [forward, inverse]))
    hits = {}  # lang -> [words found in its own column, in the other's]
    total = {}  # lang -> words read
    for l, other in zip(langs, langs[::-1]):
        words = []
        for line in read_text(files[l]["train"], CS_SAMPLE_LINES):
            if lowercase:
                line = lowercase_and_strip_accents(line)
            words += pretokenize(line, l)
        hits[l] = [sum(w in c or w.lower() in c for w in words) for c in (switch[l], switch[other])]
        total[l] = len(words)

    # the share of the words found in the dictionary's `column`, per language
    def found(column):
        return ", ".join(f"{l} {100 * hits[l][column] / max(total[l], 1):.1f} %" for l in langs)
    if sum(hits[l][1] for l in langs) > sum(hits[l][0] for l in langs):
        raise InputError(f"--code-switch {code_switch}: its columns look the wrong way round for "
                         f"--langs {','.join(langs)} (words found as given: {found(0)}; swapped: "
                         f"{found(1)}); it must be '{langs[0]}-word {langs[1]}-word' per line")
    for l in langs:
        if hits[l][0] < max(1, 0.001 * total[l]):
            raise InputError(f"--code-switch {code_switch}: matches almost no {l} word of "
                             f"{files[l]['train']} ({hits[l][0]} of {total[l]} in its first "
                             f"{CS_SAMPLE_LINES} lines); is it a {'-'.join(langs)} dictionary?")
    print(f"code-switching dictionary {code_switch}: words of the text found in it: {found(0)}")
    return switch


def _fingerprint(path):
    """A recipe's record of an input: a file's path, size and time; a WikiExtractor directory's
    path and the sha1 of its files' names, sizes and times."""
    if path is None or not isdir(path):
        return path and [abspath(path), getsize(path), os.stat(path).st_mtime_ns]
    stats = [[relpath(f, path), getsize(f), os.stat(f).st_mtime_ns]
             for f in wikiextractor_files(path)]
    return [abspath(path), hashlib.sha1(dumps(stats).encode()).hexdigest()]


def _text_splits(lang, splits, out):
    """A language's text as files: a WikiExtractor directory's lines, a train text without a dev
    file shuffled into train and held-out dev lines, in out/ -> {"train": path, "dev": path}."""
    paths = dict(splits)
    train = splits["train"]
    dev = splits["dev"]
    dev_txt = join(out, f"{lang}.dev.txt")
    if dev and isdir(dev):  # a WikiExtractor dev directory: its lines in order
        paths["dev"] = dev_txt
        write_text(dev_txt, (line + "\n" for line in read_wikiextractor(dev)))
    if isdir(train) or dev is None:
        held_out = dev_txt if dev is None else None
        paths["train"] = join(out, f"{lang}.train.txt")
        paths["dev"] = held_out or paths["dev"]
        size = sum(map(getsize, wikiextractor_files(train) if isdir(train) else [train]))
        work_dir = join(out, f"shuffle.{getpid()}.tmp")
        n_train, n_dev = shuffle_split(read_text(train), size, work_dir, paths["train"], held_out)
        print(f"{lang}: {train}: {n_train} train lines, shuffled (seed {SHUFFLE_SEED})"
              f"{f', {n_dev} dev lines held out' if held_out else ''}, in {out}")
    return paths


# pretrain.py's main calls it too: there, as in bpe.py's, a bad input is one line
@reported(None)
def prepare(langs, prep_dir, data=None, files=None, mode="joint", merges=80000,
            separate_vocab=False, lowercase=False, max_lines=None, seed=0, code_switch=None,
            workers=1, master=True, program="pretrain.py", allow_overlap=False):
    """Raw text (`files` {lang: {"train": path, "dev": path or None}}, or in `data`) ->
    prep_dir/<mode>-<merges>-<hash>/ (tokenizer.json, {lang}.{train,dev}.bin), reused; a prepared
    `data` folder is used if its recipe matches."""
    langs = parse_langs(langs)
    recipe = {"langs": langs, "bpe": mode, "merges": merges, "separate_vocab": separate_vocab,
              "lowercase": lowercase,
              "code_switch_sha1": file_sha1(code_switch) if code_switch else None}
    if not files:
        if not isdir(data):
            why = "not a directory" if exists(data) else "no such directory"
            raise InputError(f"--data {data}: {why}")
        # DIR/l.s.txt, or DIR/mono/l.s.txt (a toy world)
        files = {l: {s: next(filter(isfile, [join(data, f"{l}.{s}.txt"),
                                             join(data, "mono", f"{l}.{s}.txt")]), None)
                     for s in ("train", "dev")} for l in langs}
        absent = [f"no {l}.{s}.txt (nor mono/{l}.{s}.txt) for language '{l}'" for l in langs
                  for s in ("train", "dev") if not files[l][s]]
        made = [n for n in prepared_files(langs) + ["done"] if isfile(join(data, n))]
        # a prepared folder (with the text and stray files: the text)
        if made and (absent or not _missing(data, langs)):
            _check_prepared(data, recipe, program)
            return data
        if absent:
            raise InputError(f"--data {data}: {absent[0]}")
        if made:
            print(f"note: --data {data}: {', '.join(made)} there but no complete prepared folder: "
                  "its text is prepared")
    switch = {}  # lang -> {word: [translations]}
    if master:
        for l, splits in files.items():  # the dev text first: train is compared with it
            dev = splits["dev"] and _check_text(splits["dev"], l, "dev")
            _check_text(splits["train"], l, "train", dev, allow_overlap)
        if code_switch:
            switch = _code_switching(code_switch, files, langs, lowercase)
    recipe.update(bpe_lines=max_lines, seed=seed, code_switch=_fingerprint(code_switch),
                  sources={l: {s: _fingerprint(p) for s, p in v.items()} for l, v in files.items()})
    if any(v["dev"] is None or any(map(isdir, v.values())) for v in files.values()):
        recipe.update(shuffle_seed=SHUFFLE_SEED, dev_lines=DEV_LINES)  # shuffle_split's choices
    # the directory names of earlier versions: without the dictionary's digest
    hashed = {k: v for k, v in recipe.items() if k != "code_switch_sha1"}
    digest = hashlib.sha1(dumps(hashed, sort_keys=True).encode()).hexdigest()[:10]
    out = join(prep_dir, f"{mode}-{merges}{'-sepvocab' if separate_vocab else ''}-{digest}")
    if not master:
        while _missing(out, langs):  # the other DDP ranks wait for the master's data
            time.sleep(2)
        return out
    # a complete folder is read without the lock (many runs may use it at once)
    with _preparing(out) if _missing(out, langs) else nullcontext():
        missing = _missing(out, langs)  # again, under the lock: its last holder may have made it
        if not missing:
            print(f"using prepared data in {out}")
            return out
        # a damaged folder (a file deleted, or cut short): made again
        if "done" not in missing:
            print(f"note: {out}: a prepared folder without {', '.join(missing)}; preparing it "
                  "again")
        paths = {l: _text_splits(l, v, out) for l, v in files.items()}
        print(f"learning BPE ({mode}, {merges} merges) for {out}")
        tok = Tokenizer.build({l: paths[l]["train"] for l in langs}, mode, merges, separate_vocab,
                              lowercase, max_lines, seed=seed)
        print(f"preparing data in {out}")
        unk_percent = recipe["unk_percent"] = {l: {} for l in langs}
        for s, l in product(("dev", "train"), langs):  # dev first: a bad one fails in seconds
            meta = binarize(paths[l][s], tok, l, join(out, f"{l}.{s}"), workers=workers,
                            code_switch=switch.get(l) if s == "train" else None, seed=seed)
            unk = 100 * meta["n_unk"] / max(meta["n_tokens"] - meta["n_sentences"], 1)
            unk_percent[l][s] = round(unk, 2)
            if unk > 5:
                print(f"note: {unk:.1f} % of the {l} {s} tokens are <unk> (the vocabulary was "
                      "learned on other text, or on too few lines); a model trained or measured "
                      "on them means little")
            if "n_switched" in meta:
                share = 100 * meta["n_switched"] / max(meta["n_words"], 1)
                print(f"code-switching {l}: {meta['n_switched']} of {meta['n_words']} words "
                      f"({share:.1f} %) replaced by {langs[1 - langs.index(l)]} words")
        tok.save(join(out, "tokenizer.json"))
        write_text(join(out, "recipe.json"), dumps(recipe, indent=1))
        sizes = {n: getsize(join(out, n)) for n in prepared_files(langs) if n.endswith(".bin")}
        write_text(join(out, "done"), dumps(sizes))  # last: the ids it holds (_missing checks)
    return out


# bpe.py's flags (`prepare`); the prepare sub-parser is `parser.prepare` (its usage errors)
def build_parser():
    parser = argparse.ArgumentParser(prog="bpe.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    prep = parser.add_subparsers(dest="cmd", required=True).add_parser(
        "prepare", help="tokenizer + binarised train/dev splits for pretrain.py",
        formatter_class=HelpFormatter)
    parser.prepare = prep
    a = prep.add_argument
    a("--data", metavar="DIR",
      help="holds {lang}.{train,dev}.txt (or toydata's mono/); required unless --train-files")
    a("--train-files", metavar="LANG=PATH,...",
      help="required unless --data: training text per language, e.g. en=a.txt,fr=b.txt: text "
      "files, or WikiExtractor output directories (shuffled with a fixed seed, <doc> dropped)")
    a("--dev-files", metavar="LANG=PATH,...",
      help=f"dev text per language (with --train-files); without it, min({DEV_LINES}, a tenth) "
      "of each train text's shuffled lines are held out as dev")
    a("--langs", default="en,fr",
      help="comma-separated language codes, the first is 'English'; zh text is split into "
      "characters, Han-script text under another code is refused")
    a("--mode", choices=MODES, default="joint", help="vocabulary regime (paper §4.2)")
    a("--merges", type=number(1),
      help="BPE merge operations (default: the paper's 80000 joint, else 40000 per language); "
      f"words over {MAX_WORD} characters are cut (BPE's time over a word grows with its length)")
    a("--separate-vocab", action="store_true",
      help="one id space per language (separate embeddings)")
    a("--lowercase", action="store_true", help="lowercase and strip accents (XLM-15)")
    a("--max-lines", type=number(1),
      help="lines per file to learn BPE and vocabularies from (default: all)")
    a("--seed", type=number(0), default=0,
      help="seed of the joint-BPE line sampling and code-switching")
    a("--code-switch", metavar="DICT",
      help="MUSE dictionary: code-switch the training text (§4.2; default: none)")
    a("--workers", type=number(1), default=1, help="encoding processes")
    a("--allow-overlap", action="store_true",
      help="accept a dev text that is mostly training lines (refused: its perplexity measures "
      "what is trained on)")
    a("--prep-dir", metavar="DIR", required=True,
      help="cache of prepared data (as pretrain.py --prep-dir): the prepared directory inside it "
      "is printed; one process at a time prepares one (a second is refused); required")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    # a bad flag: one line after prepare's usage (code 2), before any work
    with reported(parser.prepare):
        langs = parse_langs(args.langs)
        if args.dev_files and not args.train_files or bool(args.data) == bool(args.train_files):
            raise InputError("give --data, or --train-files with --dev-files (or without: dev "
                             "lines are held out)", 2)
        if args.code_switch and (args.separate_vocab or len(langs) != 2):
            raise InputError("--code-switch needs two --langs and one shared vocabulary (no "
                             "--separate-vocab)", 2)
        files = None
        if args.train_files:
            train = parse_lang_files("--train-files", args.train_files, langs)
            dev = parse_lang_files("--dev-files", args.dev_files, langs) if args.dev_files else {}
            files = {l: {"train": train[l], "dev": dev.get(l)} for l in langs}
        merges = args.merges or (80000 if args.mode == "joint" else 40000)

        # SIGTERM as Ctrl-C, once: a second one cannot cut the clean-up short
        def stopped(signum, frame):
            for s in STOP_SIGNALS:
                signal(s, SIG_IGN)
            raise KeyboardInterrupt(Signals(signum).name)
        handlers = {s: signal(s, stopped) for s in STOP_SIGNALS}
        try:
            print(prepare(langs, args.prep_dir, args.data, files, args.mode, merges,
                          args.separate_vocab, args.lowercase, args.max_lines, args.seed,
                          args.code_switch, args.workers, program="bpe.py",
                          allow_overlap=args.allow_overlap))
        except KeyboardInterrupt as e:
            name = str(e) or "SIGINT"
            print(f"bpe.py prepare: stopped by {name} (no half-written file is left); run the same "
                  "command to prepare the data", file=sys.stderr)
            sys.exit(128 + Signals[name])
        finally:
            # restored for a caller in this process; once stopped, ignored until the exit
            if getsignal(SIGINT) is stopped:
                for s, handler in handlers.items():
                    signal(s, handler)


if __name__ == "__main__":
    main()
