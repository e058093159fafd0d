from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

# OpenMP threads that wait sleep rather than spin, set before torch loads its OpenMP (and passed
# to pytest-xdist's workers and every subprocess): the suite runs a worker a core, each with
# torch's threads and some with a thread a lane, and spinning threads took the cores the others
# needed (tests/test_runtime.py and test_zoo.py on 2 workers, 2 cores: 302 s, 182 s sleeping)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

if TYPE_CHECKING:
    from opsched.ir import Graph


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run the tests marked slow (minutes each)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    not_now = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(not_now)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The profile store and the schedule cache of this test session's own: tests neither read
    what the user's runs left nor leave anything there (subprocesses inherit it too)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPSCHED_CACHE_DIR", str(tmp_path_factory.mktemp("opsched-cache")))
        yield


class ZooCase(NamedTuple):
    """A zoo model at batch 1 with its example inputs, what eager PyTorch gives on them, and its graph."""

    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    expected: Any
    graph: Graph


@pytest.fixture(scope="session")
def zoo_case() -> Callable[[str], ZooCase]:
    """Each zoo model built, run and traced once per test session, for the tests that schedule
    every model many ways (torch.export traces nasnet_large in 10 to 20 seconds here, most of
    what one of them costs). Shared: a test must not change the model or its inputs."""

    @functools.cache
    def case(name: str) -> ZooCase:
        from opsched import from_torch
        from opsched.models import example_inputs, get_model

        model, inputs = get_model(name), example_inputs(name)
        with torch.no_grad():
            expected = model(*inputs)
        return ZooCase(model, inputs, expected, from_torch(model, inputs))

    return case


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture
def strict_float32() -> Iterator[None]:
    """float32 as float32: no TF32 in cuDNN convolutions or matrix products while the test runs
    (on a GPU, a test that compares float32 with eager float32 needs it; elsewhere it changes nothing)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def mode_switch_onnx(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An .onnx file whose int64 input ``mode`` selects a branch, as Silero VAD's sample rate does:
    ``y = (-x if mode == 1 else unsqueeze(squeeze(x, 0), 0)) * x``, ``x`` of declared dimensions
    ``[n, 4]``. At n=2 only the first branch runs, and ONNX Runtime's shape inference of the
    second fails at a fixed ``n`` (a squeezed axis of size 2): ONNX Runtime loads the file only
    with ``n`` open."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def branch(name: str, nodes: list[onnx.NodeProto], shape: list[int | str]) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(nodes[-1].output[0],
                                                                                 TensorProto.FLOAT, shape)])

    then = branch("then", [helper.make_node("Neg", ["x"], ["t"])], ["n", 4])
    axis = helper.make_node("Constant", [], ["axis"], value=numpy_helper.from_array(np.array([0], np.int64)))
    else_ = branch("else", [axis, helper.make_node("Squeeze", ["x", "axis"], ["s"]),
                            helper.make_node("Unsqueeze", ["s", "axis"], ["e"])], [1, 4])
    nodes = [helper.make_node("Equal", ["mode", "one"], ["c"]),
             helper.make_node("If", ["c"], ["r"], then_branch=then, else_branch=else_),
             helper.make_node("Mul", ["r", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "mode_switch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.array(1, np.int64), "one")])
    path = tmp_path_factory.mktemp("onnx") / "mode_switch.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)
