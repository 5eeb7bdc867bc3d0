#!/usr/bin/env bash
# Issue 51's GPU measurements, in two stages that each fit one lent-machine call
# (at most 10 min), from the repository root of a machine with one NVIDIA GPU:
#
#   bash benchmarks/gpu.sh OUT 1 [BASE]   # ResNet-18 shape and W at batch 256, ours vs pytorch-cka
#   bash benchmarks/gpu.sh OUT 2          # the paper's protocol (auto, highest, pytorch-cka); the
#                                         # float-sensitive test files on the GPU
#
# BASE: a folder holding an older revision's files (`git archive REV | tar -x -C BASE`),
# whose cold runs of ours are the "before" of the same machine. Wheels the machine
# lacks (ml_collections, the peers, the tests' references) go in .whl/ (README).
# Every log and record lands in OUT; `python -m benchmarks.readme_numbers device OUT/stage1.txt
# COMMAND` and `... device OUT/paper.json COMMAND` make the README's GPU blocks of them.
# BASE's benchmark runs as a module from BASE (`python -m benchmarks.cka_benchmark`), as any
# revision's does, whether or not its benchmarks/ is a package.
set -u
out=${1:?usage: gpu.sh OUT STAGE [BASE]}
stage=${2:?usage: gpu.sh OUT STAGE [BASE]}
base=${3:-}
mkdir -p "$out"
py=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# jax 0.11.2's Triton GEMM pass aborts on these models' forward (README); cuBLAS instead.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=false"
export PYTHONUNBUFFERED=1
step() { echo "== $1 ($(date +%T))"; }
bench=benchmarks.cka_benchmark

if [ "$stage" = 1 ]; then
  {
    step environment
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $py -c "import jax, torch; print('jax', jax.__version__, jax.devices(), '| torch', torch.__version__)"
    step "ResNet-18 shape: ours cold, warm, a second call; pytorch-cka, cka-pytorch"
    timeout 240 $py -m $bench --workload resnet18 --device cuda --peers pytorch-cka,cka-pytorch --second --rounds 1 \
      --work /tmp/r18 --json "$out/r18.json"
    step "W at 10,240 images, batch 256: ours cold and warm; pytorch-cka"
    timeout 240 $py -m $bench --images 10240 --batch 256 --device cuda --peers pytorch-cka --no_reference --rounds 1 \
      --work /tmp/w256 --json "$out/w256.json"
    if [ -n "$base" ]; then
      step "before: $base, ours cold (ResNet-18 shape, then W)"
      (cd "$base" && timeout 60 $py -m $bench --part ours --workload resnet18 --images 10000 --batch 1000 \
        --size 32 --work /tmp/r18) | tail -1 | tee "$out/base_r18.json"
      (cd "$base" && timeout 150 $py -m $bench --part ours --images 10240 --batch 256 --work /tmp/w256) \
        | tail -1 | tee "$out/base_w256.json"
    fi
    step "W cold with XLA's GPU autotuning off (--xla_gpu_autotune_level=0)"
    XLA_FLAGS="$XLA_FLAGS --xla_gpu_autotune_level=0" timeout 120 $py -m $bench --part ours --images 10240 \
      --batch 256 --device cuda --work /tmp/w256 | tail -1 | tee "$out/w256_autotune0.json"
    step done
  } 2>&1 | tee "$out/stage1.txt"
else
  {
    step "the paper's protocol: pytorch-cka, then ours at highest and auto (no compilation cache)"
    VITCNN_JAX_COMPILATION_CACHE=none timeout 330 $py -m benchmarks.accelerator --precisions highest,auto \
      --peer pytorch-cka --json "$out/paper.json"
    step "the float-sensitive test files on the GPU"
    JAX_PLATFORMS=cuda timeout 200 $py -m pytest -q -p no:cacheprovider tests/similarity/test_cka.py \
      tests/similarity/test_measures.py tests/similarity/test_more_measures.py tests/models/test_upstream_numerics.py \
      tests/similarity/test_reference_measures.py
    step done
  } 2>&1 | tee "$out/stage2.txt"
fi
