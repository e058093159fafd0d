"""Frontend behaviour beyond the zoo: converters, opaque fallback, and every bad input."""

from __future__ import annotations

import io
import logging
import re
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from torch import nn

import opsched
from opsched import from_onnx, from_torch
from opsched.errors import (
    FrontendError,
    InputMismatchError,
    MalformedModelError,
    UnsupportedOpError,
    UntraceableModuleError,
)
from opsched.frontends import TRACERS
from opsched.ir.ops.aten import SDPA, arguments
from opsched.ir.ops.onnx_builder import OPSET
from opsched.runtime import run_graph
from opsched.structure import InputStructure
from opsched.testing import assert_close


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # control flow on tensor data: fx cannot trace this
            return x * 2
        return x


class WithDataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.odd = DataDependent()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.odd(self.conv(x)))


def test_untraceable_module_names_the_construct_and_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UntraceableModuleError) as info:
        from_torch(WithDataDependent(), torch.randn(1, 3, 8, 8))
    msg = str(info.value)
    assert "'odd' (DataDependent)" in msg and "leaf_modules=[DataDependent]" in msg and "from_onnx" in msg
    assert "torch.compile(model, backend='opsched')" in msg
    # both tracers tried, both reasons given
    assert "torch.export cannot trace WithDataDependent: GuardOnDataDependentSymNode" in msg
    assert "torch.fx cannot trace WithDataDependent" in msg
    # and not the graph torch.export traced before it failed, which it prints whole
    assert "def forward" not in capsys.readouterr().err
    with pytest.raises(UntraceableModuleError) as info:  # the whole model: keeping it whole is no fix
        from_torch(DataDependent(), torch.randn(1, 3, 8, 8))
    assert "leaf_modules" not in str(info.value) and "torch.compile" in str(info.value)
    # torch.export alone (or a model torch.fx cannot be tried on: a detector called with a list of images)
    with pytest.raises(FrontendError, match=r"GuardOnDataDependentSymNode.*\[the model's sizes or control flow "
                                            r"depend on its tensors' values .* torch.compile\(model, "
                                            r"backend='opsched'\) schedules the graphs"):
        from_torch(DataDependent(), torch.randn(1, 3, 8, 8), tracer="export")
    # and where in the model's code: the line that branched on a value, not torch's own code
    with pytest.raises(FrontendError,
                       match=r"\) at \S*test_frontends\.py:\d+ in forward \(`if x\.sum\(\) > 0:[^`]*`\) \["):
        from_torch(DataDependent(), torch.randn(1, 3, 8, 8), tracer="export")


class _MasksWhenEager(nn.Module):
    """A Hugging Face encoder's way with a mask left at None (LongT5's): made only outside tracing."""

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None and not torch.compiler.is_compiling():
            attention_mask = torch.ones_like(ids)
        return ids * attention_mask.shape[-1]  # while traced, None's shape


def test_a_trace_that_meets_an_unmade_mask_says_to_pass_it() -> None:
    """torch.export fails on the None a model leaves unmade while compiled: the error says where,
    and which argument to pass; passed, the model traces and the module equals eager."""
    model, ids = _MasksWhenEager(), torch.randint(0, 9, (1, 6))
    with pytest.raises(FrontendError, match=r"'NoneType' object has no attribute 'shape' at \S+:\d+ in forward "
                                            r"\(`return ids \* attention_mask\.shape\[-1\][^`]*`\) \[the model met "
                                            r"None where it makes a default outside tracing: .* pass attention_mask as "
                                            r"its tokenizer or processor gives them\]"):
        from_torch(model, {"ids": ids}, tracer="export")
    module = opsched.optimize(model, {"ids": ids, "attention_mask": torch.ones_like(ids)}, cost="analytic")
    assert torch.equal(module(ids, attention_mask=torch.ones_like(ids)), model(ids))


class _GridTower(nn.Module):
    """A vision tower's use of its grid, (frames, rows, columns) of patches per image: read out as
    numbers, they size its tensors (Qwen2-VL's split of attention per image, its ``cu_seqlens``)."""

    def __init__(self, branch: bool = False) -> None:
        super().__init__()
        self.proj, self.branch = nn.Linear(8, 8), branch

    def forward(self, patches: torch.Tensor, grid: torch.Tensor, scale: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.proj(patches) * scale
        if self.branch and x.sum() > 0:  # a branch on the data, not the grid
            x = -x
        images = [part.softmax(0).sum(0, keepdim=True) for part in torch.split(x, grid.prod(-1).tolist())]
        starts = torch.cumsum(grid.prod(-1), 0) - grid.prod(-1)
        return torch.cat(images), x[starts] * torch.arange(int(grid[:, 1].max()))[:, None, None].sum()


def test_a_model_sized_by_an_integer_input_is_specialised_to_its_values() -> None:
    """Where a model sizes its tensors by the numbers of an integer input, torch.export cannot
    trace it, and the error names the input to fix; fixed, the graph leaves it out (its numbers
    computed at import), the module equals eager on the example and on fresh patches, and refuses
    another grid, before and after pickling, naming the values it was made for."""
    model, grid = _GridTower().eval(), torch.tensor([[1, 2, 3], [1, 1, 2]])
    patches = torch.randn(8, 8)
    with pytest.raises(FrontendError, match=r"torch.export cannot trace _GridTower: .*where they are the numbers of "
                                            r"grid .* fixed_values=\('grid',\) specialises the graph"):
        from_torch(model, (patches, grid), tracer="export")
    graph = from_torch(model, (patches, grid), fixed_values=("grid",))
    assert [v.name for v in graph.inputs] == ["patches"]
    module = opsched.optimize(model, (patches, grid), cost="analytic", fixed_values=("grid",))
    fresh = torch.randn(8, 8)
    for x in (patches, fresh):
        with torch.no_grad():
            assert_close(module(x, grid), model(x, grid))
    with torch.no_grad():
        assert_close(module(fresh, grid=grid.clone()), model(fresh, grid))  # by name, an equal tensor
        # bound to the signature first (a default passed): the fixed grid was refused as unequal
        assert_close(module(fresh, grid, scale=1.0), model(fresh, grid))
    import pickle
    for m in (module, pickle.loads(pickle.dumps(module))):
        with pytest.raises(InputMismatchError, match=r"input 'grid' is fixed to \[\[1, 2, 3\], \[1, 1, 2\]\] \(int64\) "
                                                     r"\(fixed_values=\).* got \[\[1, 2, 3\], \[1, 2, 1\]\]"):
            m(patches, torch.tensor([[1, 2, 3], [1, 2, 1]]))


def test_what_a_model_computes_of_fixed_values_alone_is_computed_while_traced(
        caplog: pytest.LogCaptureFixture) -> None:
    """The grid's consequences (its numbers, the arange of a count, a tensor of Python's values)
    are computed for real while the model is traced: no draft_export, and the graph holds none of
    those calls. Where the model writes traced values into one in place (a buffer of zeros the
    size of the grid, summed into), that trace is given up for torch.export's plain one (the
    grid's numbers unbacked sizes, bound at conversion; draft_export fails on this model), equal
    too."""

    class Scatter(nn.Module):
        def forward(self, patches: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            owner = torch.repeat_interleave(torch.arange(len(grid)), grid.prod(-1))  # each patch's image
            pooled = torch.zeros(len(grid), patches.shape[1])
            pooled.index_add_(0, owner, patches)
            return pooled / torch.tensor(grid.prod(-1).tolist())[:, None]

    grid, patches = torch.tensor([[1, 2, 3], [1, 1, 2]]), torch.randn(8, 8)
    with caplog.at_level(logging.INFO, logger="opsched.frontends"):
        graph = from_torch(_GridTower().eval(), (patches, grid), fixed_values=("grid",))
    assert not [r for r in caplog.records if "draft_export" in r.getMessage()]
    assert not any(n.attrs.get("target", "").startswith(("aten::arange", "aten::cumsum")) for n in graph.nodes)
    with caplog.at_level(logging.INFO, logger="opsched.frontends"):
        module = opsched.optimize(Scatter(), (patches, grid), cost="analytic", fixed_values=("grid",))
    assert [r for r in caplog.records if "writes traced values into a fixed value in place" in r.getMessage()]
    fresh = torch.randn(8, 8)
    assert_close(module(fresh, grid), Scatter()(fresh, grid))


def test_fixing_an_input_refuses_a_branch_on_a_number_read_out_of_another() -> None:
    """A model traced with fixed values takes each branch on a number as the example does; where
    the number is read out of a tensor not fixed, the graph would hold for the example alone."""
    model, grid = _GridTower(branch=True).eval(), torch.tensor([[1, 2, 3], [1, 1, 2]])
    with pytest.raises(FrontendError, match=r"reads a number out of a tensor that is not a fixed input, and the "
                                            r"model branches on it at test_frontends.py:\d+: "
                                            r"if self.branch and x.sum\(\) > 0"):
        from_torch(model, (torch.randn(8, 8), grid), fixed_values=("grid",), tracer="export")


def test_fixed_values_must_name_tensors_of_the_call() -> None:
    model, args = _GridTower(), (torch.randn(8, 8), torch.tensor([[1, 2, 4]]))
    with pytest.raises(InputMismatchError, match=r"fixed_values names 'sizes', which the example call does not pass "
                                                 r"as a tensor; its tensors are 'patches', 'grid'"):
        from_torch(model, args, fixed_values=("sizes",))
    with pytest.raises(FrontendError, match=r"a sequence of argument names, got the string 'grid'"):
        from_torch(model, args, fixed_values="grid")  # type: ignore[arg-type]
    with pytest.raises(FrontendError, match=r"torch.fx cannot fix _GridTower's tensor arguments grid"):
        from_torch(model, args, fixed_values=("grid",), tracer="fx")


class _PaddedConv(nn.Module):
    """An audio codec's convolution (Mimi's, EnCodec's): its stride and kernel size kept as integer
    buffers, which size the padding that makes every frame whole."""

    def __init__(self, stride: int = 3, kernel: int = 5) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 2, kernel, stride)
        self.stride = nn.Buffer(torch.tensor(stride), persistent=False)
        self.kernel_size = nn.Buffer(torch.tensor(kernel), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = torch.ceil((length - self.kernel_size) / self.stride + 1).to(torch.int64)
        extra = (frames - 1) * self.stride + self.kernel_size - length
        if extra > 0:  # where the last frame is not whole
            x = nn.functional.pad(x, (0, extra))
        return self.conv(nn.functional.pad(x, (self.kernel_size - self.stride, 0)))


def test_a_model_that_sizes_its_tensors_by_numbers_it_keeps_in_buffers_is_traced_with_them_fixed(
        caplog: pytest.LogCaptureFixture) -> None:
    """torch.export sees a model's buffers as inputs of unknown value, so a padding sized by
    integers kept in buffers is a size it cannot know. Those numbers are the model's, fixed as its
    weights are: the model is traced again with them computed, the graph holds no arithmetic on
    them, the module equals eager on fresh inputs, and the model keeps its own buffers. A model
    whose sizes follow its input's values is still refused, as before, with torch.export's reason."""
    model, x = nn.Sequential(_PaddedConv(), _PaddedConv(2, 4)).eval(), torch.randn(1, 2, 16)
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(model, (x,), strict=False)
    with caplog.at_level(logging.INFO, logger="opsched.frontends"):
        graph = from_torch(model, (x,), tracer="export")
    assert [r for r in caplog.records if "traced with its constants computed (4 scalar buffers" in r.getMessage()]
    assert [n.op for n in graph.nodes] == ["pad", "pad", "aten.conv"] * 2  # each padding a constant
    assert [n.attrs["pads"] for n in graph.nodes if n.op == "pad"] == [(0, 1), (2, 0), (0, 1), (2, 0)]
    module = opsched.optimize(model, (x,), cost="analytic")
    fresh = torch.randn(1, 2, 16)
    with torch.no_grad():
        assert_close(module(fresh), model(fresh))
    assert all(type(b) is torch.Tensor for b in model.buffers()) and int(model[0].stride) == 3

    class Counted(_PaddedConv):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x[:, :, : int((x > 0).sum())])  # a size the data sets

    with pytest.raises(FrontendError, match=r"torch.export cannot trace Counted: .*data-dependent.* at "
                                            r"\S*test_frontends\.py:\d+ in forward"):
        from_torch(Counted().eval(), (x,), tracer="export")


class _CausalEncoder(nn.Module):
    """PyTorch's tutorial language model: a TransformerEncoder given the causal mask its forward
    makes (or, ``given``, that it is called with), which torch.nn compares with a causal mask of
    its own to choose its kernel, unless told ``is_causal``."""

    def __init__(self, given: bool = False, is_causal: bool | None = None) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.given, self.is_causal = given, is_causal

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        causal = mask if self.given else nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.encoder(x, mask=causal, is_causal=self.is_causal)


class _CausalTransformer(nn.Module):
    """nn.Transformer as its documentation calls it: the decoder's causal mask made in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.Transformer(16, 4, 1, 1, 32, dropout=0.0, batch_first=True)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        return self.transformer(source, target, tgt_mask=mask)


@pytest.mark.parametrize("model_type", [_CausalEncoder, _CausalTransformer])
def test_torch_nn_transformers_given_a_causal_mask_their_forward_makes_import_whole_and_equal_eager(
        model_type: type[nn.Module]) -> None:
    """torch.nn's Transformer compares the mask it is given with a causal one (``torch.equal``: a
    branch on values, which torch.export refuses; torch.fx then kept the whole encoder as one
    opaque call). The mask is made of constants alone, so it is computed while traced: the graph
    holds every call, each attention made causal with no mask, and equals eager on fresh inputs."""
    torch.manual_seed(0)
    model = model_type().eval()
    inputs = (torch.randn(2, 6, 16),) + ((torch.randn(2, 5, 16),) if model_type is _CausalTransformer else ())
    graph = from_torch(model, inputs, tracer="export")
    assert not [n for n in graph.nodes if n.op == "opaque"]
    calls = [arguments(n) for n in graph.nodes if n.attrs.get("target") == SDPA]
    causal = [c.get("is_causal", False) and c.get("attn_mask") is None for c in calls]
    # each encoder layer's; or the encoder's, the decoder's own and its attention to the encoder
    assert causal == ([True, True] if model_type is _CausalEncoder else [False, True, False])
    module = opsched.optimize(model, inputs, cost="analytic")
    fresh = tuple(torch.randn_like(x) for x in inputs)
    with torch.no_grad():
        assert_close(module(*fresh), model(*fresh))


def test_a_mask_torch_nn_compares_with_a_causal_one_is_named_with_what_settles_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """Given its mask as an input, the encoder's branch is on an input's values: torch.export's
    refusal says what settles it (``is_causal``, or ``fixed_values``); ``tracer="auto"``, whose
    torch.fx keeps the encoder whole, says why; told ``is_causal``, the model imports whole."""
    torch.manual_seed(0)
    x, mask = torch.randn(2, 6, 16), nn.Transformer.generate_square_subsequent_mask(6)
    model = _CausalEncoder(given=True).eval()
    with pytest.raises(FrontendError, match=r"data-dependent.* \[torch.nn's Transformer compares the mask it is "
                                            r"given with a causal mask of its own.*is_causal= \(TransformerEncoder, "
                                            r"its layers\) or tgt_is_causal= .*fixed_values"):
        from_torch(model, (x, mask), tracer="export")
    with caplog.at_level(logging.WARNING, logger="opsched.frontends"):
        graph = from_torch(model, (x, mask))
    assert [n.op for n in graph.nodes] == ["opaque"]
    assert [r for r in caplog.records if "compares the mask it is given" in r.getMessage()
            and "torch.fx traced it instead" in r.getMessage()]
    told = _CausalEncoder(given=True, is_causal=True).eval()
    module = opsched.optimize(told, (x, mask), cost="analytic")
    assert not [n for n in module.graph.nodes if n.op == "opaque"]
    fresh = torch.randn(2, 6, 16)
    with torch.no_grad():
        assert_close(module(fresh, mask), told(fresh, mask))


class _SampledPatches(nn.Module):
    """ViLT's choice of image patches: drawn by ``multinomial`` from weights its forward makes of
    constants alone, and a branch on a number of them (a size torch.export cannot know)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        valid = torch.ones(x.shape[0])
        if int(valid.sum()) > 4:  # a branch on what is computed of constants alone
            return x[torch.multinomial(valid, 4)]
        return x


def test_a_draw_from_constants_made_in_forward_is_traced_not_frozen() -> None:
    """What a model computes of constants alone is computed while traced, but for random draws:
    frozen, ViLT's patches were the same on every call, and the sweep found it 5.6 from eager with
    its check passed. The draw stays in the graph, so each call draws anew."""
    from opsched.check import draws_random

    graph = from_torch(_SampledPatches(), (torch.randn(6, 3),), tracer="export")
    assert [n.attrs["target"] for n in graph.nodes if draws_random(n)] == ["aten::multinomial.default"]


def test_a_weight_registered_by_a_conversion_taken_back_registers_anew() -> None:
    """A converter that registers a weight and then cannot type its call is taken back, weight
    and all; the weight's next use registered it under the name taken back, which the graph no
    longer held (a KeyError deep in the builder: Qwen2.5-VL's tower, its grid fixed)."""
    from opsched.frontends._common import ConversionContext, Unsupported

    ctx, weight = ConversionContext("m"), torch.ones(2, 3)

    def refused() -> str:
        ctx.add("constant", [], params=[ctx.param("w", weight)])
        raise Unsupported

    with pytest.raises(Unsupported):
        ctx.checked(refused, None, "w (aten::mul)")
    made = ctx.add("constant", [], params=[ctx.param("w", weight)])
    assert ctx.type(made).shape == (2, 3)


class _Keypoints(nn.Module):
    """SuperPoint's keypoint selection: the positions of the local maxima above a threshold."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        peaks = scores == F.max_pool2d(scores, 3, stride=1, padding=1)  # an unbatched (C, H, W) pool
        return torch.nonzero(peaks & (scores > 0.5)).float()


def test_a_tensor_whose_size_depends_on_the_data_is_named_with_its_node() -> None:
    """torch.export traces nonzero with a size it leaves unknown; the conversion reached it as a
    bare GuardOnDataDependentSymNode from the depth of the IR. Now named, with the line of the
    model's code that made it."""
    with pytest.raises(FrontendError, match=r"node 'nonzero' \(aten::nonzero.default\) at test_frontends.py:\d+ "
                                            r"\(`return torch.nonzero\(peaks & \(scores > 0.5\)\).float\(\)`\) gives "
                                            r"a tensor whose size \(u\d+\) depends on the values it reads.*"
                                            r"torch.compile\(model, backend='opsched'\)"):
        from_torch(_Keypoints(), torch.rand(1, 16, 16), tracer="export")


class _SmallBoxes(nn.Module):
    """torchvision's ``remove_small_boxes``, with its threshold a tensor read by ``.item()``."""

    def forward(self, boxes: torch.Tensor, min_size: torch.Tensor) -> torch.Tensor:
        widths = boxes[:, 2] - boxes[:, 0]
        return (widths >= min_size.item()) & (widths.size(0) > 1)  # the size: a constant of these shapes


def test_a_number_read_from_a_tensors_values_is_refused_not_frozen_into_the_graph() -> None:
    """torch.fx's recording run gives ``.item()`` the example inputs' number, and the graph held
    it as a constant: at another threshold it was silently wrong. Both tracers refuse it, naming
    the node and the input it reads; a size read by ``.size()`` stays a constant."""
    model, boxes = _SmallBoxes(), torch.rand(32, 4) * 4
    with pytest.raises(FrontendError, match=r"node 'item' \(Tensor.item\) reads the values of 'min_size' into "
                                            r"Python \(0.5 for the example inputs\).*wrong for inputs of other "
                                            r"values.*torch.compile\(model, backend='opsched'\)"):
        from_torch(model, (boxes, torch.tensor(0.5)), tracer="fx")
    with pytest.raises(FrontendError, match=r"depends on tensor data.*; and .* reads the values of 'min_size'"):
        from_torch(model, (boxes, torch.tensor(0.5)))

    class Sized(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(x.size(0), x.shape[1] * x.shape[2]) * x.dim() * x.numel()

    x = torch.randn(2, 3, 4)
    assert_close(run_graph(from_torch(Sized(), x, tracer="fx"), [x]), [Sized()(x)])


class _Checked(nn.Module):
    """XLM's ``assert lengths.max().item() <= slen`` and the ``torch._check`` of RT-DETR's
    deformable attention (its spatial shapes' cells against the sequence): assertions on numbers
    read out of tensors, beside a computation that never reads them. (XLM's is a plain ``assert``,
    which torch.export traces as it does ``torch._check``; pytest rewrites a test module's asserts.)"""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shapes", torch.tensor([[2, 3], [1, 2]]))
        self.proj = nn.Linear(8, 8)

    def forward(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        lengths = (tokens != 0).sum(dim=1)
        torch._check(lengths.max().item() <= tokens.shape[1])
        torch._check(((self.shapes[:, 0] * self.shapes[:, 1]).sum() == x.shape[1]).item())
        return self.proj(x).softmax(-1)


def test_assertions_on_tensor_values_are_left_out_and_said_where(caplog: pytest.LogCaptureFixture) -> None:
    """Such an assertion made torch.export's graph read a number back into Python, and the import
    refused the model (XLM, Flaubert, RT-DETR v2, D-FINE, DEIMv2). The graph leaves the assertion
    out, logs the line that made it, and computes what the model does; a tensor computed from the
    number is still refused (the test above). The assertion on the buffer's numbers is no
    assertion on the data: those numbers are read at import, as the weights are known."""
    model, tokens, x = _Checked().eval(), torch.randint(0, 5, (2, 7)), torch.randn(2, 8, 8)
    with caplog.at_level(logging.INFO, logger="opsched.frontends"):
        graph = from_torch(model, (tokens, x))
    assert not any("item" in n.name or "is_all_true" in n.name for n in graph.nodes), [n.name for n in graph.nodes]
    assert_close(run_graph(graph, [tokens, x]), [model(tokens, x)])
    said = [r.getMessage() for r in caplog.records if "assertions on its tensors' values" in r.getMessage()]
    assert len(said) == 1 and said[0].count("test_frontends.py:") == 1, said
    assert "torch._check(lengths.max().item() <= tokens.shape[1])" in said[0], said

    class Peak(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
            return x * 2, x.max().item()

    with pytest.raises(FrontendError, match=r"Peak returns a number read out of a tensor \(node 'item', "
                                            r"aten::item.default\).*return the tensor"):
        from_torch(Peak(), torch.randn(3, 4), tracer="export")


class _Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Conv2d(3, 8, 1), nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x)).mean((2, 3))


@pytest.mark.parametrize("where", ["stem", "head", "head.0"])
@pytest.mark.parametrize("kind", ["hook", "pre-hook"])
def test_module_hooks_are_imported_by_either_tracer(where: str, kind: str) -> None:
    """A forward hook (or pre-hook) changes what a module's call computes. torch.fx traced a
    leaf module (a convolution) by its type and left its hook out, silently; the module now runs
    whole (opaque), with its hooks. A hook on the model itself, which torch.fx cannot see, is
    refused by torch.fx alone."""
    model, x = _Hooked().eval(), torch.randn(1, 3, 8, 8)
    module = model.get_submodule(where)
    if kind == "hook":
        module.register_forward_hook(lambda m, args, out: out * 2 - 1)
    else:
        module.register_forward_pre_hook(lambda m, args: (args[0].flip(-1),))
    for tracer in ("export", "fx"):
        assert_close(run_graph(from_torch(model, x, tracer=tracer), [x]), [model(x)], f"{where} ({tracer})")
    model = _Hooked().eval()
    model.register_forward_hook(lambda m, args, out: out * 2)
    with pytest.raises(UntraceableModuleError, match=r"not the forward hooks registered on _Hooked itself"):
        from_torch(model, x, tracer="fx")
    assert_close(run_graph(from_torch(model, x), [x]), [model(x)], "the model's own hook, through torch.export")


class _UnbatchedPools(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 3, stride=1, padding=1) + F.avg_pool2d(x, 2).repeat_interleave(2, -1) \
            .repeat_interleave(2, -2)


@pytest.mark.parametrize("tracer", ["export", "fx"])
def test_a_pool_of_an_unbatched_image_stays_generic_and_equals_eager(tracer: str) -> None:
    """torch pools a (C, H, W) image; the pool family's rule wants (N, C, H, W) and refused it
    with a ShapeMismatchError that failed the import (SuperPoint): the call stays generic."""
    model, x = _UnbatchedPools(), torch.randn(3, 8, 8)
    graph = from_torch(model, x, tracer=tracer)  # type: ignore[arg-type]
    assert "pool" not in {n.op for n in graph.nodes}
    assert_close(run_graph(graph, [x]), [model(x)])


class _Functional(nn.Module):
    """Convolutions and a linear layer called as functions of the model's own weights (as custom
    layers, and the graphs Dynamo captures, call them), and one of a weight it computes."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(8, 3, 3, 3)), nn.Parameter(torch.randn(8))
        self.w2 = nn.Parameter(torch.randn(8, 3, 1, 1))
        self.fw, self.fb = nn.Parameter(torch.randn(4, 16)), nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.cat([F.conv2d(x, self.w, self.b, padding=1).relu(), torch.conv2d(x, self.w2)], 1)
        standardised = F.conv2d(x, self.w / self.w.norm(), self.b, padding=1)
        return F.linear(y.mean((2, 3)), self.fw, bias=self.fb), standardised


def test_functional_convolutions_and_linears_of_the_models_weights_convert_under_torch_fx() -> None:
    model, x = _Functional().eval(), torch.randn(2, 3, 8, 8)
    graph = from_torch(model, x, tracer="fx")
    convolutions = [n for n in graph.nodes if n.op == "conv2d"]
    assert [(n.attr("padding"), n.attr("groups"), len(n.params)) for n in convolutions] == \
        [((1, 1), 1, 2), ((0, 0), 1, 1)]
    assert [len(n.params) for n in graph.nodes if n.op == "linear"] == [2]
    assert [n.attr("target") for n in graph.nodes if n.op == "opaque"][-1] == "conv2d"  # a computed weight
    with torch.no_grad():
        assert_close(run_graph(graph, [x]), list(model(x)), "functional calls")


def test_leaf_module_runs_opaquely_and_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    model, x = WithDataDependent().eval(), torch.randn(1, 3, 8, 8)
    with caplog.at_level(logging.WARNING, logger="opsched.frontends"):
        graph = from_torch(model, x, leaf_modules=[DataDependent])
    opaque = [n for n in graph.nodes if n.op == "opaque"]
    assert [n.attr("target") for n in opaque] == ["DataDependent odd"]
    reports = [r for r in caplog.records if "opaque" in r.getMessage()]
    assert len(reports) == 1 and "odd" in reports[0].getMessage()
    assert_close(run_graph(graph, [x]), [model(x)])


class Functional(nn.Module):
    """Functional calls, methods, getitem slicing, chunk, pads, softmax, and an unconverted op."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding="same")
        self.fc = nn.Linear(8 * 4 * 4, 10)
        self.scale = nn.Parameter(torch.randn(1, 8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.conv(x)) * self.scale
        a, b = y.chunk(2, dim=1)
        z = torch.cat([torch.sigmoid(a), b.tanh(), F.gelu(a), F.silu(b)], 1)[:, :8]
        z = F.pad(z, (0, 1, 0, 1))[:, :, 1:, 1:]
        z = F.max_pool2d(z, 2) + F.avg_pool2d(z, 2, ceil_mode=True)
        z = torch.cumsum(z, dim=1)  # no converter: runs opaquely
        flat = z.view(z.size(0), -1)
        return F.softmax(self.fc(flat), dim=-1) + flat.mean(dim=1, keepdim=True)


@pytest.mark.parametrize("tracer", ["export", "fx"])
def test_functional_model_converts_and_matches(tracer: str) -> None:
    model, x = Functional().eval(), torch.randn(2, 4, 8, 8)
    graph = from_torch(model, x, tracer=tracer)  # type: ignore[arg-type]
    ops = {n.op for n in graph.nodes}
    assert {"slice", "pad", "concat", "mul", "softmax", "mean", "flatten"} <= ops
    if tracer == "fx":  # a call without a converter runs as itself
        assert [n.attr("target") for n in graph.nodes if n.op == "opaque"] == ["cumsum"]
    else:  # torch.export sees the ATen call: a generic node, nothing opaque
        assert "opaque" not in ops
        assert [n.attr("target") for n in graph.nodes if n.op.startswith("aten.")] == ["aten::cumsum.default"]
    with torch.no_grad():
        assert_close(run_graph(graph, [x]), [model(x)])


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(32, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(self.lstm(x)[0])[1]


class _KeepsAValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = self.fc(x)  # the model's own state, which torch.export rightly warns about
        return self.last.relu()


def test_torch_export_warns_about_the_models_attributes_not_about_torchs_rnn_internals() -> None:
    """nn.LSTM and nn.GRU refresh their ``_flat_weights`` in forward, and torch.export warns about
    it on every import; no user of the model can act on that. A tensor the model itself keeps
    still gets torch.export's warning."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = from_torch(_Recurrent().eval(), torch.randn(2, 5, 8))
        from_torch(_KeepsAValue().eval(), torch.randn(2, 8))
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "_flat_weights" in m], messages
    assert any("self.last" in m for m in messages), messages
    assert "opaque" not in {n.op for n in graph.nodes}


class _FixesItsBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3))).reshape(3, 2, 3)  # batch 3, as written


def test_an_input_marked_dynamic_for_torch_compile_is_imported_at_its_sizes() -> None:
    """``torch._dynamo.mark_dynamic`` leaves its mark on the tensor object, and torch.export takes
    a marked size for a dynamic dimension, refusing a model that fixes it: the import sees the
    example's sizes (as it promises), so torch.export traces it, and nothing runs opaquely."""
    model, x = _FixesItsBatch().eval(), torch.randn(3, 3, 8, 8)
    torch._dynamo.mark_dynamic(x, 0)
    graph = from_torch(model, x, tracer="export")
    assert [n.op for n in graph.nodes] == ["conv2d", "mean", "linear", "reshape"]
    with torch.no_grad():
        assert_close(run_graph(graph, [x]), [model(x)], "marked input")
    assert getattr(x, "_dynamo_dynamic_indices", None) == {0}  # the caller's mark is left as it was

class _EmptyCache(nn.Module):
    """A decoder step with its key-value cache still empty: ``cat`` skips the 1-D empty tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("past", torch.empty(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([self.past, self.proj(x)], dim=-2)
        return keys.softmax(-1)


class _NoGradRegion(nn.Module):
    """Llama's rotary embedding computes its angles under ``torch.no_grad()``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("freq", torch.arange(1, 5, dtype=torch.float32) / 4)
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            angles = x[..., :1] * self.freq
        return self.proj(x) * angles.cos() + angles.sin()


class _ModeRegions(nn.Module):
    """Regions that set a mode, each traced as a higher-order call: attention scores computed
    with autocast off (as many models guard their softmax), and a region with gradients on."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            scores = (self.q(x).float() @ self.k(x).transpose(-1, -2)).softmax(-1)
        with torch.enable_grad():
            mixed = scores @ x
        return mixed + x.sin()


@pytest.mark.parametrize("tracer", ["export", "fx"])
@pytest.mark.parametrize("model_type", [_EmptyCache, _NoGradRegion, _ModeRegions])
def test_decoder_idioms_import_whole_and_equal_eager(tracer: str, model_type: type[nn.Module]) -> None:
    model, x = model_type().eval(), torch.randn(2, 3, 8 if model_type is _EmptyCache else 4)
    graph = from_torch(model, x, tracer=tracer)  # type: ignore[arg-type]
    assert tracer == "fx" or not [n for n in graph.nodes if n.op == "opaque"]  # fx lacks cos, sin, getitem
    if model_type is _EmptyCache:
        assert [len(n.inputs) for n in graph.nodes if n.op == "concat"] in ([], [1])  # the empty one skipped
    with torch.no_grad():
        assert_close(run_graph(graph, [x]), [model(x)])


class _EmptySlices(nn.Module):
    """Slices of no element (a cache with no entries yet, ``x[:, n:]`` where ``n`` is the
    width), read by a concatenation, a sum, a product and a multiplication."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        empty = x[:, :0]
        return (torch.cat([empty, x.sin()], 1), empty.sum(1) + x[:, 0], empty @ self.w[:0], empty * 2,
                x[:, 4:].cos())


@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize("tracer", ["export", "fx"])
def test_an_empty_slice_is_a_value_of_no_element(tracer: str, backend: str) -> None:
    """It was refused at import ("slice 0:0 of axis 1 of f32[3,4] is empty")."""
    model, x = _EmptySlices(), torch.randn(3, 4)
    module = opsched.optimize(model, x, tracer=tracer, backend=backend, cost="analytic")  # type: ignore[arg-type]
    assert [tuple(t.shape) for t in module(x)] == [(3, 4), (3,), (3, 5), (3, 0), (3, 0)]
    assert_close(list(module(x)), list(model(x)))


class _OverlappingWindows(nn.Module):
    """Longformer's chunking, in two layers: overlapping windows of rows, an ``as_strided`` view
    of a transposed tensor, whose strides are not its shape's."""

    @staticmethod
    def windows(y: torch.Tensor) -> torch.Tensor:
        s = y.stride()
        return y.as_strided((y.shape[0] - 1, y.shape[1], 2, y.shape[2]), (s[0], s[1], s[0], s[2]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.windows((x * 2).transpose(0, 1)).relu()
        return first + self.windows((x + 1).transpose(0, 1)).sin()


class _BeyondASlice(nn.Module):
    """An ``as_strided`` view of a slice that reads its base's memory before the slice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1)[:, 1:].as_strided((2, 4), (1, 1), 0).exp()


@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize("model_type", [_OverlappingWindows, _BeyondASlice])
def test_a_strided_view_reads_what_eager_reads_whatever_layout_its_input_has(backend: str,
                                                                              model_type: type[nn.Module]) -> None:
    """An ONNX Runtime segment makes every value contiguous, and the export of ``as_strided``
    flattened its input as if it were: the windows came out 5.1 off. The view is a gather of
    positions fixed at import, from the layout traced."""
    model = model_type()
    layers = 2 if model_type is _OverlappingWindows else 1
    x = torch.randn(3, 6, 5) if model_type is _OverlappingWindows else torch.randn(3, 4)
    graph = from_torch(model, x)
    takes = [n for n in graph.nodes if n.attrs.get("target") == "aten::take.default"]
    assert len(takes) == layers and len({n.params for n in takes}) == 1  # one parameter for views alike
    assert "aten::as_strided.default" not in {n.attrs.get("target") for n in graph.nodes}
    module = opsched.optimize(model, x, backend=backend, scheduler="sequential", cost="analytic", verify=False)
    assert_close(module(x), model(x))


class _AutocastRegion(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.proj(x)
        return y.float().relu() + x


def test_a_region_autocast_turns_on_runs_whole_on_torch_and_equal_eager() -> None:
    """Its calls compute in another precision than they are recorded in, and which depends on the
    device (autocast("cpu") casts CPU tensors only): it stays one call of the region, replayed on
    the device the graph runs on, as the model would run there."""
    model, x = _AutocastRegion().eval(), torch.randn(2, 3, 4)
    graph = from_torch(model, x)
    assert [n.attrs["target"] for n in graph.nodes if n.op == "opaque"] == ["wrap_with_autocast"]
    assert_close(run_graph(graph, [x]), [model(x)])


class _ComplexRotary(nn.Module):
    """Rotary embeddings as Meta's reference LLaMA code writes them: query and key as complex
    numbers, turned by a complex buffer, and back to real."""

    def __init__(self, dim: int = 16, tokens: int = 8) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(dim, dim), nn.Linear(dim, dim)
        angles = torch.outer(torch.arange(tokens).float(), 1 / 10_000 ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("turn", torch.polar(torch.ones_like(angles), angles))

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * self.turn).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.rotate(self.q(x)) @ self.rotate(self.k(x)).transpose(-1, -2), -1) @ x


class _SpectralFilter(nn.Module):
    """Complex in, complex out: a learned filter applied in the frequency domain."""

    def __init__(self, n: int = 32) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.randn(n, dtype=torch.complex64))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.fft.ifft(torch.fft.fft(z) * self.gain) + z.conj()


@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize(("model_type", "in_sessions"), [
    (_ComplexRotary, {"view_as_complex", "view_as_real", "view_as_complex_1", "view_as_real_1"}),
    (_SpectralFilter, {"fft_fft", "fft_ifft", "_conj"}),
])
def test_complex_values_are_held_and_cross_sessions_as_pairs_of_parts(backend: str, model_type: type[nn.Module],
                                                                      in_sessions: set[str]) -> None:
    """ONNX Runtime's kernels take no complex tensors: a session holds a complex value as its
    pairs of parts, in the ops that have a form on them (small Fourier transforms, the views
    between complex and real, the conjugate), and takes and makes it so at its edges (the
    spectral filter's input and output are complex); complex products, sums and constants run
    on torch between sessions."""
    from opsched.backends.ort_export import exportable

    torch.manual_seed(0)
    model = model_type().eval()
    x = torch.randn(2, 8, 16) if model_type is _ComplexRotary else torch.randn(3, 32, dtype=torch.complex64)
    module = opsched.optimize(model, x, cost="analytic", backend=backend, scheduler="sequential")
    graph = module.graph
    assert "complex64" in graph.dtypes and not [n for n in graph.nodes if n.op == "opaque"]
    complex_nodes = [n for n in graph.nodes if "complex" in n.out.dtype or
                     any("complex" in graph.types[v].dtype for v in n.inputs)]
    assert {n.name for n in complex_nodes if exportable(graph, n)} == in_sessions
    with torch.no_grad():
        assert_close([module(x)], [model(x)])


@pytest.mark.parametrize(("hidden", "tokens", "in_session"), [(64, 16, True), (384, 64, False)])
def test_a_fourier_transform_joins_the_session_where_a_cut_would_cost_more(hidden: int, tokens: int,
                                                                           in_session: bool) -> None:
    """FNet's token mixing (a 2-D FFT, the real part kept) as ONNX Runtime's DFT on pairs inside
    one session where it is small, and as torch's FFT between sessions where ORT's kernel would
    cost more than the cuts (opsched.ir.ops.fourier.pays_outside_ort)."""
    from opsched.backends.ort_export import exportable

    class Mixing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(x + torch.fft.fftn(x, dim=(1, 2)).real)

    torch.manual_seed(0)
    model, x = Mixing().eval(), torch.randn(1, tokens, hidden)
    module = opsched.optimize(model, x, cost="analytic", backend="ort", scheduler="sequential")
    (transform,) = [n for n in module.graph.nodes if n.attrs.get("target") == "aten::fft_fftn.default"]
    assert exportable(module.graph, transform) == in_session
    assert ("fft_fftn (aten.data)" in module.executor.describe()) != in_session  # named where it runs on torch
    assert len([s for s in module.executor.program.sessions if s is not None]) == 1
    with torch.no_grad():
        assert_close([module(x)], [model(x)])


class _Transform(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(self.fn(x)) * 2 if self.fn(x).is_complex() else self.fn(x) * 2


@pytest.mark.parametrize(("complex_input", "fn"), [
    (False, lambda x: torch.fft.fft(x)),
    (False, lambda x: torch.fft.fft(x, n=20, dim=1, norm="ortho")),  # padded along the other axis
    (False, lambda x: torch.fft.rfft(x, n=10, norm="forward")),  # trimmed, one-sided
    (True, lambda x: torch.fft.ifft(x, norm="ortho")),
    (True, lambda x: torch.fft.ifft(x, norm="forward")),
    (True, lambda x: torch.fft.ifftn(x)),
    (False, lambda x: torch.fft.fft2(x, norm="forward")),
    (True, lambda x: torch.fft.fftn(x, s=(6,), dim=(0,)).imag),
    (True, lambda x: torch.fft.fft(x).conj_physical()),
], ids=["fft", "fft-n-dim-ortho", "rfft-n-forward", "ifft-ortho", "ifft-forward", "ifftn", "fft2-forward",
        "fftn-s-imag", "conj-physical"])
def test_small_fourier_transforms_run_in_the_session_as_onnx_dfts_equal_to_eager(complex_input: bool,
                                                                                  fn: Any) -> None:
    """Each ``torch.fft`` form a segment holds (lengths, axes, norms, one-sided, parts,
    conjugate), as ONNX's DFT on pairs of parts, one session, equal to eager."""
    x = torch.randn(4, 12, dtype=torch.complex64 if complex_input else torch.float32)
    model = _Transform(fn).eval()
    module = opsched.optimize(model, x, cost="analytic", backend="ort", scheduler="sequential")
    assert any(n.attrs.get("target", "").startswith("aten::fft_") for n in module.graph.nodes)
    assert "with torch between them" not in module.executor.describe()  # nothing left out of the session
    with torch.no_grad():
        assert_close([module(x)], [model(x)])


class _ReturnsACache(nn.Module):
    class KeyValueCache:
        def __init__(self, keys: torch.Tensor) -> None:
            self.keys = keys

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, _ReturnsACache.KeyValueCache]:
        return x.relu(), self.KeyValueCache(x * 2)


def test_a_model_returning_a_cache_object_is_told_how_to_return_tensors() -> None:
    with pytest.raises(FrontendError, match=r"returns a KeyValueCache, whose tensors torch.export cannot see: "
                                            r"model.config.use_cache = False"):
        from_torch(_ReturnsACache(), torch.randn(2, 3), tracer="export")


def test_canonical_graph_folds_and_fuses() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(), nn.Flatten()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 8, 8)
    graph = from_torch(model, x)
    assert [(n.op, n.attr("act")) for n in graph.nodes] == [("conv2d", "relu"), ("flatten", None)]
    for tracer in TRACERS:
        raw = from_torch(model, x, canonical=False, tracer=tracer)
        assert [n.op for n in raw.nodes] == ["conv2d", "batch_norm", "relu", "identity", "flatten"], tracer
    with torch.no_grad():
        assert_close(run_graph(graph, [x]), [model(x)])



class _Promoting(nn.Module):
    """Arithmetic and concatenation on operands torch promotes (Mask2Former multiplies by masks)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = x < 0
        return (mask * y, mask + (y > 0), mask * (y > 0), x.int() * y, x.half() * y.sum(),
                torch.cat([x.int(), y], 1))


@pytest.mark.parametrize("tracer", TRACERS)
def test_operands_torch_promotes_are_typed_and_run_as_torch_computes_them(tracer: str) -> None:
    """A bool mask times float32 values is float32, a sum or product of masks their or and and,
    a float16 times a float32 scalar float16: typed so, and run so in one ONNX Runtime session."""
    from opsched.backends import get_backend
    from opsched.costing import host_cpu_model
    from opsched.execution import RunOptions
    from opsched.runtime import lower
    from opsched.schedulers import schedule

    model, inputs = _Promoting(), (torch.randn(2, 8), torch.randn(2, 8))
    g = from_torch(model, inputs, tracer=tracer)
    expected = model(*inputs)
    assert [g.node(v).op for v in g.returns] == ["mul", "add", "mul", "mul", "mul", "concat"]
    assert [g.types[v].dtype for v in g.returns] == [str(e.dtype).removeprefix("torch.") for e in expected]
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor(list(inputs))
    executor.close()
    if tracer != "fx":  # whose comparisons and casts are opaque calls
        assert executor.sessions == 1, executor.describe()  # type: ignore[attr-defined]
    assert [m.dtype for m in made] == [e.dtype for e in expected]
    assert_close(made, list(expected))


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_call_its_family_types_otherwise_than_torch_stays_generic(tracer: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The safety net under every family's shape rule: where one disagrees with the type torch
    gave the call, the call is kept as torch ran it (a generic ATen node, or an opaque call)."""
    from opsched.ir.ops import elementwise
    from opsched.ir.types import TensorType

    def first_dtype(op: str, types: list[TensorType]) -> TensorType:  # the rule before promotion
        return TensorType(max((t.shape for t in types), key=len), types[0].dtype)

    monkeypatch.setattr(elementwise, "broadcast", first_dtype)
    model, inputs = _Promoting(), (torch.randn(2, 8), torch.randn(2, 8))
    g = from_torch(model, inputs, tracer=tracer)
    ops = [g.node(v).op for v in g.returns]
    assert ops[1:3] == ["add", "mul"] and "mul" not in (ops[0], ops[3]), ops  # bools stay bools
    assert [g.types[v].dtype for v in g.returns] == [str(e.dtype).removeprefix("torch.") for e in model(*inputs)]
    assert_close(run_graph(g, list(inputs)), list(model(*inputs)))

class UnusedBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.unused(x).sigmoid()  # computed and thrown away
        return self.used(x)


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_a_branch_no_output_reads_is_removed(backend: str) -> None:
    """An ONNX Runtime segment of dead nodes had no output to ask for, which ORT refuses."""
    import opsched

    model, x = UnusedBranch().eval(), torch.randn(1, 3, 6, 6)
    for tracer in TRACERS:
        assert [n.op for n in from_torch(model, x, canonical=False, tracer=tracer).nodes] == ["conv2d", "sigmoid",
                                                                                              "conv2d"], tracer
        assert [n.name for n in from_torch(model, x, tracer=tracer).nodes] == ["used"], tracer
    for canonical in (True, False):  # dead nodes kept: greedy gives them a lane, an ORT segment with no output
        module = opsched.optimize_graph(from_torch(model, x, canonical=canonical), backend=backend,
                                        scheduler="greedy", max_lanes=2, cost="analytic", check=False)
        with torch.no_grad():
            assert_close([module(x)], [model(x)])


def test_wrong_number_of_example_inputs() -> None:
    with pytest.raises(FrontendError, match=r"cannot be called as forward\(<tensor 1 float32>, <tensor 1 float32>\) "
                                            r"with the example inputs: too many positional arguments"):
        from_torch(nn.ReLU(), (torch.randn(1), torch.randn(1)))


def test_wrong_input_shape_at_run_time() -> None:
    graph = from_torch(nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8))
    with pytest.raises(InputMismatchError, match=r"expected f32\[1,3,8,8\].*got shape \(2, 3, 8, 8\)"):
        run_graph(graph, [torch.randn(2, 3, 8, 8)])
    with pytest.raises(InputMismatchError, match=re.escape(
            "expected f32[1,3,8,8] (float32), got float64 values of that shape; the graph (and any schedule for it) "
            "runs in the types it was made for: pass the input as tensor.to(torch.float32), or optimize again with "
            "dtype='float64' for a graph in that precision")):
        run_graph(graph, [torch.randn(1, 3, 8, 8, dtype=torch.float64)])
    ids = from_torch(nn.Embedding(10, 4), torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(InputMismatchError, match=r"got int32 values of that shape; .* tensor.to\(torch.int64\)$"):
        run_graph(ids, [torch.zeros(1, 3, dtype=torch.int32)])
    with pytest.raises(InputMismatchError, match="takes 1 inputs"):
        run_graph(graph, [])


# --- ONNX bad inputs ----------------------------------------------------------------------
def test_missing_empty_garbage_and_truncated_onnx_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MalformedModelError, match="cannot read ONNX file"):
        from_onnx(tmp_path / "missing.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(MalformedModelError, match="empty"):
        from_onnx(tmp_path / "empty.onnx")
    (tmp_path / "garbage.onnx").write_bytes(b"\xff\xfe this is not a protobuf at all \x00\x01")
    with pytest.raises(MalformedModelError, match="garbage.onnx"):
        from_onnx(tmp_path / "garbage.onnx")
    good = tmp_path / "good.onnx"
    torch.onnx.export(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), (torch.randn(1, 3, 8, 8),), str(good),
                      dynamo=False)
    data = good.read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(MalformedModelError, match="truncated.onnx"):
        from_onnx(tmp_path / "truncated.onnx")


def test_weights_stored_beside_the_file_are_read_from_its_directory(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """torch.onnx.export(model, args, "model.onnx") writes the weights to model.onnx.data by default;
    the file imports from any working directory. Without its data: one error saying where it is."""
    import onnxruntime

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, dynamo=False, input_names=["x"])
    path = tmp_path / "model" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(onnx.load_from_string(buffer.getvalue()), str(path), save_as_external_data=True,
                    location="model.onnx.data", size_threshold=0)
    assert (path.parent / "model.onnx.data").stat().st_size > 0
    want = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    monkeypatch.chdir(tmp_path)
    module = opsched.optimize_graph(from_onnx(path), backend="ort", scheduler="sequential", cost="analytic",
                                    check=False)
    np.testing.assert_allclose(module(x).numpy(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(MalformedModelError, match="stored outside the model, in 'model.onnx.data'.*file's path"):
        from_onnx(onnx.load(str(path), load_external_data=False))
    (path.parent / "model.onnx.data").unlink()
    with pytest.raises(MalformedModelError, match="model.onnx: its weights are stored in files beside it"):
        from_onnx(path)


def _model(nodes: list[onnx.NodeProto], opset: int = 17, dims: list[object] | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims or [1, 4])
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_ops_without_a_converter_run_through_onnx_runtime_equal_to_its_own_session() -> None:
    import onnxruntime

    model = _model([
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Erf", ["a"], ["b"], name="erf1"),
        helper.make_node("Div", ["b", "x"], ["c"]),  # both operands tensors
        helper.make_node("Neg", ["c"], ["y"], name="neg"),
    ])
    graph = from_onnx(model)
    assert [n.op for n in graph.nodes] == ["relu", "onnx.activation", "onnx.elementwise", "onnx.elementwise"]
    x = torch.randn(1, 4)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()})[0]
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(x).numpy(), want, rtol=1e-6, atol=1e-6)


def test_nodes_after_a_size_onnx_shape_inference_gets_wrong_are_typed_as_onnx_runtime_runs_them() -> None:
    """ONNX's shape inference sizes a max pool with ceil_mode and padding by a rule PyTorch and
    ONNX Runtime do not follow (11 for 10 here). The pool's converter sizes it right, so a node
    after it typed by shape inference read a value of another size: the import failed (fuzz seed
    1004). Such a node is now typed by running it."""
    import onnxruntime

    graph = helper.make_graph([
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
        helper.make_node("Softplus", ["p"], ["s"]),
        helper.make_node("Tanh", ["s"], ["t"]),
        helper.make_node("Mul", ["p", "t"], ["y"]),
    ], "mish_after_pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 19, 19])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    pooled = next(v for v in onnx.shape_inference.infer_shapes(model).graph.value_info if v.name == "p")
    assert [d.dim_value for d in pooled.type.tensor_type.shape.dim] == [1, 3, 11, 11]
    imported = from_onnx(model)
    assert imported.types[imported.outputs[0]].shape == (1, 3, 10, 10)
    x = torch.randn(1, 3, 19, 19)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()})[0]
    module = opsched.optimize_graph(imported, scheduler="sequential", cost="analytic", check=False)
    np.testing.assert_allclose(module(x).numpy(), want, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_pool_window_larger_than_its_input_runs_as_onnx_runtime_clips_it(op: str) -> None:
    """An exporter that sizes an adaptive pool from a wrong shape inference writes a window
    larger than the input it gets (13 wide on 12 here; fuzz seed 1004 of the mask-making fuzzer).
    ONNX Runtime clips it and makes one output; PyTorch's pool refuses it, so the node runs as
    ONNX Runtime does, where the import used to fail."""
    import onnxruntime

    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], kernel_shape=[11, 13], strides=[11, 13])],
                              "clipped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 10, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = torch.randn(1, 2, 10, 12)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()})[0]
    assert want.shape == (1, 2, 1, 1)
    imported = from_onnx(model)
    assert imported.types[imported.outputs[0]].shape == (1, 2, 1, 1)
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(imported, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(x).numpy(), want, rtol=1e-6, atol=1e-6)

def test_nodes_onnx_runtime_cannot_run_are_listed_in_one_error() -> None:
    model = _model([
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Frobnicate", ["a"], ["b"], name="frob1", domain="com.example"),
        helper.make_node("Frobnicate", ["b"], ["c"], name="frob2", domain="com.example"),  # after a failure: skipped
        helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64),
        helper.make_node("Erf", ["i"], ["d"], name="erf"),  # ONNX Runtime has no integer Erf
        helper.make_node("Cast", ["d"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["c", "f"], ["y"]),
    ])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError) as info:
        from_onnx(model)
    assert info.value.ops == ["Erf", "com.example::Frobnicate"]
    message = str(info.value)
    assert "2 node(s) cannot be imported" in message
    assert "node 'frob1' (com.example::Frobnicate): ONNX Runtime cannot run it" in message
    assert "node 'erf' (Erf): ONNX Runtime cannot run it" in message and "frob2" not in message


@pytest.mark.parametrize("listed_as_input", [False, True])
def test_large_weights_stay_out_of_onnx_passes_and_import_exactly(listed_as_input: bool, monkeypatch) -> None:
    """ONNX's checker, version converter and shape inference serialise the model they are given:
    they see it without its large initializers (here a 64 KiB weight), which are read once, by
    name, as constants; an old opset is still upgraded and the model runs equal to ONNX Runtime."""
    import onnxruntime
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((128, 128)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "B")  # 512 bytes: stays
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 128])
    inputs = [x, helper.make_tensor_value_info("W", TensorProto.FLOAT, [128, 128])] if listed_as_input else [x]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "g", inputs, [y], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    seen: list[int] = []

    def spy(real):  # type: ignore[no-untyped-def]
        def call(m, *a, **k):  # type: ignore[no-untyped-def]
            seen.append(m.ByteSize())
            return real(m, *a, **k)
        return call
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy(onnx.shape_inference.infer_shapes))
    monkeypatch.setattr(onnx.version_converter, "convert_version", spy(onnx.version_converter.convert_version))
    imported = from_onnx(model)
    assert len(seen) == 2 and max(seen) < 4096 < w.ByteSize()
    assert [i.name for i in imported.inputs] == ["x"]
    feed = rng.standard_normal((2, 128)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed})[0]
    for backend in ("torch", "ort"):
        run = opsched.optimize_graph(imported, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(run(torch.from_numpy(feed)).numpy(), want, rtol=1e-5, atol=1e-5)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]  # truncated
    with pytest.raises(MalformedModelError, match=r"initializer 'W' \(shape \[128, 128\]\): its data cannot be read"):
        from_onnx(model)


class _BatchStatistics(nn.Module):
    """Normalised by each batch's own statistics, in eval mode too: a batch norm that keeps no
    running ones, and a weight-standardised convolution (BiT, NFNet) whose weight's
    standardisation exports as a BatchNormalization in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.conv.weight
        standard = F.batch_norm(w.reshape(1, 8, -1), None, None, training=True, eps=1e-6).reshape_as(w)
        return torch.relu(self.norm(F.conv2d(x, standard, self.conv.bias, padding=1)))


@pytest.mark.parametrize("opset", [9, 13, 17])
def test_a_batch_norm_in_training_mode_normalises_by_the_batch_as_onnx_runtime_does(opset: int) -> None:
    """Before opset 14 a BatchNormalization with more outputs than ``Y`` runs in training mode:
    ``onnx.version_converter`` refuses its ``saved_*`` outputs and, once they are dropped, leaves
    ``training_mode`` at 0 (the running statistics); opsched keeps the batch's."""
    import onnxruntime

    torch.manual_seed(0)
    model, x = _BatchStatistics().eval(), torch.randn(2, 3, 8, 8)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset)
    proto = onnx.load_model_from_string(buf.getvalue())
    assert [len(n.output) for n in proto.graph.node if n.op_type == "BatchNormalization"] == \
        ([5, 5] if opset < 14 else [3, 3])
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(want, model(x).numpy(), rtol=0, atol=1e-5)
    graph = from_onnx(proto)
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(x).numpy(), want, rtol=0, atol=1e-5, err_msg=backend)


def test_a_training_mode_batch_norm_with_constant_running_statistics_still_uses_the_batchs() -> None:
    import onnxruntime
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    stats = [numpy_helper.from_array(v.astype(np.float32), name) for v, name in
             ((rng.random(4) + 0.5, "scale"), (rng.standard_normal(4), "bias"), (np.zeros(4), "mean"),
              (np.ones(4), "var"))]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"],
                            training_mode=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 3])], initializer=stats)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    x = (3 + 2 * rng.standard_normal((2, 4, 3, 3))).astype(np.float32)  # far from the running statistics
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    imported = from_onnx(model)
    assert [n.op for n in imported.nodes] == ["onnx.norm"]  # ONNX Runtime's node, not opsched's batch_norm
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(imported, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=0, atol=1e-5, err_msg=backend)


def test_invalid_onnx_graph_is_malformed() -> None:
    model = _model([helper.make_node("Relu", ["nothing_defines_this"], ["y"])])
    with pytest.raises(MalformedModelError, match="not a valid ONNX model: .*nothing_defines_this.*; ONNX Runtime "
                                                  "refuses it too: .*nothing_defines_this"):
        from_onnx(model)


@pytest.mark.parametrize("defect", ["output without a shape", "nodes out of order"])
def test_a_file_the_checker_refuses_but_onnx_runtime_runs_imports_as_ort_reads_it(
        defect: str, caplog: pytest.LogCaptureFixture) -> None:
    """Both defects are common in files from the wild; ORT runs them, so opsched must too (with
    a warning), equal to ORT, leaving the caller's ModelProto as it was."""
    import onnxruntime

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    if defect == "nodes out of order":
        nodes = nodes[::-1]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None if defect == "output without a shape" else [2, 4])
    model = helper.make_model(helper.make_graph(nodes, "wild", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    feed = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    want = onnxruntime.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, {"x": feed})[0]
    with caplog.at_level(logging.WARNING, logger="opsched"):
        graph = from_onnx(model)
    assert "ONNX Runtime loads it" in caplog.text
    assert model.SerializeToString() == before
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(feed)).numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("op", "opset", "mode", "scale"), [
    ("Upsample", 7, "nearest", 1.25), ("Upsample", 9, "linear", 1.5), ("Resize", 10, "nearest", 0.75),
    ("Resize", 10, "linear", 1.5),
])
def test_an_opset_10_resize_means_what_it_meant_after_the_upgrade(op: str, opset: int, mode: str,
                                                                  scale: float) -> None:
    """onnx.version_converter's 10 -> 11 adapter leaves Resize at 11's half-pixel defaults
    (onnx/onnx#8480); the import restores what ONNX Runtime computes at 10: ``x / scale``,
    nearest rounded down where the image grows and up where it shrinks. Every case here
    differed from ORT before."""
    import onnxruntime
    from onnx import numpy_helper

    scales, side = [1.0, 1.0, scale, scale], int(7 * scale)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 7, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, side, side])
    if opset == 7:
        nodes, inits = [helper.make_node(op, ["x"], ["y"], scales=scales, mode=mode)], []
    else:
        nodes = [helper.make_node(op, ["x", "scales"], ["y"], mode=mode)]
        inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    model = helper.make_model(helper.make_graph(nodes, "upsample", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 4
    feed = np.random.default_rng(0).standard_normal((1, 2, 7, 7)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed})[0]
    graph = from_onnx(model)
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(feed)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_an_ir_3_file_is_upgraded_though_the_upgrade_adds_initializers_it_does_not_list_as_inputs() -> None:
    """Before IR version 4 every initializer is a graph input too, as PyTorch writes a file at opset
    7 or 8. Upgrading its Pad makes the pads an initializer the converter does not list, and at
    IR 3 the converter refused its own result ("in initializer but not in graph input"): such a
    file of Inception V3 or NASNet could not be imported."""
    import onnxruntime
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 6])
    nodes = [helper.make_node("Pad", ["x"], ["p"], pads=[0, 0, 2, 0, 0, 0, 0, 0], value=0.5),
             helper.make_node("Conv", ["p", "w"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "padded", [x, w], [y], [weight]),
                              opset_imports=[helper.make_opsetid("", 7)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    feed = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed})[0]
    graph = from_onnx(model)
    assert [n.op for n in graph.nodes] == ["pad", "conv2d"] and [i.name for i in graph.inputs] == ["x"]
    assert model.ir_version == 3  # the caller's model is left as it was
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(feed)).numpy(), want, rtol=1e-5, atol=1e-5)


def test_dynamic_onnx_dimension_needs_input_shapes() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], dims=["batch", 4])
    with pytest.raises(FrontendError, match=r"dynamic dimension\(s\) 'batch' \(dimensions \[batch, 4\]\).*input_sh"):
        from_onnx(model)
    graph = from_onnx(model, input_shapes={"x": (3, 4)})
    assert graph.inputs[0].type.shape == (3, 4)
    for wrong in ((3, 5), (3, 4, 1)):  # a fixed dimension changed, or another rank
        with pytest.raises(FrontendError, match=rf"gives input 'x' the shape \({wrong[0]}, .*declares dimensions"):
            from_onnx(model, input_shapes={"x": wrong})
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(FrontendError, match="input 'x' declares no shape"):
        from_onnx(model)
    assert from_onnx(model, input_shapes={"x": (2, 4)}).inputs[0].type.shape == (2, 4)


def test_opset_versions_choose_their_converter() -> None:
    # Clip changed from attributes (opset 6) to inputs (opset 11): both forms read as ReLU6.
    old = _model([helper.make_node("Clip", ["x"], ["y"], min=0.0, max=6.0)], opset=9)
    new = _model([
        helper.make_node("Constant", [], ["lo"], value=helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0])),
        helper.make_node("Constant", [], ["hi"], value=helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])),
        helper.make_node("Clip", ["x", "lo", "hi"], ["y"]),
    ], opset=13)
    for m in (old, new):
        graph = from_onnx(m)
        assert [n.op for n in graph.nodes] == ["relu6"]
        x = torch.randn(1, 4) * 10
        assert_close(run_graph(graph, [x]), [F.relu6(x)])


class _Resizes(nn.Module):
    def __init__(self, shrink: bool) -> None:
        super().__init__()
        self.shrink = shrink

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wide = F.interpolate(x, size=(10, 10), mode="bilinear") + F.interpolate(x, scale_factor=1.5, mode="nearest")
        return wide, F.interpolate(x, size=(5, 5) if self.shrink else (12, 12), mode="nearest")


@pytest.mark.parametrize("opset", [9, 10, 11])
def test_torch_onnx_exports_of_interpolate_at_old_opsets_run_equal_to_onnx_runtime(opset: int) -> None:
    """As the TorchScript exporter writes them: Upsample (9; ORT cannot shrink with it), Resize
    whose output the version converter renames (9, 10), Resize with sizes beside an empty scales
    tensor (11), which opset 13 forbids."""
    import io

    import onnxruntime

    model, x = _Resizes(shrink=opset > 9), torch.randn(1, 2, 7, 7)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=opset)
    want = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()})
    graph = from_onnx(onnx.load_from_string(buffer.getvalue()))
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        for got, expected in zip(module(x), want, strict=True):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_newer_files_generic_nodes_join_one_ort_session_equal_to_its_own() -> None:
    """An opset-20 file as torch.onnx writes them (the converter cannot bring Gelu, new in 20,
    down): its MatMul, Transpose, IsNaN (version 20, newer types only), Where, a Gather of a 0-d
    index, a Resize that sets version 19's antialias to its default and a ReduceL2 with version
    18's axes input all run inside one ONNX Runtime session."""
    import onnxruntime

    from opsched.backends.lanes import LaneExecutor

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1])
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.random.default_rng(0).random(16).tolist()),
             helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
             helper.make_tensor("first", TensorProto.INT64, [], [0]),  # 0-d: Gather drops the axis
             helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
             helper.make_tensor("scales", TensorProto.FLOAT, [2], [1.0, 2.0])]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1]),
             helper.make_node("IsNaN", ["t"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "t"], ["clean"]),
             helper.make_node("Gather", ["clean", "first"], ["g"], axis=0),
             helper.make_node("Gelu", ["g"], ["act"]),
             helper.make_node("Resize", ["act", "", "scales"], ["wide"], mode="linear", antialias=0),
             helper.make_node("ReduceMean", ["wide", "axes"], ["mean"]),
             helper.make_node("ReduceL2", ["act", "axes"], ["norm"], noop_with_empty_axes=0),
             helper.make_node("Add", ["mean", "norm"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "newer", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 20)])
    graph = from_onnx(model)
    assert {n.attrs["opset"] for n in graph.nodes if n.op.startswith("onnx.")} == {20}
    inputs = torch.randn(2, 3, 4)
    inputs[0, 1, 2] = float("nan")
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": inputs.numpy()})[0]
    module = opsched.optimize_graph(graph, backend="ort", scheduler="sequential", cost="analytic", check=False)
    np.testing.assert_allclose(module(inputs).numpy(), want, rtol=1e-6, atol=1e-6)
    executor = module.executor
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()


def _newer_reference(model: onnx.ModelProto) -> Any:
    """ONNX Runtime's session of a file newer than the segments' opset, the test skipped where
    this ONNX Runtime does not run that opset yet (opsched needs only opset 20 of it)."""
    import onnxruntime

    try:
        return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        pytest.skip(f"ONNX Runtime {onnxruntime.__version__} does not run opset {opset}: {e}")


def _control_flow(case: str, opset: int) -> onnx.ModelProto:
    """Models whose If and Loop sub-graphs read the model's input ``x`` from outside."""
    from onnx import numpy_helper

    def info(name: str, elem: int = TensorProto.FLOAT, shape: list[int] | None = None) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, [2, 4] if shape is None else shape)

    def branches(tag: str) -> dict[str, onnx.GraphProto]:
        return {"then_branch": helper.make_graph([helper.make_node("Relu", ["x"], [f"{tag}t"])], "then", [],
                                                 [info(f"{tag}t")]),
                "else_branch": helper.make_graph([helper.make_node("Neg", ["x"], [f"{tag}e"])], "else", [],
                                                 [info(f"{tag}e")])}

    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(3, np.int64), "n"), numpy_helper.from_array(np.array(True), "yes")]
    if case == "if on a computed condition":
        reduce, greater = helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node(
            "Greater", ["s", "zero"], ["c"])
        nodes = [reduce, greater, helper.make_node("If", ["c"], ["r"], **branches("a"))]
    elif case == "if on a constant condition":
        nodes = [helper.make_node("If", ["yes"], ["r"], **branches("a"))]
    else:  # a loop whose body halves its carried value, adds x, and branches on x: x read two levels deep
        sign = helper.make_node("ReduceMax", ["acc_in"], ["top"], keepdims=0)
        body = helper.make_graph(
            [helper.make_node("Mul", ["acc_in", "half"], ["m"]), sign,
             helper.make_node("Greater", ["top", "zero"], ["c"]), helper.make_node("If", ["c"], ["b"], **branches("b")),
             helper.make_node("Add", ["m", "b"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
            "body",
            [info("i", TensorProto.INT64, []), info("cond_in", TensorProto.BOOL, []), info("acc_in")],
            [info("cond_out", TensorProto.BOOL, []), info("acc_out")],
            [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
        nodes = [helper.make_node("Loop", ["n", "yes", "x"], ["r"], body=body)]
    nodes.append(helper.make_node("Add", ["r", "x"], ["y" if opset <= OPSET else "sum"]))
    if opset > OPSET:  # CumProd is new in 26, and not a function of older ops: the file stays at 26
        inits.append(numpy_helper.from_array(np.array(1, np.int64), "axis"))
        nodes.append(helper.make_node("CumProd", ["sum", "axis"], ["y"]))
    return helper.make_model(helper.make_graph(nodes, "control", [info("x")], [info("y")], inits),
                             opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [17, OPSET, 26])
@pytest.mark.parametrize("case", ["if on a computed condition", "if on a constant condition", "a nested loop"])
def test_if_and_loop_reading_outer_values_run_equal_to_onnx_runtime(case: str, opset: int) -> None:
    """Their sub-graphs read ``x`` by name from outside: a session that runs them must define it,
    renamed to its own value names. In a file at or upgraded to the segments' opset they join the
    segment; in a file the converter cannot bring down their sub-graphs keep the file's opset, in a
    session of their own. An ``If`` on a constant condition is the branch it takes."""

    from opsched.backends.lanes import LaneExecutor

    model = _control_flow(case, opset)
    reference = _newer_reference(model)
    graph = from_onnx(model)
    for sign in (1.0, -1.0):  # both branches
        feed = sign * np.abs(np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
        want = reference.run(None, {"x": feed})[0]
        for backend in ("torch", "ort"):
            module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic",
                                            check=False)
            np.testing.assert_allclose(module(torch.from_numpy(feed)).numpy(), want, rtol=1e-6, atol=1e-6)
    executor = module.executor
    assert isinstance(executor, LaneExecutor)
    if case == "if on a constant condition":  # the branch it takes, in its place
        assert not any(n.attrs.get("op_type") == "If" for n in graph.nodes) and "r (onnx" not in executor.describe()
    else:
        assert executor.sessions == 1 if opset <= OPSET else "r (onnx.data)" in executor.describe(), \
            executor.describe()


def test_an_if_onnx_runtime_cannot_infer_at_fixed_sizes_runs_alone_with_its_sizes_open(
        mode_switch_onnx: str) -> None:
    """Silero VAD's case: ONNX Runtime's shape inference fails in a branch at the sizes given
    (ONNX Runtime refuses the file itself once they are fixed), though that branch never runs at
    them. The ``If`` is typed by running the branch that does (the condition is computed, so both
    are tried) and runs in a session of its own that leaves its inputs' sizes open, as the file did."""
    import onnxruntime

    file = onnx.load(mode_switch_onnx)
    file.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    with pytest.raises(Exception, match="Dimension of input 0 must be 1 instead of 2"):
        onnxruntime.InferenceSession(file.SerializeToString(), providers=["CPUExecutionProvider"])
    graph = from_onnx(mode_switch_onnx, input_shapes={"x": (2, 4)})
    (branching,) = [n for n in graph.nodes if n.attrs.get("op_type") == "If"]
    assert branching.attrs["open_shapes"] and branching.out.shape == (2, 4)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    mode = np.array(1, np.int64)
    want = onnxruntime.InferenceSession(mode_switch_onnx, providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "mode": mode})[0]
    np.testing.assert_allclose(run_graph(graph, {"x": torch.from_numpy(x), "mode": torch.from_numpy(mode)})[0],
                               want, rtol=0, atol=0)
    for backend in ("ort", "torch"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(x=torch.from_numpy(x), mode=torch.from_numpy(mode)).numpy(), want,
                                   rtol=0, atol=0)
    with pytest.raises(InputMismatchError, match="takes the inputs 'x', 'mode', got 'x'"):
        run_graph(graph, {"x": torch.from_numpy(x)})


def test_an_input_fixed_at_a_value_is_a_constant_and_the_branch_it_decides_is_inlined(
        mode_switch_onnx: str, tmp_path: Any) -> None:
    """Plans are timed on drawn inputs, where an integer is 0: here the branch that fails at the
    sizes given. The error says so and names the input to fix; ``input_values`` fixes it, the
    ``If`` it decides becomes the branch it takes, and the graph no longer takes it."""
    import onnxruntime

    from opsched.errors import ExecutionError

    graph = from_onnx(mode_switch_onnx, input_shapes={"x": (2, 4)})
    with pytest.raises(ExecutionError, match=r"drawn inputs, integers zero .* here 'mode'; .* "
                                             r"input_values=\{'mode': \.\.\.\}"):
        opsched.optimize_graph(graph, cache_dir=str(tmp_path))
    fixed = from_onnx(mode_switch_onnx, input_shapes={"x": (2, 4)}, input_values={"mode": 1})
    assert [i.name for i in fixed.inputs] == ["x"]
    assert [n.attrs.get("op_type", n.op) for n in fixed.nodes] == ["Neg", "mul"]  # Equal folded, If inlined
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    want = onnxruntime.InferenceSession(mode_switch_onnx, providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "mode": np.array(1, np.int64)})[0]
    module = opsched.optimize_graph(fixed, cache_dir=str(tmp_path))
    np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=0, atol=0)
    for values, shapes, why in [
            ({"mode": [1, 1]}, {"x": (2, 4)}, r"gives input 'mode' a value of shape \(2,\), but the file declares "
                                              r"dimensions \[\]"),
            ({"mode": "one"}, {"x": (2, 4)}, "gives input 'mode' a value that is not of its type, int64"),
            ({"mod": 1}, {"x": (2, 4)}, "input_values names 'mod', but the model's inputs are 'x', 'mode'"),
            ({"mode": 1, "x": np.zeros((2, 4))}, {"x": (2, 4)}, "'x' given both a shape and a value")]:
        with pytest.raises(FrontendError, match=why):
            from_onnx(mode_switch_onnx, input_shapes=shapes, input_values=values)


def test_a_module_of_a_graph_with_inputs_fixed_at_values_takes_them_as_the_file_does(
        mode_switch_onnx: str, tmp_path: Any) -> None:
    """An input ``input_values`` fixes is left out of the graph, and a module of it is fed as
    the file is (ONNX Runtime's feeds, Silero's ``model(x, sr)``): with the input or without,
    by name or, where it follows every input a call must pass, by position; the value as a
    tensor of any type, an array or a number. Another value is refused, naming the input, its
    value and the call. A fixed input before one a call must pass is keyword-only."""
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32))
    module = opsched.optimize_graph(from_onnx(mode_switch_onnx, input_shapes={"x": (2, 4)}, input_values={"mode": 1}),
                                    cost="analytic", cache_dir=str(tmp_path))
    want = -x * x
    for args, kwargs in [((x,), {}), ((x, 1), {}), ((x,), {"mode": torch.tensor(1)}), ((), {"x": x, "mode": 1.0}),
                         ((x, np.array(1, np.int32)), {})]:
        torch.testing.assert_close(module(*args, **kwargs), want, rtol=0, atol=0)
    with pytest.raises(InputMismatchError, match=r"input 'mode' was fixed at 1 \(int64\) where the graph was "
                                                 r"made \(input_values=\).*got 0 \(int64\).*"
                                                 r"input_values=\{'mode': \.\.\.\}"):
        module(x, torch.tensor(0))
    for args, kwargs, why in [((x, [1, 1]), {}, "got \\[1, 1\\]"),
                              ((x, 1, 2), {}, r"forward\(x, mode=1\): too many positional"),
                              ((x, 1), {"mode": 1}, "multiple values for argument 'mode'"),
                              ((x,), {"mode": "1"}, "got '1'")]:
        with pytest.raises(InputMismatchError, match=why):
            module(*args, **kwargs)
    per_shape = opsched.optimize_per_shape(mode_switch_onnx, {"x": x}, input_values={"mode": 1}, cost="analytic",
                                           cache_dir=str(tmp_path))
    torch.testing.assert_close(per_shape(x, mode=1), want, rtol=0, atol=0)

    graph = helper.make_graph([helper.make_node("Cast", ["scale"], ["s"], to=TensorProto.FLOAT),
                               helper.make_node("Mul", ["x", "s"], ["y"])], "scaled",
                              [helper.make_tensor_value_info("scale", TensorProto.INT64, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    scaled = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    fixed = from_onnx(scaled, input_values={"scale": 3})
    assert [(f.name, f.value.tolist(), f.position) for f in fixed.fixed_inputs] == [("scale", 3, 0)]
    module = opsched.optimize_graph(fixed, cost="analytic", cache_dir=str(tmp_path))
    assert str(module.inputs.signature) == "(x, *, scale=3)"
    assert "\n  computes for inputs fixed at scale=3 (int64) (input_values)\n" in str(module.report())
    for args, kwargs in [((x,), {}), ((x,), {"scale": 3}), ((), {"scale": 3, "x": x})]:
        torch.testing.assert_close(module(*args, **kwargs), 3 * x, rtol=0, atol=0)
    with pytest.raises(InputMismatchError, match="too many positional arguments"):
        module(x, 3)
    nameless = InputStructure.positional(["x", "x"])  # two inputs of one name: by position alone, and refused so
    assert nameless.signature is None
    with pytest.raises(InputMismatchError, match=r"called as forward\(args\[0\], args\[1\]\), got forward\(<tensor"):
        nameless.tensors((x,), {})


def test_inputs_fixed_among_those_a_call_passes_keep_the_files_order_where_python_can() -> None:
    """A file's inputs ``a x b y c``, ``a``, ``b`` and ``c`` fixed: ``c`` follows every input a
    call must pass and stays positional, ``a`` and ``b`` precede one and are keyword-only. Every
    call ONNX Runtime's feeds make (by name, any subset of the fixed ones) and every positional
    one Python allows gives the graph ``x`` and ``y``, in that order; a fixed value at another
    value, or given twice, is refused."""
    from opsched.structure import FixedInput

    x, y = torch.zeros(1), torch.ones(1)
    fixed = [FixedInput("a", torch.tensor(1), 0), FixedInput("b", torch.tensor([2.0, 3.0]), 2),
             FixedInput("c", torch.tensor(True), 4)]
    call = InputStructure.positional(["x", "y"], fixed)
    assert str(call.signature) == "(x, y, c=True, *, a=1, b=[2.0, 3.0])"
    assert call.describe() == "forward(x, y, c=True, a=1, b=[2.0, 3.0])"
    values = {"a": np.int64(1), "b": np.array([2, 3], np.float32), "c": torch.tensor(True)}
    for k in range(8):  # every subset of the fixed inputs, by name; then c by position
        given = {name: v for bit, (name, v) in enumerate(values.items()) if k >> bit & 1}
        for args, kwargs in [((x, y), given), ((), {"y": y, "x": x, **given}), ((x,), {"y": y, **given})]:
            got = call.tensors(args, kwargs)
            assert len(got) == 2 and got[0] is x and got[1] is y, (args, kwargs)
        rest = {n: v for n, v in given.items() if n != "c"}
        got = call.tensors((x, y, True), rest)
        assert got[0] is x and got[1] is y
    for args, kwargs, why in [((x, y), {"b": [2.0, 4.0]}, r"input 'b' was fixed at \[2.0, 3.0\] \(float32\)"),
                              ((x, y, False), {}, r"input 'c' was fixed at True \(bool\)"),
                              ((x, y, True), {"c": True}, "multiple values for argument 'c'"),
                              ((x, y, True, 1), {}, "too many positional arguments"),
                              ((x,), {"a": 1}, "missing a required argument: 'y'")]:
        with pytest.raises(InputMismatchError, match=why):
            call.tensors(args, kwargs)


def test_an_if_whose_branches_differ_in_type_is_refused_unless_an_input_value_decides_it() -> None:
    """At opset 11 (its branches' Unsqueeze and ReduceMean take their axes as attributes, which
    the upgrade to the segments' opset makes inputs, in the branches too): a computed condition
    whose branches return (1, 2, 1) or (2, 1, 1) has no one type, and is refused naming both;
    fixed by ``input_values``, each mode is the branch it takes, equal to ONNX Runtime."""
    import onnxruntime

    def branch(name: str, axis: int) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Unsqueeze", ["x"], [f"{name}u"], axes=[axis]),
                                  helper.make_node("ReduceMean", [f"{name}u"], [f"{name}m"], axes=[2], keepdims=1)],
                                 name, [], [helper.make_tensor_value_info(f"{name}m", TensorProto.FLOAT, [1, 1, 1])])

    nodes = [helper.make_node("Equal", ["mode", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("then", 0), else_branch=branch("else", 1))]
    graph = helper.make_graph(nodes, "modes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                               helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    with pytest.raises(UnsupportedOpError, match=r"node 'y' \(If\): its output 'y' is f32\[2,1,1\] or f32\[1,2,1\] "
                                                 r"by the branch taken.*input_values= fixes it"):
        from_onnx(model)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mode in (1, 0):
        (want,) = session.run(None, {"x": x, "mode": np.array(mode, np.int64)})
        module = opsched.optimize_graph(from_onnx(model, input_values={"mode": mode}), cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("op", "inputs", "attrs"), [
    ("Range", [np.float32(0), np.float32(5), np.float32(1)], {}),  # YOLOv8's anchor grid: float32, not float64
    ("Range", [np.int32(7), np.int32(-2), np.int32(-3)], {}),
    ("Range", [np.int64(3), np.int64(3), np.int64(1)], {}),
    ("Div", [np.array([7, -7, -6, 6], np.int64), np.array([2, 2, -4, -4], np.int64)], {}),  # toward zero
    ("Div", [np.array([1.0, -3.0], np.float32), np.array([4.0, 2.0], np.float32)], {}),
    ("Reshape", [np.zeros((2, 3, 4), np.float32), np.array([0, -1], np.int64)], {}),  # 0: the input's size
    ("Reshape", [np.zeros((0, 3), np.float32), np.array([0, 3], np.int64)], {"allowzero": 1}),
])
def test_every_folding_rule_computes_what_onnx_defines(op: str, inputs: list[np.ndarray],
                                                       attrs: dict[str, Any]) -> None:
    """The NumPy rules that fold shape arithmetic give ONNX's reference values in ONNX's types."""
    import onnx.reference

    from opsched.frontends.onnx_fold import FOLDABLE

    names = [f"i{k}" for k in range(len(inputs))]
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op, names, ["o"], **attrs)], "fold",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v))
         for n, v in zip(names, inputs)], [onnx.ValueInfoProto(name="o")]),
        opset_imports=[helper.make_opsetid("", 17)])
    (want,) = onnx.reference.ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))
    got = FOLDABLE[op](None, [np.asarray(v) for v in inputs], attrs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_an_output_declared_at_the_batch_it_was_exported_at_gets_the_batch_it_is_imported_at() -> None:
    """torch.onnx given dynamic axes for the inputs alone declares the outputs at the example's
    batch: shape inference took that declaration at its word, and a generic last node (Hardmax)
    was typed at batch 1 while it returns 3 rows."""
    import onnxruntime

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Hardmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "declared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    imported = from_onnx(model, input_shapes={"x": (3, 4)})
    assert imported.types[imported.outputs[0]].shape == (3, 4)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (want,) = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    module = opsched.optimize_graph(imported, cost="analytic", check=False)
    np.testing.assert_array_equal(module(torch.from_numpy(x)).numpy(), want)


def test_a_file_that_writes_open_sizes_as_minus_one_and_computes_its_anchors_from_them(tmp_path: Any) -> None:
    """Two exporters' habits: Paddle2ONNX declares open sizes as -1 (inputs and annotations
    alike); YOLOv8's head builds its anchor grid with Range from the input's size, which folds
    once the size is fixed and must stay float32 (ONNX Runtime refused the Sub that reads it)."""
    import onnxruntime
    from onnx import numpy_helper

    def const(name: str, value: Any, dtype: Any) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(value, dtype), name)

    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "three"], ["w"]),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["zero", "wf", "one"], ["grid"]),
             helper.make_node("Add", ["grid", "half"], ["centres"]),
             helper.make_node("Conv", ["x", "k"], ["c"]), helper.make_node("Sub", ["c", "centres"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 2, -1, -1])
    graph = helper.make_graph(
        nodes, "anchors", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3, -1, -1])],
        [const("three", 3, np.int64), const("zero", 0, np.float32), const("one", 1, np.float32),
         const("half", 0.5, np.float32),
         numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 2, 1, 1)).astype(np.float32), "k")],
        value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, [-1, 3, -1, -1])])
    path = tmp_path / "anchors.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]), str(path))
    imported = from_onnx(str(path), input_shapes={"x": (1, 2, 5, 6)})
    assert all(imported.types[v].dtype == "float32" for v in imported.types)
    feed = np.random.default_rng(1).standard_normal((1, 2, 5, 6)).astype(np.float32)
    want = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": feed})[0]
    for backend in ("ort", "torch"):
        module = opsched.optimize_graph(imported, backend=backend, scheduler="sequential", cost="analytic",
                                        check=False)
        np.testing.assert_allclose(module(torch.from_numpy(feed)).numpy(), want, rtol=1e-6, atol=1e-6)


def test_ops_the_segments_lack_are_expanded_into_their_onnx_functions() -> None:
    """An opset-23 file as torch.onnx writes a transformer block: Attention (a boolean mask, a
    scale) and RMSNormalization are new in 23, so the segments' opset lacks them; each becomes
    the body ONNX defines it by, the file comes down to the segments' opset, and all of it runs
    in one ONNX Runtime session, equal to ONNX Runtime's own run of the file."""
    from onnx import numpy_helper

    from opsched.backends.lanes import LaneExecutor
    from opsched.ir.ops.onnx_opsets import lacks

    assert lacks(OPSET, "Attention", 23) and lacks(OPSET, "GroupNormalization", 21)
    assert not lacks(OPSET, "MatMul", 23) and not lacks(OPSET, "NoSuchOp", 23)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 24)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 6, 3, 2, 4], np.int64), "heads"),
             numpy_helper.from_array(np.tril(np.ones((6, 6), bool)), "mask"),
             numpy_helper.from_array(np.array([1, 6, 8], np.int64), "merged"),
             numpy_helper.from_array(rng.random(8).astype(np.float32) + 0.5, "scale")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["qkv"]),
             helper.make_node("Reshape", ["qkv", "heads"], ["split"]),
             helper.make_node("Transpose", ["split"], ["t"], perm=[2, 0, 3, 1, 4]),  # (3, 1, 2, 6, 4)
             helper.make_node("Split", ["t"], ["q5", "k5", "v5"], axis=0, num_outputs=3),
             *(helper.make_node("Squeeze", [f"{v}5", "zero"], [v]) for v in "qkv"),
             helper.make_node("Attention", ["q", "k", "v", "mask"], ["a"], scale=0.3),
             helper.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["at", "merged"], ["m"]),
             helper.make_node("RMSNormalization", ["m", "scale"], ["y"], epsilon=1e-5)]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
    model = helper.make_model(helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])], inits),
        opset_imports=[helper.make_opsetid("", 23)])
    x = rng.standard_normal((1, 6, 8)).astype(np.float32)
    want = _newer_reference(model).run(None, {"x": x})[0]
    graph = from_onnx(model)
    kinds = {n.attrs.get("op_type") for n in graph.nodes}
    assert not kinds & {"Attention", "RMSNormalization"}, kinds
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    executor = module.executor
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()

@pytest.mark.parametrize(("op", "opset", "attrs"), [
    ("GroupNormalization", 21, {"num_groups": 2, "epsilon": 1e-5}),
    ("GroupNormalization", 23, {"num_groups": 2, "epsilon": 1e-5}),
    ("RotaryEmbedding", 23, {}),
    ("Swish", 24, {}),  # a function body of its own, which reads alpha: its default, 1
    ("Swish", 24, {"alpha": 1.7}),
])
def test_a_moved_or_newer_op_runs_as_its_function_equal_to_onnx_runtime(op: str, opset: int,
                                                                        attrs: dict[str, object]) -> None:
    """GroupNormalization 21 scales per channel where opset 20's (18) scales per group: declared
    at 20 as it is it would compute something else, so it is expanded too; its body's Cast and
    Reshape, written at 21, are read at 23 in the second case."""
    from onnx import numpy_helper

    from opsched.backends.lanes import LaneExecutor

    rng = np.random.default_rng(1)
    shape = [1, 4, 3, 3] if op == "GroupNormalization" else [1, 2, 4, 8]
    consts: dict[str, np.ndarray] = {}
    if op == "GroupNormalization":
        consts = {"scale": rng.random(4) + 0.5, "bias": rng.random(4)}
    elif op == "RotaryEmbedding":  # (batch, heads, sequence, head size): positions rotated by cached angles
        angles = rng.random((6, 4))
        consts = {"cos": np.cos(angles), "sin": np.sin(angles), "positions": np.array([[0, 2, 3, 5]])}
    node = helper.make_node(op, ["x", *consts], ["y"], **attrs)
    inits = [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k) for k, v in consts.items()]
    model = helper.make_model(helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits),
        opset_imports=[helper.make_opsetid("", opset)])
    x = rng.standard_normal(shape).astype(np.float32)
    want = _newer_reference(model).run(None, {"x": x})[0]
    graph = from_onnx(model)
    assert op not in {n.attrs.get("op_type") for n in graph.nodes}
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    executor = module.executor
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()

def test_empty_slices_and_split_pieces_are_dropped_by_the_concat_that_reads_them() -> None:
    """The IR has no empty tensors; ONNX has them (a rotary embedding that rotates every channel
    splits off zero pass-through channels and concatenates them back): the empty piece of a
    Slice or a Split is a constant that the Concat leaves out."""
    import onnxruntime

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    inits = [helper.make_tensor(k, TensorProto.INT64, [len(v)], v)
             for k, v in {"s": [4], "e": [9], "ax": [1], "sizes": [4, 0]}.items()]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "s", "e", "ax"], ["empty"]),  # r[:, 4:9]: nothing
             helper.make_node("Split", ["r", "sizes"], ["all", "none"], axis=-1),
             helper.make_node("Concat", ["empty", "r", "none", "all"], ["y"], axis=1)]
    model = helper.make_model(helper.make_graph(nodes, "empty", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", OPSET)])
    feed = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed})[0]
    graph = from_onnx(model)
    assert [n.op for n in graph.nodes] == ["relu", "concat"]  # the Split's whole piece is r itself
    assert_close(run_graph(graph, [torch.from_numpy(feed)]), [torch.from_numpy(want)])

def test_a_quantized_weight_stays_quantized_so_ort_runs_its_integer_kernels() -> None:
    """A QDQ file (as ONNX Runtime's quantize_static writes it): folding the weight's
    DequantizeLinear would hand ONNX Runtime a float Conv between the activation's
    QuantizeLinear and DequantizeLinear, which it computes in float where its own session fuses
    QLinearConv, off by a quantization step (0.12 on a ResNet). Kept, the segment is fused as the
    file is: equal to ONNX Runtime's own run."""
    import onnxruntime
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3), dtype=np.int8), "w_q"),
             numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
             numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(0.05, np.float32), "y_scale"),
             numpy_helper.from_array(np.array(0, np.uint8), "zero")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "zero"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "zero"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"]),
             helper.make_node("Conv", ["x_dq", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "y_scale", "zero"], ["y_q"]),
             helper.make_node("DequantizeLinear", ["y_q", "y_scale", "zero"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits),
        opset_imports=[helper.make_opsetid("", OPSET)])
    x = rng.random((1, 4, 8, 8)).astype(np.float32) * 2
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    graph = from_onnx(model)
    weight = next(n for n in graph.nodes if n.attrs.get("op_type") == "DequantizeLinear" and not n.inputs)
    assert graph.param_types[weight.params[0]].dtype == "int8"
    # it reads nothing: it joins its reader's schedule unit (not a free unit that doubles the DP's
    # states), and so its reader's segment
    from opsched.schedulers import UnitGraph

    (unit,) = [u for u in UnitGraph.build(graph).units if weight.name in u]
    reader = graph.node(unit[unit.index(weight.name) + 1])
    assert reader.attrs.get("op_type") == "Conv"  # a generic ONNX Conv: its weight is computed
    module = opsched.optimize_graph(graph, backend="ort", scheduler="sequential", cost="analytic", check=False)
    np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=0, atol=1e-6)

def _dft_file(opset: int, shape: list[int], axis: int, *, inverse: int = 0, onesided: int = 0,
              length: int | None = None, then_inverse: bool = False) -> tuple[onnx.ModelProto, Any]:
    """A Relu, a DFT (and, with ``then_inverse``, the inverse DFT of its spectrum) and a Sigmoid,
    the DFT's axis an attribute before opset 20 and an input from it; and the file's function
    computed in float64 by NumPy."""
    from onnx import numpy_helper

    inits = [] if length is None else [numpy_helper.from_array(np.array(length, np.int64), "n")]
    extra, attrs = ["" if length is None else "n"], {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        inits.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
        extra.append("axis")
    else:
        attrs["axis"] = axis
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("DFT", ["r", *extra], ["f"], **attrs)]
    if then_inverse:
        nodes.append(helper.make_node("DFT", ["f", *extra], ["g"], **{**attrs, "inverse": 1}))
    nodes.append(helper.make_node("Sigmoid", [nodes[-1].output[0]], ["y"]))
    at = axis % len(shape)

    def computed(x: Any) -> Any:
        r = np.maximum(x.astype(np.float64), 0)
        signal = r[..., 0] if shape[-1] == 1 else r[..., 0] + 1j * r[..., 1]
        f = (np.fft.rfft if onesided else np.fft.ifft if inverse else np.fft.fft)(signal, n=length, axis=at)
        f = np.fft.ifft(f, n=length, axis=at) if then_inverse else f
        return 1 / (1 + np.exp(-np.stack([f.real, f.imag], -1)))
    out = list(computed(np.zeros(shape)).shape)
    model = helper.make_model(helper.make_graph(
        nodes, "dft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits),
        opset_imports=[helper.make_opsetid("", opset)])
    return model, computed


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize(("shape", "axis", "form", "kernels"), [
    ([2, 12, 96, 1], 2, {}, ["squeeze.dim", "fft_fft.default", "view_as_real.default"]),
    ([2, 12, 96, 1], -2, {"onesided": 1}, ["squeeze.dim", "fft_rfft.default", "view_as_real.default"]),
    ([2, 12, 96, 2], 1, {"inverse": 1}, ["clone.default", "view_as_complex.default", "fft_ifft.default",
                                         "view_as_real.default"]),
    ([2, 12, 96, 2], 1, {"length": 20, "then_inverse": True},  # trimmed to 20, then back without the pairs
     ["clone.default", "view_as_complex.default", "fft_fft.default", "fft_ifft.default", "view_as_real.default"]),
    ([2, 64, 64, 2], 2, {"then_inverse": True},  # a power of two, large enough
     ["clone.default", "view_as_complex.default", "fft_fft.default", "fft_ifft.default", "view_as_real.default"]),
    ([2, 16, 64, 2], 2, {"then_inverse": True}, []),  # too small to pay for a session cut: ONNX Runtime's
    ([1, 4, 96, 1], 2, {}, []),
])
def test_a_dft_large_enough_runs_as_torchs_fft(opset: int, shape: list[int], axis: int, form: dict[str, Any],
                                               kernels: list[str]) -> None:
    """ONNX Runtime's CPU DFT is 7-166x slower than torch's FFT (benchmarks/fourier.py): a DFT
    large enough to pay for a session cut (fewer values where the length is not a power of two)
    is imported as torch's FFT between sessions (on every backend), and a chain of DFTs passes
    complex spectra without pairs between them. Checked against the file's function in
    float64, to float32 rounding; ONNX Runtime's own session of a length-96 DFT is 100 times
    further from it (5e-5), and agrees to 1e-4."""
    import onnxruntime

    if opset < 20 and axis < 0:
        axis += len(shape)
    model, computed = _dft_file(opset, shape, axis, **form)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    graph = from_onnx(model)
    made = [n.attrs["target"].removeprefix("aten::") for n in graph.nodes if "target" in n.attrs]
    assert made == kernels
    transforms = [n for n in graph.nodes if n.attrs.get("op_type") == "DFT"]
    assert len(transforms) == (0 if kernels else 1 + form.get("then_inverse", False))
    own = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        got = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, computed(x), rtol=0, atol=1e-6 if kernels else 1e-4)  # ORT's: coarser
        np.testing.assert_allclose(got, own, rtol=0, atol=1e-4)


@pytest.mark.parametrize(("components", "samples", "size", "window", "onesided", "on_torch"), [
    (1, 1000, 100, True, 1, True), (1, 1000, 100, True, 0, True), (2, 1000, 100, False, 0, True),
    (1, 1000, 64, True, 1, True),
    (1, 200, 64, True, 1, False),  # 14 frames of a power of two: ONNX Runtime's STFT
])
def test_an_stft_large_enough_runs_as_torchs_fft(components: int, samples: int, size: int, window: bool,
                                                 onesided: int, on_torch: bool) -> None:
    """ONNX's STFT (frames every ``step`` samples, times the window, transformed) as torch's
    unfold and FFT where it pays for a session cut; checked against NumPy in float64."""
    import onnxruntime
    from onnx import numpy_helper

    hann = np.hanning(size).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(10, np.int64), "step"), numpy_helper.from_array(hann, "window"),
             numpy_helper.from_array(np.array(size, np.int64), "length")]
    stft = helper.make_node("STFT", ["x", "step", "window" if window else "", "" if window else "length"], ["y"],
                            onesided=onesided)
    model = helper.make_model(helper.make_graph(
        [stft], "stft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, samples, components])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((2, samples, components)).astype(np.float32)
    signal = x[..., 0].astype(np.float64) if components == 1 else x[..., 0] + 1j * x[..., 1].astype(np.float64)
    frames = np.lib.stride_tricks.sliding_window_view(signal, size, axis=1)[:, ::10] * (hann if window else 1)
    spectrum = (np.fft.rfft if onesided else np.fft.fft)(frames, axis=-1)
    want = np.stack([spectrum.real, spectrum.imag], -1)
    graph = from_onnx(model)
    assert [n.attrs.get("op_type") for n in graph.nodes].count("STFT") == (not on_torch)
    assert (("aten::fft_rfft.default" if onesided else "aten::fft_fft.default") in
            [n.attrs.get("target") for n in graph.nodes]) == on_torch
    own = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(own, want, rtol=0, atol=1e-2)  # the same function, by ORT's own (coarser) kernel
    for backend in ("torch", "ort"):
        module = opsched.optimize_graph(graph, backend=backend, scheduler="sequential", cost="analytic", check=False)
        np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=0, atol=2e-5)


def test_onnx_runtimes_own_ops_join_its_segments() -> None:
    """A file as ONNX Runtime's transformer optimizer writes it: com.microsoft's BiasGelu and
    SkipLayerNormalization between standard ops, all in one session, equal to ORT's own."""
    import onnxruntime
    from onnx import numpy_helper

    from opsched.backends.lanes import LaneExecutor

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((8, 8)), "bias": rng.standard_normal(8), "gamma": rng.random(8) + 0.5,
               "beta": rng.standard_normal(8)}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("BiasGelu", ["m", "bias"], ["g"], domain="com.microsoft"),
             helper.make_node("SkipLayerNormalization", ["g", "x", "gamma", "beta"], ["n"], domain="com.microsoft",
                              epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    model = helper.make_model(helper.make_graph(nodes, "optimized", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    feed = rng.standard_normal((1, 4, 8)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed})[0]
    graph = from_onnx(model)
    assert {n.attrs.get("domain") for n in graph.nodes if n.op.startswith("onnx.")} == {"com.microsoft"}
    module = opsched.optimize_graph(graph, backend="ort", scheduler="sequential", cost="analytic", check=False)
    np.testing.assert_allclose(module(torch.from_numpy(feed)).numpy(), want, rtol=1e-5, atol=1e-5)
    executor = module.executor
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()


@pytest.mark.parametrize(("op", "opset", "attrs", "dtypes", "constants", "refused", "declared"), [
    ("Transpose", 20, {"perm": [1, 0]}, ("float32",), {}, None, ({"perm"}, (0,))),  # version 13 at both
    ("IsNaN", 20, {}, ("float32",), {}, None, (set(), (0,))),  # 20 added float8 types only
    ("Cast", 19, {"to": TensorProto.INT64}, ("float32",), {}, None, ({"to"}, (0,))),
    ("Cast", 19, {"to": TensorProto.FLOAT16, "saturate": 0}, ("float32",), {}, "attribute 'saturate' is newer",
     None),  # saturate defaults to 1: 0 is something version 13 cannot say
    ("ReduceL2", 18, {}, ("float32", "int64"), {}, "input 'axes' is computed", None),
    ("ReduceL2", 18, {"keepdims": 1, "noop_with_empty_axes": 0}, ("float32", "int64"), {1: [1, -1]}, None,
     ({"keepdims", "axes"}, (0,))),  # axes back to an attribute; the default-valued newer one dropped
    ("ReduceL2", 18, {}, ("float32",), {}, None, (set(), (0,))),  # no axes: all of them, at both versions
    ("Resize", 19, {"coordinate_transformation_mode": "half_pixel"}, ("float32", None, "float32"), {}, None,
     ({"coordinate_transformation_mode"}, (0, 1, 2))),
    ("Resize", 19, {"mode": "linear", "antialias": 0}, ("float32", None, "float32"), {}, None,
     ({"mode"}, (0, 1, 2))),
    ("Resize", 19, {"mode": "linear", "antialias": 1}, ("float32", None, "float32"), {},
     "attribute 'antialias' is newer", None),
    ("Resize", 19, {"coordinate_transformation_mode": "half_pixel_symmetric"}, ("float32", None, "float32"), {},
     "coordinate_transformation_mode='half_pixel_symmetric' is newer", None),
    ("DFT", 20, {}, ("float32",), {}, "DFT changed after opset 17", None),
    ("Transpose", 24, {"perm": [1, 0]}, ("float32",), {}, "Transpose changed after opset 17", None),  # unread
    ("Equal", 19, {}, ("float32", "float32"), {}, None, (set(), (0, 1))),
    ("Squeeze", 11, {"axes": [0]}, ("float32",), {}, "Squeeze of opset 11 changed by opset 17", None),
    ("Relu", 14, {}, ("float32",), {}, None, (set(), (0,))),
])
def test_a_newer_node_joins_a_segment_only_where_it_means_the_same(
        op: str, opset: int, attrs: dict[str, object], dtypes: tuple[str | None, ...],
        constants: dict[int, list[int]], refused: str | None, declared: tuple[set[str], tuple[int, ...]] | None,
) -> None:

    from opsched.ir import TensorType
    from opsched.ir.ops.onnx_opsets import declaration_at
    from opsched.ir.ops.registry import NotExportable

    node = helper.make_node(op, [f"i{k}" for k in range(len(dtypes))], ["o"], **attrs)
    types = [None if d is None else TensorType((2, 2), d) for d in dtypes]
    values = {k: np.array(v) for k, v in constants.items()}
    if refused is not None:
        with pytest.raises(NotExportable, match=re.escape(refused)):
            declaration_at(17, op, opset, node.attribute, types, values, 1, None, 0)
        return
    assert declared is not None
    got = declaration_at(17, op, opset, node.attribute, types, values, 1, None, 0)
    assert ({a.name for a in got.attributes}, got.inputs) == declared
    if "axes" in declared[0]:
        assert next(list(a.ints) for a in got.attributes if a.name == "axes") == constants[1]


@pytest.mark.parametrize(("op", "opset", "attrs", "target", "refused"), [
    ("GridSample", 22, {"mode": "linear"}, 20, None),  # "linear" is 20's name for 16's "bilinear"
    ("GridSample", 22, {"mode": "linear"}, 17, "mode='linear' is newer"),
    ("DFT", 22, {}, 20, None),  # version 20 at both
    ("DFT", 22, {}, 19, "DFT changed after opset 19"),  # its axis moved at 20
    ("GroupNormalization", 21, {"num_groups": 2}, 20, "GroupNormalization changed after opset 20"),  # per channel
    ("GroupNormalization", 21, {"num_groups": 2}, 21, None),
])
def test_what_a_version_changed_is_refused_only_below_that_version(
        op: str, opset: int, attrs: dict[str, object], target: int, refused: str | None) -> None:
    from opsched.ir import TensorType
    from opsched.ir.ops.onnx_opsets import declaration_at
    from opsched.ir.ops.registry import NotExportable

    n_inputs = 2 if op == "GridSample" else 1  # GridSample's grid
    node = helper.make_node(op, [f"i{k}" for k in range(n_inputs)], ["o"], **attrs)
    types = [TensorType((2, 2), "float32")] * n_inputs
    if refused is not None:
        with pytest.raises(NotExportable, match=re.escape(refused)):
            declaration_at(target, op, opset, node.attribute, types, {}, 1, None, 0)
        return
    got = declaration_at(target, op, opset, node.attribute, types, {}, 1, None, 0)
    assert {a.name for a in got.attributes} == set(attrs)


@pytest.mark.parametrize("name", ["googlenet", "inception_v3", "nasnet_mobile", "randwire_small"])
def test_a_model_on_another_device_imports_with_every_weight_left_there(name: str) -> None:
    """A model already on a GPU keeps its weights there through the import and its passes (a
    batch norm folded into a bias-free convolution once made its new bias on the CPU). The meta
    device stands in for CUDA: an operation mixing it with a CPU tensor fails as CUDA's would."""
    from opsched.models import example_inputs, get_model

    model = get_model(name).eval().to("meta")
    graph = from_torch(model, *(t.to("meta") for t in example_inputs(name)))
    assert graph.params and {t.device.type for t in graph.params.values()} == {"meta"}


class _Mixed(nn.Module):
    """Calls PyTorch's flop counter has rules for (a linear, an einsum it decomposes into a
    batched product, attention), calls it runs to count nothing (cumsum, topk, sort), and an
    elementwise one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        s = torch.einsum("bij,bkj->bik", h, x)
        a = F.scaled_dot_product_attention(h[:, None], x[:, None], h[:, None])[:, 0]
        top = torch.topk(s, 2, dim=-1).values.sum(-1, keepdim=True)
        return torch.cumsum(a, -1) + torch.sort(h, -1).values * top


def test_flops_of_traced_calls_are_pytorchs_counts_and_calls_it_cannot_count_skip_its_counter() -> None:
    """A traced call's FLOPs are what PyTorch's flop counter counts on its fake tensors; calls
    the counter has no rule for and cannot decompose are not run through it (a millisecond a
    node) and count as they did through it: nothing, then opsched's own count per element."""
    from torch.utils.flop_counter import FlopCounterMode

    from opsched.frontends._common import _counted_by_torch, traced_flops

    program = torch.export.export(_Mixed().eval(), (torch.randn(2, 5, 8),))
    calls = [n for n in program.graph.nodes if isinstance(n.target, torch._ops.OpOverload)]
    skipped, counted = set(), set()
    for n in calls:
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta.get("val"))
        with FlopCounterMode(display=False) as counter:
            n.target(*args[0], **args[1])
        by_torch = int(counter.get_total_flops())
        if not _counted_by_torch(n.target):
            assert by_torch == 0, n.target
            skipped.add(n.target._schema.name)
        elif by_torch:
            assert traced_flops(n) == by_torch, n.target
            counted.add(n.target._schema.name)
    assert {"aten::cumsum", "aten::sort", "aten::topk"} <= skipped
    assert {"aten::linear", "aten::einsum"} <= counted
    cumsum = next(n for n in calls if n.target._schema.name == "aten::cumsum")
    assert traced_flops(cumsum) == 2 * 5 * 8  # opsched's count for a reduction: a pass over its input


class _ConvertsItself(nn.Module):
    """A router that converts its classifier to its own dtype in every forward, as
    SwitchTransformers' does; with ``to``, a conversion that changes its weights."""

    def __init__(self, to: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.classifier, self.to_dtype = nn.Linear(8, 4), to

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(self.to_dtype)
        return self.classifier(x.to(self.to_dtype)).softmax(-1)


def test_a_module_converting_itself_to_what_it_is_traces_and_equals_eager() -> None:
    """torch.export cannot apply a module's ``.to()`` to the weights it traces, even one that
    changes nothing ("Couldn't swap Linear.weight"): that one returns the module while traced,
    and torch's own ``nn.Module.to`` is back after."""
    model, x = _ConvertsItself().eval(), torch.randn(3, 8)
    to = nn.Module.to
    module = opsched.optimize(model, x, cost="analytic", tracer="export")
    assert nn.Module.to is to
    with torch.no_grad():
        assert_close(module(x), model(x))
    with pytest.raises(FrontendError, match="torch.export cannot trace _ConvertsItself"):
        from_torch(_ConvertsItself(torch.float64).eval(), x, tracer="export")  # a conversion of its weights
    assert nn.Module.to is to


@pytest.mark.parametrize("tracer", ["export", "fx"])
def test_a_model_is_traced_holding_dynamos_compile_lock(monkeypatch: pytest.MonkeyPatch, tracer: str) -> None:
    """torch.export's tracer is process-wide state Dynamo takes for its own when it compiles a
    frame in another thread at the same time (a server's threads meeting new input shapes of
    ``torch.compile(model, backend="opsched")``); Dynamo compiles holding its lock, so a trace
    holds it too, and another thread cannot take it meanwhile."""
    import threading

    from torch._dynamo.convert_frame import compile_lock

    from opsched.frontends import pytorch

    taken_elsewhere: list[bool] = []

    def try_elsewhere() -> None:
        got = compile_lock.acquire(blocking=False)
        if got:
            compile_lock.release()
        taken_elsewhere.append(got)

    def probing(real: Any) -> Any:
        def traced(*args: Any, **kwargs: Any) -> Any:
            other = threading.Thread(target=try_elsewhere)
            other.start()
            other.join()
            return real(*args, **kwargs)
        return traced

    monkeypatch.setattr(pytorch, "export_graph", probing(pytorch.export_graph))
    monkeypatch.setattr(pytorch, "fx_graph", probing(pytorch.fx_graph))
    from_torch(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(1, 4), tracer=tracer)  # type: ignore[arg-type]
    assert taken_elsewhere == [False]
    try_elsewhere()
    assert taken_elsewhere == [False, True]  # released after
