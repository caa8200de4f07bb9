"""The tests' reader of the workers' step records (tests/_jsonl.py) reads what a full parse
reads, at every moment of a file's life: appended to, caught mid-line, replaced, removed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests._jsonl import JsonLines


def test_appended_torn_replaced_and_removed_files_read_as_a_full_parse(tmp_path: Path) -> None:
    path, lines = tmp_path / "n1.jsonl", JsonLines()
    assert lines.rows(path) == []
    with open(path, "w") as f:
        f.write(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n")
        f.flush()
        assert lines.rows(path) == [{"step": 1}, {"step": 2}]
        f.write('{"step": 3, "dig')  # caught mid-line: not a row yet
        f.flush()
        assert lines.rows(path) == [{"step": 1}, {"step": 2}]
        f.write('est": "a"}\nnot json\n\n' + json.dumps({"step": 4}) + "\n")
        f.flush()
        assert lines.rows(path) == [{"step": 1}, {"step": 2}, {"step": 3, "digest": "a"},
                                    {"step": 4}]
    rows = lines.rows(path)
    rows.clear()  # a caller's list is its own
    assert len(lines.rows(path)) == 4
    # A new process's file in the same place (another inode), shorter than the old one.
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"step": 9}) + "\n")
    os.replace(new, path)
    assert lines.rows(path) == [{"step": 9}]
    path.write_text("")  # truncated in place
    assert lines.rows(path) == []
    path.unlink()
    assert lines.rows(path) == []
