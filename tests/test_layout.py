"""The repository keeps its flat layout (README "Files")."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_requirements_list_only_the_allowed_packages():
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        names = [l.split("=")[0].split(">")[0].split("<")[0].strip() for l in f
                 if l.strip() and not l.startswith("#")]
    assert sorted(names) == ["numpy", "pytest", "regex", "torch", "tqdm"]


def test_ci_script_runs_pytest():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert "pytest" in f.read()


# ---------------------------------------------------------------------------------------------
# the scripts read plainly (README "Files and reading order"): short lines, one statement a line,
# the paper part above each file's ruler, and five files that copy alone

import ast
import io
import shutil
import subprocess
import sys
import tokenize

import pytest

SCRIPTS = ["bpe.py", "model.py", "pretrain.py", "finetune.py", "align.py", "cka.py", "toydata.py"]
RULER_AT_MOST = {"model.py": 420, "bpe.py": 540, "pretrain.py": 420, "finetune.py": 640,
                 "align.py": 420, "cka.py": 110, "toydata.py": 620}
COPY_ALONE = ["bpe.py", "model.py", "cka.py", "toydata.py", "align.py"]


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def tokens(source):
    return list(tokenize.generate_tokens(io.StringIO(source).readline))


def plain_faults(source):
    """The constructs a plain script leaves out, as (line, what) pairs."""
    faults = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, ast.IfExp):
            faults.append((node.iter.lineno, "conditional iterable"))
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.IfExp, ast.BoolOp)):
            faults.append((node.lineno, "expression used as a statement"))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                if isinstance(side, ast.Call) and getattr(side.func, "id", "") == "bool":
                    faults.append((node.lineno, "multiplication by bool()"))
    return faults


def packings(source):
    """Assignments of three or more values at once: `a, b, c = x, y, z`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            target = node.targets[0]
            if isinstance(target, ast.Tuple) and len(target.elts) >= 3:
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_reads_plainly(name):
    source = read(name)
    lines = source.splitlines()
    over_100 = [i + 1 for i, line in enumerate(lines) if len(line) > 100]
    over_120 = [i + 1 for i, line in enumerate(lines) if len(line) > 120]
    long_trailing = [t.start[0] for t in tokens(source) if t.type == tokenize.COMMENT
                     and t.line[:t.start[1]].strip() and len(t.string) > 60]
    assert len(over_100) <= 0.05 * len(lines), f"{name}: lines over 100 characters: {over_100}"
    assert not over_120, f"{name}: lines over 120 characters: {over_120}"
    assert len(long_trailing) <= 0.015 * len(lines), f"{name}: long trailing comments: {long_trailing}"
    assert plain_faults(source) == [], name
    assert len(packings(source)) <= 2, f"{name}: packings at lines {packings(source)}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_paper_part_ends_at_its_ruler(name):
    lines = read(name).splitlines()
    rulers = [i + 1 for i, line in enumerate(lines) if line.startswith("# ====")]
    assert rulers and rulers[0] <= RULER_AT_MOST[name], f"{name}: first ruler at {rulers[:1]}"
    # every class the paper part uses (its errors included) is defined or imported above the
    # ruler; functions of the plumbing (checkpoints, logging) may be called from the paper part
    above = ast.parse("\n".join(lines[:rulers[0] - 1]))
    below = ast.parse("\n".join(lines[rulers[0]:]))
    classes_below = {n.name for n in below.body if isinstance(n, ast.ClassDef)}
    for node in ast.walk(below):
        if isinstance(node, ast.ImportFrom):
            classes_below |= {alias.asname or alias.name for alias in node.names}
    defined_above = {n.name for n in ast.walk(above)
                     if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    used_above = {n.id for n in ast.walk(above) if isinstance(n, ast.Name)}
    leaks = (used_above & classes_below) - defined_above
    assert not leaks, f"{name}: the paper part uses {sorted(leaks)}, defined below the ruler"


@pytest.mark.parametrize("name", COPY_ALONE)
def test_the_file_imports_alone(tmp_path, name):
    """Copied alone into an empty folder, the file imports (no other project file at module level)."""
    shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    module = name[:-3]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{name} alone: {done.stderr[-800:]}"


CODE_TOKENS_AT_MOST = 53600  # the seven scripts, comments and layout tokens left out


def test_the_seven_scripts_hold_their_token_budget():
    layout = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
              tokenize.ENDMARKER}
    counts = {name: sum(t.type not in layout for t in tokens(read(name))) for name in SCRIPTS}
    total = sum(counts.values())
    assert total <= CODE_TOKENS_AT_MOST, f"{total} code tokens: {counts}"
