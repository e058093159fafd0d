"""Third-party models (Hugging Face ``transformers``, built from configs; :mod:`opsched.testing.corpus`)
through both frontends: the torch import leaves nothing opaque and every scheduler x CPU backend
equals eager; the model's ``torch.onnx`` export imports and runs equal to ONNX Runtime's own session.

CI runs the models not marked slow; ``--runslow`` runs them all."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import opsched
from opsched.compare import largest_difference, tolerance
from opsched.costing import host_cpu_model
from opsched.testing import assert_close
from opsched.testing.corpus import corpus, corpus_available, wide_corpus
from opsched.testing.export import export_onnx

pytestmark = pytest.mark.skipif(not corpus_available(), reason="needs Hugging Face transformers")

CORPUS = corpus() if corpus_available() else {}
CASES = [pytest.param(name, marks=pytest.mark.slow) if entry.slow else name for name, entry in CORPUS.items()]
SCHEDULERS = ["sequential", "greedy", "ios", "est"]
WIDE = wide_corpus() if corpus_available() else {}
#: Wide-corpus files torch.onnx cannot write, or writes so that ONNX Runtime's own session
#: refuses them (the exporter's gaps, not opsched's), by model and opset (None: the default
#: export, 17: the TorchScript exporter's), and what the failure says. Each must still fail so.
EXPORTER_GAPS: dict[tuple[str, int | None], str] = {
    # aten::diff, of their attention masks' positions, has no TorchScript symbolic
    **{(name, 17): "aten::diff" for name in ("gpt_neox", "phi", "qwen2", "qwen3", "mistral", "gemma", "cohere",
                                             "mixtral", "qwen2_moe", "gemma2", "gemma3_text", "phi3", "stablelm",
                                             "falcon", "gptj")},
    # the experts' matrix products, transformers' own operator, have no ONNX function
    **{(name, None): "grouped_mm_fallback" for name in ("mixtral", "qwen2_moe")},
    ("mobilevitv2", 17): "aten::col2im",  # folding patches back (ONNX Col2Im is opset 18)
    ("mamba2", 17): "Invalid attribute perm",  # permute(x, [0, -2, -1, 1]) as a Transpose of negative axes
    ("patchtst", 17): "Incompatible dimensions",  # unfold over dimension -2 as a slice of another axis
    # the attention of its last character encoder as a MatMul of mismatched shapes
    ("canine", 17): "Incompatible dimensions",
    # the dynamo exporter fails and the TorchScript one types the sampling grid float64, for
    # which ONNX Runtime has no GridSample
    ("mask2former", None): "GridSample", ("mask2former", 17): "GridSample",
}
CPU = host_cpu_model()


@pytest.mark.parametrize("name", CASES)
def test_a_corpus_model_computes_outputs_a_wrong_result_cannot_hide_in(name: str) -> None:
    """Every corpus model, made to look trained (``trained_looking``), returns floating outputs of
    a size the tolerance is small beside (0.02-60 across the corpora, where MobileNetV2's were 2e-21
    and EfficientNet's exact zeros at their initialisers': equal, within 1e-4, to anything), and
    its batch norms' statistics are its own activations', not the initial 0 and 1."""
    model, inputs, expected = _built(name)
    floating = [t for t in expected if t.is_floating_point() and t.numel()]
    assert floating and max(float(t.abs().max()) for t in floating) > 1e-2, name
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            assert not m.training and not torch.equal(m.running_var, torch.ones_like(m.running_var)), name


@functools.cache
def _built(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[torch.Tensor]]:
    model, inputs = CORPUS[name].build()
    with torch.no_grad():
        expected = [t for t in torch.utils._pytree.tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor)]
    return model, inputs, expected


@functools.cache
def _torch_graph(name: str) -> opsched.Graph:
    model, inputs, _ = _built(name)
    return opsched.from_torch(model, inputs)


@pytest.mark.parametrize("name", CASES)
def test_torch_import_leaves_nothing_opaque(name: str) -> None:
    graph = _torch_graph(name)
    assert [n.name for n in graph.nodes if n.op == "opaque"] == []
    assert not [n for n in graph.nodes if n.op == "constant" and not n.inputs and n.name in graph.outputs]


@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("name", CASES)
def test_every_scheduler_and_backend_equals_eager(name: str, scheduler: str, backend: str) -> None:
    model, inputs, expected = _built(name)
    options = {"budget_s": 5.0} if scheduler == "ios" else {}
    module = opsched.optimize_graph(_torch_graph(name), cost=CPU, scheduler=scheduler, backend=backend, check=False,
                                    **options)
    got = module(*inputs)
    assert_close(list(got) if isinstance(got, (list, tuple)) else [got], expected, f"{name} / {scheduler} / {backend}")



@pytest.mark.parametrize("name", CASES)
def test_in_float64_what_onnx_runtime_has_no_kernel_for_runs_with_torch(name: str) -> None:
    """ONNX Runtime has float64 kernels of some ops only (no Conv, no Gemm): every model in
    float64 on the ORT backend equals eager, its nodes without a kernel run with torch, and every
    exporter writes its constants in its values' dtype (a Pad's was float32: Swin failed)."""
    model, inputs = CORPUS[name].build()
    model, inputs = model.double(), tuple(t.double() if t.is_floating_point() else t for t in inputs)
    with torch.no_grad():
        expected = [t for t in torch.utils._pytree.tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor)]
    graph = opsched.from_torch(model, inputs)
    module = opsched.optimize_graph(graph, cost=CPU, scheduler="sequential", backend="ort", check=False)
    got = module(*inputs)
    computed_in = {t.dtype for t in graph.types.values()}  # Llama's rotary embedding: float32
    for a, e in zip(list(got) if isinstance(got, (list, tuple)) else [got], expected, strict=True):
        assert a.dtype == e.dtype and largest_difference(a, e) <= tolerance(e, computed_in), name

def _runs_equal_to_onnx_runtime(proto: onnx.ModelProto, inputs: tuple[torch.Tensor, ...], what: str,
                                model: torch.nn.Module) -> None:
    """``proto`` imported with nothing opaque, and its sequential and greedy plans on both CPU
    backends equal to ONNX Runtime's own session of it (or as near the float64 outputs of the
    ``model`` it was exported from as that session's are)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})
    graph = opsched.from_onnx(proto)
    assert [n.name for n in graph.nodes if n.op == "opaque"] == []
    for backend in ("torch", "ort"):
        for scheduler in ("sequential", "greedy"):
            module = opsched.optimize_graph(graph, cost=CPU, scheduler=scheduler, backend=backend, check=False)
            got = module(*inputs)
            assert_close(list(got) if isinstance(got, (list, tuple)) else [got], [torch.from_numpy(w) for w in want],
                         f"{what} / {scheduler} / {backend}", model=model, inputs=inputs)


@pytest.mark.parametrize("name", CASES)
def test_onnx_export_imports_and_runs_equal_to_onnx_runtime(name: str) -> None:
    model, inputs, _ = _built(name)
    proto, exporter = export_onnx(model, inputs)
    _runs_equal_to_onnx_runtime(proto, inputs, f"{name} ({exporter})", model)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WIDE))
def test_the_wide_corpus_runs_equal_through_the_torch_import_and_both_onnx_exporters(name: str) -> None:
    """``benchmarks/sweep.py``'s models: the torch import whole and equal to eager (or, where
    trained-looking batch norms amplify rounding past the tolerance, as near the model's float64
    outputs as eager's own); the dynamo export, and the TorchScript one at opset 17 (older tools'
    files), equal to ONNX Runtime."""
    model, inputs = WIDE[name].build()
    with torch.no_grad():
        expected = [t for t in torch.utils._pytree.tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor)]
    graph = opsched.from_torch(model, inputs)
    assert [n.name for n in graph.nodes if n.op == "opaque"] == []
    module = opsched.optimize_graph(graph, cost=CPU, scheduler="greedy", backend="ort", check=False)
    got = module(*inputs)
    assert_close(list(got) if isinstance(got, (list, tuple)) else [got], expected, name, model=model, inputs=inputs)
    for opset in (None, 17):
        def exported_and_run(opset: int | None = opset) -> None:
            proto, exporter = export_onnx(model, inputs, opset, torchscript=opset is not None)
            _runs_equal_to_onnx_runtime(proto, inputs, f"{name} ({exporter} at opset {opset or 'default'})", model)

        if (name, opset) in EXPORTER_GAPS:
            with pytest.raises(Exception, match=re.escape(EXPORTER_GAPS[name, opset])):  # noqa: PT011 (matched)
                exported_and_run()
        else:
            exported_and_run()


@pytest.mark.parametrize("name", CASES)
def test_the_models_torch_export_program_saved_and_loaded_optimizes_equal_to_eager(name: str, tmp_path: Path) -> None:
    """PyTorch 2's deployment artifact: ``torch.export.save``, then ``torch.export.load`` and
    ``optimize(program)`` at the example inputs saved with it, checked against eager (verify)."""
    model, inputs, expected = _built(name)
    torch.export.save(torch.export.export(model, inputs), tmp_path / f"{name}.pt2")
    module = opsched.optimize(torch.export.load(tmp_path / f"{name}.pt2"), cost=CPU)
    with torch.no_grad():
        got = [t for t in torch.utils._pytree.tree_leaves(module(*inputs)) if isinstance(t, torch.Tensor)]
    assert_close(got, expected)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_an_opset_23_export_is_one_session_equal_to_onnx_runtime(name: str) -> None:
    """At ``opset_version=23`` torch.onnx writes Attention (and Llama's RMSNormalization), ops
    the segments' opset lacks: imported as the functions ONNX defines them by, the model stays
    one ONNX Runtime session."""
    import onnxruntime

    from opsched.backends.lanes import LaneExecutor

    model, inputs, _ = _built(name)
    proto, exporter = export_onnx(model, inputs, opset=23)
    assert exporter == "dynamo" and "Attention" in {n.op_type for n in proto.graph.node}
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})
    module = opsched.optimize_graph(opsched.from_onnx(proto), cost=CPU, scheduler="sequential", backend="ort",
                                    check=False)
    got = module(*inputs)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), w, rtol=0, atol=1e-4 * max(1.0, float(np.abs(w).max())))
    executor = module.executor
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()


def test_a_model_called_with_its_tokenizer_output_is_called_the_same_way(tmp_path: Path) -> None:
    """``model(**tokenizer(texts, padding=True, return_tensors="pt"))``, as pipelines call it: keyword
    inputs, a padded attention mask and token type ids, which index a table of two rows (the
    plans raced end to end run on inputs made from the graph alone, whose ids must be valid)."""
    import transformers

    model, (ids,), _ = _built("bert")
    ids = torch.cat([ids, ids.flip(1)])
    mask, types = torch.ones_like(ids), torch.zeros_like(ids)
    mask[1, 10:], types[:, 8:] = 0, 1
    batch = transformers.BatchEncoding({"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
    module = opsched.optimize(model, batch, cache_dir=str(tmp_path))  # measured: plans race on zero ids
    assert module.outcome.race is not None
    with torch.no_grad():
        want = model(**batch)
        for got in (module(**batch), module(ids, mask, types)):
            assert type(got) is type(want)
            assert_close([got.last_hidden_state, got.pooler_output], [want.last_hidden_state, want.pooler_output])


def _decoders() -> dict[str, tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    """Decoders as users build them: the key-value cache on (``use_cache`` is their default)."""
    import transformers as hf

    torch.manual_seed(0)
    small = {"vocab_size": 100, "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32,
             "intermediate_size": 64}
    ids = torch.randint(0, 100, (1, 8))
    return {
        "llama": (hf.LlamaForCausalLM(hf.LlamaConfig(num_key_value_heads=1, **small)).eval(),
                  {"input_ids": ids, "attention_mask": torch.ones_like(ids)}),
        "gpt2": (hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=100, n_layer=2, n_head=2, n_embd=32)).eval(),
                 {"input_ids": ids}),
        "t5": (hf.T5ForConditionalGeneration(hf.T5Config(vocab_size=100, num_layers=2, num_heads=2, d_model=32,
                                                         d_kv=16, d_ff=64)).eval(),
               {"input_ids": ids, "decoder_input_ids": ids[:, :4]}),
    }


@pytest.mark.parametrize("name", ["llama", "gpt2", "t5"])
def test_a_decoder_returning_its_key_value_cache_returns_it_rebuilt(name: str) -> None:
    """torch.export could not see the tensors of a transformers Cache in the output: every
    decoder built with its defaults was refused. The cache types are pytree nodes now, as
    transformers' own exporter makes them, and the module returns the cache with its tensors."""
    model, example = _decoders()[name]
    module = opsched.optimize(model, example, cost=CPU)
    with torch.no_grad():
        want, got = model(**example), module(**example)
    assert type(got.past_key_values) is type(want.past_key_values)
    leaves = torch.utils._pytree.tree_leaves
    assert len(leaves(got.past_key_values)) == len(leaves(want.past_key_values)) >= 4
    assert_close(leaves(got), leaves(want))


def _decode_step(model: torch.nn.Module, cache: object, position: int, token: int) -> dict[str, object]:
    """The keyword inputs of one decoding step: a token, the cache, and (for a static cache) where it goes."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {"input_ids": torch.tensor([[token]]), name: cache, "cache_position": torch.tensor([position])}


def test_a_decoding_loop_that_passes_one_cache_on_sees_it_change_as_in_eager() -> None:
    """A decoder appends each step's keys and values to the cache it is passed, and a loop keeps
    passing that one object. The module returned a rebuilt cache and left the caller's as it was,
    so a loop ran every step after the first on stale state, silently; now the caller's cache is
    the one returned, changed, a static one in its own tensors. A static cache is traced once
    the model has filled it (it holds no tensors before), and one passed unfilled is refused,
    saying so."""
    import copy

    from transformers.cache_utils import DynamicCache, StaticCache

    model, example = _decoders()["llama"]
    model = model.model  # the decoder, without its head
    with torch.no_grad():
        prefill = model(**example).past_key_values
    assert isinstance(prefill, DynamicCache)
    step = _decode_step(model, copy.deepcopy(prefill), 8, 5)
    module = opsched.optimize(model, step, cost=CPU)
    ours, theirs = copy.deepcopy(prefill), copy.deepcopy(prefill)
    with torch.no_grad():
        got, want = module(**_decode_step(model, ours, 8, 5)), model(**_decode_step(model, theirs, 8, 5))
    assert got.past_key_values is ours and want.past_key_values is theirs
    leaves = torch.utils._pytree.tree_leaves
    assert [t.shape[2] for t in leaves(ours)] == [t.shape[2] for t in leaves(theirs)] == [9] * 4
    assert_close(leaves(got), leaves(want))

    def static() -> StaticCache:
        return StaticCache(config=model.config, max_cache_len=16)

    def filled() -> StaticCache:
        cache = static()
        with torch.no_grad():
            model(**_decode_step(model, cache, 0, 1))
        cache.reset()
        return cache

    module = opsched.optimize(model, _decode_step(model, filled(), 0, 5), cost=CPU)
    ours, theirs = filled(), filled()
    storage = leaves(ours)
    for position, token in enumerate([5, 17, 3, 42]):
        with torch.no_grad():
            got = module(**_decode_step(model, ours, position, token))
            want = model(**_decode_step(model, theirs, position, token))
        assert got.past_key_values is ours
        assert_close(leaves(got), leaves(want))
    assert all(a is b for a, b in zip(leaves(ours), storage, strict=True))  # written in place, as eager writes it

    module = opsched.optimize(model, _decode_step(model, static(), 0, 5), cost=CPU)
    cache = static()
    with torch.no_grad():
        module(**_decode_step(model, cache, 0, 5))  # fills the cache: the next call is not the one traced
        with pytest.raises(opsched.errors.InputMismatchError,
                           match=r"holds 6 values, 2 when traced: a StaticCache holds its tensors once a call of the "
                                 r"model has filled it; trace with one as it will be passed"):
            module(**_decode_step(model, cache, 1, 7))


def test_a_vision_towers_grid_fixed_it_optimizes_equal_to_eager_and_refuses_another_grid() -> None:
    """Qwen2.5-VL's vision tower sizes its windows and its attention per image by the numbers of
    ``grid_thw`` (``.tolist()``, a cumulative sum): torch.export cannot trace it. With the grid a
    fixed value, the module equals eager on the example and on fresh patches, windowed attention
    and all, and a call with another grid is refused by name."""
    from transformers import Qwen2_5_VisionTransformerPretrainedModel, Qwen2_5_VLVisionConfig

    torch.manual_seed(0)
    config = Qwen2_5_VLVisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64,
                                    window_size=56, fullatt_block_indexes=[1])
    tower = Qwen2_5_VisionTransformerPretrainedModel(config).eval()
    grid = torch.tensor([[1, 4, 4], [1, 4, 8]])  # two images, as a processor gives them: 48 patches of 3x2x14x14
    patches = torch.randn(48, 3 * 2 * 14 * 14)
    with pytest.raises(opsched.errors.FrontendError, match=r"fixed_values=\('grid_thw',\)"):
        opsched.from_torch(tower, {"hidden_states": patches, "grid_thw": grid}, tracer="export")
    module = opsched.optimize(tower, {"hidden_states": patches, "grid_thw": grid}, cost=CPU,
                              fixed_values=("grid_thw",))
    assert [v.name for v in module.graph.inputs] == ["hidden_states"]
    for x in (patches, torch.randn_like(patches)):
        with torch.no_grad():
            got, want = module(hidden_states=x, grid_thw=grid), tower(hidden_states=x, grid_thw=grid)
        assert_close(got.to_tuple(), want.to_tuple())
    with pytest.raises(opsched.errors.InputMismatchError, match=r"input 'grid_thw' is fixed to \[\[1, 4, 4\], "
                                                                r"\[1, 4, 8\]\] \(int64\)"):
        module(hidden_states=patches, grid_thw=torch.tensor([[1, 4, 4], [1, 8, 4]]))


def test_experts_that_loop_in_python_are_traced_routing_as_tensors_and_left_as_they_were() -> None:
    """Experts implemented as transformers' "eager" loop (OpenAI's privacy filter's default) go
    over the experts some token chose, a count torch.export cannot trace: the model is traced
    with transformers' grouped implementation of the same experts, equals eager on fresh tokens
    too, and is left with its own implementation."""
    from transformers import MixtralConfig, MixtralModel

    torch.manual_seed(0)
    model = MixtralModel(MixtralConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                       num_experts_per_tok=2, use_cache=False)).eval()
    model.set_experts_implementation("eager")
    ids = torch.randint(0, 100, (1, 12))
    with pytest.raises(Exception, match=r"data.dependent"):  # what the retry answers: torch.export's own refusal
        torch.export.export(model, (ids,), strict=False)
    graph = opsched.from_torch(model, (ids,), tracer="export")
    assert not [n for n in graph.nodes if n.op == "opaque"]
    assert model.get_experts_implementation() == {"": "eager"}
    module = opsched.optimize(model, (ids,), cost=CPU)
    for x in (ids, torch.randint(0, 100, (1, 12))):
        with torch.no_grad():
            assert_close(module(x).last_hidden_state, model(x).last_hidden_state)
