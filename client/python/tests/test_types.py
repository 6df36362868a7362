"""The package's type hints hold (mypy, as Debian ships it), and AsyncClient's
generated coroutine methods are current with the sync ones."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO

PY = REPO / "client" / "python"


def test_type_hints_check():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (apt-get install python3-mypy; make deps)")
    with tempfile.TemporaryDirectory() as cache:
        run = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                              str(PY / "pyproject.toml"), "--cache-dir", cache,
                              str(PY / "gpuq")], cwd=cache, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=300)
    assert run.returncode == 0, run.stdout


def test_the_async_methods_are_generated_from_the_current_sync_ones():
    sys.path.insert(0, str(PY / "tools"))
    try:
        import gen_aio
    finally:
        sys.path.pop(0)
    current = (PY / "gpuq" / "aio_methods.py").read_text()
    assert current == gen_aio.generate(), \
        "gpuq/aio_methods.py is stale: run python3 client/python/tools/gen_aio.py"


def test_the_package_says_it_is_typed():
    import gpuq
    from pathlib import Path
    assert (Path(gpuq.__file__).parent / "py.typed").exists()
