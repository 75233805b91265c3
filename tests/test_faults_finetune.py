"""User-side faults in finetune.py, align.py and cka.py (issue 14): every mistake ends in one clear line
naming the flag, or the file and line; none leaves a half-written file or a results file that looks valid.

Run: python -m pytest -q tests/test_faults_finetune.py
"""
import re

import pytest
import torch

import finetune as ft

torch.set_num_threads(1)  # tiny tensors: extra threads only spin on a shared 2-core machine

# -----------------------------------------------------------------------------
# readers: file:line errors (XNLI labels, UTF-8, CoNLL-U trees)

GOOD_XNLI = "A man.\tA person.\tentailment\nB.\tC.\tneutral\n"
GOOD_NER = "Paris\tB-LOC\nis\tO\n\nRome\tB-LOC\n"
# word ids 1..4, a valid tree: 2 is the root, 1 -> 2, 3 -> 2, 4 -> 3
GOOD_CONLLU = ("# sent_id = a\n1\tA\ta\tDET\t_\t_\t2\tdet\t_\t_\n2\tdog\tdog\tNOUN\t_\t_\t0\troot\t_\t_\n\n"
               "# sent_id = b\n# text = x\n1\tI\tI\tPRON\t_\t_\t2\tnsubj\t_\t_\n2\tsee\tsee\tVERB\t_\t_\t0\troot\t_\t_\n"
               "3\tit\tit\tPRON\t_\t_\t2\tobj\t_\t_\n4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_\n")


def _conllu_heads(heads):
    """Second sentence of GOOD_CONLLU (starting at line 5) with the given HEAD column for words 1..4."""
    lines = GOOD_CONLLU.split("\n")
    for k, h in enumerate(heads):
        cols = lines[6 + k].split("\t")
        cols[6] = str(h)
        lines[6 + k] = "\t".join(cols)
    return "\n".join(lines)


READER_FAULTS = [
    # (reader, file content (bytes or str), expected message; {p} = the file's path)
    (ft.read_xnli, "A.\tB.\tentailment\nC.\tD.\tneutrall\n",
     "{p}:2: unknown XNLI label 'neutrall' (expected entailment, neutral, contradiction)"),
    (ft.read_xnli, GOOD_XNLI.encode() + b"caf\xe9\tx\tneutral\n", "{p}:3: not valid UTF-8"),
    (ft.read_ner, GOOD_NER.encode() + b"\nM\xfcnchen\tB-LOC\n", "{p}:6: not valid UTF-8"),
    (ft.read_conllu, GOOD_CONLLU.encode().replace(b"dog\tdog", b"d\xc3g\tdog"), "{p}:3: not valid UTF-8"),
    (ft.read_conllu, _conllu_heads([2, 0, 2, 4]), "{p}:10: word 4 is its own head"),
    (ft.read_conllu, _conllu_heads([2, 0, 0, 3]), "{p}:5: sentence is not a tree: 2 words on ROOT"),
    (ft.read_conllu, _conllu_heads([2, 3, 2, 3]), "{p}:5: sentence is not a tree: 0 words on ROOT"),
    (ft.read_conllu, _conllu_heads([2, 0, 4, 3]), "{p}:5: sentence is not a tree: words 3 -> 4 -> 3 form a cycle"),
    (ft.read_conllu, _conllu_heads([2, 0, 2, 5]), "{p}:10: head 5 outside 0..4"),
]


@pytest.mark.parametrize("reader, content, msg", READER_FAULTS, ids=[
    "xnli-label", "xnli-utf8", "ner-utf8", "conllu-utf8", "conllu-self-loop", "conllu-two-roots", "conllu-no-root",
    "conllu-cycle", "conllu-head-range"])
def test_reader_faults_name_file_and_line(tmp_path, reader, content, msg):
    p = tmp_path / "data.txt"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=re.escape(msg.format(p=p))) as e:
        reader(str(p))
    assert "\n" not in str(e.value)


def test_readers_accept_the_good_files(tmp_path):
    for reader, text in ((ft.read_xnli, GOOD_XNLI), (ft.read_ner, GOOD_NER), (ft.read_conllu, GOOD_CONLLU)):
        p = tmp_path / "ok.txt"
        p.write_text(text)
        assert len(reader(str(p))) == 2
    p.write_text(GOOD_CONLLU)
    assert ft.read_conllu(str(p))[1]["heads"] == [2, 0, 2, 3]
