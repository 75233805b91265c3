"""Post-hoc alignment of pretrained representations (paper §5.1, Figures 4-6).

Do two (monolingual or bilingual) BERT-style models encode words and sentences in spaces that
differ only by a rotation? If so, one orthogonal map W fitted on translation pairs (Procrustes)
makes nearest-neighbour retrieval across the two spaces work. Three granularities:

  Fig. 4  words       word vectors from the embedding table (a) or averaged contextual states (b),
                      Procrustes on a MUSE train dictionary, CSLS precision@1 on the test dictionary
  Fig. 5  contextual  word *tokens* in parallel sentences, paired by a numpy fast_align,
                      one map per layer
  Fig. 6  sentences   mean-pooled sentence vectors, Tatoeba-style retrieval with and without a map

References: Conneau et al. 2020 (the paper), Conneau et al. 2018 "Word translation without
parallel data" (MUSE: Procrustes, CSLS), Zhang et al. 2019 (iterative normalisation), Dyer et al.
2013 (fast_align), Artetxe & Schwenk 2019 / XTREME (Tatoeba retrieval).

Only numpy at module level (the file copies alone); the command line imports the rest inside:
    python align.py words      --toy --data WORLD --ckpt RUN/best.pt [--ckpt2 RUN_FR/best.pt]
    python align.py contextual --toy --data WORLD --ckpt RUN/best.pt --save-maps maps.npz
    python align.py sentences  --ckpt RUN/best.pt
                               --test-src tatoeba.fra-eng.eng --test-tgt tatoeba.fra-eng.fra
"""
import argparse
import os
from collections import Counter

import numpy as np


class InputError(ValueError):
    """A bad input (a file, a flag), the whole message, one `error:` line (bpe.py's, copied)."""


# -------------------------------------------------------------------------------------------------
# §5.1 (MUSE): orthogonal Procrustes and iterative normalisation
def _as_matrix(X, name):
    """X as a float 2-D array, checked by every function below: a clear error, not silent NaNs."""
    X = np.asarray(X)
    if X.ndim != 2 or 0 in X.shape:
        raise ValueError(f"{name} must be a non-empty 2-D array (rows are examples), "
                         f"got shape {X.shape}")
    if not np.issubdtype(X.dtype, np.floating):
        X = X.astype(np.float64)
    if not np.isfinite(X).all():
        raise ValueError(f"{name} contains NaN or inf "
                         f"(first in row {int(np.argwhere(~np.isfinite(X))[0, 0])})")
    return X


def procrustes(X, Y):
    """Orthogonal W minimising ||X W - Y||_F, rows of X and Y are paired examples (n, d).
    Closed form (Schönemann 1966): XᵀY = U Σ Vᵀ, W = U Vᵀ, as SciPy's
    `orthogonal_procrustes(X, Y)[0]`. The paper (and MUSE) put examples in columns,
    argmin ||W X - Y||, i.e. W_paper = Wᵀ.
    >>> R = np.array([[0., -1.], [1., 0.]]); X = np.random.randn(5, 2)
    >>> np.allclose(procrustes(X, X @ R), R)
    True
    """
    X = _as_matrix(X, "X")
    Y = _as_matrix(Y, "Y")
    # row k of both describes one example; W is square
    if X.shape != Y.shape:
        raise ValueError(f"Procrustes needs X and Y of equal rows and dimension, "
                         f"got X {X.shape} and Y {Y.shape}")
    U, _, Vt = np.linalg.svd(X.T @ Y)
    return U @ Vt


def normalize_rows(X, eps=1e-8):
    """x <- x / (||x||₂ + eps) for every row (a zero row stays zero)."""
    return X / (np.linalg.norm(X, axis=1, keepdims=True) + eps)


def iterative_normalize(X, n_iter=5):
    """Iterative normalisation (Zhang et al. 2019, `iternorm.py`), one language at a time: unit
    length AND zero mean; each step breaks the other's property, so both repeat, ending on unit."""
    X = _as_matrix(X, "X").astype(np.float64)
    for _ in range(n_iter):
        X = normalize_rows(X)
        X = X - X.mean(axis=0)
    return normalize_rows(X)


# -------------------------------------------------------------------------------------------------
# §5.1 retrieval: nearest neighbour by cosine and CSLS (Conneau et al. 2018), in chunks. Queries
# X (n, d), candidates Y (m, d) -> index of the best row of Y for every row of X. Similarities are
# computed block by block, memory O(chunk * m): 200k x 200k float32 similarities would be 160 GB.
CHUNK_BYTES = 128 * 2**20  # ~128 MB a block (float32: 671 rows x 50k)


def _unit(X, name):
    X = _as_matrix(X, name)
    # float32 in, float32 math (MUSE)
    return normalize_rows(X if X.dtype == np.float32 else X.astype(np.float64))


def _blocks(X, Y, chunk_bytes):
    step = max(1, int(chunk_bytes // (X.itemsize * Y.shape[0])))
    for a in range(0, X.shape[0], step):
        yield slice(a, a + step), X[a:a + step] @ Y.T


def nn_knn(X, Y, chunk_bytes=CHUNK_BYTES):
    """Nearest neighbour by cosine: best row of Y for every row of X -> (n,) int."""
    X = _unit(X, "X")
    Y = _unit(Y, "Y")
    return np.concatenate([S.argmax(axis=1) for _, S in _blocks(X, Y, chunk_bytes)])


def csls_knn(X, Y, k=10, chunk_bytes=CHUNK_BYTES):
    """Cross-domain similarity local scaling (Conneau et al. 2018, eq. 6): best row of Y per row
    of X.
        CSLS(x, y) = 2 cos(x, y) - r_T(x) - r_S(y)
        r_T(x) = mean cos of x to its k nearest rows of Y,
        r_S(y) = mean cos of y to its k nearest rows of X
    r_T(x) is the same for every candidate of one query, so it cannot change the argmax and is not
    computed. Penalising "hubs" (y close to everything, large r_S) is what makes CSLS beat plain
    NN."""
    X = _unit(X, "X")
    Y = _unit(Y, "Y")
    if X.shape[1] != Y.shape[1]:
        raise ValueError(f"X and Y must have the same dimension, got {X.shape} and {Y.shape}")
    k = min(k, X.shape[0])
    # r_S as MUSE's `get_nn_avg_dist`, block by block
    r_S = np.empty(Y.shape[0])
    for rows, S in _blocks(Y, X, chunk_bytes):
        r_S[rows] = np.partition(S, -k, axis=1)[:, -k:].mean(axis=1)
    r_S = r_S.astype(X.dtype)
    return np.concatenate([(2 * S - r_S).argmax(axis=1) for _, S in _blocks(X, Y, chunk_bytes)])


# -------------------------------------------------------------------------------------------------
# §5.1.1 word translation (MUSE `word_translation.py`): dictionary pairs, P@1, any gold right
def dictionary_indices(pairs, src_words, tgt_words, name="dictionary"):
    """The pairs whose words both own a row of src_words / tgt_words -> (src_idx, tgt_idx)."""
    src_row = {w: i for i, w in enumerate(src_words)}
    tgt_row = {w: i for i, w in enumerate(tgt_words)}
    kept = [(src_row[s], tgt_row[t]) for s, t in pairs if s in src_row and t in tgt_row]
    if not kept:
        raise InputError(f"{name}: none of its {len(pairs)} pairs has both words in the "
                         f"vocabularies ({len(src_words)} source, {len(tgt_words)} target words)")
    return tuple(np.array(kept).T)


def word_translation_accuracy(X_src, X_tgt, src_idx, tgt_idx, W=None, k=10):
    """P@1 of CSLS retrieval among ALL rows of X_tgt for the unique source words of the pairs
    (src_idx, tgt_idx), X_src @ W if W; right if ANY gold is retrieved (MUSE) -> (p@1, n words)."""
    X_src = _as_matrix(X_src, "X_src")
    X_tgt = _as_matrix(X_tgt, "X_tgt")
    gold = {}  # source row -> its gold target rows
    for s, t in zip(src_idx.tolist(), tgt_idx.tolist()):
        gold.setdefault(s, set()).add(t)
    queries = sorted(gold)  # as np.unique(src_idx)
    Q = X_src[queries] if W is None else X_src[queries] @ W
    hits = [p in gold[s] for s, p in zip(queries, csls_knn(Q, X_tgt, k))]
    return float(np.mean(hits)), len(hits)


# -------------------------------------------------------------------------------------------------
# §5.1.2 word pairs from parallel sentences: fast_align (Dyer et al. 2013) re-implemented in numpy,
# not its binary. Reparameterised IBM Model 2. For target word j (1..m) of a pair with n source
# words plus NULL (i = 0):
#     p(a_j = 0)          = p0                                           (p0 = 0.08)
#     p(a_j = i | j,m,n)  = (1 - p0) exp(λ h(i,j,m,n)) / Z_λ(j,m,n),
#                           h = -| i/n - j/m |,  i = 1..n
#     p(f_j, a_j = i)     = p(a_j = i) θ(f_j | e_i)
# EM with -v (variational Bayes, Dirichlet(α) prior):
#     θ(f|e) = exp(ψ(c(e,f) + α) - ψ(Σ_f' c(e,f') + α));
# -o moves λ (8 gradient steps per pass, from the second pass on) towards equal prior and posterior
# expectations of h. The last pass only decodes (argmax_i, NULL links dropped). As
# `fast_align -d -o -v`. Vectorised over the corpus: every (target token, source position) is one
# "cell", a pair owns m * (n + 1) consecutive cells; per-token sums are np.bincount, which adds in
# the order of fast_align's own loops.
# The aim is fast_align's links exactly, so these details of its src/fast_align.cc, src/da.h and
# src/ttables.h are kept, although some depart from the formulas above:
#   - the prior's expected h divides by Z_λ of the *transposed* pair (source and target lengths
#     swapped);
#   - the posterior's expected h takes the 0-based target position: h = -| i/n - (j-1)/m |;
#   - Z_λ and the prior's Σ h exp(λ h) are closed-form (arithmetico-)geometric sums, not direct
#     sums;
#   - ψ is fast_align's own series, θ starts at 1e-9, and p(a_j = i) is
#     exp(λ h) / (Z_λ / (1 - p0)).
# The first two change λ and hence links whenever lengths differ (on the first 1,000 Tatoeba
# fra-eng pairs, leaving out the first alone changes 91 pairs' links, the second alone 430); the
# rest only change rounding. Words are split on ASCII spaces and tabs only, as fast_align reads a
# line (U+00A0 or U+202F, which French text has before punctuation, stay inside a word).
def digamma(x):
    """ψ(x), x > 0, as fast_align: ψ(x) = ψ(x+1) - 1/x until x >= 7, then the asymptotic series
    of ψ(y + 1/2) in y = x - 1/2 up to y^-8 (absolute error below 1e-10)."""
    x = np.array(x, np.float64)
    out = np.zeros_like(x)
    while (small := x < 7).any():
        out[small] -= 1.0 / x[small]
        x[small] += 1.0
    y = x - 0.5
    y2 = (1.0 / y) * (1.0 / y)
    y4 = y2 * y2
    return out + (np.log(y) + (1 / 24) * y2 - (7 / 960) * y4 + (31 / 8064) * y4 * y2
                  - (127 / 30720) * y4 * y4)


def _h(i, j, m, n):
    """Diagonal feature of source position i, target position j (1-based), lengths n, m."""
    return -np.abs(i / n - j / m)


def _diag_z(j, m, n, lam):
    """Z_λ(j, m, n) = Σ_{i=1..n} exp(λ h(i, j, m, n)) in fast_align's closed form (j, m, n
    integer arrays): geometric series of ratio exp(-λ/n) from below j·n/m down to 1 and from above
    it up to n. The upper one's length is an unsigned 32-bit difference (C++): j·n/m > n, only in
    _model_h's transposed call, wraps it (sum: the limit)."""
    below = j * n // m
    n_above = ((n - below) % 2 ** 32).astype(np.float64)
    r = np.exp(-lam / n)
    above_sum = np.exp(_h(below + 1, j, m, n) * lam) * (1.0 - r ** n_above) / (1.0 - r)
    below_sum = np.exp(_h(below, j, m, n) * lam) * (1.0 - r ** below) / (1.0 - r)
    return np.where(n_above > 0, above_sum, 0.0) + np.where(below > 0, below_sum, 0.0)


def _model_h(j, m, n, lam):
    """The prior's expected h for target position j as fast_align's -o computes it:
    Σ_i h exp(λ h) (closed form, h falling by 1/n per step away from j·n/m) / Z_λ(j, n, m)
    (lengths swapped)."""
    below = j * n // m
    n_above = n - below
    r = np.exp(-lam / n)
    d = -1.0 / n

    # Σ_{k < count} (h_1 + k d) g_1 r^k, g_1 = exp(λ h_1), h_1 = h(first)
    def series(first, count):
        h1 = _h(first, j, m, n)
        g1 = np.exp(h1 * lam)
        g_end = g1 * r ** count
        h_last = d * (count - 1) + h1
        return (h_last * g_end - h1 * g1) / (r - 1) - d * (g_end - g1 * r) / ((r - 1) * (r - 1))
    above = np.where(n_above > 0, series(below + 1, n_above), 0.0)
    return (above + np.where(below > 0, series(below, below), 0.0)) / _diag_z(j, n, m, lam)


def _split_words(s):
    """A sentence as fast_align reads it (split on ASCII spaces and tabs); a word list stays."""
    return [w for w in s.replace("\t", " ").split(" ") if w] if isinstance(s, str) else list(s)


def ibm2_align(src_sents, tgt_sents, n_iter=5, p0=0.08, tension=4.0, alpha=0.01):
    """One direction of fast_align: every target word picks at most one source word. src_sents,
    tgt_sents: equal-length lists of sentences (strings or word lists) -> one list of 0-based
    (i, j) links per pair, as `fast_align -i src ||| tgt` prints them. A pair with an empty side
    gets no links (fast_align stops there)."""
    if len(src_sents) != len(tgt_sents):
        raise ValueError(f"{len(src_sents)} source but {len(tgt_sents)} target sentences")
    e_id = {"<NULL>": 0}
    f_id = {}
    # per pair, of every cell: source word, target word, source position i, token, diagonal
    # feature h, and h with the 0-based j (-o's posterior)
    cells = []
    tokens = []  # per pair: m, n, j (1-based) of every target token
    blocks = []  # (pair, first cell, m, n): where its cells live
    n_tok = n_cell = 0
    for k, (es, fs) in enumerate(zip(map(_split_words, src_sents), map(_split_words, tgt_sents))):
        if not es or not fs:
            continue
        n = len(es)
        m = len(fs)
        e = np.array([0] + [e_id.setdefault(w, len(e_id)) for w in es])  # (n+1,) NULL first
        f = np.array([f_id.setdefault(w, len(f_id)) for w in fs])  # (m,)
        J, I = np.indices((m, n + 1)).reshape(2, -1)  # of every cell: 0-based j, i
        cells.append((e[I], f[J], I, n_tok + J, _h(I, J + 1, m, n), _h(I, J, m, n)))
        tokens.append((np.full(m, m), np.full(m, n), np.arange(1, m + 1)))
        blocks.append((k, n_cell, m, n))
        n_tok += m
        n_cell += m * (n + 1)
    links = [[] for _ in src_sents]
    if not blocks:
        return links
    cell_e, cell_f, cell_i, tok, h, h_prev = map(np.concatenate, zip(*cells))
    tok_mnj = np.concatenate(tokens, axis=1)
    tok_m, tok_n, tok_j = tok_mnj
    null = cell_i == 0
    # one θ entry per co-occurring (e, f) pair: cell -> pair index, pair -> e
    pairs, pair_of_cell = np.unique(cell_e * len(f_id) + cell_f, return_inverse=True)
    pair_e = pairs // len(f_id)
    theta = np.full(len(pairs), 1e-9)  # fast_align's, before the first normalisation
    # -o's prior expectation sums over the distinct (m, n, j) of the target tokens, each weighted
    # by its count (the pairs of lengths m, n), in the order of (m, n, j)
    (size_m, size_n, size_j), size_w = np.unique(tok_mnj, axis=1, return_counts=True)
    lam = tension
    for it in range(n_iter):
        az = _diag_z(tok_j, tok_m, tok_n, lam) / (1 - p0)  # per token
        # p(a_j = i) θ(f_j | e_i)
        probs = theta[pair_of_cell] * np.where(null, p0, np.exp(h * lam) / az[tok])
        if it == n_iter - 1:
            break  # the final pass only decodes
        q = probs / np.bincount(tok, probs, minlength=n_tok)[tok]  # posterior over i per token
        c = np.bincount(pair_of_cell, q, minlength=len(pairs)) + alpha  # expected counts + α
        # -o, from the second pass on; the posterior's h summed in corpus order
        if it > 0:
            posterior_h = np.cumsum(np.where(null, 0.0, h_prev * q))[-1] / n_tok
            for _ in range(8):
                prior_h = np.sum(size_w * _model_h(size_j, size_m, size_n, lam)) / n_tok
                lam = np.clip(lam + (posterior_h - prior_h) * 20.0, 0.1, 14.0)
        tot = np.bincount(pair_e, c, minlength=len(e_id))[pair_e]
        theta = np.exp(digamma(c) - digamma(tot))
    # Viterbi decoding: per target word the most probable position; NULL (i = 0) wins ties, then
    # the leftmost
    for k, start, m, n in blocks:
        best = probs[start:start + m * (n + 1)].reshape(m, n + 1).argmax(axis=1)
        links[k] = [(int(i) - 1, j) for j, i in enumerate(best) if i > 0]
    return links


def grow_diag_final_and(fwd, rev):
    """Symmetrise two directional alignments of one sentence pair, as
    `atools -c grow-diag-final-and`: from the intersection, repeatedly add union points (in (i, j)
    order) that touch an aligned point (8-neighbourhood) and have an unaligned word on one side;
    then the points of fwd, then of rev, whose words are both still unaligned."""
    res = set(fwd) & set(rev)

    def unaligned(i, j):  # is source word i, is target word j still without a link?
        return i not in {a for a, _ in res}, j not in {b for _, b in res}
    todo = sorted((set(fwd) | set(rev)) - res)
    grown = True
    while grown:
        grown = False
        for i, j in list(todo):
            # touching: an aligned point in the 8-neighbourhood ((i, j) itself is not aligned)
            if any(unaligned(i, j)) and any(abs(i - a) <= 1 and abs(j - b) <= 1 for a, b in res):
                res.add((i, j))
                todo.remove((i, j))
                grown = True
    for i, j in sorted(fwd) + sorted(rev):
        if all(unaligned(i, j)):
            res.add((i, j))
    return sorted(res)


def fast_align(src_sents, tgt_sents):
    """Links of parallel sentences: forward and reverse (`fast_align -r`) ibm2_align symmetrised
    by grow-diag-final-and (the paper's recipe) -> sorted (i, j) links per pair."""
    fwd = ibm2_align(src_sents, tgt_sents)
    rev = ibm2_align(tgt_sents, src_sents)
    return [grow_diag_final_and(f, [(i, j) for j, i in r]) for f, r in zip(fwd, rev)]


def one_to_one_pairs(links, src_words, tgt_words):
    """Links whose two words are each linked once, minus identical strings (shijie-wu/
    crosslingual-nlp `_process_align`): copies say nothing about how the spaces align."""
    src_links = Counter(i for i, _ in links)
    tgt_links = Counter(j for _, j in links)
    return [(i, j) for i, j in links
            if src_links[i] == 1 and tgt_links[j] == 1 and src_words[i] != tgt_words[j]]


# =================================================================================================
# The command line: layers L0 (embeddings) .. L8 as in the paper's Figures 5-7; sentences run as
# XLM's `</s> w1 ... wn </s>`. bpe.py, model.py and torch are imported inside the functions.

# vectors from a checkpoint: word tokens, word types, the encoders of the two sides
def encode_word_tokens(model, tok, sents_words, lang_idx, lang_code, batch_size, notes=None):
    """Every word token's vector, the mean of its subword states (the paper leaves it open) ->
    (array (n_layers + 1, n_words, dim), offsets): sentence k's words are rows offsets[k]:
    offsets[k+1], NaN past max_positions; `notes` gets a note of many <unk>."""
    import bpe
    import model as M
    per_word = [tok.encode_words(ws, lang_code) for ws in sents_words]
    offsets = np.cumsum([0] + [len(w) for w in per_word])
    out = np.full((model.config.n_layers + 1, offsets[-1], model.config.dim), np.nan, np.float32)
    sent_ids = [sum(w, []) for w in per_word]
    unk_note(notes, sent_ids, lang_code)
    states = M.iter_states(model, sent_ids, lang_idx, batch_size)
    for k, H in bpe.encode_bar(lang_code)(states, len(per_word)):
        end = 1  # position 0 is </s>, the last one too
        for w, ids in enumerate(per_word[k]):
            start, end = end, end + len(ids)
            if end < H.shape[1]:
                out[:, offsets[k] + w] = H[:, start:end].mean(axis=1)
    return out, offsets


def word_vectors(model, tok, lang_idx, lang, path, max_sents, batch_size, notes):
    """Word vectors (the paper leaves them open) of a corpus's word types, most frequent first,
    lowercase (MUSE) -> (row name, words, vectors) per row of Fig. 4: embedding rows of ONE-subword
    words (4a), then per layer the mean state of each word's tokens (4b)."""
    import bpe
    sents = [tok.words(line, lang) for line in bpe.read_lines(path, max_sents)]
    words = [w for ws in sents for w in ws]
    if not words:
        raise InputError(f"{path}: no words")
    keys = [w for w, _ in Counter(w.lower() for w in words).most_common(200000)]  # MUSE's 200k
    form = {w.lower(): w for w in reversed(words)}  # the first surface form is encoded
    tables = model.tok_emb
    table = tables[lang_idx % len(tables)].weight.detach().float().cpu().numpy()
    key_ids = tok.encode_words([form[k] for k in keys], lang)
    single = {k: ids[0] for k, ids in zip(keys, key_ids) if len(ids) == 1 and ids[0] != bpe.UNK_ID}
    layers, _ = encode_word_tokens(model, tok, sents, lang_idx, lang, batch_size, notes)
    row = {k: i for i, k in enumerate(keys)}
    which = np.array([row.get(w.lower(), -1) for w in words])
    counted = (which >= 0) & ~np.isnan(layers[0, :, 0])  # a kept word type, a token with states
    # the word types with states, most frequent first: per layer, the mean over their tokens
    kept, type_of, n_occ = np.unique(which[counted], return_inverse=True, return_counts=True)
    S = np.zeros((len(layers), len(kept), layers.shape[2]))
    np.add.at(S, (slice(None), type_of), layers[:, counted])
    means = (S / n_occ[:, None]).astype(np.float32)
    with_states = [keys[i] for i in kept]
    return [("emb (4a)", list(single), table[list(single.values())])] + [
        (f"L{l} (4b)", with_states, X) for l, X in enumerate(means)]


def _encoders(args):
    """(model, tokenizer, language index, code) per side: --ckpt's --src, --ckpt2's --tgt."""
    import bpe
    import model
    out = []
    loaded = {}
    for path, lang in ((args.ckpt, args.src), (args.ckpt2 or args.ckpt, args.tgt)):
        if path not in loaded:
            loaded[path] = model.load_encoder(path, args.device, bpe.checkpoint_tokenizer,
                                              args.xlm_codes)
            # a model whose MLM stalled (model.py's rule)
            note = model.stall_note(path, loaded[path][3])
            if note:
                args.notes.append(note.removeprefix("note: "))
        mdl, tok, langs, _ = loaded[path]
        lang_idx = bpe.checkpoint_lang(langs, lang, f"{path}: language {lang!r} is")
        out.append((mdl, tok, lang_idx, lang))
    # before any encoding: vectors of two widths cannot be compared, layers of two depths paired
    first, second = (side[0].config for side in out)
    if first.dim != second.dim:
        raise InputError(f"--ckpt {args.ckpt} has width {first.dim} but --ckpt2 {args.ckpt2} "
                         f"{second.dim}: their vectors cannot be compared or mapped")
    if first.n_layers != second.n_layers:
        raise InputError(f"--ckpt {args.ckpt} has {first.n_layers} layers but --ckpt2 {args.ckpt2} "
                         f"{second.n_layers}: the tables pair layer l of one model with layer l of "
                         "the other; give two models of one depth")
    # another file of one model (best.pt and checkpoint.pt of a run): told by the weights
    if args.ckpt2 and model.same_weights(out[0][0], out[1][0]):
        raise InputError(f"--ckpt2 {args.ckpt2} holds the same weights as --ckpt {args.ckpt}: a "
                         "model compared with itself; give a second model or leave --ckpt2 out")
    return out


# notes: a word beside a number that means little (after the table; kept in --save-maps)
def unk_note(notes, ids, lang):
    """More than 5 % <unk> among a side's tokens (id lists): a note with the rate."""
    import bpe
    n_tokens = sum(map(len, ids))
    n_unk = sum(s.count(bpe.UNK_ID) for s in ids)
    if notes is not None and n_unk > 0.05 * n_tokens:
        notes.append(f"{100 * n_unk / n_tokens:.1f} % of the {lang} tokens are <unk> (the "
                     "vocabulary was learned on other text); the score means little")


def weak_notes(notes, where, n_fit, dim, n_test, items):
    """Notes: a map fitted on fewer pairs than dimensions (n_fit 0: none), under 50 items scored."""
    if 0 < n_fit < dim:
        notes.append(f"{where}the map is fitted on {n_fit} pairs in {dim} dimensions: "
                     "underdetermined (fewer pairs than dimensions); the mapped score means little")
    if n_test < 50:
        notes.append(f"{where}{n_test} {items} scored, fewer than 50: the score means little")


# files: dictionaries, parallel sides, maps
def read_muse_dictionary(path):
    """MUSE dictionary `src tgt` per line -> pairs in file order, lowercased (as MUSE's vectors)."""
    import bpe
    return [(s.lower(), t.lower()) for s, t in bpe.read_dictionary(path)]


def read_sides(args, src, tgt):
    """bpe.read_parallel under --max-sents; one text on both sides is refused unless --ckpt2."""
    import bpe
    texts = bpe.read_parallel(src, tgt, args.max_sents, same_ok=bool(args.ckpt2))
    if texts[0] == texts[1] and not args.ckpt2:
        raise InputError(f"parallel files {src} and {tgt} hold the same lines: both sides would be "
                         "one text")
    return texts


def without_test_pairs(train, test, names, allow, overlap, key):
    """Unless `allow`: train pairs whose key is a test pair's are left out of the fit with a note
    "N of the M {overlap}" (MUSE's en-fr.txt holds its test pairs); test pairs only: refused."""
    tested = {key(pair) for pair in test}
    kept = [pair for pair in train if key(pair) not in tested]
    if allow or len(kept) == len(train):
        return train
    if not kept:
        raise InputError(f"{names[0]}: all its pairs are in {names[1]} (the same file or "
                         "contents?): a map fitted on the test pairs scores its own training data; "
                         "give a separate train set (or --allow-overlap)")
    print(f"note: {len(train) - len(kept)} of the {len(train):,} {overlap}: left out of the fit "
          "(--allow-overlap keeps them)")
    return kept


def save_maps(path, maps, src, tgt, digests=("", ""), notes=()):
    """The per-layer maps (.npz), atomically, with the checkpoints' digests and the notes."""
    import bpe
    W = np.stack(maps)
    # the file is closed before the rename
    with bpe.write_errors(path), bpe.atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, src_to_tgt=W, tgt_to_src=W.transpose(0, 2, 1), src=src, tgt=tgt,
                 src_ckpt_digest=digests[0], tgt_ckpt_digest=digests[1], notes=np.array(notes, str))


def load_map(path, src, tgt, layer, digests=None):
    """The layer's map W, x_src @ W ~ x_tgt, from a save_maps file (either direction) -> float32
    (dim, dim); `digests` (src's and tgt's file_digest; a string: both) must be the file's."""
    try:
        with np.load(path) as z:
            pair = str(z["src"]), str(z["tgt"])
            order = ("src", "tgt") if pair == (src, tgt) else ("tgt", "src")
            maps = z[f"{order[0]}_to_{order[1]}"]
            recorded = [str(z[f"{k}_ckpt_digest"]) if f"{k}_ckpt_digest" in z else None
                        for k in order]
    # missing, truncated, not an .npz, no such entry: OSError, BadZipFile, KeyError, ...
    except Exception as e:
        raise InputError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    if set(pair) != {src, tgt}:
        raise InputError(f"{path}: maps are for {pair[0]}->{pair[1]}, not {src}->{tgt}")
    if maps.ndim != 3 or not 0 <= layer < len(maps) or not np.isfinite(maps[layer]).all():
        raise InputError(f"{path}: no finite layer-{layer} map (maps of shape {maps.shape})")
    expected = [digests] * 2 if isinstance(digests, str) else list(digests or [])
    if expected and recorded != expected:
        why = (f"fitted on the checkpoints {recorded}, not {expected}" if any(recorded)
               else "written without checkpoint digests")
        raise InputError(f"{path}: maps {why} ({src}, {tgt}); fit them again with align.py "
                         "contextual on this model")
    return maps[layer].astype(np.float32)


def print_table(title, header, rows, args):
    """Markdown table (percentages, one decimal), args.notes below it; --plot draws it too."""
    import model
    pct = [[100 * v if isinstance(v, float) else v for v in r] for r in rows]
    print(f"\n{title}\n\n" + model.markdown_table(header, pct, "{:.1f}"))
    for text in args.notes:
        print(f"note: {text}")
    if args.plot:
        model.plot_layers(args.plot, title, header, pct, "P@1 (%)")


# the sub-commands
def cmd_words(args):
    """Fig. 4: word translation P@1 (CSLS) after Procrustes on the train dictionary, per layer."""
    train = read_muse_dictionary(args.train_dict)
    test = read_muse_dictionary(args.test_dict)
    names = (f"--train-dict {args.train_dict}", f"--test-dict {args.test_dict}")
    overlap = f"pairs of {names[0]} share a source word with the test pairs of {names[1]}"
    train = without_test_pairs(train, test, names, args.allow_overlap, overlap,
                               lambda pair: pair[0])
    # per side: one (row name, words, vectors) per row of the table
    vs, vt = (word_vectors(*side, path, args.max_sents, args.batch_size, args.notes)
              for side, path in zip(_encoders(args), (args.src_corpus, args.tgt_corpus)))
    rows = []
    errors = []
    for (name, ws, Xs), (_, wt, Xt) in zip(vs, vt):
        try:
            fit_s, fit_t = dictionary_indices(train, ws, wt, f"{args.train_dict} ({name})")
            te = dictionary_indices(test, ws, wt, f"{args.test_dict} ({name})")
        except InputError as e:  # e.g. few words are one subword (4a): an empty row
            errors.append(e)
            rows.append([name, "-", "-", 0, 0, f"{len(ws)}/{len(wt)}"])
            continue
        Xs = iterative_normalize(Xs)
        Xt = iterative_normalize(Xt)
        W = procrustes(Xs[fit_s], Xt[fit_t])
        p_raw, n = word_translation_accuracy(Xs, Xt, *te)
        p_map, _ = word_translation_accuracy(Xs, Xt, *te, W=W)
        rows.append([name, p_raw, p_map, len(fit_s), n, f"{len(ws)}/{len(wt)}"])
        weak_notes(args.notes, f"{name}: ", len(fit_s), Xs.shape[1], n, "test words")
    if len(errors) == len(rows):
        raise errors[0]  # main reports it as an InputError
    args.notes += map(str, errors)
    print_table(f"Word translation {args.src}->{args.tgt}: P@1 (CSLS) on {args.test_dict}",
                ["vectors", "no map", "Procrustes", "train pairs", "test words", "vocab src/tgt"],
                rows, args)
    return rows


def cmd_contextual(args):
    """§5.1.2: per-layer maps from fast_align pairs of parallel sentences, CSLS P@1 held out."""
    path = args.save_maps
    # --save-maps is checked before any work
    if path:
        folder = os.path.dirname(os.path.abspath(path))
        why = "is a directory" if os.path.isdir(path) else f"{folder} is not a writable directory"
        if os.path.isdir(path) or not os.access(folder, os.W_OK):
            raise InputError(f"--save-maps {path}: cannot write there ({why})")
        if os.path.exists(path) and not args.overwrite:
            raise InputError(f"--save-maps {path}: exists (maps of an earlier run, perhaps of "
                             "another checkpoint); pass --overwrite to replace it, or another file")
    elif args.overwrite:  # it would replace nothing
        raise InputError("--overwrite goes with --save-maps (it replaces that file)")
    sides = _encoders(args)
    texts = read_sides(args, args.src_file, args.tgt_file)
    # per side: the words of each sentence; the states of the word tokens, where sentences start
    S, T = ([tok.words(line, lang) for line in lines]
            for (_, tok, _, lang), lines in zip(sides, texts))
    (Hs, off_s), (Ht, off_t) = (
        encode_word_tokens(mdl, tok, ws, i, lang, args.batch_size, args.notes)
        for (mdl, tok, i, lang), ws in zip(sides, (S, T)))
    n_fit = round(len(S) * 0.8)  # the last 20 % of the sentences are held out
    if not 0 < n_fit < len(S):
        raise InputError(f"{args.src_file}: {len(S)} sentences are too few for a fit and a "
                         "held-out part")
    # the word tokens with states (none past max_positions)
    has_s = ~np.isnan(Hs[0, :, 0])
    has_t = ~np.isnan(Ht[0, :, 0])
    # (source row, target row) of the one-to-one fast_align pairs whose two words have states
    linked = [(off_s[k] + i, off_t[k] + j) for k, links in enumerate(fast_align(S, T))
              for i, j in one_to_one_pairs(links, S[k], T[k])]
    linked = np.array(linked, np.int64).reshape(-1, 2)
    linked = linked[has_s[linked[:, 0]] & has_t[linked[:, 1]]]
    held_out = linked[:, 0] >= off_s[n_fit]
    fit_s, fit_t = linked[~held_out].T
    ev_s, ev_t = linked[held_out].T
    # the candidates: the target tokens of the eval sentences (with states)
    cand = off_t[n_fit] + np.flatnonzero(has_t[off_t[n_fit]:])
    if len(fit_s) < 2 or len(ev_s) < 1 or len(cand) < 2:  # one candidate is always the nearest
        raise InputError(f"{args.src_file}: too few one-to-one aligned pairs ({len(fit_s)} fit, "
                         f"{len(ev_s)} eval, {len(cand)} candidate tokens; at least 2, 1, 2)")
    weak_notes(args.notes, "", len(fit_s), Hs.shape[2], len(ev_s), "held-out pairs")
    gold = np.searchsorted(cand, ev_t)  # each eval pair's target among the candidates
    maps = []
    rows = []
    for l, (Xs, Xt) in enumerate(zip(Hs, Ht)):
        # x_src @ W ~ x_tgt
        maps.append(procrustes(Xs[fit_s], Xt[fit_t]))
        Q = Xs[ev_s]
        acc = [float(np.mean(csls_knn(q, Xt[cand]) == gold)) for q in (Q, Q @ maps[l])]
        rows.append([f"L{l}", *acc, len(fit_s), len(ev_s), len(cand)])
    print_table(f"Contextual word alignment {args.src}->{args.tgt}: CSLS P@1 on held-out "
                f"fast_align pairs (last 20% of {len(S)} sentences)",
                ["layer", "no map", "Procrustes", "fit pairs", "eval pairs", "candidates"],
                rows, args)
    if path:
        save_maps(path, maps, args.src, args.tgt, args.digests, args.notes)
        print(f"\nsaved {len(maps)} maps to {path}: x_{args.src} @ src_to_tgt[l] ~ "
              f"x_{args.tgt}, x_{args.tgt} @ tgt_to_src[l] ~ x_{args.src} (l = 0 embeddings .. "
              f"{len(maps) - 1})")
    return rows


def cmd_sentences(args):
    """Fig. 6: Tatoeba-style retrieval P@1 per layer of mean-pooled sentence vectors, ± a map."""
    import bpe
    import model
    if (args.train_src is None) != (args.train_tgt is None):
        raise InputError("--train-src and --train-tgt go together: give both or neither")
    sides = _encoders(args)
    tests = read_sides(args, args.test_src, args.test_tgt)
    n = len(tests[0])
    if n < 2:
        raise InputError(f"--test-src {args.test_src}: {n} test pair; retrieval needs at least 2 "
                         "candidates (one is always the nearest)")
    train = []
    if args.train_src:
        train = list(zip(*bpe.read_parallel(args.train_src, args.train_tgt, args.max_sents)))
        names = (f"--train-src/--train-tgt {args.train_src}", f"--test-src/--test-tgt {args.test_src}")
        overlap = f"pairs of {names[0]} are test pairs of {names[1]}"
        # a toy world's own parallel text: its generator repeats short sentences
        if args.toy and args.train_src.startswith(args.data):
            overlap = "training pairs repeat a test pair (the toy generator repeats short sentences)"
        # pairs compared with whitespace collapsed, in Unicode NFC (a trailing space, a decomposed é)
        normal = lambda pair: tuple(map(bpe.normal_text, pair))
        train = without_test_pairs(train, list(zip(*tests)), names, args.allow_overlap, overlap, normal)

    def encode(part, *texts):  # the sentence vectors of each side's lines, per layer
        vectors = []
        for (mdl, tok, i, lang), lines in zip(sides, texts):
            ids = [tok.encode(s, lang) for s in lines]
            unk_note(args.notes, ids, f"{lang} {part}")
            vectors.append(model.pool_sentences(mdl, ids, i, args.batch_size, bpe.encode_bar(lang)))
        return vectors

    def acc(Q, C):  # P@1: query k's nearest candidate is candidate k
        return float(np.mean(nn_knn(Q, C) == np.arange(n)))
    Es, Et = encode("test", *tests)
    rows = [[f"L{l}", acc(es, et), acc(et, es)] for l, (es, et) in enumerate(zip(Es, Et))]
    header = ["layer", f"{args.src}->{args.tgt}", f"{args.tgt}->{args.src}"]
    title = (f"Sentence retrieval P@1 in % (cosine NN; chance 100/{n} = {100 / n:.2g}%) on {n} "
             f"pairs of {args.test_src}")
    if train:
        Fs, Ft = encode("fit", *zip(*train))
        for row, es, et, fs, ft in zip(rows, Es, Et, Fs, Ft):
            W = procrustes(fs, ft)  # x_src @ W ~ x_tgt
            row += [acc(es @ W, et), acc(et @ W.T, es)]
        header += [f"{h} mapped" for h in header[1:]]
        title += f"; maps fitted on {len(Fs[0])} pairs of {args.train_src}"
    weak_notes(args.notes, "", len(train), Es[0].shape[1], n, "test pairs")
    if args.ckpt2 and not train:
        args.notes.append("the columns are without a map: two separately trained models' spaces "
                          "are not aligned, so they stay near chance; a map needs "
                          "--train-src/--train-tgt (a parallel corpus)")
    print_table(title, header, rows, args)
    return rows


# flags and main
def build_parser():
    import bpe
    import model
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=bpe.HelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)  # the flags of every sub-command
    a = common.add_argument
    a("--ckpt", help="checkpoint (pretrain.py best.pt) encoding --src (and --tgt); required")
    a("--ckpt2", help="second (monolingual) checkpoint encoding --tgt (default: none, --ckpt)")
    a("--xlm-codes", metavar="CODES",
      help="fastBPE codes of a released XLM checkpoint given as --ckpt/--ckpt2 (e.g. codes_enfr; "
      "default: none, pretrain.py checkpoints)")
    a("--src", default="en", help="source language code as in the checkpoint")
    a("--tgt", default="fr", help="target language code as in the checkpoint")
    a("--toy", nargs="?", const=True, default=False, metavar="DIR",
      help="the data are --data's toy world (--toy DIR = --toy --data DIR: deprecated)")
    a("--data", metavar="DIR",
      help="with --toy: a toydata.py world, whose files fill in every data path not given")
    a("--max-sents", type=bpe.number(1), metavar="N",
      help="read the first N lines of each text file, N pairs of parallel files (default: all)")
    a("--batch-size", type=bpe.number(1), default=32, help="sentences per forward pass")
    a("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N, mps")
    a("--dtype", default="auto", choices=("auto",) + model.DTYPES,
      help="autocast of the encoders, as in pretrain.py")
    a("--plot", metavar="FILE.png", help="also draw the table (needs matplotlib; default: none)")

    # paths: data flag -> (help, its file in a --toy --data DIR world); overlap: --allow-overlap's
    def command(name, func, summary, paths, overlap=None):
        p = sub.add_parser(name, parents=[common], help=summary, formatter_class=bpe.HelpFormatter)
        toy_paths = {}
        for f, (h, rel) in paths.items():
            flag_help = f"{h} (default with --toy: --data's {rel.format(l0='SRC', l1='TGT')})"
            p.add_argument("--" + f.replace("_", "-"), help=flag_help)
            toy_paths[f] = rel
        p.set_defaults(func=func, toy_paths=toy_paths)
        if overlap:
            p.add_argument("--allow-overlap", action="store_true",
                           help=f"fit the map on test pairs too (default: {overlap} are left out "
                           "of the fit, and a train set with nothing else is refused)")
        return p

    command("words", cmd_words, "Fig. 4: word translation after Procrustes (MUSE dictionaries)", {
        "train_dict": ("MUSE dictionary, fit (en-fr.0-5000.txt)", "dict/{l0}-{l1}.train.txt"),
        "test_dict": ("MUSE dictionary, test (en-fr.5000-6500.txt)", "dict/{l0}-{l1}.test.txt"),
        "src_corpus": ("source text: vocabulary, contextual averages", "mono/{l0}.train.txt"),
        "tgt_corpus": ("target text: vocabulary, contextual averages", "mono/{l1}.train.txt")},
        "train pairs of a tested source word")
    p = command("contextual", cmd_contextual,
                "§5.1.2: contextual word alignment from fast_align pairs", {
        "src_file": ("parallel sentences, source side", "parallel/{l0}-{l1}.train.{l0}"),
        "tgt_file": ("parallel sentences, target side", "parallel/{l0}-{l1}.train.{l1}")})
    p.add_argument("--save-maps", help="write the per-layer maps here (.npz; finetune.py "
                   "--align-maps; default: none)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --save-maps file")
    command("sentences", cmd_sentences, "Fig. 6: Tatoeba-style sentence retrieval per layer", {
        "test_src": ("test pairs, source (tatoeba.fra-eng.eng)", "tatoeba/tatoeba.{l1}-{l0}.{l0}"),
        "test_tgt": ("test pairs, target (tatoeba.fra-eng.fra)", "tatoeba/tatoeba.{l1}-{l0}.{l1}"),
        "train_src": ("fit pairs, source (optional)", "parallel/{l0}-{l1}.train.{l0}"),
        "train_tgt": ("fit pairs, target (with --train-src)", "parallel/{l0}-{l1}.train.{l1}")},
        "train pairs that are test pairs")
    return ap


def main(argv=None):
    """Flags, files and the device checked before any work (model.analysis_run); the sub-command."""
    import bpe
    import model
    parser = build_parser()
    args = parser.parse_args(argv)
    args.notes = []
    with bpe.reported(parser), model.analysis_run(args, args.toy_paths, bpe.check_src_tgt,
                                              bpe.toy_data, ("train_src", "train_tgt")):
        return args.func(args)


if __name__ == "__main__":
    main()
