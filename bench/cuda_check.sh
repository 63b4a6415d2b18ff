#!/usr/bin/env bash
# The hardware check on a lent single-GPU machine, prepared to run once:
#   bench/cuda_check.sh OUTDIR
# Every cuda cell at world size 1 on the machine's own torch (all variants, the hf_ pack
# where transformers is installed), then the same cells with --init meta. Each part has a
# wall-clock budget (a hang cannot eat the lease: a cell's own timeout ends it first, the
# budget ends the part), and each finished cell's record is on disk before the next starts.
# Needs no nox and no network: python3 with torch (CUDA), pandas, pyyaml, psutil, packaging.
# OUTDIR gets env.txt, walls.txt, and per part PART.jsonl (records) and PART.log.
set -u
out=${1:?usage: bench/cuda_check.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

{ nvidia-smi -L
  "$py" -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
  "$py" -c "import transformers; print('transformers', transformers.__version__)"
} >"$out/env.txt" 2>&1

part() {  # part NAME BUDGET_S [harness run args]
  local name=$1 budget=$2 start rc
  shift 2
  start=$(date +%s)
  timeout -k 10 "$budget" "$py" -m harness run --device cuda --world-size 1 --timeout 60 \
    --run-id "cuda-$name" --out "$out/$name.jsonl" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s) - start ))s budget=${budget}s" | tee -a "$out/walls.txt"
}

part full "${FULL_BUDGET_S:-240}"
part meta "${META_BUDGET_S:-150}" --init meta

# the launch logs travel as one archive (a lent machine returns only a few files)
tar czf "$out/launch-logs.tgz" -C "$out" full.logs meta.logs 2>/dev/null && rm -rf "$out/full.logs" "$out/meta.logs"
ls -la "$out"
