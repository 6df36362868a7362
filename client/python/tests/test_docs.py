"""docs/python.md's tour works as written: its Python blocks run in order."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re

import pytest

import gpuq

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


def docstring_examples():
    """The expressions and op chains that the docstrings of expr, reduce, run and
    parse_ops (and the ops module's) show in double backquotes, as a string alone
    ("sum(x)") or as one a method is called with (c.reduce("sum(x)")):
    (method, text) pairs, the method being what the text is written for: a
    chain (``|``) is run's ops, a statement (``=``) expr's, the rest reduce's."""
    import gpuq.api
    import gpuq.ops
    docs = [gpuq.Client.expr.__doc__, gpuq.Client.reduce.__doc__, gpuq.Client.run.__doc__,
            gpuq.api.parse_ops.__doc__, gpuq.ops.__doc__]
    found = []
    for doc in docs:
        for span in re.findall(r"``(.*?)``", doc or "", re.S):
            example = re.fullmatch(r'(?:[\w.]*\b(?:reduce|expr|run)\()?"([^"]*)"\)?', span)
            if example:
                text = example[1]
                method = "run" if "|" in text else "expr" if "=" in text else "reduce"
                found.append((method, " ".join(text.split())))
    return found


def test_the_docstrings_expressions_are_accepted(private_daemon):
    """docs/python.md's examples run in the tour above; the docstrings' are not
    executed code, so each expression and chain they show is run here, over
    float buffers named as they name them, and must be accepted (the grammar
    is docs/protocol.md's, which has no comparisons, for one)."""
    import numpy as np
    examples = docstring_examples()
    kinds = {m for m, _ in examples}
    assert kinds == {"run", "expr", "reduce"} and len(examples) >= 12, examples
    with private_daemon().client() as c:
        for n, name in enumerate("xyab"):
            c.put_array(name, np.linspace(-1, 1, 64, dtype=np.float32) + n)
        for method, text in examples:
            try:
                if method == "run":
                    c.run("x", text)
                elif method == "expr":
                    c.expr(text)
                else:
                    c.reduce(text)
            except gpuq.GpuqError as e:
                pytest.fail(f"the docstring's {method} example {text!r} is refused: {e}")
