"""Linear CKA between layers of two encoders on parallel sentences (paper §5.2, Figure 7).

Centered kernel alignment (Kornblith et al. 2019, "Similarity of neural network representations
revisited") compares two sets of representations of the SAME n examples, X (n, d1) and Y (n, d2), and
is invariant to orthogonal transforms and isotropic scaling of either side, but not to arbitrary linear
maps. The paper uses it to show that layers of a bilingual model, and of two separately trained
monolingual models, represent translations similarly, well above a random-encoder baseline.

The numpy part (`linear_cka`, `linear_cka_gram`) can be copied alone. The CLI imports torch, model.py
and bpe.py inside its functions and prints the per-layer Figure 7 table:

    python cka.py --toy DIR --ckpt RUN/best.pt                         # bilingual model, both languages
    python cka.py --toy DIR --ckpt RUN_EN/best.pt --ckpt2 RUN_FR/best.pt   # two monolingual models
    python cka.py --ckpt RUN/best.pt --src en --tgt fr \\
        --src-file ../shared/data/tatoeba/tatoeba.fra-eng.eng --tgt-file ../shared/data/tatoeba/tatoeba.fra-eng.fra
"""
import argparse
import os
import sys

import numpy as np

# -----------------------------------------------------------------------------------------------------
# linear CKA (Kornblith et al. 2019; paper §5.2)


def _check(X, Y):
    X, Y = np.asarray(X), np.asarray(Y)
    for name, A in (("X", X), ("Y", Y)):
        if A.ndim != 2 or A.shape[0] < 2 or A.shape[1] == 0:
            raise ValueError(f"{name} must be a 2-D array with at least 2 rows (examples), got shape {A.shape}")
        if not np.isfinite(A).all():
            raise ValueError(f"{name} contains NaN or inf (first in row {int(np.argwhere(~np.isfinite(A))[0, 0])})")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but Y has {Y.shape[0]}: row k of both must be the same example")
    X = X.astype(np.float64) - X.mean(axis=0, dtype=np.float64)   # centre the columns, in float64
    Y = Y.astype(np.float64) - Y.mean(axis=0, dtype=np.float64)
    for name, A in (("X", X), ("Y", Y)):
        if not np.any(A):
            raise ValueError(f"{name} has zero variance (all rows identical): CKA is undefined")
    return X, Y


def linear_cka(X, Y):
    """Linear CKA of X (n, d1) and Y (n, d2), rows are the same n examples -> float in [0, 1].

    Feature-space form, O(n d²) time and O(d²) memory (never an n x n matrix):
        paper §5.2:  CKA(X, Y) = ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F),  X and Y column-centred
    It equals the Gram form of `linear_cka_gram` because ‖YᵀX‖²_F = tr(XXᵀ YYᵀ) = <K, L>.
    When n < d the n x n Gram form is the cheaper one and is used instead (same value).

    >>> np.random.seed(1337); X = np.random.randn(100, 10); Y = np.random.randn(100, 10) + X
    >>> round(linear_cka(X, Y), 5)
    0.55761
    """
    X, Y = _check(X, Y)
    if X.shape[0] < max(X.shape[1], Y.shape[1]):
        return _gram_cka(X @ X.T, Y @ Y.T)
    num = np.linalg.norm(Y.T @ X) ** 2                     # ‖YᵀX‖²_F, (d2, d1) cross-covariance
    den = np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y)
    return float(num / den)


def _gram_cka(K, L):
    # <vec K, vec L> / (‖K‖_F ‖L‖_F) for already centred Gram matrices
    return float(np.vdot(K, L) / (np.linalg.norm(K) * np.linalg.norm(L)))


def center_gram(K):
    """H K H with H = I - 11ᵀ/n, without forming H: subtract column means, then row means
    (the CKA demo's two steps; the grand mean is added back implicitly)."""
    K = K - K.mean(axis=0, keepdims=True)
    K -= K.mean(axis=1, keepdims=True)
    return K


def linear_cka_gram(X, Y):
    """Reference Gram form, O(n² d) time and O(n²) memory (Kornblith et al. eq. 3 / the CKA demo):
    K = XXᵀ, L = YYᵀ (uncentred inputs), CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)); the 1/(n-1)²
    factors cancel. For tests and the benchmark; use `linear_cka`."""
    _check(X, Y)  # validation only: here the centring happens on the Gram matrices (H K H)
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    return _gram_cka(center_gram(X @ X.T), center_gram(Y @ Y.T))
