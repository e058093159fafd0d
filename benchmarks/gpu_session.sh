#!/usr/bin/env bash
# One call on a lent GPU machine: set the image's Python up, run the CUDA tests, then the GPU
# benchmarks the open issues wait on, in the order given, each stage cut to what is left of the
# call's time, so a stage that runs long costs the ones after it and never the results before it.
#
#   bash benchmarks/gpu_session.sh SECONDS STAGE...
#   stages: setup tests tests-hetero tests-inductor compile compile-b compile-c compile32 compile32-b
#           compile32-c compile-max compile-max-b compile32-max compile32-max-b dynamo-overhead
#           restart hetero memory memory-b corpus tests-vision vision vision-b standing
#
# The lent machine's image has its own PyTorch (not this project's pin) and nothing can be
# installed from a registry there: `setup` installs the wheels carried in .whl/ (platformdirs,
# which the image lacks) and opsched itself with no dependencies, for the torch.compile entry
# point. Fetch the wheel here first, and name .whl in the device call's carry:
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl platformdirs==4.12.2
# Each stage's output goes to /tmp/gpu-session-logs/<stage>.log; after every stage the logs and
# every results file written since the start are packed into $OUT/results.tar.gz, so a call cut
# short still brings back what was measured. $OUT/session.log says what ran, its
# exit status and time.
#
# What the first two uses taught (H200, 2026-11-25 and -26): a session's 900 s of device time
# is one call of about 590 s and, issued at once while the machine is warm (30 s), one or two more;
# a start costs about 30 s. Stage times on the H200 (2026-11-26): setup 22 s; tests (everything
# but Inductor) 93 s under -n 8; tests-inductor 102 s under -n 6; hetero 15 s; corpus (19 models)
# 141 s; memory about 20 s a row (6 rows: 130 s); compile about 65 s a model in float16 (GoogLeNet's
# Inductor segments alone 57 s). torch.compile's max-autotune spent over 150 s on GoogLeNet alone:
# compile-max is a stage of its own. The third use (2026-11-26, a fresh H200): setup 29 s,
# tests-hetero 29 s, hetero 23 s, memory 30 s a row (cut at 150 s after its fifth), compile 220 s
# for its three models, and compile-b cut at 240 s after Inception V3 and ResNet-50, so NASNet-A
# mobile (649 operators, the most segments) is a stage of its own: compile-c, compile32-c.
# The fourth (2026-11-26, a fresh H200): setup 36 s, compile32 238 s, compile-c (NASNet-A mobile
# alone) 275 s, compile32-b 194 s: compile32-c needs a call with 300 s to spare.
set -u
deadline=$(( $(date +%s) + $1 )); shift
OUT=${OUT:-/tmp/gpu-session}
logs=/tmp/gpu-session-logs
mkdir -p "$OUT" "$logs"
log="$OUT/session.log"
stamp=$(mktemp)
export PYTHONUNBUFFERED=1 OPSCHED_CACHE_DIR=/tmp/opsched-cache
export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# What earlier calls on this warm machine wrote, restored over the checkout's copies, so that a
# --resume stage (compile-b) adds to the rows of this session's earlier stage, not to the
# committed rows of a session before (which happened on 2026-11-26, when the results were not
# unpacked into the tree between two calls issued back to back)
keep=/tmp/gpu-session-keep
mkdir -p "$keep"
cp -p "$keep"/* docs/results/ 2>/dev/null

pack() {
    find docs/results -maxdepth 1 -newer "$stamp" -type f -exec cp -p -t "$keep" {} +
    find docs/results -newer "$stamp" -type f -print0 |
        tar czf "$OUT/results.tar.gz" --null -T - -C "$(dirname "$logs")" "$(basename "$logs")"
}

# stage NAME CAP_SECONDS COMMAND...: run COMMAND within CAP seconds or what is left, if less
stage() {
    local name=$1 cap=$2 left t0 rc
    shift 2
    left=$(( deadline - $(date +%s) - 10 ))
    if (( left < 30 )); then
        echo "== $name: skipped, ${left}s left" | tee -a "$log"
        return
    fi
    (( cap > left )) && cap=$left
    echo "== $name (at most ${cap}s): $*" | tee -a "$log"
    t0=$(date +%s)
    timeout -k 10 "$cap" bash -c '"$@"' "$name" "$@" > "$logs/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$log"
    tail -n 30 "$logs/$name.log" >> "$log"
    pack
}

setup() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || echo "editable install failed: src on PYTHONPATH"
    python3 - <<'EOF'
import importlib, torch
for m in ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "triton", "numpy"):
    print(m, getattr(importlib.import_module(m), "__version__", "?"))
print("cuda", torch.version.cuda, torch.cuda.get_device_name(), torch.backends.cudnn.version())
import opsched
from opsched.models import example_inputs, get_model
model, x = get_model("squeezenet1_1").eval(), example_inputs("squeezenet1_1")
module = opsched.optimize(model, x, device="cuda", scheduler="greedy", cost="analytic")
print(module.report())
EOF
}

# pytest, on the GPU's tests: one line per test as it ends (a call cut short still says which
# passed), the slowest named, two intra-op threads per worker so the workers do not starve
# each other of the 16 cores
gpu_pytest() {
    OMP_NUM_THREADS=2 python3 -m pytest -v -p no:cacheprovider -p no:benchmark --timeout 240 --durations 15 "$@"
}

tests() {
    gpu_pytest -n 8 -m gpu -k "not inductor" --ignore tests/test_vision_corpus.py tests  # its own stage: tests-vision
    gpu_pytest tests/test_hetero.py -k measured_once
}

tests_hetero() {
    gpu_pytest -n 8 -m gpu tests/test_hetero.py
}

tests_inductor() {
    gpu_pytest -n 6 -m gpu -k inductor tests
}

tests_vision() {
    gpu_pytest -n 8 -m gpu tests/test_vision_corpus.py
}

# compile_gpu STAGE PAGE [--resume] MODEL...: issue 22's contenders on MODELs in PAGE's precision
# (compile32-gpu: float32), written to docs/results/PAGE; with --resume added to the rows there
# (this session's, where an earlier call on this machine wrote them: see keep above). The
# compile*-max-gpu pages hold torch.compile's max-autotune mode alone beside the graph, the base
# through which it compares with the compile*-gpu pages' contenders: its autotuning takes minutes
# a model (over 150 s on GoogLeNet), too long to run beside them in one stage.
compile_gpu() {
    local name=$1 page=$2 dtype=float16 resume=() contenders=(graph compile compile-ro ios opsched-compile)
    shift 2
    [[ $page == compile32* ]] && dtype=float32
    [[ $page == *-max-gpu ]] && contenders=(graph compile-max)
    [[ $1 == --resume ]] && { resume=(--resume); shift; }
    stage "$name" 300 python3 benchmarks/gpu.py --batches 1 --dtypes "$dtype" --contenders "${contenders[@]}" \
        --budget 10 --rounds 20 --profile --name "$page" "${resume[@]}" --models "$@"
}

export -f setup gpu_pytest tests tests_hetero tests_inductor tests_vision
for s in "$@"; do
    case $s in
        setup) stage setup 60 setup ;;
        tests) stage tests 240 tests ;;
        tests-inductor) stage tests-inductor 240 tests_inductor ;;
        tests-hetero) stage tests-hetero 120 tests_hetero ;;
        # issue 22: Inductor segments on streams against torch.compile's modes and the 1-stream graph,
        # at most 300 s a stage (about 70 s a model), each precision its own results page
        compile) compile_gpu compile compile-gpu squeezenet1_1 googlenet randwire_small ;;
        compile-b) compile_gpu compile-b compile-gpu --resume inception_v3 resnet50 ;;
        compile-c) compile_gpu compile-c compile-gpu --resume nasnet_mobile ;;
        compile32) compile_gpu compile32 compile32-gpu squeezenet1_1 googlenet randwire_small ;;
        compile32-b) compile_gpu compile32-b compile32-gpu --resume inception_v3 resnet50 ;;
        compile32-c) compile_gpu compile32-c compile32-gpu --resume nasnet_mobile ;;
        compile-max) compile_gpu compile-max compile-max-gpu squeezenet1_1 googlenet randwire_small ;;
        compile-max-b) compile_gpu compile-max-b compile-max-gpu --resume inception_v3 resnet50 nasnet_mobile ;;
        compile32-max) compile_gpu compile32-max compile32-max-gpu squeezenet1_1 googlenet randwire_small ;;
        compile32-max-b) compile_gpu compile32-max-b compile32-max-gpu --resume inception_v3 resnet50 nasnet_mobile ;;
        # the backend's first call in a new process: cold, with the measurements, with the schedule
        # cache; Inductor segments, whose compiles a loaded schedule does once (the kept plan's)
        restart) stage restart 400 python3 benchmarks/compile_restart.py --device cuda --dtype float16 \
            --backend cuda cuda-inductor --models googlenet --name compile-restart-gpu ;;
        # issue 22: what a call through torch.compile(backend="opsched") costs beyond the plan, where
        # the plans run in a fraction of a millisecond (on this CPU: 0.3-4.2 ms of Dynamo's a call)
        dynamo-overhead) stage dynamo-overhead 300 python3 benchmarks/dynamo_overhead.py --device cuda \
            --dtype float16 --cost analytic --models squeezenet1_1 googlenet inception_v3 nasnet_mobile --budget 10 --rounds 15 \
            --name dynamo-overhead-gpu ;;
        # issue 21: placements across the CPU's cores and the GPU, measured
        hetero) stage hetero 70 python3 benchmarks/heterogeneous.py --no-simulated --measure cpu+cuda \
            --measure-models squeezenet1_1 resnet18 googlenet --rounds 7 ;;
        # issue 20: GraphTurbo's split plans at the batches where activations outgrow the L2
        memory) stage memory 150 python3 benchmarks/gpu.py --batches 64 128 --dtypes float16 \
            --models inception_v3 googlenet resnet50 --contenders graph ios graphturbo --budget 10 --rounds 15 \
            --profile --name memory-gpu ;;
        memory-b) stage memory-b 90 python3 benchmarks/gpu.py --batches 128 --dtypes float16 --models resnet50 \
            --contenders graph ios graphturbo --budget 10 --rounds 15 --profile --name memory-gpu-c ;;
        # issue 18: the real-model corpus against the single-stream CUDA graph
        corpus) stage corpus 400 python3 benchmarks/gpu.py --corpus --batches 1 --dtypes float16 \
            --contenders eager graph sequential optimize --budget 10 --rounds 15 --name corpus-gpu ;;
        # the models users bring (torchvision's and timm's, opsched.testing.vision), which only this
        # machine's image has: each in float16 on CUDA equal to eager; then the branchy ones (and two
        # chains for contrast) against the single-stream CUDA graph
        tests-vision) stage tests-vision 240 tests_vision ;;
        vision) stage vision 300 python3 benchmarks/gpu.py --batches 1 --dtypes float16 \
            --contenders eager graph ios optimize --budget 10 --rounds 15 --name vision-gpu --models \
            torchvision/googlenet torchvision/inception_v3 torchvision/densenet121 timm/inception_v4 \
            timm/hrnet_w18_small timm/dpn68 ;;
        vision-b) stage vision-b 300 python3 benchmarks/gpu.py --batches 1 --dtypes float16 \
            --contenders eager graph ios optimize --budget 10 --rounds 15 --name vision-gpu --resume --models \
            timm/res2net50_14w_8s timm/resnest14d timm/crossvit_tiny_240 timm/inception_resnet_v2 \
            torchvision/resnet18 torchvision/mobilenet_v3_small ;;
        # ../shared/GPU.md item 2: optimize() racing the IOS and est plans
        standing) stage standing 400 python3 benchmarks/gpu.py --batches 1 --dtypes float32 float16 \
            --contenders graph ios est optimize --budget 20 --name gpu-race ;;
        *) echo "unknown stage $s" | tee -a "$log" ;;
    esac
done
pack
echo "== done, $(( deadline - $(date +%s) ))s to spare" | tee -a "$log"
