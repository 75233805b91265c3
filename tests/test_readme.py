"""Every command of every ```bash block of README.md, RESULTS.md and notes/*.md parses with its script's own
argparse parser, in the spellings of this release (no deprecated flag), and every $VARIABLE a block uses is set in
that block, so a block runs as written when pasted alone; a study's own script (python notes/...py) must exist.
Nothing is run: parsing only, well under a second."""
import glob
import os
import re
import shlex

import pytest

import align
import bpe
import cka
import finetune
import model
import pretrain
import toydata

import bench_gpu  # tests/ is on the path: pytest puts a test file's own folder there

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RESULTS = os.path.join(ROOT, "RESULTS.md")
NOTES = sorted(glob.glob(os.path.join(ROOT, "notes", "*.md")))  # the studies and details RESULTS.md links

PARSERS = {"model.py": model.build_parser, "finetune.py": finetune.build_parser, "align.py": align.build_parser, "cka.py": cka.build_parser,
           "bpe.py": bpe.build_parser, "toydata.py": toydata.build_parser, "pretrain.py": pretrain.build_parser,
           "bench_gpu.py": bench_gpu.build_parser}


SHELL = {"HOME", "PWD", "USER"}  # set by the shell itself


def bash_blocks(text):
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def logical_lines(block):
    """Lines with comments cut and backslash continuations joined; a heredoc's body is left out."""
    out, heredoc, pending = [], None, ""
    for line in block.splitlines():
        if heredoc:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if m := re.search(r"<<\s*'?(\w+)'?", line):
            heredoc = m.group(1)
        line = re.sub(r"(^|\s)#.*$", "", line)  # a comment starts with a word-initial #
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def set_names(lines):
    """{name: raw value} of the block's assignments; loop variables get their first item, and the words a
    function reads from its arguments ($1 ...) or a parameter expansion (${x##...}) a placeholder 0."""
    names = {}
    for line in lines:
        for m in re.finditer(r"(?:^|[;\s])([A-Za-z_]\w*)=(\"[^\"]*\"|'[^']*'|[^\s;]*)", line):
            value = m.group(2).strip("\"'")
            names[m.group(1)] = ("0" if re.fullmatch(r"\$\{?\d\}?|\$\{\w+[#%].*\}", value) or value.startswith("$(")
                                 else value)  # a command's output ($(...)): a placeholder too
        for m in re.finditer(r"\bfor (\w+) in (\"[^\"]*\"|'[^']*'|\S+)", line):
            names[m.group(1)] = m.group(2).rstrip(";").strip("\"'")
        for m in re.finditer(r"\bset -- \$\{?(\w+)\}?", line):  # set -- $run: $1, $2 ... are its words
            names.update({str(k): w for k, w in enumerate(names.get(m.group(1), "").split(), 1)})
    return names


def expand(line, names):
    line = line.replace('"$@"', "")
    for _ in range(5):  # values that use other variables (BI=$T/pt/...)
        line = re.sub(r"\$\{?([A-Za-z_]\w*|\d)\}?", lambda m: names.get(m.group(1), m.group(0)), line)
    return line


def braces(word):
    """Bash brace expansion of one word: a{b,c}d -> abd acd."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if not m:
        return [word]
    return [x for part in m.group(1).split(",") for x in braces(word[:m.start()] + part + word[m.end():])]


def commands(text):
    """(block number, script, argv, the line as written) for every python/torchrun command of every bash block;
    also the unset variables each block uses."""
    found, unset = [], []
    for b, block in enumerate(bash_blocks(text), 1):
        lines = logical_lines(block)
        names = set_names(lines)
        for line in lines:
            line = re.sub(r"\s\d*>>?(&\d+|\s*\S+)", " ", line)  # redirections
            unset += [(b, v) for v in re.findall(r"\$\{?([A-Za-z_]\w*)", line) if v not in names and v not in SHELL]
            for words in split_commands(expand(line, names)):
                if not words or words[0] not in ("python", "torchrun") or {"-m", "-c", "-"} & set(words[:2]):
                    continue
                i = next(k for k, w in enumerate(words) if w.endswith(".py"))
                argv = [x for w in words[i + 1:] for x in braces(w)]
                script = words[i] if words[i].startswith("notes/") else os.path.basename(words[i])
                found.append((b, script, argv, shlex.join(words)))
    return found, unset


def split_commands(line):
    """The words of each command of a line cut at `;`, `&&`, `||`, `|`, `&` and parentheses outside quotes."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    commands = [[]]
    for token in lex:
        if token and set(token) <= set(lex.punctuation_chars):
            commands.append([])
        else:
            commands[-1].append(token)
    return commands


def old_spelling(script, args):
    """The reason a parsed command would be refused or warned about at run time (not only at parsing), or ''."""
    if script in ("finetune.py", "align.py", "cka.py"):
        if isinstance(args.toy, str):
            return "--toy DIR is deprecated: --toy --data DIR"
        if args.toy and not args.data and not getattr(args, "table", None):
            return "--toy needs --data WORLD"
    if script == "pretrain.py" and not (args.data or args.train_files or args.toy):
        return "pretrain.py needs --data, --train-files/--dev-files or --toy"
    return ""


# README.md is a guide now (its long real-data blocks are in notes/real-data.md, parsed here too): a lower floor
@pytest.mark.parametrize("path, least", [(README, 20), (RESULTS, 15)] + [(note, 0) for note in NOTES])
def test_every_command_parses_with_its_script(capsys, path, least):
    """README.md, RESULTS.md and notes/*.md: every python/torchrun command of their bash blocks (the least count is
    a floor that shows the extraction found the documents' commands)."""
    name = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        found, unset = commands(f.read())
    assert not unset, f"{name} bash blocks use variables they do not set (block, name): {sorted(set(unset))}"
    parsed, bad = 0, []
    for block, script, argv, line in found:
        if script.startswith("notes/"):  # a study's own script, beside its notes: no project parser
            assert os.path.isfile(os.path.join(ROOT, script)), f"{name} block {block}: no such script: {line}"
            continue
        assert script in PARSERS, f"{name} block {block}: unknown script {script}: {line}"
        try:
            args = PARSERS[script]().parse_args(argv)
        except SystemExit:
            bad.append(f"block {block}: {line}\n    {capsys.readouterr().err.strip().splitlines()[-1]}")
            continue
        if why := old_spelling(script, args):
            bad.append(f"block {block}: {line}\n    {why}")
        parsed += 1
    assert not bad, f"{name} commands that do not parse:\n" + "\n".join(bad)
    assert parsed >= least, parsed


def test_results_table1_rows_parse():
    """RESULTS.md's Table 1 block feeds its rows (NAME SEED WORLD [pretrain flags]) through a heredoc, ROWS, to a
    shell function that runs pretrain.py with them; the extractor leaves heredocs out, so each row is parsed here."""
    with open(RESULTS, encoding="utf-8") as f:
        bodies = re.findall(r"<<ROWS[^\n]*\n(.*?)^ROWS$", f.read(), flags=re.S | re.M)
    rows = [line.split() for body in bodies for line in body.splitlines() if line.strip()]
    assert len(rows) >= 15, rows  # the block was found
    for name, seed, world, *flags in rows:
        args = pretrain.build_parser().parse_args(["--toy", "--data", world, "--seed", seed, "--out", name, *flags])
        assert not old_spelling("pretrain.py", args), (name, flags)


def test_the_extraction_sees_variables_loops_and_braces():
    """The extractor itself: assignments, loop variables, continuations, redirections, heredocs and brace
    expansion; a variable set in another block counts as unset."""
    text = ("```bash\nT=runs/x; W=\"--overlap 0.3 --seed 0\"\npython toydata.py --out $T/w $W  # c\n"
            "for task in ner parse; do\n  python finetune.py --task $task --toy --data $T/w \\\n"
            "    --ckpt a.pt --out $T/{a,b} > $T/log 2>&1 && echo ok\ndone\ncat <<X\npython nope.py\nX\n"
            "python -c \"import bpe; print(1)\"; python bpe.py prepare --data \"$T/w\"|tail\n```\n"
            "```bash\npython cka.py --toy --data $T/w --ckpt a.pt\n```\n")
    found, unset = commands(text)
    assert [(b, s, a) for b, s, a, _ in found] == [
        (1, "toydata.py", ["--out", "runs/x/w", "--overlap", "0.3", "--seed", "0"]),
        (1, "finetune.py", ["--task", "ner", "--toy", "--data", "runs/x/w", "--ckpt", "a.pt", "--out", "runs/x/a",
                            "runs/x/b"]),
        (1, "bpe.py", ["prepare", "--data", "runs/x/w"]),
        (2, "cka.py", ["--toy", "--data", "$T/w", "--ckpt", "a.pt"])]
    assert unset == [(2, "T")]


def test_the_extraction_sees_positional_words_and_skips_stdin_scripts():
    """RESULTS.md's loops: `for run in "a 0 joint" ...; do set -- $run` gives $1 $2 $3 the first item's words;
    `python - ARGS <<EOF` (a script on stdin) is not a project command."""
    text = ('```bash\nfor run in "names0 1 prefixed" "x 2 joint"; do\n  set -- $run\n'
            '  python pretrain.py --toy --seed $2 --bpe $3 --out r/$1-s$2\ndone\n'
            "python - r figures/f.png <<'EOF'\nimport sys\nEOF\n```\n")
    found, unset = commands(text)
    assert [(s, a) for _, s, a, _ in found] == [
        ("pretrain.py", ["--toy", "--seed", "1", "--bpe", "prefixed", "--out", "r/names0-s1"])]
    assert unset == []


@pytest.mark.parametrize("argv, why", [
    (["--toy", "W", "--ckpt", "a.pt", "--out", "o"], "deprecated"),
    (["--toy", "--ckpt", "a.pt", "--out", "o"], "needs --data"),
])
def test_old_spellings_are_caught(argv, why):
    assert why in old_spelling("finetune.py", finetune.build_parser().parse_args(argv))
