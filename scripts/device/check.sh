#!/usr/bin/env bash
# The on-device check, run from the device bundle (scripts/device/bundle.sh) on a GPU machine:
#
#   bash target/device-bundle/check.sh          # results in $OUT (default: <bundle>/out)
#
# Within MUON_CHECK_BUDGET_S seconds (default 480): records the environment and where NVRTC,
# cuBLAS and libnccl.so.2 were found (CUDA toolkit first, then Python site-packages); runs every
# GPU test executable; measures the optimizer's step (muon-opt measure: bf16 Newton–Schulz on
# 16 llama3-8b-like layers, standard then Gram, then f32 on 2); runs a small optimizer loop under
# compute-sanitizer (memcheck, then racecheck and synccheck while time remains). Writes
# $OUT/device-run.json (the schema of docs/device-run.md), $OUT/device-run-gram.json,
# $OUT/device-run-f32.json, $OUT/summary.txt and $OUT/check.log.
# Without a GPU it prints "no GPU: skipped (...)" and exits 0.
set -uo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
budget="${MUON_CHECK_BUDGET_S:-480}"
deadline=$((SECONDS + budget))
out="${OUT:-$bundle/out}"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$out/check.log"
: >"$log"
date_utc="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
say() { printf '%s\n' "$*" | tee -a "$log"; }
left() { echo $((deadline - SECONDS)); }
# Seconds for the next step: at most $1, and never past the deadline minus a reserve of $2 for
# the steps after it; 0 when fewer than 10 remain (the step is then not run: `timeout 0` would
# mean no limit at all).
slot() { local s=$(( $(left) - $2 )); [ "$s" -gt "$1" ] && s=$1; [ "$s" -lt 10 ] && s=0; echo "$s"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    "$bundle/bin/muon-opt" measure --out "$out/device-run.json" --date "$date_utc" | tee -a "$log"
    grep -q '^no GPU: skipped' "$log" || say "no GPU: skipped (nvidia-smi finds no GPU)"
    exit 0
fi

# The test executables read tests/data and kernels/ from the checkout path compiled into them.
manifest="$(cat "$bundle/manifest_dir")"
if [ ! -d "$manifest/tests/data" ]; then
    repo="$(cd "$bundle/../.." && pwd)"
    mkdir -p "$(dirname "$manifest")" && ln -sfn "$repo" "$manifest"
    say "linked $manifest -> $repo (the test executables' data paths)"
fi

# --- environment and libraries
env_file="$work/env.txt"
put() { printf '%s=%s\n' "$1" "$2" >>"$env_file"; say "$1: $2"; }
put gpu "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
put nvidia_smi_cuda "$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
put nvcc "$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1)"
put os "$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
put glibc "$(ldd --version 2>/dev/null | head -1)"
put bundle_commit "$(cat "$bundle/commit")"
toolkit_dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
mapfile -t site_dirs < <(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
# find_lib NAME: the first directory holding NAME, toolkit first, then site-packages/nvidia/*/lib.
find_lib() {
    local d
    for d in "${toolkit_dirs[@]}"; do [ -e "$d/$1" ] && { echo "toolkit $d"; return; }; done
    for d in "${site_dirs[@]}"; do
        for l in "$d"/nvidia/*/lib; do [ -e "$l/$1" ] && { echo "site-packages $l"; return; }; done
    done
    echo "missing -"
}
lib_path=()
for lib in libnvrtc.so.13 libcublas.so.13 libnccl.so.2; do
    read -r where dir < <(find_lib "$lib")
    put "$lib" "$where $dir"
    [ "$where" != missing ] && lib_path+=("$dir")
done
for inc in /usr/local/cuda/include "${site_dirs[@]/%//nvidia/cu13/include}"; do
    [ -f "$inc/cuda_bf16.h" ] && { export MUON_CUDA_INCLUDE_DIR="$inc"; break; }
done
put cuda_include "${MUON_CUDA_INCLUDE_DIR:-missing}"
if [ "${#lib_path[@]}" -gt 0 ]; then
    LD_LIBRARY_PATH="$(IFS=:; echo "${lib_path[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
fi
export MUON_REQUIRE_NVRTC=1

# --- GPU tests
# --show-output: each test's SKIPPED notice (no device, no NCCL) in its own output section.
for t in cuda_gpu kernels_nvrtc cuda_no_gpu; do
    s=$(slot 150 270)
    say "== tests/$t (timeout ${s}s)"
    if [ "$s" -eq 0 ]; then echo "exit out-of-time" >"$work/test-$t.out"; continue; fi
    timeout "$s" "$bundle/tests/$t" --test-threads=1 --show-output >"$work/test-$t.out" 2>&1
    echo "exit $?" >>"$work/test-$t.out"
    cat "$work/test-$t.out" >>"$log"
    grep -E '^test .* \.\.\. |^SKIPPED|^exit ' "$work/test-$t.out"
done

# --- the measured step
s=$(slot 150 120)
say "== muon-opt measure (bf16 Newton-Schulz, 16 layers; timeout ${s}s)"
[ "$s" -gt 0 ] && timeout "$s" "$bundle/bin/muon-opt" measure --out "$work/measure.json" --date "$date_utc" 2>&1 | tee -a "$log"
s=$(slot 90 60)
say "== muon-opt measure (bf16 Gram Newton-Schulz, 16 layers; timeout ${s}s)"
[ "$s" -gt 0 ] && timeout "$s" "$bundle/bin/muon-opt" measure --ns-method gram \
    --out "$out/device-run-gram.json" --date "$date_utc" 2>&1 | tee -a "$log"
s=$(slot 60 40)
say "== muon-opt measure (f32 Newton-Schulz, 2 layers; timeout ${s}s)"
[ "$s" -gt 0 ] && timeout "$s" "$bundle/bin/muon-opt" measure --ns-precision f32 --layers 2 \
    --out "$out/device-run-f32.json" --date "$date_utc" 2>&1 | tee -a "$log"

# --- compute-sanitizer over a small optimizer loop
for tool in memcheck racecheck synccheck; do
    s=$(slot 150 15)
    if [ "$s" -lt 30 ] || ! command -v compute-sanitizer >/dev/null 2>&1; then
        echo "$tool not_run 0 $( [ "$s" -lt 30 ] && echo "out of time" || echo "compute-sanitizer not found")" >>"$work/sanitizer.txt"
        continue
    fi
    say "== compute-sanitizer --tool $tool (timeout ${s}s)"
    # Only the library's kernels (muon_*) are instrumented: the first run (bench/device/
    # 2026-11-28-h200.json) counted NCCL's own cudaFuncGetAttributes probes as memcheck errors,
    # and racecheck's target died and synccheck's hung inside NCCL's kernels. The library checks
    # the status of every CUDA call it makes itself, so API errors are not reported.
    NCCL_DEBUG=WARN timeout "$s" compute-sanitizer --tool "$tool" --kernel-name kns=muon_ --report-api-errors no \
        "$bundle/bin/muon-opt" measure --small --layers 2 --warmup 1 --steps 1 >"$work/san-$tool.out" 2>&1
    rc=$?
    cat "$work/san-$tool.out" >>"$log"
    summary="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$work/san-$tool.out" | tail -1)"
    errors="$(printf '%s' "$summary" | grep -oE '[0-9]+ (error|hazard)' | head -1 | cut -d' ' -f1)"
    if grep -q 'Internal Sanitizer Error' "$work/san-$tool.out"; then
        # The tool itself failed (on the H200 of 2026-11-28 racecheck did, whichever one kernel
        # it instrumented, muon_step_scalars too): not a finding about the kernels.
        echo "$tool failed 0 $(grep -m1 'Internal Sanitizer Error' "$work/san-$tool.out")" >>"$work/sanitizer.txt"
    elif [ "${errors:-0}" -gt 0 ]; then
        echo "$tool errors $errors $summary" >>"$work/sanitizer.txt"
    elif [ -n "$summary" ] && [ "$rc" -eq 0 ]; then
        echo "$tool clean 0 $summary" >>"$work/sanitizer.txt"
    else
        echo "$tool failed 0 exit $rc: $(tail -3 "$work/san-$tool.out" | tr '\n' ' ')" >>"$work/sanitizer.txt"
    fi
done

# --- one JSON: the measurement with the environment, the tests and the sanitizer added
python3 - "$work" "$out" "$date_utc" <<'PY' | tee -a "$log"
import json, os, re, sys
work, out, date = sys.argv[1:4]
path = os.path.join(work, "measure.json")
if os.path.exists(path):
    run = json.load(open(path))
else:
    run = {"schema_version": 1, "date": date, "status": "failed", "skipped": "muon-opt measure wrote no result (see check.log)",
           "predicted_with": "h100-nvlink", "op_classes": [], "references": []}
run["environment"] = dict(l.rstrip("\n").split("=", 1) for l in open(os.path.join(work, "env.txt")) if "=" in l)
tests = []
for name in sorted(os.listdir(work)):
    m = re.match(r"test-(.*)\.out$", name)
    if not m:
        continue
    text = open(os.path.join(work, name)).read()
    skipped = set(re.findall(r"^SKIPPED (\S+?):", text, re.M))
    for test, status in re.findall(r"^test (\S+) \.\.\. (ok|FAILED|ignored)", text, re.M):
        tests.append({"suite": m.group(1), "name": test,
                      "status": "skip" if test in skipped or status == "ignored" else ("pass" if status == "ok" else "fail")})
    code = re.findall(r"^exit (\S+)$", text, re.M)
    if code and code[-1] != "0" and not any(t["suite"] == m.group(1) and t["status"] == "fail" for t in tests):
        tests.append({"suite": m.group(1), "name": "(executable)", "status": "fail"})
run["tests"] = tests
san = []
if os.path.exists(os.path.join(work, "sanitizer.txt")):
    for line in open(os.path.join(work, "sanitizer.txt")):
        tool, status, errors, summary = (line.rstrip("\n").split(" ", 3) + [""])[:4]
        san.append({"tool": tool, "status": status, "errors": int(errors), "summary": summary})
run["sanitizer"] = san
json.dump(run, open(os.path.join(out, "device-run.json"), "w"), indent=2)
lines = [f"device run {run['date']}: {run['status']}  gpu {run['environment'].get('gpu', '?')}"]
count = {s: sum(t["status"] == s for t in tests) for s in ("pass", "fail", "skip")}
lines.append(f"tests: {count['pass']} pass, {count['fail']} fail, {count['skip']} skip")
lines += [f"  FAIL {t['suite']}::{t['name']}" for t in tests if t["status"] == "fail"]
if run.get("step"):
    st = run["step"]
    lines.append(f"step: measured {st['measured_ms']:.2f} ms, model {st['predicted_ms']:.2f} ms ({run['predicted_with']})")
gram_path = os.path.join(out, "device-run-gram.json")
if os.path.exists(gram_path) and json.load(open(gram_path)).get("step"):
    st = json.load(open(gram_path))["step"]
    lines.append(f"step with Gram Newton-Schulz: measured {st['measured_ms']:.2f} ms, model {st['predicted_ms']:.2f} ms")
for c in run["op_classes"][:12]:
    r = c.get("ratio")
    lines.append(f"  {c['class']:<44} {c['measured_ms']:10.3f} ms  ratio {r:.2f}" if r else f"  {c['class']:<44} {c['measured_ms']:10.3f} ms")
lines += [f"sanitizer {s['tool']}: {s['status']} ({s['errors']}) {s['summary']}" for s in san]
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
say "check.sh done in ${SECONDS}s of ${budget}s"
# What comes back is limited to 16 MiB a file: keep the log's first and last 7 MiB.
if [ "$(stat -c %s "$log")" -gt $((15 << 20)) ]; then
    { head -c $((7 << 20)) "$log"; printf '\n[... check.log cut to its first and last 7 MiB ...]\n'; tail -c $((7 << 20)) "$log"; } >"$work/log"
    mv "$work/log" "$log"
fi
