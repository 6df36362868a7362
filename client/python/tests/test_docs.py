"""docs/python.md's tour works as written: its Python blocks run in order."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re

import pytest

from conftest import REPO


def tour_blocks():
    text = (REPO / "docs" / "python.md").read_text()
    tour = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", tour, re.S)


def test_the_tour_runs_as_written(private_daemon, monkeypatch):
    d = private_daemon()
    monkeypatch.setenv("GPUQ_SOCKET", d.socket)
    blocks = tour_blocks()
    assert len(blocks) >= 10
    have_torch = importlib.util.find_spec("torch") is not None
    scope: dict = {"__name__": "__tour__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            if block.startswith("# needs torch") and not have_torch:
                continue  # test_the_tours_torch_blocks says so
            exec(compile(block, "docs/python.md", "exec"), scope)
    printed = out.getvalue()
    assert "not_found - buffer 'nothere' not found" in printed
    assert "100 noops, 100 done" in printed
    assert scope["client"].closed
    with d.client() as c:
        assert c.buffers() == []  # the tour cleaned up after itself


def test_the_tours_torch_blocks():
    """The tour's torch blocks run in the test above where torch is installed (the
    GPU machine's run); here this says they did not."""
    blocks = [b for b in tour_blocks() if b.startswith("# needs torch")]
    assert len(blocks) >= 2
    if importlib.util.find_spec("torch") is None:
        pytest.skip(f"torch is not installed here: the tour's {len(blocks)} torch blocks "
                    "did not run (the GPU machine's tests run them)")
