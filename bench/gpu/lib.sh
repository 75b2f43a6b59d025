# Sourced by bench/gpu/run.sh and bench/gpu/models.sh once LOG is set.
#
# The NVIDIA libraries memsh loads at run time, exported where the
# machine's loader would not find them (PyTorch's image keeps cuBLAS in its
# wheel): MEMSH_LIBCUBLAS, MEMSH_LIBCUDA, MEMSH_LIBNVML, unless already set.
if [ -z "${MEMSH_LIBCUBLAS:-}" ]; then
  lib=$(find /opt /usr/local /usr/lib -name 'libcublas.so.1[0-9]' -print 2>/dev/null | head -1)
  [ -n "$lib" ] && export MEMSH_LIBCUBLAS=$lib
fi
for v in MEMSH_LIBCUDA:libcuda.so.1 MEMSH_LIBNVML:libnvidia-ml.so.1; do
  var=${v%%:*} name=${v#*:}
  if [ -z "${!var:-}" ] && ! ldconfig -p 2>/dev/null | grep -q "$name"; then
    lib=$(find /usr/local/nvidia /usr/lib /usr/local -name "$name" 2>/dev/null | head -1)
    [ -n "$lib" ] && export "$var=$lib"
  fi
done

# step NAME SECONDS FILE CMD...: runs CMD with its stdout appended to FILE
# and its stderr to $LOG, for at most SECONDS — cut to what is left of
# $BUDGET seconds since the script started when BUDGET is set, and skipped
# when under 10 s is left — between two "===" lines (FILE and $LOG) that
# give its start, exit status and duration.
step() {
  local name=$1 secs=$2 file=$3; shift 3
  if [ -n "${BUDGET:-}" ]; then
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 10 ]; then echo "=== $name: skipped, $left s left" | tee -a "$file" >>"$LOG"; return; fi
    [ "$secs" -gt "$left" ] && secs=$left
  fi
  echo "=== $name ($(date +%T), limit $secs s)" | tee -a "$file" >>"$LOG"
  local t0=$SECONDS
  timeout "$secs" "$@" >>"$file" 2>>"$LOG"
  local rc=$?
  echo "=== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$file" >>"$LOG"
}
