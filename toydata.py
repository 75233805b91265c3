"""toydata.py: a synthetic bilingual world, written in the real data formats.

The paper (Conneau et al., ACL 2020, §3-§5) pretrains bilingual MLMs on Wikipedia and evaluates
zero-shot transfer on XNLI, WikiAnn NER and UD parsing, plus word/sentence alignment against MUSE
and Tatoeba. This file builds a stand-in world whose ground truth is known, in those formats:
- one language-independent meaning space: nouns in semantic groups, named entities (PER/LOC/ORG,
  often several tokens), verbs with selectional restrictions, adjectives fitting noun groups,
  prepositions, adverbs, determiners; Zipfian frequencies, a few topics reweight content words;
- a small probabilistic grammar samples a dependency tree over concepts (UPOS, universal deprels);
- each language renders each concept as its own pronounceable random word (its own letters,
  Cyrillic on request) in its own order (`--order`): vocabularies are disjoint unless `--overlap`
  makes some forms identical (anchors, §4.2); the languages share only *statistics* (isomorphic);
- `--domain-shift` gives each language its own topic mix (domain similarity, paper §4.1).
Run: python toydata.py --out out/toy  (en + fr, disjoint vocabularies; --size tiny: the tests')
     python toydata.py --out out/toy2 --overlap 0.3 --order sov-na --domain-shift 0.5 --cyrillic
"""
import argparse
import bisect
import collections
import contextlib
import fcntl
import functools
import json
import os
import random
import re
import shutil
import signal
import time

import numpy as np


class InputError(ValueError):
    """A bad argument, the whole message (code 2: a flag's usage error); bpe.py's, copied."""
    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.code = code


# -----------------------------------------------------------------------------
# The meaning space: semantic groups, verb frames, prepositions (language independent)
GROUPS = tuple("person animal food plant tool vehicle building place organisation document event "
               "material".split())
ENTITY_GROUP = {"PER": "person", "LOC": "place", "ORG": "organisation"}


def _table(text):
    """Lines 'key: a b | c' -> {key: (("a", "b"), ("c",))} (an empty part: ())."""
    rows = (line.split(":") for line in text.strip().splitlines())
    return {key: tuple(tuple(part.split()) for part in parts.split("|")) for key, parts in rows}


# preposition: groups of its object | groups of the nouns it may modify as nmod
PREPOSITIONS = _table("""
in: place building vehicle organisation event | person animal food plant tool document
with: person animal tool material | person food building vehicle
for: person organisation event animal | food tool document building
to: place building person organisation | document vehicle
from: place organisation building | person food document material animal
near: place building plant | building place animal
about: person event place organisation animal plant | document event
of: material | tool building vehicle
at: event building place | person organisation
""")

# verb class: subject groups | object groups (none: intransitive) | prepositions of its obliques
VERB_CLASSES = _table("""
consume: person animal | food plant | in with near
make: person organisation | tool vehicle building document food | for with in
move: person animal vehicle | | to from in near
visit: person organisation | place building event organisation | with for at
tell: person organisation | document event | to about for at
meet: person organisation | person organisation animal | in at near
use: person organisation | tool vehicle material | for in at
grow: plant animal | | in near
trade: person organisation | building vehicle tool animal material document | from for to
happen: event | | in near at
perceive: person animal | animal food plant vehicle building person event | in near from
shape: person organisation | material plant food | with in for
""")

DETERMINERS = {"def": 0.5, "indef": 0.3, "dem": 0.12, "quant": 0.08}  # the/a/this/every

# the universal POS tags of the kinds
KIND_UPOS = {"noun": "NOUN", "name": "PROPN", "verb": "VERB", "adj": "ADJ", "adv": "ADV",
             "adp": "ADP", "det": "DET", "punct": "PUNCT"}
CONTENT_KINDS = ("noun", "name", "verb", "adj", "adv")

ZIPF_A = 1.0  # weight of rank r (1-based) inside a class = 1 / r^ZIPF_A
N_TOPICS = 6
TOPIC_BOOST = 8.0  # a word of topic t is this much likelier about t
ENTITY_SHARE = 0.4  # entities' mass, relative to their groups' nouns
# grammar probabilities: a determiner, an adjective, a second one, an nmod, an oblique, an adverb
P_DET, P_AMOD, P_AMOD2, P_NMOD, P_OBL, P_ADV = 0.8, 0.35, 0.1, 0.15, 0.4, 0.12


def _zipf(n, rng):
    """Zipfian weights for n items, ranks in random order: the meanings' shared 'frequency'."""
    return (1.0 / (rng.permutation(n) + 1) ** ZIPF_A).tolist()


class World:
    """The concept inventory. Concepts are ints, each with a kind, a name, a weight and a topic;
    entities are tuples of name-part concepts (given name + surname) typed PER/LOC/ORG. `scale`
    multiplies every open class (name parts too); closed classes and grammar stay."""
    def __init__(self, seed=0, scale=1):
        nouns_per_group = 36 * scale
        verbs_per_class = 12 * scale
        n_adj = 120 * scale
        n_adv = 24 * scale
        n_per, n_loc, n_org = 120 * scale, 80 * scale, 60 * scale  # entities of each type
        rng = np.random.default_rng([seed, 1])
        self.kind = []
        self.name = []
        self.weight = []
        self.topic = []
        def add(kind, name, weight, topic=-1):  # a new concept
            self.kind.append(kind)
            self.name.append(name)
            self.weight.append(weight)
            self.topic.append(topic)
            return len(self.kind) - 1
        topics = lambda n: rng.integers(N_TOPICS, size=n).tolist()  # n random topics
        def pick(names, p=1.0):  # one of names with probability p, else nothing
            return (int(rng.choice(names)),) if p == 1.0 or rng.random() < p else ()
        # nouns: a group's first is its hypernym ("animal", rank 3), which NLI never swaps
        self.group_nouns = {}
        self.noun_group = {}
        for g in GROUPS:
            w = _zipf(nouns_per_group, rng)
            t = topics(nouns_per_group)
            w[0] = 1.0 / 3 ** ZIPF_A
            ids = [add("noun", f"{g}.{i:02d}" if i else g, w[i], t[i] if i else -1)
                   for i in range(nouns_per_group)]
            self.group_nouns[g] = ids
            self.noun_group.update(dict.fromkeys(ids, g))
        self.hypernyms = {ids[0] for ids in self.group_nouns.values()}
        # verbs in antonym pairs (+/-); both share one frame (perturbed from the class frame)
        self.verb_frame = {}
        for vc, (subj, obj, obl) in VERB_CLASSES.items():
            w = _zipf(verbs_per_class, rng)
            for p in range(verbs_per_class // 2):
                s = tuple(g for g in subj if len(subj) == 1 or rng.random() > 0.25) or subj[:1]
                o = tuple(g for g in obj if rng.random() > 0.3) or obj[:1]
                t = int(rng.integers(N_TOPICS))
                for k, sign in enumerate("+-", 2 * p):  # rank 2p is +, rank 2p + 1 is -
                    v = add("verb", f"{vc}.{p:02d}{sign}", w[k], t)
                    self.verb_frame[v] = (s, o, obl, vc)
        # adjectives: each fits 1-3 noun groups (a few fit all); every group gets some
        self.group_adjs = {g: [] for g in GROUPS}
        w = _zipf(n_adj, rng)
        t = topics(n_adj)
        for i in range(n_adj):
            c = add("adj", f"adj.{i:03d}", w[i], t[i])
            fit = (GROUPS if i % 15 == 0
                   else rng.choice(GROUPS, size=int(rng.integers(1, 4)), replace=False))
            for g in fit:
                self.group_adjs[g].append(c)
        for g in GROUPS:  # a handful of adjectives per group at least
            while len(self.group_adjs[g]) < 6:
                c = add("adj", f"adj.{g}.{len(self.group_adjs[g])}", 0.05,
                        int(rng.integers(N_TOPICS)))
                self.group_adjs[g].append(c)
        w = _zipf(n_adv, rng)
        t = topics(n_adv)
        self.advs = [add("adv", f"adv.{i:02d}", w[i], t[i]) for i in range(n_adv)]
        w = _zipf(len(PREPOSITIONS), rng)
        self.preps = {p: add("adp", p, w[i]) for i, p in enumerate(PREPOSITIONS)}
        self.dets = [add("det", d, wt) for d, wt in DETERMINERS.items()]
        self.punct = add("punct", ".", 1.0)
        # named entities: tuples of name parts; multi-word ones give B- and I- tags
        parts = lambda prefix, n: [add("name", f"{prefix}.{i:02d}", 1.0) for i in range(n)]
        given = parts("PER.given", 50 * scale)
        surname = parts("PER.surname", 50 * scale)
        place = parts("LOC.name", 60 * scale)
        place_pre = parts("LOC.prefix", 4)
        org = parts("ORG.name", 40 * scale)
        org_suf = parts("ORG.suffix", 6)
        entities_found = set()
        while len(entities_found) < n_per:
            entities_found.add(("PER", pick(given) + pick(surname, 0.6)))
        while len(entities_found) < n_per + n_loc:
            entities_found.add(("LOC", pick(place_pre, 0.25) + pick(place)))
        while len(entities_found) < n_per + n_loc + n_org:
            entities_found.add(("ORG", pick(org) + pick(org, 0.2) + pick(org_suf, 0.7)))
        self.entities = sorted(entities_found)  # sorted: deterministic order
        self.entity_parts = [p for _, p in self.entities]
        self.entity_weight = [0.0] * len(self.entities)
        for typ in ENTITY_GROUP:
            idx = [i for i, (t, _) in enumerate(self.entities) if t == typ]
            z = _zipf(len(idx), rng)
            noun_mass = sum(self.weight[c] for c in self.group_nouns[ENTITY_GROUP[typ]])
            for i, wi in zip(idx, z):
                self.entity_weight[i] = ENTITY_SHARE * noun_mass * wi / sum(z)
        self.entity_topic = topics(len(self.entities))
        # name parts get the weight of the entities they occur in (used for the dictionary ranking)
        for i, p in enumerate(self.entity_parts):
            for c in p:
                self.weight[c] += self.entity_weight[i]
        self.n_concepts = len(self.kind)
        self._cdfs = {}  # slot key -> topic -> (items, cdf); then the keys
        self.np_key = {p: "np:" + ",".join(obj) for p, (obj, _) in PREPOSITIONS.items()}
        preps_of = lambda g: [p for p, (_, mod) in PREPOSITIONS.items() if g in mod]
        self.nmod_key = {g: "prep:" + ",".join(preps_of(g)) for g in GROUPS}
        self.frame_keys = {v: ("np:" + ",".join(s), "np:" + ",".join(o) if o else None,
                               "prep:" + ",".join(obl))
                           for v, (s, o, obl, _) in self.verb_frame.items()}
    def draw(self, rng, key, topic=-1):
        """One item of slot `key` (e.g. 'np:person,animal') by Zipf weight x topic boost (topic
        -1: none), entities as -(e + 1): a bisect into cumulative weights cached per key, topic."""
        try:
            items, cdf = self._cdfs[key][topic]
        except KeyError:
            kind, _, arg = key.partition(":")
            args = arg.split(",")
            if kind in ("verb", "adv", "det"):
                items = {"verb": list(self.verb_frame), "adv": self.advs, "det": self.dets}[kind]
            elif kind == "adj":  # the adjectives that fit one group
                items = self.group_adjs[arg]
            elif kind == "noun":  # common nouns of one group, hypernym excluded
                items = self.group_nouns[arg][1:]
            elif kind == "prep":  # the listed prepositions
                items = [self.preps[p] for p in args]
            elif kind == "np":  # common nouns and entities of the listed groups
                items = [c for g in args for c in self.group_nouns[g]]
                items += [-(e + 1) for e, (t, _) in enumerate(self.entities)
                          if ENTITY_GROUP[t] in args]
            else:  # 'entity:TYPE,LENGTH' (NLI argument changes)
                items = [-(e + 1) for e, (t, p) in enumerate(self.entities)
                         if t == args[0] and len(p) == int(args[1])]
            w = [self.entity_weight[-i - 1] if i < 0 else self.weight[i] for i in items]
            t = [self.entity_topic[-i - 1] if i < 0 else self.topic[i] for i in items]
            w = [wi * (TOPIC_BOOST if ti == topic and topic >= 0 else 1.0) for wi, ti in zip(w, t)]
            cdf = np.cumsum(w).tolist()
            self._cdfs.setdefault(key, {})[topic] = (items, cdf)
        return items[bisect.bisect_right(cdf, rng.random() * cdf[-1], 0, len(cdf) - 1)]


# -----------------------------------------------------------------------------
# The grammar: a dependency tree over concepts, a list of nodes [concept, head, deprel] (head -1:
# the root), every dependent after its head; each language chooses the surface order later.
def add_np(world, rng, tree, key, head, rel, prep=None, topic=-1, depth=0):
    """Append a noun phrase (or named entity) for slot `key` ('np:g1,g2') to `tree` -> its index."""
    item = world.draw(rng, key, topic)
    i = len(tree)
    # a named entity: its first part is the head, the rest attach as flat
    if item < 0:
        parts = world.entity_parts[-item - 1]
        tree.append([parts[0], head, rel])
        tree += [[p, i, "flat"] for p in parts[1:]]
    else:
        g = world.noun_group[item]
        tree.append([item, head, rel])
        if rng.random() < P_DET:
            tree.append([world.draw(rng, "det"), i, "det"])
        if rng.random() < P_AMOD:
            a = world.draw(rng, "adj:" + g, topic)
            tree.append([a, i, "amod"])
            if rng.random() < P_AMOD2:
                b = world.draw(rng, "adj:" + g, topic)
                if b != a:
                    tree.append([b, i, "amod"])
        if depth == 0 and rng.random() < P_NMOD and world.nmod_key[g] != "prep:":
            p = world.name[world.draw(rng, world.nmod_key[g])]
            add_np(world, rng, tree, world.np_key[p], i, "nmod", p, topic, depth + 1)
    if prep is not None:
        tree.append([world.preps[prep], i, "case"])
    return i


def add_obl(world, rng, tree, topic=-1):
    """Append an oblique (preposition + noun phrase) to the verb at node 0, its preposition."""
    p = world.name[world.draw(rng, world.frame_keys[tree[0][0]][2])]
    add_np(world, rng, tree, world.np_key[p], 0, "obl", p, topic)


def sample_tree(world, rng, topic=-1):
    """One sentence meaning: verb (root), subject, object if transitive, maybe oblique, adverb."""
    v = world.draw(rng, "verb", topic)
    subj, obj, _ = world.frame_keys[v]
    tree = [[v, -1, "root"]]
    add_np(world, rng, tree, subj, 0, "nsubj", topic=topic)
    if obj:
        add_np(world, rng, tree, obj, 0, "obj", topic=topic)
    if rng.random() < P_OBL:
        add_obl(world, rng, tree, topic)
    if rng.random() < P_ADV:
        tree.append([world.draw(rng, "adv", topic), 0, "advmod"])
    tree.append([world.punct, 0, "punct"])
    return tree


# -----------------------------------------------------------------------------
# Word order: each deprel goes before (-1) or after (+1) its head, a priority (higher: farther)
ORDER_RE = re.compile(r"^(svo|sov|vso|vos|osv|ovs)(?:-(an|na))?(?:-(pre|post))?$")
ORDER_HELP = ("CLAUSE[-ADJ][-ADP]: CLAUSE svo/sov/vso/vos/osv/ovs, ADJ an (adjective first, "
              "default) or na, ADP pre (prepositions, default) or post (postpositions, genitive "
              "first); e.g. svo-na (French-like), sov-an-post")


def parse_order(order):
    """'sov-na-post' -> {deprel: (side, priority)}; an unknown order: InputError."""
    m = ORDER_RE.match(order or "")
    if not m:
        raise InputError(f"unknown order {order!r}; expected {ORDER_HELP}", 2)
    clause, adj, adp = m.groups()
    pre = adp != "post"
    v = clause.index("v")
    side = {x: -1 if clause.index(x) < v else 1 for x in "so"}
    dist = {x: abs(clause.index(x) - v) for x in "so"}
    rules = {"nsubj": (side["s"], 5 if dist["s"] > dist["o"] else 1),
             "obj": (side["o"], 5 if dist["o"] > dist["s"] else 1),
             "obl": (side["o"], 3), "advmod": (side["o"], 4), "punct": (1, 99),
             "det": (-1, 5), "amod": (1 if adj == "na" else -1, 2), "flat": (1, 0),
             "case": (-1 if pre else 1, 9), "nmod": (1, 3) if pre else (-1, 7)}
    # V S O / O S V: the object stays nearer than obliques and adverbs
    if side["s"] == side["o"] and dist["o"] > dist["s"]:
        rules["obj"] = (side["o"], 2)
    return rules


@functools.lru_cache(maxsize=None)
def linearize(shape, order):
    """Projective surface order (node indices) of a tree shape ((head, deprel) per node) in one
    word order; cached (a corpus has a few thousand shapes, whatever its words)."""
    rules = parse_order(order)
    deps = [[] for _ in shape]
    for i, (h, _) in enumerate(shape[1:], 1):
        deps[h].append(i)
    out = []
    # the dependents before the head (side -1) farthest first, the head, then those after it
    # nearest first: one stable sort by side x priority, the head at -0.5 (priorities are >= 1)
    def visit(i):
        place = {d: rules[shape[d][1]][0] * rules[shape[d][1]][1] for d in deps[i]}
        place[i] = -0.5
        for d in sorted(place, key=place.get):
            if d == i:
                out.append(i)
            else:
                visit(d)
    visit(0)  # the root
    return tuple(out)  # cached: read-only


# -----------------------------------------------------------------------------
# Word forms: pronounceable random strings from a language-specific letter inventory
# (onset consonants, vowels, final consonants) of a syllable
LETTERS_L0 = ("ptkbdgmnlrsfwh", "aeiou", "nsrtl")
LETTERS_L1 = ("bdfgjklmnprstvz", "aeiouéà", "rls")
LETTERS_CYRILLIC = ("бвгджзклмнпрстхш", "аеиоуыя", "нрстй")  # the second language's, --cyrillic
FULL_STOPS = (".", "。")  # the full stop of the first and of the second language


def make_lexicon(world, overlap=0.0, cyrillic=False, seed=0, name_overlap=None):
    """forms[l][c]: concept c's word form in language l (0, 1), unique in a language; an `overlap`
    fraction keep language 0's form (anchors; `name_overlap`: redrawn among entity name parts);
    frequent words are shorter (Zipf's law of abbreviation)."""
    rng = np.random.default_rng([seed, 2])
    n = world.n_concepts
    shared = set(rng.choice(n, size=int(round(overlap * n)), replace=False).tolist())
    if name_overlap is not None:
        names = [c for c in range(n) if world.kind[c] == "name"]
        pick = np.random.default_rng([seed, 5]).choice(
            names, size=int(round(name_overlap * len(names))), replace=False)
        shared = (shared - set(names)) | set(pick.tolist())
    # the 20 most frequent concepts of each kind: the shortest content words
    frequent = set()
    for k in set(world.kind):
        frequent.update(sorted((c for c in range(n) if world.kind[c] == k),
                               key=lambda c: -world.weight[c])[:20])
    forms = []
    used = set()  # every form so far, in either language
    alphabets = (LETTERS_L0, LETTERS_CYRILLIC if cyrillic else LETTERS_L1)
    for li, (cons, vows, coda) in enumerate(alphabets):
        forms.append([])
        for c in range(n):
            k = world.kind[c]
            if li == 1 and c in shared:
                w = forms[0][c]
            elif k == "punct":
                w = FULL_STOPS[li]
            else:
                # syllables: function words 1, frequent words 2, else 3 with p 0.5 (name), 0.6 or 2
                if k in ("det", "adp"):
                    nsyl = 1
                elif k == "name" or c not in frequent:
                    nsyl = 2 + int(rng.random() < (0.5 if k == "name" else 0.6))
                else:
                    nsyl = 2
                while True:
                    w = "".join(cons[rng.integers(len(cons))] + vows[rng.integers(len(vows))]
                                for _ in range(nsyl))
                    if rng.random() < 0.3:
                        w += coda[rng.integers(len(coda))]
                    if k == "name":
                        w = w.capitalize()
                    if w not in used:
                        break
                    nsyl += rng.random() < 0.2  # crowded: allow a longer word now and then
            forms[li].append(w)
            used.add(w)
    return forms


# -----------------------------------------------------------------------------
# NLI pairs: the label follows from the meaning *and* from how premise and hypothesis line up
# (structure a shared encoder carries across languages), not from single-word relations (an
# antonym verb shares its verb's frame: an MLM cannot tell them apart). Entailment drops a
# modifier, neutral adds one, contradiction swaps subject and object or changes an argument; an
# edit gets a copy of the premise -> the hypothesis, or None where it does not apply.
# the generator's order (example i gets LABELS[i % 3]); finetune.py maps them to XLM's ids by name
LABELS = ("entailment", "neutral", "contradiction")


def _choice(rng, options):
    """One of options, uniformly, by one draw of rng.random()."""
    return options[int(rng.random() * len(options))]


def _drop(world, rng, tree):
    """Entailment: one modifier removed with its subtree (one pass: dependents follow heads)."""
    mods = [i for i, n in enumerate(tree) if n[2] in ("amod", "advmod", "nmod", "obl")]
    if not mods:
        return None
    dropped = {_choice(rng, mods)}
    for j, (_, h, _) in enumerate(tree):
        if h in dropped:
            dropped.add(j)
    keep = [j for j in range(len(tree)) if j not in dropped]
    new = {j: k for k, j in enumerate(keep)}
    return [[c, new.get(h, -1), rel] for c, h, rel in (tree[j] for j in keep)]


def _add(world, rng, tree):
    """Neutral: one modifier the tree does not state added (an adjective, oblique or adverb)."""
    nouns = [i for i, n in enumerate(tree) if world.kind[n[0]] == "noun"]
    options = [r for r in ("obl", "advmod") if r not in {n[2] for n in tree}]  # not stated yet
    options = (["amod"] if nouns else []) + options
    if not options:
        return None
    choice = _choice(rng, options)
    if choice == "amod":
        i = _choice(rng, nouns)
        a = world.draw(rng, "adj:" + world.noun_group[tree[i][0]])
        if [a, i, "amod"] in tree:  # the noun has that adjective already
            return None
        tree.append([a, i, "amod"])
    elif choice == "obl":
        add_obl(world, rng, tree)
    else:
        tree.append([world.draw(rng, "adv"), 0, "advmod"])
    return tree


def _contradict(world, rng, tree):
    """Contradiction: half the time subject and object swapped (with their modifiers), else another
    noun of the same group or another entity of the same type as subject or object."""
    if rng.random() < 0.5:
        roles = {n[2]: i for i, n in enumerate(tree) if n[1] == 0}
        if "nsubj" not in roles or "obj" not in roles:
            return None
        tree[roles["nsubj"]][2] = "obj"
        tree[roles["obj"]][2] = "nsubj"
        return tree
    # a subject or object that is a name, or a noun other than a hypernym
    candidates = [i for i, n in enumerate(tree) if n[2] in ("nsubj", "obj")
             and world.kind[n[0]] in ("name", "noun") and n[0] not in world.hypernyms]
    if not candidates:
        return None
    i = _choice(rng, candidates)
    old = tree[i][0]
    if world.kind[old] == "noun":
        while tree[i][0] == old:
            tree[i][0] = world.draw(rng, "noun:" + world.noun_group[old])
        return tree
    span = [i] + [j for j, n in enumerate(tree) if n[1] == i and n[2] == "flat"]  # entity tokens
    typ = world.name[old].split(".")[0]
    if sum(t == typ and len(p) == len(span) for t, p in world.entities) < 2:
        return None
    new = parts = tuple(tree[j][0] for j in span)
    while new == parts:
        new = world.entity_parts[-world.draw(rng, f"entity:{typ},{len(span)}") - 1]
    for j, c in zip(span, new):
        tree[j][0] = c
    return tree


def sample_nli(world, rng, label):
    """(premise tree, hypothesis tree) for one label: a new premise until the edit applies."""
    edit = {"entailment": _drop, "neutral": _add, "contradiction": _contradict}[label]
    while True:
        p = sample_tree(world, rng)
        h = edit(world, rng, [list(n) for n in p])  # the edit changes a copy
        if h is not None and h != p and (label != "neutral" or _new_concepts(p, h)):
            return p, h


def _new_concepts(p, h):
    """Concepts the hypothesis states that the premise does not (as a multiset difference)."""
    stated = collections.Counter(n[0] for n in h) - collections.Counter(n[0] for n in p)
    return list(stated.elements())


# -----------------------------------------------------------------------------
# Sentences: trees sampled about a topic, rendered in one language
def render(tree, forms, order):
    """(surface words, surface order) of a tree in one language."""
    ids = linearize(tuple((h, r) for _, h, r in tree), order)
    return [forms[tree[i][0]] for i in ids], ids


def _sample_trees(world, stream, n, mixture=None, need_entity=False):
    """n trees about topics drawn from `mixture` (None: none), with a name if need_entity; `stream`
    (e.g. '0/parallel') seeds its random.Random."""
    rng = random.Random(stream)
    cdf = np.cumsum(mixture).tolist() if mixture is not None else None
    trees = []
    while len(trees) < n:
        topic = -1 if cdf is None else min(bisect.bisect_right(cdf, rng.random() * cdf[-1]),
                                           N_TOPICS - 1)
        t = sample_tree(world, rng, topic)
        if not need_entity or any(world.kind[c] == "name" for c, _, _ in t):
            trees.append(t)
    return trees


# =============================================================================
# Below: write_world, the world in the real data formats (CoNLL-U, PAN-X, XNLI, MUSE, Tatoeba); CLI
def conllu_block(world, tree, forms, order, sent_id):
    words, ids = render(tree, forms, order)  # node -> 1-based position; the root's head is 0
    pos = {-1: 0} | {i: k + 1 for k, i in enumerate(ids)}
    rows = [f"{k + 1}\t{words[k]}\t{words[k]}\t{KIND_UPOS[world.kind[c]]}\t_\t_\t{pos[h]}\t"
            f"{rel}\t_\t_" for k, (c, h, rel) in enumerate(tree[i] for i in ids)]
    return "\n".join([f"# sent_id = {sent_id}", f"# text = {' '.join(words)}"] + rows) + "\n\n"


def ner_block(world, tree, forms, order):
    """IOB2: an entity's first name part is B-TYPE, the parts attached to it as flat are I-TYPE."""
    words, ids = render(tree, forms, order)
    tags = [f"{'I' if rel == 'flat' else 'B'}-{world.name[c].split('.')[0]}"
            if world.kind[c] == "name" else "O" for c, _, rel in (tree[i] for i in ids)]
    return "".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + "\n"


def _write(out_dir, name, text):
    """out_dir/name (e.g. 'mono/en.train.txt') written atomically: never a half-written file."""
    path = os.path.join(out_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"  # bpe.atomic_path's write-then-rename
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as e:  # a full disk, Ctrl-C: no temporary file is left
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            e.filename = path  # not the .tmp, or no file at all
        raise


@contextlib.contextmanager
def _locked(out_dir):
    """One writer per folder: out_dir/.lock (its pid), held by flock while the world is written."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, ".lock"), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise InputError(f"--out {out_dir} is in use by another toydata.py (pid "
                             f"{f.read().strip()}); wait for it to end, or use another --out")
        f.truncate(0)
        print(os.getpid(), file=f, flush=True)
        try:
            yield
        finally:
            os.remove(f.name)


# Sentences per file (--size; pretrain.py --toy-size), by write_world's arguments (--help's names)
SIZE_KEYS = dict(n_train="mono train", n_dev="dev", n_test="test", n_parallel="parallel",
                 n_task_train="task train", n_task_eval="task dev/test", n_tatoeba="Tatoeba")
SIZES = {"tiny": (400, 60, 60, 60, 60, 30, 60), "small": (5000, 300, 300, 500, 500, 200, 300),
         "full": (20000, 1000, 1000, 2000, 2000, 500, 1000),
         "paper": (20000, 1000, 1000, 2000, 1000, 300, 1000)}
SIZES = {k: dict(zip(SIZE_KEYS, v)) for k, v in SIZES.items()}
# what write_world writes (a folder ends in /; .tmp: cut short): --force replaces nothing else
WRITTEN = re.compile(r"(mono|dict|parallel|tatoeba|ner|ud|xnli)/|((mono|ner|ud|xnli)/\w+\."
                     r"(train|dev|test)\.(txt|tsv|conllu)|dict/\w+-\w+(\.train|\.test)?\.txt"
                     r"|(parallel/\w+-\w+\.train|tatoeba/tatoeba\.\w+-\w+)\.\w+"
                     r"|world\.json|\.lock)(\.tmp)?")


def write_world(out_dir, langs=("en", "fr"), overlap=0.0, order="svo", domain_shift=0.0,
                n_train=20000, n_dev=1000, n_test=1000, n_parallel=2000, n_task_train=2000,
                n_task_eval=500, seed=0, cyrillic=False, n_tatoeba=1000, force=False,
                name_overlap=None, scale=1):
    """Generate the world, write every file under out_dir -> a summary dict. langs = (l0, l1): l0
    is the source ("English": SVO, adjective first, prepositions), l1 has the word order `order`:
        mono/{lang}.{train,dev,test}.txt           monolingual, sampled per language (not parallel)
        dict/{l0}-{l1}.txt, .train.txt, .test.txt  MUSE `src tgt`; train/test: distinct source words
        parallel/{l0}-{l1}.train.{l0|l1}, tatoeba/ parallel sentences (line i = line i); test pairs
        {ner,ud,xnli}/{lang}.{train,dev,test}.*    token<TAB>IOB2; CoNLL-U; premise<TAB>hyp<TAB>lab
        world.json                                 knobs, seed, vocabulary sizes (written last)"""
    t0 = time.time()
    # every bad argument is an InputError naming the flag of `python toydata.py`, before any write
    if not (len(set(langs)) == len(langs) == 2 and all(map(str.isalpha, langs))):
        raise InputError(f"--langs {','.join(langs)}: expected two distinct codes of letters "
                         "(bilingual models), e.g. en,fr", 2)
    if seed < 0:
        raise InputError(f"--seed must be >= 0, got {seed}", 2)
    for name, v in (("overlap", overlap), ("domain_shift", domain_shift),
                    ("name_overlap", name_overlap)):
        if v is not None and not 0.0 <= v <= 1.0:
            raise InputError(f"{name} must be in [0, 1], got {v}", 2)
    # drawing unique word forms slows as they crowd
    if not (isinstance(scale, int) and 1 <= scale <= 64):
        raise InputError(f"--scale must be an integer in 1..64 (64: 60,416 concepts in about "
                         f"15 s), got {scale}", 2)
    if not out_dir:
        raise InputError("--out '': an empty path", 2)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"--out {out_dir}: exists and is not a directory", 2)
    parse_order(order)
    world = World(seed, scale=scale)
    l0, l1 = langs
    with _locked(out_dir):
        if set(os.listdir(out_dir)) - {".lock"}:
            if not force:
                raise FileExistsError(f"{out_dir} is not empty; pass --force to overwrite it "
                                      "(write_world: force=True)")
            # a toy world only: all below out_dir is what this writes, no link (a user's mono/)
            for top, dirs, files in os.walk(out_dir):
                for name in dirs + files:
                    path = os.path.join(top, name)
                    found = os.path.relpath(path, out_dir) + ("/" if name in dirs else "")
                    link = ", a link" if os.path.islink(path) else ""
                    if link or not WRITTEN.fullmatch(found):
                        raise FileExistsError(f"--force: {out_dir} is not a toy world (it holds "
                                              f"{found}{link}); nothing was removed")
            # world.json first: a world cut short from here on has none, so it reads as incomplete
            for name in ("world.json", "mono", "dict", "parallel", "tatoeba", "ner", "ud", "xnli"):
                path = os.path.join(out_dir, name)
                if os.path.isfile(path):
                    os.remove(path)
                shutil.rmtree(path, ignore_errors=True)  # a folder, if it exists
        forms = make_lexicon(world, overlap, cyrillic, seed, name_overlap)
        orders = ("svo", order)
        sizes = {"train": n_train, "dev": n_dev, "test": n_test}
        task_sizes = {"train": n_task_train, "dev": n_task_eval, "test": n_task_eval}
        # a tree in language li; trees, a line each
        sentence = lambda tree, li: " ".join(render(tree, forms[li], orders[li])[0])
        text = lambda trees, li: "".join(sentence(t, li) + "\n" for t in trees)
        # monolingual corpora, each language's own topic mix (domain similarity, §4.1): uniform at
        # domain_shift 0, only the language's own topics at 1
        for li, lang in enumerate(langs):
            mix = np.full(N_TOPICS, (1 - domain_shift) / N_TOPICS)
            mix[li::2] += domain_shift / (N_TOPICS // 2)  # own topics: l0 the even, l1 the odd ones
            for split, n in sizes.items():
                trees = _sample_trees(world, f"{seed}/mono/{lang}/{split}", n, mix)
                _write(out_dir, f"mono/{lang}.{split}.txt", text(trees, li))
        # the rest is the same meanings in both languages, sampled without a topic. The dictionary:
        # one line per concept, most frequent first (ties by c); the test split: 20 % of content
        by_freq = sorted(range(world.n_concepts), key=lambda c: -world.weight[c])
        content = [c for c in by_freq if world.kind[c] in CONTENT_KINDS]
        test_rng = np.random.default_rng([seed, 3])
        test = set(test_rng.choice(content, size=len(content) // 5, replace=False).tolist())
        parts = {"": by_freq, ".train": [c for c in by_freq if c not in test],
                 ".test": [c for c in by_freq if c in test]}
        for part, concepts in parts.items():
            _write(out_dir, f"dict/{l0}-{l1}{part}.txt",
                   "".join(f"{forms[0][c]} {forms[1][c]}\n" for c in concepts))
        par = _sample_trees(world, f"{seed}/parallel", n_parallel)
        tat = _sample_trees(world, f"{seed}/tatoeba", n_tatoeba)
        for li, lang in enumerate(langs):
            _write(out_dir, f"parallel/{l0}-{l1}.train.{lang}", text(par, li))
            _write(out_dir, f"tatoeba/tatoeba.{l1}-{l0}.{lang}", text(tat, li))
        # task sets: UD trees, NER (each sentence has an entity, as in PAN-X), NLI (balanced labels)
        for split, n in task_sizes.items():
            ud = _sample_trees(world, f"{seed}/ud/{split}", n)
            ner = _sample_trees(world, f"{seed}/ner/{split}", n, need_entity=True)
            rng = random.Random(f"{seed}/xnli/{split}")
            labels = [LABELS[i % 3] for i in range(n)]
            rng.shuffle(labels)
            nli = [(sample_nli(world, rng, lab), lab) for lab in labels]
            for li, lang in enumerate(langs):
                _write(out_dir, f"ud/{lang}.{split}.conllu",
                       "".join(conllu_block(world, t, forms[li], orders[li], f"{split}-{k + 1}")
                               for k, t in enumerate(ud)))
                _write(out_dir, f"ner/{lang}.{split}.tsv",
                       "".join(ner_block(world, t, forms[li], orders[li]) for t in ner))
                pairs = [f"{sentence(p, li)}\t{sentence(h, li)}\t{lab}\n" for (p, h), lab in nli]
                _write(out_dir, f"xnli/{lang}.{split}.tsv", "".join(pairs))
        # world.json: no path or time, so that the same seed gives the same bytes
        summary = dict(
            langs=[l0, l1], seed=seed, overlap=overlap, order=order, domain_shift=domain_shift,
            cyrillic=cyrillic,
            sizes={"mono": sizes, "parallel": n_parallel, "tatoeba": n_tatoeba, "task": task_sizes},
            n_concepts=world.n_concepts, n_entities=len(world.entities),
            vocab_sizes={lang: len(set(forms[li])) for li, lang in enumerate(langs)},
            shared=len(set(forms[0]) & set(forms[1])), dict_test_words=len(test))
        # name_overlap and scale are recorded only when set, so that older worlds keep their bytes
        if name_overlap is not None:
            summary["name_overlap"] = name_overlap
        if scale != 1:
            summary["scale"] = scale
        _write(out_dir, "world.json", json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    return {**summary, "out_dir": str(out_dir), "seconds": round(time.time() - t0, 2)}


# -----------------------------------------------------------------------------
# CLI: bpe.py's HelpFormatter, copied in short (toydata.py copies alone)
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help: each flag's default after its help, unless its help says it or it is a switch."""
    def _get_help_string(self, action):
        if action.default is None or action.default is False or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    add = ap.add_argument  # every flag but --size is an argument of write_world
    add("--out", dest="out_dir", metavar="DIR", required=True, help="required; empty, or --force")
    add("--langs", type=lambda s: s.split(","), default="en,fr", help="two codes, the source first")
    add("--overlap", type=float, default=0.0, help="fraction of shared word forms (§4.2)")
    add("--name-overlap", type=float,
        help="fraction of identical entity name parts, drawn apart from --overlap (default: as "
        "--overlap gives)")
    add("--order", default="svo", help="word order of the second language, " + ORDER_HELP)
    add("--domain-shift", type=float, default=0.0, help="0: one topic mix, 1: disjoint (§4.1)")
    add("--cyrillic", action="store_true", help="write the second language in Cyrillic letters")
    add("--scale", type=int, default=1,
        help="multiply the open word classes (nouns, verbs, adjectives, adverbs, names, entities) "
        "by this integer: 1 gives 944 concepts, 4 about 3,700 (the sentence counts are --size's)")
    sizes = "; ".join(f"{k}: " + ", ".join(f"{SIZE_KEYS[f]} {n}" for f, n in v.items())
                      for k, v in SIZES.items())
    add("--size", choices=SIZES, default="full",
        help=f"sentences (or pairs) per language and file (paper: Table 1's world): {sizes}")
    add("--seed", type=int, default=0, help="random seed (same seed, same files)")
    add("--force", action="store_true", help="replace a toy world in --out (nothing else)")
    return ap


def main(argv=None):
    ap = build_parser()
    args = vars(ap.parse_args(argv))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill is a Ctrl-C: one line
    try:
        s = write_world(**SIZES[args.pop("size")], **args)  # size is popped before args unpacks
    except (InputError, FileExistsError) as e:  # bpe.reported's copy: a flag's (2) with usage
        if getattr(e, "code", 1) == 2:
            ap.error(str(e))
        raise SystemExit(f"error: {e}") from None
    except OSError as e:  # a full disk, a read-only folder: _write named its file
        raise SystemExit(f"toydata.py: error: cannot write {e.filename or args['out_dir']}: {e.strerror or e}")
    except KeyboardInterrupt:
        raise SystemExit(f"toydata.py: interrupted; {args['out_dir']} is incomplete (write it "
                         "again with --force)")
    print(f"wrote {s['out_dir']} in {s['seconds']} s: {s['n_concepts']} concepts, vocab "
          f"{s['vocab_sizes']}, shared forms {s['shared']}")
    return s


if __name__ == "__main__":
    main()
