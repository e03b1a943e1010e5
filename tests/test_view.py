"""`advisor view`: TensorBoard's profiler plugin serves the run the user pointed at."""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.request

import pytest
from trace_edit import trace_file, trace_path

from advisor.errors import InputError
from advisor.render.tensorboard import profiler_logdir, start_tensorboard


def test_logdir_is_the_run_folder_or_the_trace_files_folder(tmp_path):
    run = trace_path("v100_resnet50_nw0")
    assert profiler_logdir(run) == run
    assert profiler_logdir(trace_file("v100_resnet50_nw0")) == run
    with pytest.raises(InputError, match="no such file"):
        profiler_logdir(tmp_path / "missing")


def test_tensorboard_lists_the_run_in_its_profiler_plugin():
    for module in ("tensorboard", "torch_tb_profiler"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} not installed (pip install 'torch-advisor[view]')")
    run = trace_path("v100_resnet50_nw0")
    server = start_tensorboard(run, host="127.0.0.1", port=0)  # any free port: tests may run in parallel
    try:
        assert server.url.endswith("/#pytorch_profiler") and ":0/" not in server.url
        base = server.url.split("/#")[0]
        runs: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.name not in runs:
            with urllib.request.urlopen(f"{base}/data/plugin/pytorch_profiler/runs", timeout=5) as r:
                runs = json.loads(r.read())["runs"]
            time.sleep(0.5)
        assert runs == [run.name]  # the run itself, not its neighbours in ../shared/traces
    finally:
        server.stop()
    assert server.process.poll() is not None
