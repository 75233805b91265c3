"""Shared pytest set-up: keep the tests on few threads so the suite is fast on 2 cores."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest

# The small synthetic world every test shares (toydata.py). Sizes are tiny so it is written in about a second.
TOY_WORLD_SIZES = dict(n_train=2000, n_dev=200, n_test=200, n_parallel=300, n_tatoeba=200,
                       n_task_train=300, n_task_eval=120)


@pytest.fixture(scope="session")
def toy_world(tmp_path_factory):
    """Directory (pathlib.Path) of a small en-fr toy world: disjoint vocabularies, same word order, seed 0."""
    import toydata
    out = tmp_path_factory.mktemp("toy_world")
    toydata.write_world(out, langs=("en", "fr"), seed=0, **TOY_WORLD_SIZES)
    return out


@pytest.fixture(scope="session")
def toy_world_overlap(tmp_path_factory):
    """Like toy_world but 30 % of the word forms are shared (anchors) and fr is SOV with adjectives after nouns."""
    import toydata
    out = tmp_path_factory.mktemp("toy_world_overlap")
    toydata.write_world(out, langs=("en", "fr"), overlap=0.3, order="sov-na", seed=0, **TOY_WORLD_SIZES)
    return out
