# What scripts/lab-*-check.sh share, sourced from the repository root: the lab cluster of
# ../shared/lab (KUBECONFIG, kubectl on PATH), timestamped lines, waiting, the lab's pod shape, and
# the fixture's device nodes made on the host (the pods' runtime opens the host paths).
LAB=${LAB:-/opt/k8s-lab-1.36}
export KUBECONFIG=$LAB/kubeconfig/admin.kubeconfig PATH=$LAB/bin:$PATH
ts() { date +%H:%M:%S.%3N; }
say() { echo "$(ts) $*"; }
waitfor() {  # seconds, command...: true once the command succeeds, false after the seconds
  local n=$1; shift; local end=$((SECONDS + n))
  until "$@" >/dev/null 2>&1; do (( SECONDS >= end )) && return 1; sleep 0.5; done
}
running() { [[ $(kubectl get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
lab_pod() {  # name, shell command, resources (flow YAML), [pod spec lines]: the manifest
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  hostNetwork: true
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
${4:-}
  containers:
  - {name: bb, image: lab.local/busybox:1.36, imagePullPolicy: Never, command: [sh, -c, "$2"], resources: $3}
YAML
}
# The ResourceClaimTemplate "edgetpu" (one Edge TPU through the shipped DeviceClass), and a pod
# (name) whose container lists the TPU it got and sleeps, with a claim made from it.
claim_template() {
  cat <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: edgetpu}
spec: {spec: {devices: {requests: [{name: tpu, exactly: {deviceClassName: edgetpu.edgeaccel.io}}]}}}
YAML
}
claim_pod() {
  lab_pod "$1" "ls -l /dev/apex*; sleep 3600" "{claims: [{name: tpu}]}" \
    "  resourceClaims: [{name: tpu, resourceClaimTemplateName: edgetpu}]"
}
# The fixture's PCIe Edge TPUs (apex_0 120:0, apex_1 120:1), and with "usb" its USB Accelerator
# (bus 2, device 3: 189:130).
make_device_nodes() {
  for i in 0 1; do [[ -e /dev/apex_$i ]] || mknod -m 0640 /dev/apex_$i c 120 $i; done
  if [[ ${1:-} == usb ]]; then
    mkdir -p /dev/bus/usb/002
    [[ -e /dev/bus/usb/002/003 ]] || mknod -m 0664 /dev/bus/usb/002/003 c 189 130
  fi
}
