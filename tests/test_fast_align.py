"""align.fast_align against the C++ tool: links computed by clab/fast_align (github.com/clab/fast_align) and written
here, on a corpus of this file's own and on the first 1,000 Tatoeba fra-eng pairs.

The expected links come from fast_align built from source with cmake (std::unordered_map, no sparsehash), run on one
thread (with OpenMP on two threads its unsynchronised count updates made one run in three differ), on a file of
`src ||| tgt` lines:

    OMP_NUM_THREADS=1 fast_align -i corpus.txt -d -o -v    > fwd.txt
    OMP_NUM_THREADS=1 fast_align -i corpus.txt -d -o -v -r > rev.txt
    atools -i fwd.txt -j rev.txt -c grow-diag-final-and   > sym.txt

Run: python -m pytest -q tests/test_fast_align.py
"""
import hashlib
from pathlib import Path

import pytest

import align
import bpe

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# -----------------------------------------------------------------------------------------------------
# known answers on text written here: accents, punctuation attached and detached, U+202F before ? and !,
# repeated words, unequal lengths (1 word against 6, 3 against 1) and two long pairs (35-45 and 43-41 words)

NB = "\u202f"   # narrow no-break space: French typography puts it before ? ! ; : (fast_align keeps it inside a word)
PAIRS = [
    ("Le chat dort sur le canapé.", "The cat is sleeping on the sofa."),
    ("Le chien et le chat jouent dans le jardin.", "The dog and the cat play in the garden."),
    (f"Où est la gare{NB}?", "Where is the station?"),
    (f"Entrez{NB}!", "Please come in and sit down."),
    ("Je t'aime.", "I love you."),
    ("Il pleut depuis ce matin.", "It has been raining since this morning."),
    (f"Non, non et non{NB}!", "No, no and no!"),
    ("C'est très, très difficile.", "It is very, very hard."),
    ("L'élève a déjà fini ses devoirs.", "The pupil has already finished his homework."),
    ("Le garçon mange une pomme verte.", "The boy eats a green apple."),
    ("La fille mange une pomme rouge.", "The girl eats a red apple."),
    ("Nous passerons Noël chez mes grands-parents à Québec.", "We will spend Christmas at my grandparents' in Quebec."),
    ("Parlez-vous français ?", "Do you speak French?"),
    ("Oui.", "Yes, I do."),
    ("Je ne sais pas où il habite.", "I don't know where he lives."),
    ("Elle a acheté trois livres et deux cahiers.", "She bought three books and two notebooks."),
    ("L'été dernier, nous sommes allés à la mer.", "Last summer we went to the seaside."),
    ("Il faut être patient avec les enfants.", "One must be patient with children."),
    ("Ça ne fait rien.", "Never mind."),
    ("Le train part à huit heures et quart.", "The train leaves at a quarter past eight."),
    (f"Qu'est-ce que tu veux{NB}?", "What do you want?"),
    ("Le chat, le chien et le cheval dorment.", "The cat, the dog and the horse are sleeping."),
    ("Merci beaucoup, Marie !", "Thank you very much, Mary!"),
    ("Il a plu toute la journée ; nous sommes restés à la maison.", "It rained all day, so we stayed home."),
    ("Mon frère aîné travaille à l'hôpital.", "My older brother works at the hospital."),
    ("La pomme est rouge, la poire est verte.", "The apple is red, the pear is green."),
    ("« Viens ici », dit-elle.", "\"Come here,\" she said."),
    ("Tom a 30 ans.", "Tom is thirty years old."),
    ("Je n'ai jamais vu un garçon aussi grand.", "I have never seen such a tall boy."),
    ("Le chat dort.", "The cat sleeps."),
]
# two long pairs: pairs 0-7 run together (35 and 45 words), and pairs 20-25 (43 and 41 words)
PAIRS += [tuple(" ".join(p[side] for p in PAIRS[a:b]) for side in (0, 1)) for a, b in ((0, 8), (20, 26))]

FWD = """
0: 0-0 1-1 2-2 2-3 3-4 4-5 5-6
1: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8
2: 0-0 1-1 2-2 3-3
3: 0-0 0-1 0-2 0-3 0-4 0-5
4: 0-0 0-1 1-2
5: 0-0 1-1 1-2 2-3 3-4 3-5 4-6
6: 0-0 1-1 2-2 3-3
7: 0-0 1-1 1-2 2-3 3-4
8: 0-0 0-1 2-2 2-3 3-4 4-5 5-6
9: 0-0 1-1 2-2 3-3 4-4 5-5
10: 0-0 1-1 2-2 3-3 4-4 5-5
11: 0-0 1-1 2-2 3-3 4-5 5-6 6-4 7-7 7-8
12: 0-0 1-1 1-2 2-3
13: 0-0 0-1 0-2
14: 0-0 1-1 3-2 4-3 5-4 6-5
15: 0-0 2-1 3-2 4-3 5-4 6-5 7-6
16: 0-0 1-1 3-2 4-3 4-4 6-5 7-6
17: 1-0 1-1 3-2 4-3 5-4 6-5
18: 0-0 3-1
19: 0-0 1-1 2-2 3-3 4-4 5-5 7-6 7-7
20: 0-0 1-1 2-2 3-3
21: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 6-7 7-8
22: 0-0 1-1 1-2 2-3 3-4
23: 0-0 2-1 3-2 6-3 7-4 8-5 9-6 12-7
24: 0-0 1-1 2-2 2-3 4-4 4-5 5-6
25: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
26: 0-0 1-1 3-2 4-3
27: 0-0 0-1 2-2 2-3 3-4
28: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
29: 0-0 1-1 2-2
30: 0-0 1-1 2-2 2-3 3-4 4-5 5-6 6-7 7-8 8-9 8-23 9-10 9-14 10-11 11-12 12-13 12-22 13-18 14-15 15-16 16-17 18-19
    19-20 19-21 19-24 19-25 20-26 20-27 21-28 22-29 23-30 23-31 24-32 25-33 25-34 26-35 27-36 28-37 29-38 30-39
    31-40 32-41 32-42 33-43 34-44
31: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8 9-9 10-10 10-11 11-12 12-13 13-14 13-15 14-16 15-17 16-18 18-19 19-20 22-21
    23-22 24-23 25-24 28-25 29-26 30-27 31-28 31-29 33-30 34-32 35-33 36-34 37-35 38-36 39-37 40-38 41-39 42-40
"""

REV = """
0: 0-0 1-1 2-3 3-4 4-5 5-6
1: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8
2: 0-0 1-1 2-2 3-3
3: 0-5
4: 0-0 1-2
5: 0-0 1-2 2-3 3-5 4-6
6: 0-0 1-1 2-2 3-3
7: 0-0 1-2 2-3 3-4
8: 0-1 1-1 2-3 3-4 4-5 5-6
9: 0-0 1-1 2-2 3-3 4-4 5-5
10: 0-0 1-1 2-2 3-3 4-4 5-5
11: 0-0 1-1 2-2 3-3 4-5 5-6 6-4 7-8
12: 0-0 1-2 2-3
13: 0-2
14: 0-0 1-1 2-2 3-2 4-3 5-4 6-5
15: 0-0 1-1 2-2 3-2 4-3 5-4 6-5 7-6
16: 0-0 1-1 2-2 3-2 4-3 5-4 6-5 7-6
17: 0-0 1-1 2-2 3-2 4-3 5-4 6-5
18: 0-0 1-0 2-1 3-1
19: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
20: 0-0 1-1 2-2 3-3
21: 0-0 1-1 2-2 3-3 4-4 5-5 6-7 7-8
22: 0-0 1-1 2-3 3-4
23: 0-0 1-0 2-1 3-1 4-2 5-3 6-3 7-4 8-5 9-5 10-6 11-6 12-7
24: 0-0 1-1 2-2 3-3 4-4 5-6
25: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
26: 0-0 1-1 2-1 3-2 4-3
27: 0-0 1-2 2-3 3-4
28: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
29: 0-0 1-1 2-2
30: 0-0 1-1 2-3 3-4 4-5 5-6 6-7 7-8 8-9 9-10 10-11 11-12 12-13 13-18 14-15 15-16 16-17 18-19 19-25 20-26 21-28 22-29
    23-31 24-32 25-33 26-35 27-36 28-37 29-38 30-39 31-40 32-42 33-43 34-44
31: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8 9-9 10-11 11-12 12-13 13-14 14-16 15-17 16-18 17-18 18-19 19-19 20-20 21-21
    22-21 23-22 24-23 25-23 26-24 28-25 29-26 30-27 31-28 32-29 33-30 34-32 35-33 36-34 37-35 38-36 39-37 40-38
    41-39 42-40
"""

SYM = """
0: 0-0 1-1 2-2 2-3 3-4 4-5 5-6
1: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8
2: 0-0 1-1 2-2 3-3
3: 0-0 0-1 0-2 0-3 0-4 0-5
4: 0-0 0-1 1-2
5: 0-0 1-1 1-2 2-3 3-4 3-5 4-6
6: 0-0 1-1 2-2 3-3
7: 0-0 1-1 1-2 2-3 3-4
8: 0-0 0-1 1-1 2-2 2-3 3-4 4-5 5-6
9: 0-0 1-1 2-2 3-3 4-4 5-5
10: 0-0 1-1 2-2 3-3 4-4 5-5
11: 0-0 1-1 2-2 3-3 4-5 5-6 6-4 7-7 7-8
12: 0-0 1-1 1-2 2-3
13: 0-0 0-1 0-2
14: 0-0 1-1 2-2 3-2 4-3 5-4 6-5
15: 0-0 1-1 2-1 3-2 4-3 5-4 6-5 7-6
16: 0-0 1-1 2-2 3-2 4-3 4-4 5-4 6-5 7-6
17: 0-0 1-1 2-2 3-2 4-3 5-4 6-5
18: 0-0 1-0 2-1 3-1
19: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
20: 0-0 1-1 2-2 3-3
21: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 6-7 7-8
22: 0-0 1-1 1-2 2-3 3-4
23: 0-0 1-0 2-1 3-1 3-2 4-2 5-3 6-3 7-4 8-5 9-5 9-6 10-6 11-6 12-7
24: 0-0 1-1 2-2 2-3 3-3 4-4 4-5 5-6
25: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
26: 0-0 1-1 2-1 3-2 4-3
27: 0-0 0-1 1-2 2-3 3-4
28: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7
29: 0-0 1-1 2-2
30: 0-0 1-1 2-2 2-3 3-4 4-5 5-6 6-7 7-8 8-9 9-10 10-11 11-12 12-13 13-18 14-15 15-16 16-17 18-19 19-20 19-21 19-24
    19-25 20-26 20-27 21-28 22-29 23-30 23-31 24-32 25-33 25-34 26-35 27-36 28-37 29-38 30-39 31-40 32-41 32-42
    33-43 34-44
31: 0-0 1-1 2-2 3-3 4-4 5-5 6-6 7-7 8-8 9-9 10-10 10-11 11-12 12-13 13-14 13-15 14-16 15-17 16-18 17-18 18-19 19-19
    19-20 20-20 21-21 22-21 23-22 24-23 25-23 25-24 26-24 28-25 29-26 30-27 31-28 31-29 32-29 33-30 34-32 35-33
    36-34 37-35 38-36 39-37 40-38 41-39 42-40
"""


# fast_align's output lines, one per pair ("k: i-j ..." with 0-based source i, target j), sorted, wrapped


def parse(block):
    """'k: i-j i-j ...' lines (a pair may continue on indented lines) -> one sorted list of (i, j) per pair."""
    pairs = []
    for tok in block.split():
        if tok.endswith(":"):
            assert int(tok[:-1]) == len(pairs)
            pairs.append([])
        else:
            i, j = tok.split("-")
            pairs[-1].append((int(i), int(j)))
    return [sorted(p) for p in pairs]


def three_stages(S, T):
    """Forward, reverse (as (src, tgt) links) and grow-diag-final-and links, each sorted per pair."""
    fwd = [sorted(ln) for ln in align.ibm2_align(S, T)]
    rev = [sorted((i, j) for j, i in ln) for ln in align.ibm2_align(T, S)]
    return fwd, rev, [sorted(align.grow_diag_final_and(f, r)) for f, r in zip(fwd, rev)]


def test_known_answer_against_cpp_fast_align():
    S, T = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    got = three_stages(S, T)
    for name, mine, block in zip(("forward", "reverse", "grow-diag-final-and"), got, (FWD, REV, SYM)):
        want = parse(block)
        assert len(want) == len(PAIRS)
        bad = [k for k in range(len(PAIRS)) if mine[k] != want[k]]
        assert not bad, f"{name}: pairs {bad} differ from fast_align's, first: {mine[bad[0]]} != {want[bad[0]]}"
    assert [sorted(ln) for ln in align.fast_align(S, T)] == got[2]
    # word lists give the same links as the strings they split into (on ASCII spaces only)
    words = [[w for w in s.split(" ") if w] for s in S]
    assert align.ibm2_align(words, T) == align.ibm2_align(S, T)


# -----------------------------------------------------------------------------------------------------
# the first 1,000 Tatoeba fra-eng pairs: sha256 of fast_align's links, one line per pair, "i-j" sorted,
# joined by spaces, lines ending in \n (links: forward 6,798, reverse 7,442, symmetrised 8,425)

TATOEBA_SHA256 = {
    "forward": "a613752672aaa1ecd0989cb939c6c6f65a2f03e7bbaac7a6e734936e4635df47",
    "reverse": "b7cf1bace9ce1e2a4acab930c018ebb5087dcfbea3ed1198979ac1de7352a26b",
    "grow-diag-final-and": "7c6f97b8a51ef8d6ec333ca203b7142380f99919ae727a6deb1d7360c0cf0042",
}


@pytest.mark.skipif(not (DATA / "tatoeba").is_dir(), reason=f"real data not present at {DATA} (a bare clone): skipped")
def test_tatoeba_fra_eng_against_cpp_fast_align():
    S, T = bpe.read_parallel(str(DATA / "tatoeba/tatoeba.fra-eng.fra"), str(DATA / "tatoeba/tatoeba.fra-eng.eng"), 1000)
    assert len(S) == 1000
    for name, links in zip(TATOEBA_SHA256, three_stages(S, T)):
        text = "".join(" ".join(f"{i}-{j}" for i, j in ln) + "\n" for ln in links)
        assert hashlib.sha256(text.encode()).hexdigest() == TATOEBA_SHA256[name], \
            f"{name}: links differ from fast_align's ({sum(map(len, links))} links)"
