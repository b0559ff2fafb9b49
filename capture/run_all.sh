#!/usr/bin/env bash
# Capture every workload of this folder with `tracedx capture --time-unprofiled` and run
# `tracedx calibrate`: the commands that made sample_traces/ on the H200.
#
#   bash capture/run_all.sh OUTDIR [PART] [NAME...]
#
# PART is 1 to 6 or all (each part fits a 10-minute run; "all" is all six); NAMEs,
# when given, pick captures by name instead. Each capture goes to OUTDIR/traces/<name>.json.gz
# and its output to OUTDIR/log-<part>.txt; the traces are then bundled into
# OUTDIR/traces-<part>.tar. Each capture is limited to CAP_TIMEOUT (default 150) s; once BUDGET_S (default 540)
# seconds have passed, the remaining captures are skipped (and listed in the log).
set -u
OUTDIR=${1:?usage: run_all.sh OUTDIR [PART] [NAME...]}
PART=${2:-all}
shift $(($# >= 2 ? 2 : $#))
ONLY=" $* "
BUDGET_S=${BUDGET_S:-540}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR/traces"
LOG="$OUTDIR/log-$PART.txt"
: >"$LOG"
cd "$(dirname "$0")/.."

say() { echo "$*" | tee -a "$LOG"; }

# cap NAME PART WAIT WARMUP ACTIVE K [capture options] -- SCRIPT [script args]
cap() {
  local name=$1 part=$2 wait=$3 warmup=$4 active=$5 k=$6
  shift 6
  if [ "$ONLY" != "  " ]; then
    case "$ONLY" in *" $name "*) ;; *) return ;; esac
  elif [ "$PART" != all ] && [ "$PART" != "$part" ]; then
    return
  fi
  if [ "$SECONDS" -ge "$BUDGET_S" ]; then
    say "== $name: SKIPPED (time budget spent)"
    return
  fi
  local tmp="$OUTDIR/tmp-$name"
  rm -rf "$tmp"
  say "== $name: tracedx capture --wait $wait --warmup $warmup --steps $active --time-unprofiled $k $*"
  local t0=$SECONDS
  timeout -s INT "${CAP_TIMEOUT:-150}" $PY -m tracedx.cli capture --out "$tmp" --wait "$wait" --warmup "$warmup" \
    --steps "$active" --time-unprofiled "$k" "$@" 2>&1 | grep -v '^USDT:' | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  local f
  f=$(ls "$tmp"/*.json.gz 2>/dev/null | head -1)
  if [ -n "$f" ]; then
    mv "$f" "$OUTDIR/traces/$name.json.gz"
    say "== $name: rc=$rc, $(stat -c %s "$OUTDIR/traces/$name.json.gz") bytes, $((SECONDS - t0)) s"
  else
    say "== $name: rc=$rc, NO TRACE, $((SECONDS - t0)) s"
  fi
  rm -rf "$tmp"
}

say "== host: $(hostname) $(date -u +%FT%TZ)"
$PY -c 'import torch, sys; print("== torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0], "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)' 2>&1 | tee -a "$LOG"

# name                    part wait warmup active K
cap matmul-bf16              1 1 1 5 20 -- capture/matmul.py --steps 25
cap matmul-fp32              1 1 1 5 20 -- capture/matmul.py --dtype fp32 --n 4096 --steps 25
cap matmul-tf32              1 1 1 5 20 -- capture/matmul.py --dtype fp32 --n 4096 --tf32 --steps 25
cap mlp_train-eager          1 2 1 5 50 -- capture/mlp_train.py --steps 60
cap mlp_train-cudagraph      1 2 1 5 50 --marker explicit -- capture/mlp_train.py --cuda-graph --steps 60
cap decode-eager             1 2 1 4 20 -- capture/decode.py --steps 30
cap decode-static            1 2 1 4 20 -- capture/decode.py --static-cache --steps 30
cap decode-cudagraph         1 2 1 4 20 -- capture/decode.py --cuda-graph --steps 30
cap add_loop-eager           1 2 1 4 20 -- capture/add_loop.py --steps 30
cap add_loop-cudagraph       1 2 1 4 20 -- capture/add_loop.py --cuda-graph --steps 30
cap elementwise-eager        1 2 1 5 20 -- capture/elementwise.py --steps 30
cap elementwise-compile      1 3 1 5 20 -- capture/elementwise.py --compile --steps 30
cap attention-naive          2 1 1 5 20 -- capture/attention.py --steps 25
cap attention-sdpa           2 1 1 5 20 -- capture/attention.py --sdpa --steps 25
cap h2d_copy-pageable        2 1 1 5 20 -- capture/h2d_copy.py --steps 25
cap h2d_copy-pinned          2 1 1 5 20 -- capture/h2d_copy.py --pinned --steps 25
cap item_loop-sync           2 2 1 3 10 -- capture/item_loop.py --steps 15
cap item_loop-nosync         2 2 1 3 10 -- capture/item_loop.py --no-sync --steps 15
cap resnet_train-fp32        2 3 1 4 20 -- capture/resnet_train.py --steps 25
cap resnet_train-bf16-cl     2 3 1 4 20 -- capture/resnet_train.py --bf16 --channels-last --steps 25
cap resnet_train-notf32      2 3 1 4 20 -- capture/resnet_train.py --no-tf32 --steps 25
cap mlp_large-fp32           2 2 1 3 10 -- capture/mlp_train.py --width 8192 --batch 2048 --steps 14
cap mlp_large-bf16           2 2 1 3 10 -- capture/mlp_train.py --width 8192 --batch 2048 --bf16 --steps 14
cap convnet_dataloader-main  2 2 1 3 10 -- capture/convnet_dataloader.py --steps 14
cap convnet_dataloader-workers 2 2 1 3 10 -- capture/convnet_dataloader.py --workers 8 --pin-memory --steps 14
cap convnet_dataloader-workers-pageable 2 2 1 3 10 -- capture/convnet_dataloader.py --workers 8 --steps 14
# part 3 (session 3, issue 16): a Hugging Face model, .item() either way, larger batches
cap gpt2_train-eager         3 2 1 3 10 --profile-memory -- capture/gpt2_train.py --steps 16
cap gpt2_train-compile       3 2 1 3 10 -- capture/gpt2_train.py --compile --steps 16
cap gpt2_decode-eager        3 2 1 4 20 -- capture/gpt2_decode.py --steps 30
cap gpt2_decode-compile      3 2 1 4 20 -- capture/gpt2_decode.py --compile --steps 30
cap item_loop-host-sync      3 2 1 3 10 -- capture/item_loop.py --host-us 100 --iters 100 --steps 15
cap item_loop-host-nosync    3 2 1 3 10 -- capture/item_loop.py --host-us 100 --iters 100 --no-sync --steps 15
cap item_loop-big-sync       3 2 1 3 10 -- capture/item_loop.py --size 4194304 --iters 100 --steps 15
cap item_loop-big-nosync     3 2 1 3 10 -- capture/item_loop.py --size 4194304 --iters 100 --no-sync --steps 15
cap mlp_train-b64            3 2 1 5 50 --profile-memory -- capture/mlp_train.py --steps 60
cap mlp_train-b128           3 2 1 5 50 --profile-memory -- capture/mlp_train.py --batch 128 --steps 60
cap mlp_mid-b1024            3 2 1 5 30 --profile-memory -- capture/mlp_train.py --width 4096 --batch 1024 --bf16 --steps 40
cap mlp_mid-b2048            3 2 1 5 30 --profile-memory -- capture/mlp_train.py --width 4096 --batch 2048 --bf16 --steps 40
cap mlp_large-b2048          3 2 1 3 10 --profile-memory -- capture/mlp_train.py --width 8192 --batch 2048 --bf16 --steps 14
cap mlp_large-b4096          3 2 1 3 10 --profile-memory -- capture/mlp_train.py --width 8192 --batch 4096 --bf16 --steps 14
cap mlp_mid-b512             3 2 1 5 30 --profile-memory -- capture/mlp_train.py --width 4096 --batch 512 --bf16 --steps 40
cap gpt2_train-eager-b16     3 2 1 3 10 --profile-memory -- capture/gpt2_train.py --batch 16 --steps 16

# part 4 (session 12): library models the estimates were not made on (torchvision, transformers)
cap vit_train-fp32           4 2 1 3 10 -- capture/vision_train.py --model vit_b_16 --steps 16
cap vit_train-bf16           4 2 1 3 10 -- capture/vision_train.py --model vit_b_16 --bf16 --steps 16
cap vit_train-tf32           4 2 1 3 10 -- capture/vision_train.py --model vit_b_16 --tf32 --steps 16
cap resnet50_train-fp32      4 2 1 3 10 -- capture/vision_train.py --model resnet50 --steps 16
cap resnet50_train-bf16-cl   4 2 1 3 10 -- capture/vision_train.py --model resnet50 --bf16 --channels-last --steps 16
cap llama_train-eager        4 2 1 3 10 --profile-memory -- capture/llama_train.py --steps 16
cap llama_train-b8           4 2 1 3 10 --profile-memory -- capture/llama_train.py --batch 8 --steps 16
cap llama_train-compile      4 2 1 3 10 -- capture/llama_train.py --compile --steps 16
# part 5 (session 13): more held-out library models (transformers BERT; torchvision ResNet-50 batch)
cap bert_train-fp32          5 2 1 3 10 -- capture/bert_train.py --steps 16
cap bert_train-tf32          5 2 1 3 10 -- capture/bert_train.py --tf32 --steps 16
cap bert_train-bf16          5 2 1 3 10 --profile-memory -- capture/bert_train.py --bf16 --steps 16
cap bert_train-bf16-b64      5 2 1 3 10 --profile-memory -- capture/bert_train.py --bf16 --batch 64 --steps 16
cap resnet50_train-bf16-b32  5 2 1 3 10 --profile-memory -- capture/vision_train.py --model resnet50 --bf16 --channels-last --steps 16
cap resnet50_train-bf16-b64  5 2 1 3 10 --profile-memory -- capture/vision_train.py --model resnet50 --bf16 --channels-last --batch 64 --steps 16
# part 6 (session 16): torch.compile on held-out library models, each pair captured together
cap bert_train-bf16-eager    6 2 1 3 10 -- capture/bert_train.py --bf16 --steps 16
cap bert_train-bf16-compile  6 2 1 3 10 -- capture/bert_train.py --bf16 --compile --steps 16
cap vit_train-bf16-eager     6 2 1 3 10 -- capture/vision_train.py --model vit_b_16 --bf16 --steps 16
cap vit_train-bf16-compile   6 2 1 3 10 -- capture/vision_train.py --model vit_b_16 --bf16 --compile --steps 16

if [ "$PART" = 2 ] || [ "$PART" = all ]; then
  if [ "$ONLY" = "  " ] || [[ "$ONLY" == *" calibrate "* ]]; then
    say "== calibrate"
    timeout 120 $PY -m tracedx.cli calibrate --out "$OUTDIR/calibration-h200.json" 2>&1 | tee -a "$LOG"
  fi
fi

(cd "$OUTDIR/traces" && ls -l) | tee -a "$LOG"
tar -C "$OUTDIR" -cf "$OUTDIR/traces-$PART.tar" traces && rm -rf "$OUTDIR/traces"
say "== done in $SECONDS s"
