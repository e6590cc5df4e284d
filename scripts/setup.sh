#!/usr/bin/env bash
# Host set-up for otelbpf on Debian 12, in two sizes (idempotent: safe and fast to re-run):
#   scripts/setup.sh          what the demo and `otelbpf run` need (scripts/demo.sh runs it)
#   scripts/setup.sh --test   that, plus what the test suite needs (scripts/test.sh runs it)
#   scripts/setup.sh --bench  --test's, plus the load generator bench/ drives HTTP with (wrk)
# It runs as root; started as a user it runs itself again under sudo.
#
# What it does, and why:
#   1. apt packages: BCC (bpfcc-tools, python3-bpfcc, libbpfcc), a C toolchain for the example
#      libraries (build-essential), python3-venv.  With --test also: libibverbs (libibverbs1,
#      ibverbs-providers, libibverbs-dev: the ibverbs examples and tests), golang-go, tmux, chromium,
#      prometheus (promtool and the server the straggler rules are tested with).  With --bench
#      also wrk (bench/http.py and bench/ring_size.py's HTTP/1 load; 0.3 MB).
#      apt-get runs only when something is missing.
#   2. kernel headers BCC compiles against: linux-headers-$(uname -r) when Debian has it; otherwise
#      (custom kernels such as this 6.18 VM) linux-headers-<arch> and /lib/modules/$(uname -r)/{build,source}
#      linked to the newest installed ones.  That is a fallback: struct layouts in those headers are
#      not the running kernel's, which is fine because otelbpf never reads kernel structs.
#   3. tracefs at /sys/kernel/tracing and debugfs at /sys/kernel/debug (BCC attaches, and detaches
#      uprobes, through them).
#   4. .venv at the repo root (OTELBPF_VENV moves it) that can `import bcc` (Debian ships it only for
#      the system python), with otelbpf installed editable: with the `demo` extra (the real CUDA 12
#      runtime the demo drives, the MCP SDK for `otelbpf mcp`), or with --test the `test` extra
#      (re-installed only when pyproject.toml changes or --test asks for more than is there).
#   5. otelbpf on the PATH: /usr/local/bin/otelbpf (OTELBPF_BIN_DIR moves it), a link to
#      .venv/bin/otelbpf, so the README's commands work as written, also under sudo (Debian's
#      secure_path has /usr/local/bin).  A file there that is not such a link is left alone, and said.
#
# Downloads on a fresh Debian 12 (see the README's "Two commands" for how they were measured): the
# demo's set-up 155 MB of apt packages and 47 MB of wheels; --test 264 MB and 643 MB more.
set -euo pipefail

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

test_tools=0
bench_tools=0
for arg in "$@"; do
  case $arg in
    --test) test_tools=1 ;;
    --bench) test_tools=1 bench_tools=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) die "unknown option $arg (scripts/setup.sh [--test|--bench])" ;;
  esac
done

if [[ $(id -u) -ne 0 ]]; then  # it installs packages, mounts tracefs and links kernel headers
  command -v sudo >/dev/null || die "must run as root (it installs packages, mounts tracefs and links kernel headers)"
  log "not root: running again under sudo"
  exec sudo --preserve-env=OTELBPF_VENV,OTELBPF_BIN_DIR -- bash "$(readlink -f "$0")" "$@"
fi

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${OTELBPF_VENV:-$REPO_ROOT/.venv}
BIN_DIR=${OTELBPF_BIN_DIR:-/usr/local/bin}
KREL=$(uname -r)
ARCH=$(dpkg --print-architecture)
MODDIR="/lib/modules/$KREL"
export DEBIAN_FRONTEND=noninteractive

is_installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == 'install ok installed' ]]; }

# True when BCC can find a kernel build tree for the running kernel.
headers_present() { [[ -d "$MODDIR/build/include" ]]; }

# --- 1 + 2: packages -------------------------------------------------------------------------
wanted=(bpfcc-tools python3-bpfcc libbpfcc build-essential python3-venv)
if ((test_tools)); then
  # libibverbs1 + ibverbs-providers + libibverbs-dev: the real RDMA verbs library the ibverbs probes
  # attach to, and the headers examples/ibverbs/ builds its provider stand-in against;
  # golang-go: `go tool pprof`, the pprof consumer the profile tests read with;
  # tmux: the terminal the `otelbpf top` tests type into and read back;
  # chromium: the headless browser the report page is drawn in (tests/test_report_chromium.py;
  # 113 MB download, 414 MB on disk, ~14 s to install here);
  # prometheus: promtool for the NCCL straggler rules and the real server the fleet test scrapes with
  wanted+=(libibverbs1 ibverbs-providers libibverbs-dev golang-go tmux chromium prometheus)
fi
((bench_tools)) && wanted+=(wrk)
missing=()
for pkg in "${wanted[@]}"; do is_installed "$pkg" || missing+=("$pkg"); done

header_pkg=""
headers_fallback=0
if ! headers_present; then
  apt-get update -qq
  if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then
    header_pkg="linux-headers-$KREL"
  else
    header_pkg="linux-headers-$ARCH"
    headers_fallback=1
    log "Debian has no linux-headers-$KREL (custom kernel); falling back to $header_pkg"
  fi
  is_installed "$header_pkg" || missing+=("$header_pkg")
fi

if ((${#missing[@]})); then
  [[ -n $header_pkg ]] || apt-get update -qq
  log "installing: ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "apt packages already installed: ${wanted[*]}"
fi

if ((headers_fallback)); then
  newest=$(find /usr/src -maxdepth 1 -name "linux-headers-*-$ARCH" -printf '%f\n' | sort -V | tail -n1)
  [[ -n $newest ]] || die "no /usr/src/linux-headers-*-$ARCH after installing linux-headers-$ARCH"
  common="${newest%-"$ARCH"}-common"
  [[ -d /usr/src/$common ]] || die "/usr/src/$common is missing (it comes with /usr/src/$newest)"
  mkdir -p "$MODDIR"
  ln -sfn "/usr/src/$newest" "$MODDIR/build"
  ln -sfn "/usr/src/$common" "$MODDIR/source"
fi
headers_present || die "$MODDIR/build has no include/ after installing headers; BCC cannot compile"

build_target=$(readlink -f "$MODDIR/build")
headers_release=$(sed -n 's/^#define UTS_RELEASE "\(.*\)"$/\1/p' "$build_target/include/generated/utsrelease.h" 2>/dev/null || true)
if [[ $headers_release == "$KREL" ]]; then
  log "kernel headers: $MODDIR/build -> $build_target (matches the running kernel)"
else
  log "kernel headers: $MODDIR/build -> $build_target (${headers_release:-unknown release})"
  log "  FALLBACK: these are not $KREL's headers; BCC compiles against them, but their struct layouts"
  log "  are not the running kernel's. otelbpf never reads kernel structs, so probes are unaffected."
fi

# --- 3: tracefs / debugfs --------------------------------------------------------------------
mount_if_absent() {  # fstype mountpoint
  if mountpoint -q "$2"; then
    log "$1 already mounted at $2"
  else
    mount -t "$1" nodev "$2" || die "cannot mount $1 at $2 (in a container: mount it on the host or run privileged)"
    log "mounted $1 at $2"
  fi
}
mount_if_absent tracefs /sys/kernel/tracing
mount_if_absent debugfs /sys/kernel/debug

# --- 4: venv that sees BCC, with otelbpf installed ---------------------------------------------
if [[ ! -x $VENV/bin/python ]]; then
  log "creating $VENV with $(command -v python3) ($(python3 --version))"
  python3 -m venv "$VENV"
fi

bpfcc_files=$(dpkg -L python3-bpfcc)
bcc_init=$(grep '/bcc/__init__\.py$' <<<"$bpfcc_files" | sort | tail -n1) \
  || die "python3-bpfcc ships no bcc/__init__.py; reinstall it: apt-get install --reinstall python3-bpfcc"
bcc_pkg=$(dirname "$bcc_init")
# Expose only the bcc package, not the rest of the system dist-packages: a directory holding one
# symlink, put on sys.path by a .pth file.
bcc_dir="$VENV/system-bcc"
mkdir -p "$bcc_dir"
ln -sfn "$bcc_pkg" "$bcc_dir/bcc"
site_packages=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$bcc_dir" >"$site_packages/otelbpf-system-bcc.pth"
bcc_version=$("$VENV/bin/python" -c 'import bcc; print(bcc.__version__)') \
  || die "$VENV/bin/python cannot import bcc from $bcc_pkg (is libbpfcc installed?)"
log "venv $VENV sees bcc $bcc_version from $bcc_pkg"

# The stamp holds pyproject.toml's hash and the extra installed: `test` holds all of `demo`'s
# packages, so a venv set up for the tests serves the demo as it is.
stamp="$VENV/.otelbpf-install-stamp"
extra=demo
((test_tools)) && extra=test
pyproject_hash=$(sha256sum "$REPO_ROOT/pyproject.toml" | cut -d' ' -f1)
had_hash="" had_extra=""
[[ -f $stamp ]] && read -r had_hash had_extra <"$stamp"
if [[ $had_hash == "$pyproject_hash" && ($had_extra == "$extra" || $had_extra == test) ]]; then
  log "otelbpf already installed in $VENV with the ${had_extra} extra (pyproject.toml unchanged)"
else
  log "installing otelbpf (editable) with the $extra extra into $VENV"
  "$VENV/bin/python" -m pip install -qq --disable-pip-version-check -e "$REPO_ROOT[$extra]"
  printf '%s %s\n' "$pyproject_hash" "$extra" >"$stamp"
fi

# --- 5: otelbpf on the PATH ------------------------------------------------------------------
shim="$BIN_DIR/otelbpf"
if [[ -e $shim && ! -L $shim ]]; then
  log "NOT linking $shim: a file that is not a link is there (another install?); use $VENV/bin/otelbpf"
else
  mkdir -p "$BIN_DIR"
  ln -sfn "$VENV/bin/otelbpf" "$shim"
  log "otelbpf on the PATH: $shim -> $VENV/bin/otelbpf ($("$shim" --version))"
  case ":$PATH:" in *":$BIN_DIR:"*) ;; *) log "  $BIN_DIR is not on this shell's PATH: add it, or call $shim" ;; esac
fi
log "done"
