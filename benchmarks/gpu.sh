#!/usr/bin/env bash
# The CPU benchmarks' GPU side in one call of a lent machine with one NVIDIA GPU:
#
#   bash benchmarks/gpu.sh prepare [REV]  # here, where pip reaches the registry: the wheels that
#                                         # machine lacks into .whl/, REV's files into .base/
#   bash benchmarks/gpu.sh OUT            # there, from the repository root, .whl and .base carried
#   bash benchmarks/gpu.sh OUT paper      # there, a second call if time is left: the paper's
#                                         # protocol and the float-sensitive test files on the GPU
#
# The one call (about 5 minutes; at most GPU_SH_BUDGET seconds, default 300; paper's 560) runs,
# most wanted first: the ResNet-18 shape and W at minibatches of 256, ours cold and with the
# cache warm, pytorch-cka beside them, and our cold runs at REV (default e83d5af, before issue
# 64's work), the before of the same machine; then the measures' step beside linear CKA's, now
# and at REV. Each step's timeout is cut to what is left of the budget; a step left under half
# of its own is skipped, and the log says so.
# `python -m benchmarks.readme_numbers device OUT/gpu_cka.txt COMMAND` makes the docs' block of
# its log. GPU_SH_DEVICE=cpu runs the same steps on a CPU at a few images: the script checked
# where there is no GPU.
set -u
first=${1:?usage: gpu.sh prepare [REV] | gpu.sh OUT [paper]}
py=${PYTHON:-python3}
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac  # still found after `cd $base`

if [ "$first" = prepare ]; then
  rev=${2:-e83d5af}
  rm -rf .whl .base && mkdir -p .whl .base || exit 1
  # ml-collections as the runtime pins it; the two fastest peers as the benchmarks pin them.
  wheels=$(grep -h -E '^(ml-collections|pytorch-cka|cka-pytorch)[=<>]' requirements.txt benchmarks/requirements.txt \
    | sed 's/ *#.*//')
  # $wheels unquoted: one argument a requirement.
  $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $wheels || exit 1
  git archive "$rev" | tar -x -C .base && echo "$rev" >.base/REVISION || exit 1
  ls .whl && echo "REV $rev in .base/"
  exit 0
fi

out=$first
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# jax 0.11.2's Triton GEMM pass aborts on these models' forward (README); cuBLAS instead.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=false"
export PYTHONUNBUFFERED=1
device=${GPU_SH_DEVICE:-cuda}
paper=$([ "${2:-}" = paper ] && echo 1)
budget=${GPU_SH_BUDGET:-$([ -n "$paper" ] && echo 560 || echo 300)}
bench=benchmarks.cka_benchmark
base=.base

slower=$([ "$device" = cpu ] && echo 4 || echo 1)  # the dry run's steps take longer on 2 cores

# step SECONDS TITLE: logs the step's title and sets t, its timeout: SECONDS (on a GPU), or what
# is left of the call's budget where that is less; a step left under half its own is skipped (1).
step() {
  local own=$(($1 * slower))
  t=$((budget - SECONDS < own ? budget - SECONDS : own))
  t=$((t < 0 ? 0 : t))
  if [ $((2 * t)) -lt "$own" ]; then
    echo "== skipped, ${t} s left of the call's ${budget} s: $2 ($(date +%T))"
    return 1
  fi
  echo "== $2 ($(date +%T))"
}

if [ -n "$paper" ]; then
  {
    step 330 "the paper's protocol: pytorch-cka, then ours at highest and auto (no compilation cache)" &&
      VITCNN_JAX_COMPILATION_CACHE=none timeout $t $py -m benchmarks.accelerator --precisions highest,auto \
        --peer pytorch-cka --json "$out/paper.json"
    step 200 "the float-sensitive test files on the GPU" &&
      JAX_PLATFORMS=cuda timeout $t $py -m pytest -q -p no:cacheprovider tests/similarity/test_cka.py \
        tests/similarity/test_measures.py tests/similarity/test_more_measures.py \
        tests/models/test_upstream_numerics.py tests/similarity/test_reference_measures.py
    echo "== done ($(date +%T))"
  } 2>&1 | tee "$out/paper.txt"
  exit 0
fi

if [ "$device" = cpu ]; then  # the dry run's sizes
  r18_images=2000 w_images=64 w_batch=32 layers=(--layers 8 --batch 64)
else
  r18_images=10000 w_images=2560 w_batch=256 layers=()
fi
w=(--images $w_images --batch $w_batch)
{
  echo "== environment ($(date +%T))"
  if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  if ! $py -c "import jax, torch, ml_collections; print('jax', jax.__version__, jax.devices(), '| torch', \
      torch.__version__)"; then
    echo "== stopped: a package is missing (the wheels: 'bash benchmarks/gpu.sh prepare' here, .whl carried)"
    exit 1
  fi
  [ -f $base/REVISION ] && echo "before: $(cat $base/REVISION)"
  step 90 "ResNet-18 shape: ours cold and warm; pytorch-cka" &&
    timeout $t $py -m $bench --workload resnet18 --images $r18_images --device "$device" --peers pytorch-cka \
      --rounds 1 --work /tmp/r18 --json "$out/r18.json"
  step 130 "W at minibatches of $w_batch: ours cold and warm; pytorch-cka" &&
    timeout $t $py -m $bench "${w[@]}" --device "$device" --peers pytorch-cka --no_reference --rounds 1 \
      --work /tmp/w256 --json "$out/w256.json"
  if [ -f $base/REVISION ]; then
    # A revision's benchmarks run from its own root; the weights are the parts' shared folder's.
    step 45 "before: ours cold, the ResNet-18 shape" &&
      (cd $base && timeout $t $py -m $bench --part ours --workload resnet18 --images $r18_images \
        --batch 1000 --size 32 --work /tmp/r18) | tail -1
    step 75 "before: ours cold, W" &&
      (cd $base && timeout $t $py -m $bench --part ours "${w[@]}" --work /tmp/w256) | tail -1
  fi
  step 90 "the measures' step (every measure, its null) beside linear CKA's" &&
    timeout $t $py -m benchmarks.measures_cost "${layers[@]}"
  if [ -f $base/REVISION ]; then
    step 90 "before: the measures' step" &&
      (cd $base && timeout $t $py benchmarks/measures_cost.py "${layers[@]}")
  fi
  echo "== done ($(date +%T))"
} 2>&1 | tee "$out/gpu_cka.txt"
