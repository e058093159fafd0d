"""Fourier transforms on this CPU: ONNX Runtime's DFT kernel against torch's FFT, and FNet
(token mixing by a 2-D Fourier transform) through ONNX Runtime's own session and through opsched.

ONNX Runtime's CPU ``DFT`` and ``STFT`` are far slower than torch's FFT (its radix-2 FFT for
power-of-two lengths, a slower algorithm for others); from either frontend, opsched runs a
transform large enough to pay for a session cut as torch's FFT between its sessions, and a
smaller one inside the session as ONNX's DFT (:mod:`opsched.ir.ops.fourier`).

1. *Kernels*: a DFT along the last axis of a float32 ``[1, 128, n]`` signal, and an STFT of one
   second of 16 kHz audio (frames of ``n`` every ``hop`` samples, a Hann window: Whisper's
   400 / 160, a power of two, and the 100 / 10 of an ONNX Runtime issue on its STFT), ONNX
   Runtime's one-node session against torch's ``fft`` (``unfold`` and ``rfft`` for the STFT);
   and each one's largest difference from NumPy's float64 result, relative to the spectrum's
   largest value.
2. *FNet*: Hugging Face's ``FNetModel`` (random weights, two layers, ``intermediate = 4 * hidden``)
   at the corpus's size, at powers of two, and at FNet-base's width (768) at 128 and 512 tokens;
   exported by ``torch.onnx`` (dynamo), whose DFTs ONNX Runtime's own session runs, against
   eager PyTorch, opsched's import of that file (sequential plan) and ``opsched.optimize`` on the
   model itself (which plan its race kept: on ONNX Runtime's kernels, with the FFTs on torch
   between sessions, or the sequential plan on torch's kernels). Each contender's largest
   difference from eager is reported.

Latencies are medians over interleaved rounds in one process (:func:`opsched.timing.interleave`,
50 ms of sleep before each turn of one untimed and ``--block`` timed calls); ratios are
medians of per-round ratios, > 1 where opsched is faster.

    python benchmarks/fourier.py
    python benchmarks/fourier.py --lengths 96 768 --models 768x128 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _report import geomean, write  # noqa: E402

import opsched  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.testing.export import export_onnx  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402

#: FNet sizes, ``HIDDENxTOKENS``: the corpus's, powers of two only, FNet-base's width.
MODELS = ("64x16", "256x128", "768x128", "768x512")
#: STFT frames and hops: Whisper's, a power of two, an ONNX Runtime issue's.
STFTS = ((400, 160), (512, 160), (100, 10))


def _session(model_bytes: bytes) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])  # its default options


def _one_node(node: Any, shape: list[int], inits: list[Any]) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def _dft_case(n: int) -> tuple[str, bytes, np.ndarray, Any, np.ndarray]:
    """A DFT along the last axis of ``[1, 128, n]``: the ONNX model, its input, torch's call, the exact result."""
    from onnx import helper, numpy_helper

    x = np.random.default_rng(0).standard_normal((1, 128, n)).astype(np.float32)
    model = _one_node(helper.make_node("DFT", ["x", "", "axis"], ["y"]), [1, 128, n, 1],
                      [numpy_helper.from_array(np.array(-2, np.int64), "axis")])
    signal = torch.from_numpy(x)
    return f"DFT {n}", model, x[..., None], lambda: torch.fft.fft(signal), np.fft.fft(x.astype(np.float64), axis=-1)


def _stft_case(n: int, hop: int) -> tuple[str, bytes, np.ndarray, Any, np.ndarray]:
    """An STFT of one second of 16 kHz audio, frames of ``n`` every ``hop`` samples under a Hann window."""
    from onnx import helper, numpy_helper

    x = np.random.default_rng(0).standard_normal((1, 16000)).astype(np.float32)
    window = np.hanning(n).astype(np.float32)
    model = _one_node(helper.make_node("STFT", ["x", "hop", "window"], ["y"]), [1, 16000, 1],
                      [numpy_helper.from_array(np.array(hop, np.int64), "hop"),
                       numpy_helper.from_array(window, "window")])
    signal, w = torch.from_numpy(x), torch.from_numpy(window)
    frames = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), n, axis=1)[:, ::hop] * window
    return (f"STFT {n} / {hop}", model, x[..., None], lambda: torch.fft.rfft(signal.unfold(1, n, hop) * w),
            np.fft.rfft(frames, axis=-1))


def kernels(cases: list[tuple[str, bytes, np.ndarray, Any, np.ndarray]], rounds: int,
            block: int) -> tuple[list[list[object]], list[dict[str, Any]]]:
    rows: list[list[object]] = []
    records: list[dict[str, Any]] = []
    for label, model, x, fft, exact in cases:
        session, feeds = _session(model), {"x": x}
        n = int(label.split()[1])
        scale = np.abs(exact).max()
        ort_error = np.abs(session.run(None, feeds)[0] - np.stack([exact.real, exact.imag], -1)).max() / scale
        torch_error = np.abs(fft().numpy() - exact).max() / scale
        times = interleave({"ort": lambda: session.run(None, feeds), "torch": fft},  # noqa: B023 (called here)
                           rounds, warmup=1, settle_s=0.05, block=block)
        ms = {k: statistics.median(v) for k, v in times.items()}
        ratio = paired_ratio(times["ort"], times["torch"])
        power = n & (n - 1) == 0
        rows.append([label, "yes" if power else "no", f"{ms['ort']:.3f}", f"{ms['torch']:.3f}", f"{ratio:.1f}",
                     f"{ort_error:.1e}", f"{torch_error:.1e}"])
        records.append({"transform": label, "power_of_two": power, "median_ms": ms, "ort_vs_torch": ratio,
                        "relative_error": {"ort": float(ort_error), "torch": float(torch_error)}})
        print(" | ".join(map(str, rows[-1])), flush=True)
    return rows, records


def _fnet(size: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    hidden, tokens = (int(v) for v in size.split("x"))
    config = transformers.FNetConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=2,
                                     intermediate_size=4 * hidden, max_position_embeddings=max(512, tokens))
    torch.manual_seed(0)
    return transformers.FNetModel(config).eval(), (torch.randint(0, 1000, (1, tokens)),)


def fnet(size: str, rounds: int, block: int, budget: float) -> tuple[list[object], dict[str, Any]]:
    model, inputs = _fnet(size)
    with torch.no_grad():
        want = model(*inputs).last_hidden_state
    proto, _ = export_onnx(model, inputs)
    session = _session(proto.SerializeToString())
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)}
    graph = opsched.from_onnx(proto)
    on_torch = sum(n.attrs.get("target", "").startswith("aten::fft") for n in graph.nodes)
    on_ort = sum(n.attrs.get("op_type") == "DFT" for n in graph.nodes)
    from_file = opsched.optimize_graph(graph, scheduler="sequential", check=False)
    optimized = opsched.optimize(model, inputs, budget_s=budget, progress=False)
    calls = {"eager": lambda: model(*inputs), "ORT own": lambda: session.run(None, feeds),
             "ONNX-file seq": lambda: from_file(*inputs), "optimize()": lambda: optimized(*inputs)}
    with torch.no_grad():
        outputs = {"ORT own": torch.from_numpy(session.run(None, feeds)[0]),
                   "ONNX-file seq": from_file(*inputs)[0], "optimize()": optimized(*inputs).last_hidden_state}
        times = interleave(calls, rounds, warmup=1, settle_s=0.05, block=block)
    ms = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: paired_ratio(times["ORT own"], times[k])
              for k in ("ONNX-file seq", "optimize()")}
    ratios["optimize() vs eager"] = paired_ratio(times["eager"], times["optimize()"])
    diff = {k: float((v - want).abs().max()) for k, v in outputs.items()}
    race = optimized.outcome.race
    kept = race.kept if race is not None else optimized.schedule.scheduler
    row: list[object] = [size, f"{on_torch} / {on_ort}", kept, *(f"{ms[k]:.2f}" for k in calls),
                         *(f"{ratios[k]:.2f}" for k in ratios), *(f"{diff[k]:.1e}" for k in diff)]
    print(" | ".join(map(str, row)), flush=True)
    return row, {"model": size, "ffts_on_torch": on_torch, "dfts_on_ort": on_ort, "optimize_kept": kept,
                 "median_ms": ms,
                 "ratios": ratios, "max_diff_vs_eager": diff}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", nargs="*", type=int, default=[64, 96, 100, 128, 384, 768, 1000, 1024])
    p.add_argument("--models", nargs="*", default=list(MODELS), help="FNet sizes, HIDDENxTOKENS")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--block", type=int, default=5, help="timed calls per contender's turn (their median)")
    p.add_argument("--budget", type=float, default=5.0, help="seconds of IOS search per model in optimize()")
    p.add_argument("--name", default="fourier")
    args = p.parse_args()
    cases = [*(_dft_case(n) for n in args.lengths), *(_stft_case(n, hop) for n, hop in STFTS)]
    kernel_rows, kernel_records = kernels(cases, args.rounds, args.block)
    model_rows, model_records = [], []
    for size in args.models:
        row, record = fnet(size, args.rounds, args.block, args.budget)
        model_rows.append(row)
        model_records.append(record)
    geo = {k: geomean(r["ratios"][k] for r in model_records)
           for k in ("ONNX-file seq", "optimize()", "optimize() vs eager")}
    kernel_headers = ["transform", "power of two", "ORT ms", "torch ms", "ORT / torch", "ORT rel. error",
                      "torch rel. error"]
    model_headers = ["FNet hidden x tokens", "FFTs on torch / DFTs in ORT", "optimize() kept", "eager ms", "ORT own ms",
                     "ONNX-file seq ms", "optimize() ms", "ONNX-file seq vs ORT", "optimize() vs ORT",
                     "optimize() vs eager", "ORT own diff", "ONNX-file seq diff", "optimize() diff"]
    markdown = "\n".join([
        "# Fourier transforms: ONNX Runtime's DFT, torch's FFT, and FNet", "",
        "See `benchmarks/fourier.py` for what each column measures. *Kernels*: a DFT along the last axis of a "
        "float32 `[1, 128, n]` signal, an STFT of one second of 16 kHz audio (frame / hop, a Hann window); errors "
        "are the largest difference from NumPy's float64 result relative to the spectrum's largest value. "
        "*FNet*: two layers at each size; *FFTs on torch / DFTs in ORT*: the nodes of opsched's import of the ONNX "
        "file that run as torch's FFT and as ONNX Runtime's DFT (one too small to pay for a session cut stays "
        "ORT's); *diff*: the largest difference from eager PyTorch's output; "
        "ratios > 1 where opsched is faster.", "",
        "## Kernels", "", format_table(kernel_headers, kernel_rows, markdown=True), "",
        "## FNet", "", format_table(model_headers, model_rows, markdown=True), "",
        "Geometric means: " + ", ".join(f"{k} {v:.2f}x" for k, v in geo.items()) + ".",
    ])
    md, js = write(args.name, markdown, {"kernels": kernel_records, "fnet": model_records, "geomean": geo,
                                         "rounds": args.rounds, "block": args.block})
    print(format_table(model_headers, model_rows))
    print("geomean:", geo)
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()
