"""The fuzzer in the suite: random DAG modules through every scheduler, CPU backend and frontend,
equal to eager PyTorch on the example input and a fresh one. A fast subset always runs; the long
run (300 models) is ``--runslow``. ``benchmarks/fuzz.py`` tallies any number of models by cause."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from opsched.testing.fuzz import FuzzNet
from opsched.testing.fuzz_check import check_model


def _check(seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.onnx's exporter is chatty about constant folding
        outcomes = check_model(seed)
    bad = [o for o in outcomes if o.status in ("wrong", "error")]
    assert not bad, "\n".join(f"{o.frontend} / {o.scheduler} / {o.backend}: {o.status}: {o.cause}" for o in bad)
    assert all(o.status == "equal" for o in outcomes if o.frontend == "torch")
    # an ONNX export the importer cannot take is refused with a named error, never half-imported
    assert all(o.cause.startswith("UnsupportedOpError") for o in outcomes if o.status == "refused")


@pytest.mark.parametrize("seed", range(24))
def test_random_models_equal_eager_everywhere(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    _check(seed)


@pytest.mark.slow
def test_three_hundred_random_models_equal_eager_everywhere(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    for seed in range(1000, 1300):
        _check(seed)


def test_the_generator_is_deterministic_and_varied() -> None:
    a, b = FuzzNet(5), FuzzNet(5)
    x = torch.randn(a.input_shape)
    with torch.no_grad():
        assert all(torch.equal(p, q) for p, q in zip(torch.utils._pytree.tree_leaves(a(x)),
                                                      torch.utils._pytree.tree_leaves(b(x))))
    kinds = {step.kind for seed in range(40) for step in FuzzNet(seed).steps}
    assert kinds == {"conv", "pool", "adaptive", "norm", "activation", "binary", "cat", "split", "matmul", "softmax",
                     "resize", "pad", "reshape", "linear", "reduce"}
    sizes = [len(FuzzNet(seed).steps) for seed in range(40)]
    assert min(sizes) >= 9 and max(sizes) <= 66 and len(set(sizes)) > 10


def test_an_export_that_runs_away_is_stopped_and_named() -> None:
    """The deadline around torch.onnx's export (which ran away on seed 73069): a block past it
    raises a TimeoutError naming what ran long, and the timer is gone afterwards."""
    import signal
    import time

    from opsched.testing.fuzz_check import _deadline

    with pytest.raises(TimeoutError, match="the exporter ran past 0 s"), _deadline(0.05, "the exporter"):
        end = time.perf_counter() + 5
        while time.perf_counter() < end:
            pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with _deadline(5, "a quick block"):
        pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
