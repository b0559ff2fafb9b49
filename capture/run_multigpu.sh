#!/usr/bin/env bash
# Capture the multi-rank workloads of this folder under torchrun (issue 18): DDP, FSDP2 and
# tensor-parallel jobs, each timed unprofiled first, then captured with `tracedx capture`.
#
#   bash capture/run_multigpu.sh OUTDIR [NPROC] [NAME...]
#
# NPROC (default: the number of GPUs, or 2 on a machine without one) processes per job, one
# per GPU with NCCL (gloo on CPU). NAMEs, when given, pick variants by name. For each variant:
#   1. `torchrun ... SCRIPT --steps 30 --time-steps 20`: every rank prints its unprofiled step
#      times (median, min, max of the last 20 steps) -> OUTDIR/log.txt;
#   2. `torchrun ... -m tracedx capture --wait 2 --warmup 1 --steps 4 SCRIPT -- --steps 10`:
#      one trace per rank, renamed OUTDIR/traces/<name>-<NPROC>r/rank<R>.json.gz;
#   3. `tracedx diagnose` of that folder (the job report) -> OUTDIR/log.txt.
# Then an all-reduce busbw curve (allreduce_busbw.py, 1 MiB to 1 GiB) and a tarball of the
# traces. Each step is limited to 240 s; once BUDGET_S (default 540) seconds have passed the
# remaining variants are skipped (and listed in the log).
#
# NVLink multicast stays off in every process (the device machines' rule: NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
set -u
OUTDIR=${1:?usage: run_multigpu.sh OUTDIR [NPROC] [NAME...]}
PY=${PYTHON:-python3}
NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
DEFAULT_N=$([ "${NGPU:-0}" -gt 0 ] && echo "$NGPU" || echo 2)
NPROC=${2:-$DEFAULT_N}
shift $(($# >= 2 ? 2 : $#))
ONLY=" $* "
BUDGET_S=${BUDGET_S:-540}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUTDIR/traces"
LOG="$OUTDIR/log.txt"
: >"$LOG"

say() { echo "$*" | tee -a "$LOG"; }
run() { timeout -s INT 240 "$@" 2>&1 | grep -v '^USDT:' | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }
TORCHRUN=($PY -m torch.distributed.run --standalone --nproc-per-node "$NPROC")

# job NAME SCRIPT [script args]
job() {
  local name=$1 script=$2
  shift 2
  if [ "$ONLY" != "  " ]; then
    case "$ONLY" in *" $name "*) ;; *) return ;; esac
  fi
  if [ "$SECONDS" -ge "$BUDGET_S" ]; then
    say "== $name: SKIPPED (time budget spent)"
    return
  fi
  local dir="$OUTDIR/traces/$name-${NPROC}r" tmp="$OUTDIR/tmp-$name" t0=$SECONDS
  say "== $name ($NPROC ranks): unprofiled: $script $* --steps 30 --time-steps 20"
  run "${TORCHRUN[@]}" "$script" "$@" --steps 30 --time-steps 20
  say "== $name: capture: tracedx capture --wait 2 --warmup 1 --steps 4 $script -- $* --steps 10"
  rm -rf "$tmp" "$dir"
  run "${TORCHRUN[@]}" -m tracedx capture --out "$tmp" --wait 2 --warmup 1 --steps 4 \
    "$script" -- "$@" --steps 10
  local rc=$?
  mkdir -p "$dir"
  local f r
  for f in "$tmp"/*-rank*.json.gz; do
    [ -e "$f" ] || continue
    r=${f##*-rank}
    mv "$f" "$dir/rank$r"
  done
  rm -rf "$tmp"
  say "== $name: rc=$rc, $(ls "$dir" | wc -l) traces, $(du -sk "$dir" | cut -f1) kB, $((SECONDS - t0)) s"
  if [ -n "$(ls "$dir")" ]; then
    run $PY -m tracedx diagnose "$dir"
  fi
}

say "== host: $(hostname) $(date -u +%FT%TZ), $NPROC processes"
$PY -c 'import torch, sys; print("== torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0], "gpus", torch.cuda.device_count(), torch.cuda.get_device_name() if torch.cuda.is_available() else None)' 2>&1 | tee -a "$LOG"
[ "${NGPU:-0}" -gt 0 ] && nvidia-smi topo -m 2>&1 | tee -a "$LOG"

# name                      script                        args
job ddp-balanced            capture/ddp_mlp.py
job ddp-host-straggler      capture/ddp_mlp.py            --straggler-rank 1 --host-ms 4
job ddp-data-straggler      capture/ddp_mlp.py            --straggler-rank 1 --batch-scale 1.5
job ddp-one-bucket          capture/ddp_mlp.py            --bucket-cap-mb 100000
job fsdp2-default           capture/fsdp2_transformer.py
job fsdp2-no-prefetch       capture/fsdp2_transformer.py  --no-prefetch
job fsdp2-no-reshard        capture/fsdp2_transformer.py  --no-reshard
job tp-mlp                  capture/tp_mlp.py

if [ "$ONLY" = "  " ] || [[ "$ONLY" == *" busbw "* ]]; then
  say "== busbw: allreduce_busbw.py (1 MiB to 1 GiB)"
  run "${TORCHRUN[@]}" capture/allreduce_busbw.py --out "$OUTDIR/allreduce-busbw-${NPROC}r.json"
fi

(cd "$OUTDIR/traces" && ls -lR) | tee -a "$LOG"
tar -C "$OUTDIR" -cf "$OUTDIR/traces-${NPROC}r.tar" traces && rm -rf "$OUTDIR/traces"
say "== done in $SECONDS s"
