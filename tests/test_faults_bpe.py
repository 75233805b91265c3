"""User-side faults in bpe.py prepare and in the prepared folders pretrain.py takes as --data (issue 22): a run whose
flags differ from how its data were prepared is refused in one line, and so is a code-switching dictionary that
switches nothing, a dev split without words, a language code that is not one; nothing is left half written.

Run: python -m pytest -q tests/test_faults_bpe.py
"""
import errno
import json
import os
import re
import shutil
import signal

import pytest

import bpe
from conftest import SMOKE

MERGES = "200"
# pretrain.py on the prepared folder: the conftest smoke model, one update (a refusal comes before any training)
SMALL = SMOKE + ["--merges", MERGES, "--batch-size", "4", "--max-steps", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def prep(toy_world, tmp_path_factory):
    """A folder written by bpe.prepare in joint mode (MERGES merges) from the shared toy world's mono/ text."""
    out = bpe.prepare(["en", "fr"], str(tmp_path_factory.mktemp("prep")), data=str(toy_world), merges=int(MERGES))
    return out


@pytest.fixture(scope="module")
def inputs(toy_world, tmp_path_factory):
    """Text and dictionaries beside the toy world: dev files of blank lines, reversed and foreign dictionaries."""
    d = tmp_path_factory.mktemp("inputs")
    blank = d / "blank"
    blank.mkdir()
    for name in ("en.train.txt", "fr.train.txt", "fr.dev.txt"):
        shutil.copy(toy_world / "mono" / name, blank / name)
    (blank / "en.dev.txt").write_text("\n" * 50)  # 50 lines, no word
    pairs = (toy_world / "dict" / "en-fr.txt").read_text().split("\n")
    (d / "fr-en.txt").write_text("\n".join(" ".join(p.split()[::-1]) for p in pairs))  # columns swapped
    (d / "de-it.txt").write_text("Hund cane\nKatze gatto\n")  # another language pair: matches nothing
    mono = toy_world / "mono"
    for name, make in (("cr", lambda t: t.replace("\n", "\r")), ("han", lambda t: "".join(  # CR-only; Han script
            chr(0x4E00 + ord(c) % 500) if c.isalpha() else c for c in t))):
        (d / name).mkdir()
        for s in ("train", "dev"):
            (d / name / f"en.{s}.txt").write_text((mono / f"en.{s}.txt").read_text())
            text = (mono / f"fr.{s}.txt").read_text()  # the train text at fault (the dev text is read first)
            (d / name / f"fr.{s}.txt").write_text(make(text) if s == "train" else text, newline="")
    # issue 48: Windows line ends with some CR-only ones among them (a file pasted together): line 3 ends in CR alone
    lines = (mono / "fr.train.txt").read_text().split("\n")
    (d / "crmix").mkdir()
    for name in ("en.train.txt", "en.dev.txt", "fr.dev.txt"):
        shutil.copy(mono / name, d / "crmix" / name)
    (d / "crmix" / "fr.train.txt").write_text("".join(line + ("\r" if k % 3 == 2 else "\r\n")
                                                      for k, line in enumerate(lines)), newline="")
    (d / "utf16").mkdir()
    for name in ("en.train.txt", "en.dev.txt", "fr.train.txt", "fr.dev.txt"):
        text = (mono / name).read_text()
        (d / "utf16" / name).write_bytes(text.encode("utf-16-le") if name == "en.train.txt" else text.encode())
    (d / "empty.txt").write_text("\n \n")
    return d


def no_temp_files(root):
    return not [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def call(main, argv, capsys):
    """main(argv) in this process -> (exit code, the last line of stderr or of the SystemExit message, stdout)."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # pretrain.main sets its own
    try:
        main([str(a) for a in argv])
        code, text = 0, ""
    except SystemExit as e:
        code, text = (1, e.code) if isinstance(e.code, str) else (e.code, "")
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    out, err = capsys.readouterr()
    lines = (text or err).strip().splitlines()
    return code, lines[-1] if lines else "", out


# -----------------------------------------------------------------------------
# 1. pretrain.py --data PREP: the folder's recipe (mode, merges, separate ids, lowercase, code-switch dictionary,
#    languages) must be the run's; else one line naming each flag that differs (before: trained on PREP silently)

PRETRAIN_ON_PREP = [
    # (extra flags, expected message); {d} = the toy world's dictionary
    (["--bpe", "prefixed"], "was prepared with other choices (--bpe joint there, prefixed here)"),
    (["--bpe", "separate", "--merges", "100"], "--bpe joint there, separate here; --merges 200 there, 100 here"),
    (["--code-switch", "{d}"], "(--code-switch none there, a dictionary with sha1 "),
    (["--sep", "emb"], "(--sep emb/tok off there, on here)"),
    (["--sep", "tok"], "(--sep emb/tok off there, on here)"),
    (["--lowercase"], "(--lowercase off there, on here)"),
    (["--merges", "300"], "(--merges 200 there, 300 here)"),
    (["--langs", "fr,en"], "(--langs en,fr there, fr,en here)"),
    # 7. a language code is letters: ' fr' would name the file ' fr.train.txt', 'en/x' a folder
    (["--langs", "en, fr"], "--langs en, fr: expected distinct languages, each a code of letters"),
    (["--langs", "en/x,fr"], "--langs en/x,fr: expected distinct languages, each a code of letters"),
]


@pytest.mark.parametrize("extra, message", PRETRAIN_ON_PREP, ids=[" ".join(f) for f, _ in PRETRAIN_ON_PREP])
def test_pretrain_refuses_a_prepared_folder_made_otherwise(prep, toy_world, tmp_path, capsys, extra, message):
    import pretrain
    extra = [a.format(d=toy_world / "dict" / "en-fr.txt") for a in extra]
    code, line, _ = call(pretrain.main, SMALL + ["--data", prep, "--out", tmp_path / "o"] + extra, capsys)
    assert code in (1, 2) and message in line, line
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("log.jsonl"))


DAMAGED_PREP = [
    # 10. (what is done to a copy of the folder, expected message)
    ("rm fr.train.bin", "a prepared folder without fr.train.bin; prepare it again"),  # was "no en.train.txt ..."
    ("rm recipe.json", "a prepared folder without recipe.json"),
    ("break en.train.json", "en.train.json: not a header written by bpe.binarize"),  # was an unnamed JSON error
    ("break recipe.json", "recipe.json: Expecting value"),
]


@pytest.mark.parametrize("damage, message", DAMAGED_PREP, ids=[d for d, _ in DAMAGED_PREP])
def test_damaged_prepared_folder_is_named(prep, tmp_path, capsys, damage, message):
    import pretrain
    copy = tmp_path / "prep"
    shutil.copytree(prep, copy)
    verb, name = damage.split()
    (copy / name).unlink() if verb == "rm" else (copy / name).write_text("[not JSON")
    code, line, _ = call(pretrain.main, SMALL + ["--data", copy, "--out", tmp_path / "o"], capsys)
    assert code == 1 and message in line and str(copy) in line, line


# -----------------------------------------------------------------------------
# bpe.py prepare: mistakes in flags and inputs, one line each, nothing written

BPE_CASES = [
    # (argv after `prepare`, expected message); {w} = the toy world, {i} = the inputs folder, {p} = PREP
    # 11. a repeated language (was dropped quietly); 7. codes of letters
    (["--data", "{w}", "--langs", "en,en"], "--langs en,en: expected distinct languages"),
    (["--data", "{w}", "--langs", "en, fr"], "--langs en, fr: expected distinct languages, each a code of letters"),
    (["--data", "{w}", "--langs", "en/x,fr"], "--langs en/x,fr: expected distinct languages"),
    (["--data", "{w}", "--langs", "en,"], "--langs en,: expected distinct languages"),
    # 2. a dictionary the wrong way round, or of other languages, switches nothing: refused before BPE is learned
    (["--data", "{w}", "--code-switch", "{i}/fr-en.txt"], "its columns look the wrong way round for --langs en,fr"),
    (["--data", "{w}", "--code-switch", "{i}/de-it.txt"], "matches almost no en word"),
    (["--data", "{w}", "--code-switch", "{i}/none.txt"], "--code-switch {i}/none.txt: no such file"),
    (["--data", "{w}", "--code-switch", "{w}/mono/en.train.txt"], "en.train.txt:1: expected 'source target'"),
    # 4. words, not lines: a dev file of blank lines is no dev set (was four </s>, and best.pt chosen on them)
    (["--data", "{i}/blank"], "{i}/blank/en.dev.txt: a en dev split of 0 words; at least 20 are needed"),
    # 1. a prepared folder as --data: its recipe must be these flags
    (["--data", "{p}", "--mode", "prefixed"], "(--mode joint there, prefixed here; --merges 200 there, 40000 here)"),
    (["--data", "{p}", "--separate-vocab"], "(--merges 200 there, 80000 here; --separate-vocab off there, on here)"),
    (["--data", "{p}", "--merges", "200", "--lowercase"], "(--lowercase off there, on here)"),
    # more inputs of our own: flags out of range, a file for a folder and the other way round, one text twice
    (["--data", "{w}", "--seed", "-1"], "argument --seed: expected one integer in [0, inf), got '-1'"),
    (["--data", "{w}/world.json"], "--data {w}/world.json: not a directory"),
    (["--data", "{w}", "--code-switch", "{w}/dict"], "--code-switch {w}/dict: not a file"),
    (["--train-files", "en={w}/mono/en.train.txt,fr={w}/mono/en.train.txt", "--dev-files",
      "en={w}/mono/en.dev.txt,fr={w}/mono/fr.dev.txt"], "--train-files: en and fr are the same file"),
    (["--data", "{p}", "--merges", "200", "--langs", "en"], "(--langs en,fr there, en here)"),
    # issue 37: CR-only line breaks (the file was one line); Han-script text under a code other than zh (a Chinese
    # line was one word)
    (["--data", "{i}/cr"], "{i}/cr/fr.train.txt:1: a carriage return (CR) inside the line: lines that end in "
                           "CR alone (old Mac) would be read glued together"),
    # issue 48: a mix of CR-LF and CR-only line ends was read with every CR-only line glued to the next one
    (["--data", "{i}/crmix"], "{i}/crmix/fr.train.txt:3: a carriage return (CR) inside the line"),
    (["--data", "{i}/han"], "{i}/han/fr.train.txt: Han-script text (100 % of its letters) under the language code 'fr'"),
    # more of our own: ASCII text in UTF-16 (valid UTF-8, a NUL between letters); no text to hold dev lines out of
    # (both found after the English text was shuffled, or never)
    (["--data", "{i}/utf16"], "{i}/utf16/en.train.txt:1: a NUL character, as in UTF-16 text"),
    (["--train-files", "en={w}/mono/en.train.txt,fr={i}/empty.txt"],
     "error: {i}/empty.txt: 0 line(s) of text, too few to hold out dev lines from (give a dev file)"),
]


@pytest.mark.parametrize("argv, message", BPE_CASES, ids=[" ".join(a[:4]) for a, _ in BPE_CASES])
def test_bpe_prepare_mistake_is_one_line(toy_world, inputs, prep, tmp_path, capsys, argv, message):
    fill = lambda s: s.format(w=toy_world, i=inputs, p=prep)  # noqa: E731
    code, line, _ = call(bpe.main, ["prepare"] + [fill(a) for a in argv] + ["--merges", MERGES] * (
        "{p}" not in argv) + ["--prep-dir", tmp_path / "cache"], capsys)
    assert code in (1, 2) and fill(message) in line, line
    assert not (tmp_path / "cache").exists()


def test_code_switching_says_how_many_words_it_switched(toy_world, tmp_path, capsys):
    """2. The count of switched words per language is printed and kept in the .json header."""
    code, _, out = call(bpe.main, ["prepare", "--data", toy_world, "--merges", "100", "--code-switch",
                                   toy_world / "dict" / "en-fr.txt", "--prep-dir", tmp_path], capsys)
    assert code == 0
    found = dict(re.findall(r"code-switching (en|fr): (\d+) of \d+ words", out))
    assert set(found) == {"en", "fr"} and all(int(n) > 0 for n in found.values())
    _, meta = bpe.load_bin(os.path.join(out.strip().splitlines()[-1], "en.train"))
    assert meta["n_switched"] == int(found["en"]) and 0 < meta["n_switched"] < meta["n_words"]


def test_full_disk_in_prepare_names_the_folder_and_leaves_no_temp_file(toy_world, tmp_path, capsys, monkeypatch):
    """10. A full disk while the ids are written: 'no space left writing in DIR' (was 'None: No space left ...')."""
    def full(chunk):
        raise OSError(errno.ENOSPC, "No space left on device")  # as f.write raises it: no file name
    monkeypatch.setattr(bpe, "_encode_chunk", full)
    code, line, _ = call(bpe.main, ["prepare", "--data", toy_world, "--merges", "50", "--prep-dir", tmp_path], capsys)
    assert code == 1 and re.fullmatch(rf"error: data preparation failed: no space left writing in "
                                      rf"{re.escape(str(tmp_path))}/joint-50-\w+", line), line
    assert no_temp_files(tmp_path) and not list(tmp_path.rglob("done"))


def test_binarize_refuses_text_without_words(tmp_path):
    """4. Blank lines are not a corpus: binarize counts words, not lines."""
    tok = bpe.Tokenizer.build({"en": __file__}, num_merges=20, verbose=False)
    (tmp_path / "blank.txt").write_text("\n\n  \n")
    with pytest.raises(ValueError, match=r"blank.txt: empty corpus \(no words in 3 lines\)"):
        bpe.binarize(str(tmp_path / "blank.txt"), tok, "en", str(tmp_path / "x"), verbose=False)
    assert not list(tmp_path.glob("x.*"))


# -----------------------------------------------------------------------------
# issue 37: two processes in one folder, a folder whose `done` promises more than it holds, every input read before
# anything is written, signals during `prepare --workers 2`

SLOW_PREPARE = """
import sys, time
import bpe
encode = bpe._encode_chunk
def slow(chunk):  # a chunk of 10 lines in 0.05 s: binarising the toy world takes seconds, not milliseconds
    time.sleep(0.05)
    return encode(chunk)
bpe._encode_chunk, bpe.CHUNK_LINES = slow, 10
bpe.main(sys.argv[1:])
"""


def test_second_prepare_is_refused_and_sigterm_leaves_nothing(toy_world, tmp_path, capsys):
    """Two `bpe.py prepare` into one folder: the second is refused in one line naming the first (was: both failed,
    one truncating the other's shuffle bucket). SIGTERM to `prepare --workers 2`: one line, code 143, no temporary
    file and no half-prepared folder (was: killed silently, BrokenPipe tracebacks from the workers, en.train.bin.tmp)."""
    import subprocess
    import sys
    import time
    argv = ["prepare", "--data", toy_world, "--merges", MERGES, "--prep-dir", tmp_path]
    first = subprocess.Popen([sys.executable, "-c", SLOW_PREPARE] + [str(a) for a in argv + ["--workers", "2"]],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(bpe.__file__))
    for line in first.stdout:  # the lock is taken before the text is read, the ids are written last
        if line.startswith("preparing data in"):
            break
    code, line, _ = call(bpe.main, argv, capsys)
    assert code == 1 and re.fullmatch(rf"error: {re.escape(str(tmp_path))}/joint-{MERGES}-\w+ is being prepared by "
                                      rf"process {first.pid} on \S+ \(it holds \S+/lock\); wait for it to end, then "
                                      "run the same command: it uses that data", line), line
    time.sleep(0.3)
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=60)  # returns once the workers too have closed stderr
    assert first.returncode == 128 + signal.SIGTERM and err.strip().splitlines() == [
        "bpe.py prepare: stopped by SIGTERM (no half-written file is left); run the same command to prepare the data"]
    assert not list(tmp_path.iterdir())  # the half-prepared folder is gone with its temporaries
    code, _, out = call(bpe.main, argv, capsys)  # the advice works
    assert code == 0 and bpe._missing(out.strip().splitlines()[-1], ["en", "fr"]) == []


@pytest.fixture
def cache(prep, tmp_path):
    """A copy of the --prep-dir that holds PREP (the same command prepares into it the folder of the same name)."""
    shutil.copytree(os.path.dirname(prep), tmp_path / "cache")
    return tmp_path / "cache"


def test_folder_of_a_killed_process_is_taken_over(prep, toy_world, cache, tmp_path, capsys):
    """A folder left by a process that was killed (a lock naming it, its temporaries, no `done`) is prepared again and
    its temporaries removed (before: left for good); a temporary name holds the pid of its process."""
    folder = cache / os.path.basename(prep)
    (folder / "done").unlink()
    (folder / "lock").write_text("process 999999999 on nowhere\n")
    (folder / "en.train.bin.999999999.tmp").write_bytes(b"\0" * 10)
    (folder / "shuffle.999999999.tmp").mkdir()
    (folder / "shuffle.999999999.tmp" / "bucket0.txt").write_text("half\n")
    code, _, out = call(bpe.main, ["prepare", "--data", toy_world, "--merges", MERGES, "--prep-dir", cache], capsys)
    assert code == 0 and out.strip().splitlines()[-1] == str(folder) and "using prepared data" not in out
    assert sorted(os.listdir(folder)) == sorted(bpe.prepared_files(["en", "fr"]) + ["done"])
    with bpe.atomic_path(tmp_path / "x") as tmp:
        assert tmp == f"{tmp_path / 'x'}.{os.getpid()}.tmp"
        open(tmp, "w").close()


def test_a_live_lock_is_refused(prep, toy_world, cache, capsys):
    """The lock is the kernel's (flock), not the file: held by a live process, it refuses; the file stays theirs."""
    import fcntl
    folder = cache / os.path.basename(prep)
    (folder / "done").unlink()
    with open(folder / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("process 12345 on elsewhere\n")
        held.flush()
        code, line, _ = call(bpe.main, ["prepare", "--data", toy_world, "--merges", MERGES, "--prep-dir", cache],
                             capsys)
    assert code == 1 and f"{folder} is being prepared by process 12345 on elsewhere (it holds {folder}/lock)" in line
    assert (folder / "lock").exists() and (folder / "en.train.bin").exists()


DAMAGED_CACHE = [
    # (what is done to the folder in the cache, what the rerun prints); before: "using prepared data in DIR", exit 0
    ("rm en.train.bin", "a prepared folder without en.train.bin; preparing it again"),
    ("cut fr.dev.bin", "a prepared folder without the fr.dev.bin of {n} bytes it was written with ({m} now)"),
]


@pytest.mark.parametrize("damage, message", DAMAGED_CACHE, ids=[d for d, _ in DAMAGED_CACHE])
def test_damaged_cache_is_prepared_again(prep, toy_world, cache, tmp_path, capsys, damage, message):
    """A cached folder whose `done` promises files it does not hold: `pretrain.py --data` refuses it with advice, and
    the advice (bpe.py prepare on its text) works: the same command makes it anew."""
    import pretrain
    folder = cache / os.path.basename(prep)
    verb, name = damage.split()
    n = (folder / name).stat().st_size
    (folder / name).unlink() if verb == "rm" else os.truncate(folder / name, n // 2)
    code, line, _ = call(pretrain.main, SMALL + ["--data", folder, "--out", tmp_path / "o"], capsys)
    assert code == 1 and "prepare it again: bpe.py prepare on its text makes it anew" in line, line
    code, _, out = call(bpe.main, ["prepare", "--data", toy_world, "--merges", MERGES, "--prep-dir", cache], capsys)
    assert code == 0 and f"note: {folder}: " + message.format(n=n, m=n // 2) in out, out
    assert bpe._missing(folder, ["en", "fr"]) == [] and (folder / name).stat().st_size == n
    assert bpe.prepare(["en", "fr"], None, data=str(folder), merges=int(MERGES)) == str(folder)  # --data takes it
    for by_hand in ("\n", "[1]", "not JSON"):  # a `done` written by hand (or by an earlier version) records no size
        (folder / "done").write_text(by_hand)
        assert bpe._missing(folder, ["en", "fr"]) == []


def test_bad_byte_in_the_second_language_is_found_before_anything_is_written(toy_world, tmp_path, capsys, monkeypatch):
    """A bad byte at the end of the French WikiExtractor folder: refused before the English text is shuffled (was:
    found after, and the shuffled English left behind). A failure after writing leaves no folder behind."""
    wiki = tmp_path / "frwiki" / "AA"
    wiki.mkdir(parents=True)
    lines = (toy_world / "mono" / "fr.train.txt").read_text().splitlines()
    (wiki / "wiki_00").write_text("".join(f'<doc id="{k}">\n{l}\n</doc>\n' for k, l in enumerate(lines)))
    (wiki / "wiki_01").write_bytes(b'<doc id="x">\nun \xff mot\n</doc>\n')
    argv = ["prepare", "--train-files", f"en={toy_world}/mono/en.train.txt,fr={tmp_path}/frwiki", "--merges", MERGES,
            "--prep-dir", tmp_path / "cache"]
    code, line, _ = call(bpe.main, argv, capsys)
    assert code == 1 and line == f"error: {wiki}/wiki_01:2: not valid UTF-8 (invalid start byte at byte 3)", line
    assert not (tmp_path / "cache").exists()
    (wiki / "wiki_01").write_text('<doc id="x">\nun mot\n</doc>\n')

    def fails(*a, **k):
        raise ValueError("BPE failed")
    monkeypatch.setattr(bpe.Tokenizer, "build", fails)
    code, line, out = call(bpe.main, argv, capsys)
    assert code == 1 and line == "error: data preparation failed: BPE failed" and "en.train.txt" not in str(
        list((tmp_path / "cache").rglob("*"))) and "shuffled" in out


ENCODE_CHUNK = bpe._encode_chunk


def encode_in_a_quiet_worker(chunk):
    """binarize's _encode_chunk in a Pool worker that checks it runs none of the parent's signal handlers."""
    if (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) != (signal.SIG_DFL, signal.SIG_IGN):
        raise RuntimeError("a binarize worker runs its parent's signal handlers")
    return ENCODE_CHUNK(chunk)


def test_binarize_workers_run_no_handler_of_the_parent(prep, tmp_path, monkeypatch):
    """pretrain.py's stop handler, inherited by binarize's workers, fired in them at pool.terminate(): a successful
    run printed "error: stopped by SIGTERM before training started". Workers now ignore Ctrl-C and die of SIGTERM."""
    tok = bpe.Tokenizer.load(os.path.join(prep, "tokenizer.json"))
    monkeypatch.setattr(bpe, "_encode_chunk", encode_in_a_quiet_worker)
    old = signal.signal(signal.SIGTERM, lambda *a: print("the parent's handler"))
    try:
        meta = bpe.binarize(__file__, tok, "en", str(tmp_path / "x"), workers=2, verbose=False)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert meta["n_words"] > 0


def test_text_with_stray_prepared_files_is_text(toy_world, tmp_path, capsys):
    """A folder of text holding a stray tokenizer.json was taken for a prepared folder, and the advice printed gave the
    same refusal: the text is prepared (with a note), as a folder of text."""
    shutil.copytree(toy_world / "mono", tmp_path / "text")
    (tmp_path / "text" / "tokenizer.json").write_text("{}")
    code, _, out = call(bpe.main, ["prepare", "--data", tmp_path / "text", "--merges", "50", "--prep-dir",
                                   tmp_path / "cache"], capsys)
    assert code == 0 and f"note: --data {tmp_path / 'text'}: tokenizer.json there but no complete prepared " in out
    assert bpe._missing(out.strip().splitlines()[-1], ["en", "fr"]) == []


# -----------------------------------------------------------------------------
# issue 48: a word when a number means little (<unk> rates, fewer merges than asked), a dev set that is the training
# text by content, Ctrl-C twice

def test_unk_rate_over_5_percent_is_noted_and_kept_in_the_recipe(toy_world, tmp_path, capsys):
    """--max-lines 1: a vocabulary of one line per language; about a quarter of every split's tokens are <unk> (was:
    no word). The rates are kept in recipe.json; a vocabulary of the whole text gets no note."""
    code, _, out = call(bpe.main, ["prepare", "--data", toy_world, "--merges", "50", "--max-lines", "1",
                                   "--prep-dir", tmp_path], capsys)
    noted = {(l, s): float(r) for r, l, s in re.findall(r"note: ([\d.]+) % of the (en|fr) (train|dev) tokens are "
                                                        r"<unk> \(the vocabulary was learned on other text", out)}
    assert code == 0 and set(noted) == {(l, s) for l in ("en", "fr") for s in ("train", "dev")}, out
    with open(os.path.join(out.strip().splitlines()[-1], "recipe.json")) as f:
        kept = json.load(f)["unk_percent"]
    assert all(abs(kept[l][s] - r) < 0.06 and r > 5 for (l, s), r in noted.items())
    code, _, out = call(bpe.main, ["prepare", "--data", toy_world, "--merges", "50", "--prep-dir", tmp_path], capsys)
    with open(os.path.join(out.strip().splitlines()[-1], "recipe.json")) as f:
        kept = json.load(f)["unk_percent"]
    assert code == 0 and "<unk>" not in out and all(r <= 5 for v in kept.values() for r in v.values())


def test_fewer_merges_than_asked_are_said_when_learned(toy_world, tmp_path, capsys):
    """--merges 1000000000 learns what the text holds and stops: one line says how many and why (was: no word)."""
    code, _, out = call(bpe.main, ["prepare", "--data", toy_world, "--merges", "1000000000", "--prep-dir", tmp_path],
                        capsys)
    found = re.findall(r"note: (\d+) merges learned, not the 1000000000 asked: no pair of symbols is left that occurs "
                       r"2 times or more \(min_freq\)", out)
    tok = bpe.Tokenizer.load(os.path.join(out.strip().splitlines()[-1], "tokenizer.json"))
    assert code == 0 and found == [str(len(tok.bpes["en"].merges))], out
    assert bpe.learn_bpe({"low": 5}, 3, verbose=True) == [("o", "w</w>"), ("l", "ow</w>")]
    assert "note: 2 merges learned, not the 3 asked" in capsys.readouterr().out
    bpe.learn_bpe({"low": 5}, 2, verbose=True)
    assert "merges learned" not in capsys.readouterr().out


def test_dev_text_that_is_the_training_text_by_content_is_refused(toy_world, tmp_path, capsys):
    """--dev-files equal to --train-files, a copy with other spacing and decomposed accents, a dev set mostly of
    training lines, a --data folder whose dev file is a copy: refused in one line before anything is written (was:
    prepared, and best.pt chosen on training text); --allow-overlap takes it; a few shared lines are counted."""
    import unicodedata
    mono = toy_world / "mono"
    train = (mono / "fr.train.txt").read_text(encoding="utf-8").splitlines()
    dev = (mono / "fr.dev.txt").read_text(encoding="utf-8").splitlines()
    by_chance = sum(line in set(train) for line in dev)
    (tmp_path / "spaced.txt").write_text("\n".join(" " + unicodedata.normalize("NFD", line).replace(" ", " \t ")
                                                   for line in train) + "\n", encoding="utf-8")
    (tmp_path / "mostly.txt").write_text("\n".join(train[:150] + dev[:50]) + "\n", encoding="utf-8")
    (tmp_path / "some.txt").write_text("\n".join(dev + train[:10]) + "\n", encoding="utf-8")
    shutil.copytree(mono, tmp_path / "data")
    shutil.copy(mono / "en.train.txt", tmp_path / "data" / "en.dev.txt")
    files = lambda fr_dev: ["--train-files", f"en={mono / 'en.train.txt'},fr={mono / 'fr.train.txt'}",  # noqa: E731
                            "--dev-files", f"en={mono / 'en.dev.txt'},fr={fr_dev}"]
    cases = [(files(mono / "fr.train.txt"), f"fr dev set is its training text ({len(train)} of its {len(train)} "),
             (files(tmp_path / "spaced.txt"), f"fr dev set is its training text ({len(train)} of its {len(train)} "),
             (files(tmp_path / "mostly.txt"),
              f"fr dev set is mostly its training text ({150 + sum(line in set(train) for line in dev[:50])} of its "
              "200 lines are training lines, whitespace collapsed, Unicode NFC)"),
             (["--data", tmp_path / "data"], "error: the en dev set is its training text")]
    for argv, message in cases:
        code, line, out = call(bpe.main, ["prepare"] + argv + ["--merges", "50", "--prep-dir", tmp_path / "c"], capsys)
        assert code == 1 and message in line and line.endswith("or --allow-overlap if it is meant"), line
        assert "learning BPE" not in out and not (tmp_path / "c").exists()
    code, _, out = call(bpe.main, ["prepare"] + cases[0][0] + ["--merges", "50", "--prep-dir", tmp_path / "c",
                                                               "--allow-overlap"], capsys)
    assert code == 0 and f"note: {len(train)} of the {len(train)} fr dev lines are training lines too" in out
    code, _, out = call(bpe.main, ["prepare"] + files(tmp_path / "some.txt") + ["--merges", "50", "--prep-dir",
                                                                                tmp_path / "c"], capsys)
    assert code == 0 and f"note: {by_chance + 10} of the {len(dev) + 10} fr dev lines are training lines too" in out


CTRL_C_TWICE = """
import atexit, os, shutil, signal, sys, time
import bpe
def learn(*args, **kwargs):  # Ctrl-C while BPE is learned
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
rmtree = shutil.rmtree
def again(*args, **kwargs):  # and again while the half-prepared folder is removed
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    rmtree(*args, **kwargs)
def late():  # and once more as the program exits (multiprocessing's and tqdm's clean-up)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
bpe.learn_bpe, shutil.rmtree = learn, again
atexit.register(late)
bpe.main(sys.argv[1:])
"""


def test_ctrl_c_twice_while_learning_is_one_line_and_leaves_nothing(toy_world, tmp_path):
    """Ctrl-C twice while BPE is learned with --workers 2: one line, code 130, no half-prepared folder (was: the second
    one broke into the clean-up, a tqdm traceback after the line)."""
    import subprocess
    import sys
    argv = ["prepare", "--data", toy_world, "--merges", MERGES, "--prep-dir", tmp_path, "--workers", "2"]
    done = subprocess.run([sys.executable, "-c", CTRL_C_TWICE] + [str(a) for a in argv], capture_output=True,
                          text=True, timeout=60, cwd=os.path.dirname(bpe.__file__))
    assert done.returncode == 128 + signal.SIGINT and done.stderr.strip().splitlines() == [
        "bpe.py prepare: stopped by SIGINT (no half-written file is left); run the same command to prepare the data"]
    assert not list(tmp_path.iterdir()), list(tmp_path.rglob("*"))
