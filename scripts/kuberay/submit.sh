#!/usr/bin/env bash
# The KubeRay job in order, so that no GPU pod waits on what a CPU pod can do first:
#   1. the secrets: the judge's key (required) and a gated model's token (optional);
#   2. the prefetch Job (groundcover-prefetch.yaml) onto the shared volume, waited for;
#   3. the RayJob (groundcover-rayjob.yaml). Run again after a failure: the run resumes.
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
if ! kubectl wait "${ns[@]}" --for=condition=complete --timeout=6h job/groundcover-prefetch; then
  echo "submit: the prefetch Job did not complete: kubectl logs job/groundcover-prefetch" >&2
  exit 1
fi
kubectl apply "${ns[@]}" -f "$here/groundcover-rayjob.yaml"
