# Sourced by the manifest and chart checks. write_kustomization DIR BASE COMPONENT...: writes
# DIR/kustomization.yaml, manifests/BASE (base, or overlays/NAME) with the named components of
# manifests/components, in that order; paths relative to DIR. Run from the repository root.
write_kustomization() {
  local dir=$1 base=$2 up component
  shift 2
  mkdir -p "$dir"
  up=$(realpath -m --relative-to="$dir" .)
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "  - $up/manifests/$base"
    echo "components:"
    for component in "$@"; do echo "  - $up/manifests/components/$component"; done
  } > "$dir/kustomization.yaml"
}
