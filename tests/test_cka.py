"""cka.py: linear CKA (known answer, Gram-form equality, invariances, bad input) and the Fig. 7 CLI.

Run: python -m pytest -q tests/test_cka.py
"""
import numpy as np
import pytest

import cka


def test_known_answer_from_the_cka_demo():
    """Kornblith et al.'s demo notebook: this seed gives linear CKA 0.55761 (PAPER_NOTES §6)."""
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
