# Sourced by scripts/setup.sh and scripts/setup_vllm_cpu.sh (issue 59): install Python packages into a venv with uv,
# pip as the fallback.
#
#   ORCH_SETUP_INSTALLER=uv   (the default) uv, falling back to pip if uv cannot be had or its install fails
#   ORCH_SETUP_INSTALLER=pip  pip alone, as before uv
#
# uv is the exact version scripts/constraints.txt pins (uv==...; also orch's dev dependency, so the install keeps it):
# the one in the venv, in .venv or on PATH if it is that version, else installed into the venv by pip first. uv does not
# read pip's configuration, so it is handed pip's package sources where uv's own variables do not set them:
# find-links (UV_FIND_LINKS), index-url (UV_INDEX_URL / UV_DEFAULT_INDEX), extra-index-url (UV_EXTRA_INDEX_URL /
# UV_INDEX; then also pip's rule of the best version across indexes, UV_INDEX_STRATEGY) and cert (SSL_CERT_FILE), read
# from pip's config files and PIP_* variables (`pip config list`). That is how uv finds what pip finds, torch 2.13.0's
# CPU build in this machine's find-links among it (PyPI's torch 2.13.0 for Linux is a multi-GB CUDA build). uv
# compiles the installed packages' bytecode as pip does (--compile-bytecode: PYTHONDONTWRITEBYTECODE machines would
# otherwise compile them in every process).
#
# Each attempt's output goes to VENV/setup.log (kept: uv and pip run quietly). When neither uv nor pip reaches the
# package registry, one line says so and the script exits 1.
#
#   installer_run VENV INSTALL_WITH_UV INSTALL_WITH_PIP   # each a function of the calling script; see setup.sh

ORCH_SETUP_INSTALLER=${ORCH_SETUP_INSTALLER:-uv}
case $ORCH_SETUP_INSTALLER in
  uv | pip) ;;
  *) echo "$(basename "$0"): ORCH_SETUP_INSTALLER must be uv or pip, not '$ORCH_SETUP_INSTALLER'" >&2; exit 2 ;;
esac
_installer_me=$(basename "$0")
# What a failure to reach an index looks like in pip's and uv's output
# What a failure to reach an index looks like in pip's and uv's output, the most telling first
_installer_net=('Connection refused' 'Name or service not known' 'Temporary failure in name resolution'
  'Network is unreachable' 'No route to host' 'Connection reset' 'timed out' 'Cannot connect to proxy' 'ProxyError'
  'certificate verify failed' 'invalid peer certificate' 'dns error' 'tcp connect error'
  'Failed to establish a new connection' 'error sending request')

_installer_net_reason() {  # LOG: the most telling sign in LOG (a file, or - for stdin) that the registry was not
  # reached, or nothing
  local text sign
  text=$(cat "$1" 2>/dev/null || true)
  for sign in "${_installer_net[@]}"; do
    if [[ $text == *"$sign"* ]]; then
      printf '%s\n' "$sign"
      return 0
    fi
  done
}

_installer_pip_option() {  # VENV OPTION: the value pip takes for OPTION (find-links, index-url, ...): its PIP_*
  # variable, else the install section's, else the global section's (the last config file's line wins)
  local listed
  listed=$("$1/bin/python" -m pip config list 2>/dev/null) || return 0
  local line
  for section in ':env:' install global; do
    line=$(printf '%s\n' "$listed" | grep -F "$section.$2=" | tail -1 || true)
    if [ -n "$line" ]; then
      line=${line#*=\'}
      printf '%s\n' "${line%\'}"
      return 0
    fi
  done
}

_installer_uv_sources() {  # VENV: fill _installer_uv_args with pip's package sources that uv's own settings leave unset
  _installer_uv_args=()
  local value item
  if [ -z "${UV_FIND_LINKS:-}" ]; then
    value=$(_installer_pip_option "$1" find-links)
    for item in $value; do _installer_uv_args+=(--find-links "$item"); done
  fi
  if [ -z "${UV_INDEX_URL:-}${UV_DEFAULT_INDEX:-}" ]; then
    value=$(_installer_pip_option "$1" index-url)
    [ -z "$value" ] || _installer_uv_args+=(--index-url "$value")
  fi
  if [ -z "${UV_EXTRA_INDEX_URL:-}${UV_INDEX:-}" ]; then
    value=$(_installer_pip_option "$1" extra-index-url)
    for item in $value; do _installer_uv_args+=(--extra-index-url "$item"); done
    if [ -n "$value" ] && [ -z "${UV_INDEX_STRATEGY:-}" ]; then
      _installer_uv_args+=(--index-strategy unsafe-best-match)
    fi
  fi
  if [ -z "${SSL_CERT_FILE:-}" ]; then
    value=$(_installer_pip_option "$1" cert)
    [ -z "$value" ] || [ ! -f "$value" ] || export SSL_CERT_FILE="$value"
  fi
}

pip_run() {  # pip's install or uninstall into $INSTALLER_VENV, quiet, its output appended to the log
  "$INSTALLER_VENV/bin/python" -m pip "$1" --quiet "${@:2}" >> "$INSTALLER_VENV/setup.log" 2>&1
}

uv_run() {  # uv pip's install or uninstall into $INSTALLER_VENV, with pip's sources, its output appended to the log
  local extra=()
  [ "$1" != install ] || extra=(--compile-bytecode "${_installer_uv_args[@]}")
  "$_installer_uv" pip "$1" --quiet --python "$INSTALLER_VENV/bin/python" "${extra[@]}" "${@:2}" \
    >> "$INSTALLER_VENV/setup.log" 2>&1
}

_installer_find_uv() {  # VENV: set _installer_uv to a uv of the pinned version, installing it with pip if need be
  local want candidate
  want=$(sed -n 's/^uv==\([0-9][0-9.]*\).*/\1/p' scripts/constraints.txt)
  _installer_uv=
  for candidate in "$1/bin/uv" .venv/bin/uv "$(command -v uv || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] \
        && [ "$("$candidate" --version 2>/dev/null | cut -d' ' -f2)" = "$want" ]; then
      _installer_uv=$candidate
      return 0
    fi
  done
  if pip_run install "uv==$want"; then
    _installer_uv="$1/bin/uv"
    return 0
  fi
  _installer_uv_failure="pip could not install uv $want"
  return 1
}

_installer_registry_error() {  # UV_REASON PIP_REASON: the one line when neither reached the registry; exit 1
  local index
  index=$(_installer_pip_option "$INSTALLER_VENV" index-url)
  echo "$_installer_me: error: cannot reach the package registry (${index:-https://pypi.org/simple}) with uv or" \
    "pip (uv: $1; pip: $2): check the network and proxy, or point UV_INDEX_URL and PIP_INDEX_URL at a reachable" \
    "index (details: $INSTALLER_VENV/setup.log)" >&2
  exit 1
}

installer_run() {  # VENV WITH_UV WITH_PIP: run WITH_UV (uv_run ...) or, failing that or with ORCH_SETUP_INSTALLER=pip,
  # WITH_PIP (pip_run ...); exit 1 with pip's last lines, or one line if neither reached the registry
  INSTALLER_VENV=$1
  : > "$INSTALLER_VENV/setup.log"
  local uv_reason=""
  if [ "$ORCH_SETUP_INSTALLER" = uv ]; then
    if _installer_find_uv "$INSTALLER_VENV"; then
      _installer_uv_sources "$INSTALLER_VENV"
      echo "== uv $("$_installer_uv" --version | cut -d' ' -f2) ($_installer_uv)" >> "$INSTALLER_VENV/setup.log"
      if "$2"; then
        INSTALLER_USED="uv $("$_installer_uv" --version | cut -d' ' -f2)"
        return 0
      fi
      uv_reason=$(_installer_net_reason "$INSTALLER_VENV/setup.log")
      echo "$_installer_me: uv failed (${uv_reason:-$(tail -1 "$INSTALLER_VENV/setup.log")}); installing with pip" >&2
      uv_reason=${uv_reason:+uv ran: $uv_reason}
    else
      uv_reason=$_installer_uv_failure
      if [ -n "$(_installer_net_reason "$INSTALLER_VENV/setup.log")" ]; then  # pip could not fetch uv: no use retrying
        _installer_registry_error "$uv_reason" "$(_installer_net_reason "$INSTALLER_VENV/setup.log")"
      fi
      echo "$_installer_me: could not install uv with pip ($(tail -1 "$INSTALLER_VENV/setup.log")); installing with pip" >&2
    fi
  fi
  echo "== pip" >> "$INSTALLER_VENV/setup.log"
  if "$3"; then
    INSTALLER_USED="pip $("$INSTALLER_VENV/bin/python" -m pip --version | cut -d' ' -f2)"
    return 0
  fi
  local pip_reason
  pip_reason=$(tac "$INSTALLER_VENV/setup.log" | sed '/^== pip$/q' | _installer_net_reason -)
  if [ -n "$pip_reason" ] && { [ "$ORCH_SETUP_INSTALLER" = pip ] || [ -n "$uv_reason" ]; }; then
    _installer_registry_error "${uv_reason:-not used (ORCH_SETUP_INSTALLER=pip)}" "$pip_reason"
  fi
  echo "$_installer_me: pip failed; its last lines ($INSTALLER_VENV/setup.log has all):" >&2
  tail -20 "$INSTALLER_VENV/setup.log" >&2
  exit 1
}
