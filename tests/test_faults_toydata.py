"""User-side faults in toydata.py (issue 22): a bad flag, an --out that is a file, a full disk or a read-only folder
end in one line naming the flag or the file; no traceback and no temporary file is left.

Run: python -m pytest -q tests/test_faults_toydata.py
"""
import builtins
import errno

import pytest

import toydata


def fake_open(kind):
    """open() for toydata's _write: a full disk fails after half a file, a read-only folder at once."""
    real = builtins.open

    def opener(path, mode="r", **kw):
        if "w" not in mode:
            return real(path, mode, **kw)
        if kind == "read-only":
            raise PermissionError(errno.EACCES, "Permission denied", path)
        if kind == "Ctrl-C":
            raise KeyboardInterrupt
        f = real(path, mode, **kw)

        def write(text):
            real_write(text[:10])
            raise OSError(errno.ENOSPC, "No space left on device")  # as a write raises it: no file name
        real_write, f.write = f.write, write
        return f
    return opener


TOYDATA_CASES = [
    # (argv, fault, expected message); {t} = tmp_path
    (["--seed", "-1"], None, "--seed must be >= 0, got -1"),  # was numpy's "expected non-negative integer"
    (["--out", "{t}/afile"], None, "--out {t}/afile: exists and is not a directory"),  # was "[Errno 17] File exists"
    (["--langs", "en, fr"], None, "--langs en, fr: expected two distinct codes of letters"),  # was ' fr.train.txt'
    (["--langs", "en/x,fr"], None, "--langs en/x,fr: expected two distinct codes of letters"),  # was a folder en/
    (["--langs", "en,en"], None, "--langs en,en: expected two distinct codes of letters"),
    (["--langs", "en"], None, "--langs en: expected two distinct codes of letters"),
    (["--langs", "en,fr,de"], None, "--langs en,fr,de: expected two distinct codes of letters"),
    (["--overlap", "nan"], None, "overlap must be in [0, 1], got nan"),
    (["--scale", "0"], None, "--scale must be an integer in 1..64"),
    (["--scale", "1000"], None, "--scale must be an integer in 1..64 (64: 60,416 concepts"),  # was an hour, silent
    (["--out", ""], None, "--out '': an empty path"),  # was "cannot write : No such file or directory"
    ([], "full disk", "toydata.py: error: cannot write {t}/w/mono/en.train.txt: No space left on device"),
    ([], "read-only", "toydata.py: error: cannot write {t}/w/mono/en.train.txt: Permission denied"),
    ([], "Ctrl-C", "toydata.py: interrupted; {t}/w is incomplete (write it again with --force)"),
]


@pytest.mark.parametrize("argv, fault, message", TOYDATA_CASES, ids=[" ".join(a) or f for a, f, _ in TOYDATA_CASES])
def test_toydata_fault_is_one_line(tmp_path, capsys, monkeypatch, argv, fault, message):
    (tmp_path / "afile").write_text("x")
    if fault:
        monkeypatch.setattr(toydata, "open", fake_open(fault), raising=False)
    argv = ["--out", str(tmp_path / "w"), "--size", "tiny"] + [a.format(t=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as e:
        toydata.main(argv)
    text = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err
    assert message.format(t=tmp_path) in text and "Traceback" not in text
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert not list(tmp_path.glob("w/*/*.txt"))
