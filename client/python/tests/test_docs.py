"""docs/python.md's tour works as written: its Python blocks run in order."""

from __future__ import annotations

import contextlib
import io
import re

from conftest import REPO


def tour_blocks():
    text = (REPO / "docs" / "python.md").read_text()
    tour = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", tour, re.S)


def test_the_tour_runs_as_written(private_daemon, monkeypatch):
    d = private_daemon()
    monkeypatch.setenv("GPUQ_SOCKET", d.socket)
    blocks = tour_blocks()
    assert len(blocks) >= 8
    scope: dict = {"__name__": "__tour__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, "docs/python.md", "exec"), scope)
    printed = out.getvalue()
    assert "not_found - buffer 'nothere' not found" in printed
    assert "100 noops, 100 done" in printed
    assert scope["client"].closed
    with d.client() as c:
        assert c.buffers() == []  # the tour cleaned up after itself
