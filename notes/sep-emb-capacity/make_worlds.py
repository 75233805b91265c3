"""The two worlds of the Sep Emb capacity study (run from the repository root).

world:    Table 1's world, the same files as `toydata.py --overlap 0.3 --size paper --seed 0`.
world-x4, world-x16: the same world with 4 and 16 times the monolingual training sentences
          (80,000 and 320,000 per language). Every split is drawn from its own seeded generator,
          so their first 20,000 training lines are world's, and their dev, test, dictionary and
          task files are world's.

    PYTHONPATH=. python notes/sep-emb-capacity/make_worlds.py OUT_DIR
"""
import sys

import toydata

out = sys.argv[1]
sizes = dict(toydata.SIZES["paper"])
toydata.write_world(f"{out}/world", overlap=0.3, seed=0, **sizes)
n_train = sizes["n_train"]
for times in (4, 16):
    sizes["n_train"] = times * n_train
    toydata.write_world(f"{out}/world-x{times}", overlap=0.3, seed=0, **sizes)
