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
