# Shared install steps for scripts/test.sh and scripts/demo.sh (sourced, not run).

ensure_system_packages() {
  # Debian packages: openssh-server (the simulated hosts run real sshd), git.
  local missing=()
  [ -x /usr/sbin/sshd ] || command -v sshd >/dev/null || missing+=(openssh-server)
  command -v git >/dev/null || missing+=(git)
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

ensure_venv() {
  # A project-local virtualenv with orch installed (editable) plus the given extras.
  if [ ! -x .venv/bin/python ]; then
    python3 -c 'import venv, ensurepip' 2>/dev/null || ensure_system_packages
    python3 -m venv .venv
  fi
  .venv/bin/python -m pip install -q --disable-pip-version-check -e "$1"
}

ensure_image_tools() {
  # Debian packages for the container image test (issue 29): podman with runc (crun fails on these
  # machines), mmdebstrap to make the image's base from Debian packages (no image registry is reachable).
  local missing=()
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || missing+=(runc)
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

pip_quietly() {
  # `PYTHON -m pip install -q ARGS...`, without pip's resolver report about a package installed with
  # --no-deps (the conformance tier installs sglang so: "ERROR: pip's dependency resolver ..." and one
  # "sglang X requires Y, which is not installed." line per requirement, ~60, on every later install).
  # Also left out: "sglang X requires Y, but you have Z which is incompatible" (the CPU torch), and the
  # notes this machine's pip configuration makes about its local index folders. Every other line of pip's
  # stderr is kept, and pip's exit code is returned.
  local python=$1 log rc=0
  shift
  log=$(mktemp)
  "$python" -m pip install -q --disable-pip-version-check "$@" 2>"$log" || rc=$?
  grep -v -e "^ERROR: pip's dependency resolver does not currently take into account" \
    -e "^sglang [^ ]* requires .*, which is not installed\.$" \
    -e "^sglang [^ ]* requires .*, but you have .* which is incompatible\.$" \
    -e "^WARNING: Location 'file:.*' is ignored: it is neither a file nor a directory\.$" "$log" >&2 || true
  rm -f "$log"
  return "$rc"
}
