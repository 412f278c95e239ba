#!/usr/bin/env bash
# The KubeRay job in order, so that no GPU pod waits on what a CPU pod can do first:
#   1. the secrets: the judge's key (required) and a gated model's token (optional);
#   2. the prefetch Job (groundcover-prefetch.yaml) onto the shared volume, waited for: a Job
#      that fails ends the wait at once, with its log;
#   3. the RayJob (groundcover-rayjob.yaml), deleted first where an earlier one is left: a
#      finished RayJob applied again does not run again. Run again after a failure: the run
#      resumes.
#   scripts/kuberay/submit.sh [NAMESPACE]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ns=(--namespace "${1:-default}")
if ! kubectl get secret groundcover-serve-key "${ns[@]}" >/dev/null 2>&1; then
  echo "submit: no secret groundcover-serve-key: kubectl create secret generic groundcover-serve-key --from-literal=key=\$(openssl rand -hex 32)" >&2
  exit 1
fi
kubectl get secret hf-token "${ns[@]}" >/dev/null 2>&1 \
  || echo "submit: no secret hf-token: a gated model (Llama) cannot be fetched without it" >&2
kubectl delete job groundcover-prefetch "${ns[@]}" --ignore-not-found >/dev/null
kubectl apply "${ns[@]}" -f "$here/groundcover-prefetch.yaml"
# Complete or Failed, whichever comes first (waiting for the condition complete alone would wait
# out its whole timeout on a Job that failed)
deadline=$((SECONDS + 6 * 3600))
while :; do
  state=$(kubectl get job groundcover-prefetch "${ns[@]}" \
    -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}')
  case " $state " in
    *" Complete "*) break ;;
    *" Failed "*)
      echo "submit: the prefetch Job failed; its log:" >&2
      kubectl logs "${ns[@]}" job/groundcover-prefetch --tail=50 >&2 || true
      exit 1 ;;
  esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "submit: the prefetch Job did not finish in 6 h: kubectl logs job/groundcover-prefetch" >&2
    exit 1
  fi
  sleep 10
done
kubectl delete rayjob groundcover-comprehensiveness "${ns[@]}" --ignore-not-found >/dev/null
kubectl apply "${ns[@]}" -f "$here/groundcover-rayjob.yaml"
