"""Linear CKA between layers of two encoders on parallel sentences (paper §5.2, Figure 7).

Centered kernel alignment (Kornblith et al. 2019) compares two sets of representations of the SAME
n examples, X (n, d1) and Y (n, d2); it is invariant to orthogonal transforms and isotropic scaling
of either side, not to arbitrary linear maps. The paper uses it to show that layers of a bilingual
model, and of two monolingual models, represent translations similarly, well above a random encoder.

The numpy part copies alone; the CLI imports torch, model.py and bpe.py inside its functions and
prints the per-layer Figure 7 table (--device and --dtype as in pretrain.py):

    python cka.py --toy --data DIR --ckpt RUN/best.pt        # bilingual model, both languages
    python cka.py --toy --data DIR --ckpt RUN_EN/best.pt --ckpt2 RUN_FR/best.pt  # two models
    python cka.py --ckpt RUN/best.pt --src en --tgt fr \\
        --src-file DATA/tatoeba/tatoeba.fra-eng.eng \\
        --tgt-file DATA/tatoeba/tatoeba.fra-eng.fra                  # README: Real data
"""
import argparse

import numpy as np

# -------------------------------------------------------------------------------------------------
# linear CKA (Kornblith et al. 2019; paper §5.2)

def _check(X, Y):
    """Both inputs validated -> X and Y as float64, columns centred."""
    X, Y = map(np.asarray, (X, Y))
    for name, A in zip("XY", (X, Y)):
        if A.ndim != 2 or len(A) < 2 or A.size == 0:
            raise ValueError(f"{name} must be a 2-D array with at least 2 rows (examples), got "
                             f"shape {A.shape}")
        if not np.isfinite(A).all():
            raise ValueError(f"{name} contains NaN or inf (first in row "
                             f"{int(np.argwhere(~np.isfinite(A))[0, 0])})")
    if len(X) != len(Y):
        raise ValueError(f"X has {X.shape[0]} rows but Y has {Y.shape[0]}: row k of both must be "
                         "the same example")
    # centre the columns, in float64
    X, Y = [A.astype(np.float64) - A.mean(axis=0, dtype=np.float64) for A in (X, Y)]
    for name, A in zip("XY", (X, Y)):
        if not np.any(A):
            raise ValueError(f"{name} has zero variance (all rows identical): CKA is undefined")
    return X, Y


def linear_cka(X, Y):
    """Linear CKA of X (n, d1) and Y (n, d2), rows are the same n examples -> float in [0, 1].

    Feature-space form, O(n d²) time and O(d²) memory (never an n x n matrix):
        paper §5.2:  CKA(X, Y) = ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F),  X and Y column-centred
    It equals the Gram form of `linear_cka_gram` because ‖YᵀX‖²_F = tr(XXᵀ YYᵀ) = <K, L>.
    When n < d the n x n Gram form is the cheaper one and is used instead (same value).

    >>> np.random.seed(1337)
    >>> X = np.random.randn(100, 10)
    >>> Y = np.random.randn(100, 10) + X
    >>> round(linear_cka(X, Y), 5)
    0.55761
    """
    X, Y = _check(X, Y)
    if len(X) < max(X.shape[1], Y.shape[1]):
        return _gram_cka(X @ X.T, Y @ Y.T)
    # ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F), YᵀX the (d2, d1) cross-covariance
    return float(np.linalg.norm(Y.T @ X) ** 2 / (np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y)))


def _gram_cka(K, L):
    # <vec K, vec L> / (‖K‖_F ‖L‖_F) for already centred Gram matrices
    return float(np.vdot(K, L) / (np.linalg.norm(K) * np.linalg.norm(L)))


def linear_cka_gram(X, Y):
    """Reference Gram form, O(n² d) time, O(n²) memory (Kornblith et al. eq. 3): K = XXᵀ, L = YYᵀ,
    CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)), the 1/(n-1)² cancelling. For tests."""
    _check(X, Y)  # validation only: here the centring happens on the Gram matrices (H K H)
    X, Y = [np.asarray(A, np.float64) for A in (X, Y)]
    K, L = X @ X.T, Y @ Y.T
    # H K H, H = I - 11ᵀ/n, without forming H: column means off, then row means (the CKA demo)
    K, L = [G - G.mean(axis=0) for G in (K, L)]
    return _gram_cka(*[G - G.mean(axis=1, keepdims=True) for G in (K, L)])


# =================================================================================================
# CLI: the Figure 7 table (torch, model.py and bpe.py are imported inside; align.py is not needed)

def cka_table(args):
    """Per layer, CKA of mean-pooled parallel sentences (rows = pairs) -> (header, rows + avg row):
      bilingual    --ckpt encodes both languages (if it knows both)
      monolingual  --ckpt encodes --src, --ckpt2 encodes --tgt (two monolingual models)
      random       an untrained model of the --tgt side's config and tokenizer: the baseline
    Notes under the table: a stalled checkpoint, many <unk>, few sentences."""
    import torch
    import model as M
    from bpe import (UNK_ID, InputError, check_src_tgt, checkpoint_lang, checkpoint_tokenizer,
                     encode_bar, read_parallel, toy_data)

    notes = {}  # each said once, in order
    # every flag and input file checked before any work; the toy world's files, l0 = --src
    world = {"src_file": "tatoeba/tatoeba.{l1}-{l0}.{l0}",
             "tgt_file": "tatoeba/tatoeba.{l1}-{l0}.{l1}"}
    with M.analysis_run(args, world, check_src_tgt, toy_data):
        src_lines, tgt_lines = read_parallel(args.src_file, args.tgt_file, args.max_sents,
                                             same_ok=args.ckpt2)
        n = len(src_lines)
        if n < 2:
            raise InputError(f"{args.src_file}: CKA needs at least 2 sentence pairs, got {n}")
        if n < 50:
            notes[f"note: {n} sentence pairs: the CKA of fewer than 50 points means little"] = 1

        def load(path):  # a side: (model, tokenizer, languages, path)
            *side, extra = M.load_encoder(path, args.device, checkpoint_tokenizer, args.xlm_codes)
            notes[M.stall_note(path, extra)] = 1
            return *side, path

        # per layer: the mean over subwords, </s> excluded
        def encode(model, tok, langs, path, lang, lines):
            index = checkpoint_lang(langs, lang, f"{path}: language {lang!r} is")
            ids = [tok.encode(s, lang) for s in lines]
            flat = [t for row in ids for t in row]
            unk = 100 * flat.count(UNK_ID) / max(len(flat), 1)
            if unk > 5:
                notes[f"note: {unk:.1f} % of the {lang} tokens are <unk> ({path}'s vocabulary was "
                      "learned on other text); the CKA means little"] = 1
            return M.pool_sentences(model, ids, index, args.batch_size, encode_bar(lang))

        if src_lines == tgt_lines and not args.ckpt2:  # a copy of one file (one model: CKA 1.000)
            raise InputError(f"parallel files {args.src_file} and {args.tgt_file} hold the same "
                             "lines: both sides would be one text")
        src_side = tgt_side = load(args.ckpt)
        if args.ckpt2:
            tgt_side = load(args.ckpt2)
            # layer i of one model against layer i of the other
            if src_side[0].config.n_layers != tgt_side[0].config.n_layers:
                raise InputError(f"--ckpt {args.ckpt} has {src_side[0].config.n_layers} layers "
                                 f"but --ckpt2 {args.ckpt2} {tgt_side[0].config.n_layers}: CKA "
                                 "compares layer i of one model with layer i of the other")
            # another file of one model (best.pt and checkpoint.pt of a run): told by the weights
            if M.same_weights(src_side[0], tgt_side[0]):
                raise InputError(f"--ckpt2 {args.ckpt2} holds the same weights as --ckpt "
                                 f"{args.ckpt}: a model compared with itself (CKA 1.000 by "
                                 "construction); give a second model or leave --ckpt2 out")
        E_src = encode(*src_side, args.src, src_lines)
        # the side each column encodes --tgt with
        sides = {}
        if args.src == args.tgt:
            print(f"note: no bilingual column: --src and --tgt are both {args.src!r} (one model "
                  "and one language on both sides: 1.000 on one text, no bilingual measure)")
        elif args.tgt in src_side[2]:
            sides["bilingual"] = src_side
        if args.ckpt2:
            sides["monolingual"] = tgt_side
        if not sides:
            raise InputError(f"{args.ckpt}: no model for {args.tgt!r} (languages {src_side[2]}); "
                             "give --ckpt2")
        # untrained (pool_sentences puts it in eval mode), the --tgt side's config and tokenizer
        torch.manual_seed(args.seed)
        sides["random"] = (M.MLM(tgt_side[0].config).to(args.device), *tgt_side[1:])
        columns = {name: encode(*side, args.tgt, tgt_lines) for name, side in sides.items()}
        header = ["layer", *columns]
        # zero variance (one vector for every sentence) or NaN states: the input's doing
        try:
            rows = [[f"L{l}"] + [linear_cka(X, E[l]) for E in columns.values()]
                    for l, X in enumerate(E_src)]
        except ValueError as e:
            raise InputError(f"linear CKA of {args.src_file} (X) and {args.tgt_file} (Y): "
                             f"{e}") from None
        rows.append(["avg"] + [float(np.mean(column)) for column in list(zip(*rows))[1:]])
        print(f"\nLinear CKA of mean-pooled parallel sentences ({n} pairs, {args.src} via "
              f"{args.ckpt}, {args.tgt} via each column's model), from 0 to 1 (the same up to a "
              "rotation and scale); the random column is the baseline to beat\n")
        print(M.markdown_table(header, rows, "{:.3f}"))
        said = "\n".join(filter(None, notes))
        print(said)
        if args.plot:  # the notes under the title
            M.plot_layers(args.plot, f"Linear CKA {args.src}-{args.tgt} per layer\n{said}".strip(),
                          header, rows[:-1], "linear CKA")
        return header, rows


def build_parser():
    import model as M
    from bpe import HelpFormatter, number
    ap = argparse.ArgumentParser(
        description="Per-layer linear CKA of parallel sentences (paper §5.2, Fig. 7).",
        formatter_class=HelpFormatter)
    a = ap.add_argument
    a("--ckpt", help="pretrain.py best.pt encoding --src (and --tgt if it has it); required")
    a("--ckpt2", help="second checkpoint encoding --tgt (the monolingual column; default: none)")
    a("--xlm-codes", metavar="CODES", help="fastBPE codes of a released XLM checkpoint given as "
      "--ckpt/--ckpt2 (e.g. codes_enfr; default: none, pretrain.py checkpoints)")
    a("--src", default="en", help="source language code")
    a("--tgt", default="fr", help="target language code")
    a("--src-file", help="source side of the parallel sentences, e.g. tatoeba.fra-eng.eng (default "
      "with --toy: --data's tatoeba/tatoeba.TGT-SRC.SRC)")
    a("--tgt-file", help="target side, line k translating line k (default with --toy: --data's "
      "tatoeba/tatoeba.TGT-SRC.TGT)")
    a("--toy", nargs="?", const=True, default=False, metavar="DIR", help="the sentence files are "
      "the toy world's, given by --data (--toy DIR, deprecated, is --toy --data DIR)")
    a("--data", metavar="DIR", help="with --toy: a toydata.py world (its tatoeba/ pairs)")
    a("--max-sents", type=number(2), metavar="N", help="read at most the first N sentences (lines) "
      "of each file, i.e. N pairs, N >= 2 (default: all)")
    a("--batch-size", type=number(1), default=32, help="sentences per forward pass")
    a("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    a("--dtype", default="auto", choices=("auto",) + M.DTYPES, help="autocast (as pretrain.py)")
    a("--seed", type=number(0, 2 ** 32), default=0, help="seed of the random-encoder baseline")
    a("--plot", metavar="FILE.png", help="also draw the table (needs matplotlib; default: none)")
    return ap


def main(argv=None):
    from bpe import reported
    # bad inputs (flags, files, checkpoints, languages): one line
    with reported(parser := build_parser()):
        return cka_table(parser.parse_args(argv))


if __name__ == "__main__":
    main()
