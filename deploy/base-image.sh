#!/usr/bin/env bash
# Build the devcoord runtime base image without any container registry.
#
# debootstraps a minimal Debian bookworm root filesystem that already contains
# the shared libraries devcoord links against (so images built FROM it need no
# network), strips docs/caches and `docker import`s it.
#
# Idempotent: if the image already exists, it only prints its name.
# Run as root on a Debian bookworm host with a running Docker engine.
#
# Environment overrides:
#   BASE_IMAGE       image name              (default devcoord-base:bookworm)
#   SUITE            Debian suite            (default bookworm)
#   MIRROR           Debian mirror           (default: from host apt sources,
#                                             else http://deb.debian.org/debian)
#   SECURITY_MIRROR  security mirror         (default: from host apt sources,
#                                             else http://deb.debian.org/debian-security)
#   SECURITY_UPGRADE 1 = apply bookworm-updates/-security inside the rootfs
#                    before import (default 1; 0 = plain debootstrap content)
#   EXTRA_PACKAGES   extra comma-separated packages for --include
#   REBUILD          1 = rebuild even if the image exists (replaces the tag)
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-devcoord-base:bookworm}"
SUITE="${SUITE:-bookworm}"
SECURITY_UPGRADE="${SECURITY_UPGRADE:-1}"
REBUILD="${REBUILD:-0}"

# Runtime libraries (the Debian runtime packages behind libnng-dev,
# libprotobuf-c-dev, libyaml-dev; libnng1 1.5.2 links mbedTLS 2.28:
# libmbedtls14, libmbedx509-1, libmbedcrypto7), libssl3 (TLS on the workers'
# data link, common/dltls.c) plus procps for
# pgrep/ps-based health checks. No ca-certificates: devcoord does not use TLS
# to the outside world.
RUNTIME_PACKAGES="libnng1,libmbedtls14,libmbedx509-1,libmbedcrypto7,libssl3,libprotobuf-c1,libyaml-0-2,procps"
INCLUDE="${RUNTIME_PACKAGES}${EXTRA_PACKAGES:+,${EXTRA_PACKAGES}}"

log() { printf '[base-image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ ${EUID} -eq 0 ]] || die "must run as root"
command -v docker >/dev/null 2>&1 || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "docker engine not reachable"

# Serialise concurrent runs (e.g. two deploys started at once).
exec 9>/run/lock/devcoord-base-image.lock
flock 9

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

OLD_ID=""
if image_exists "${BASE_IMAGE}"; then
  if [[ ${REBUILD} != 1 ]]; then
    log "image ${BASE_IMAGE} already exists; nothing to do (REBUILD=1 to force)"
    echo "${BASE_IMAGE}"
    exit 0
  fi
  OLD_ID="$(docker image inspect -f '{{.Id}}' "${BASE_IMAGE}")"
fi

# --- (a) debootstrap ---------------------------------------------------------
if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends debootstrap debian-archive-keyring >/dev/null
fi

# --- mirror discovery from the host's apt sources ----------------------------
# Prints the first URI of an enabled "deb" source that serves suite $1.
# Understands both deb822 (*.sources) and one-line (*.list) formats.
find_mirror() {
  local want="$1" f
  local -a files=()
  [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]})) || return 0
  for f in "${files[@]}"; do
    if [[ $f == *.sources ]]; then
      # Stanzas are separated by blank lines; keys are case-insensitive.
      awk -v want="$want" '
        function flush() {
          if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " want " ") && uris != "") {
            split(uris, u, " "); print u[1]; found = 1; exit
          }
          types = ""; suites = ""; uris = ""; enabled = ""
        }
        /^[[:space:]]*#/ { next }
        /^[[:space:]]*$/ { flush(); next }
        {
          line = $0; key = tolower(line); sub(/:.*/, "", key)
          val = line; sub(/^[^:]*:[[:space:]]*/, "", val); gsub(/[[:space:]]+/, " ", val)
          if (key == "types") types = val
          else if (key == "suites") suites = val
          else if (key == "uris") uris = val
          else if (key == "enabled") enabled = tolower(val)
        }
        END { if (!found) flush() }
      ' "$f"
    else
      # deb [opts] URI suite component...
      sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
        awk -v want="$want" '$1 == "deb" && $3 == want { print $2; exit }'
    fi
  done | grep -E '^(https?|file)://' | head -n1 || true
}

MIRROR="${MIRROR:-$(find_mirror "${SUITE}")}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${SECURITY_MIRROR:-$(find_mirror "${SUITE}-security")}"
SECURITY_MIRROR="${SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
MIRROR="${MIRROR%/}"
SECURITY_MIRROR="${SECURITY_MIRROR%/}"
log "mirror: ${MIRROR}  security: ${SECURITY_MIRROR}"

# --- build the rootfs ----------------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/devcoord-rootfs.XXXXXX")"
ROOT="${WORK}/rootfs"
cleanup() {
  local m
  # debootstrap unmounts what it mounted, but be safe before rm -rf.
  if [[ -d ${ROOT} ]]; then
    for m in $(awk -v r="${ROOT}" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r); do
      umount -l "$m" 2>/dev/null || true
    done
  fi
  rm -rf --one-file-system "${WORK}"
}
trap cleanup EXIT

log "debootstrap --variant=minbase ${SUITE} (include: ${INCLUDE})"
if ! debootstrap --variant=minbase --include="${INCLUDE}" \
    "${SUITE}" "${ROOT}" "${MIRROR}" >"${WORK}/debootstrap.log" 2>&1; then
  tail -n 30 "${WORK}/debootstrap.log" >&2
  [[ -f ${ROOT}/debootstrap/debootstrap.log ]] && tail -n 30 "${ROOT}/debootstrap/debootstrap.log" >&2
  die "debootstrap failed"
fi

# apt sources inside the image: main + updates + security (deb822, like the
# official debian images).
rm -f "${ROOT}/etc/apt/sources.list"
cat >"${ROOT}/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: ${MIRROR}
Suites: ${SUITE} ${SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${SECURITY_MIRROR}
Suites: ${SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF

# Container-friendly apt/dpkg defaults (as in the official debian images), so
# images derived FROM this one stay small too.
cat >"${ROOT}/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
cat >"${ROOT}/etc/apt/apt.conf.d/docker-no-languages" <<'EOF'
Acquire::Languages "none";
EOF
cat >"${ROOT}/etc/apt/apt.conf.d/docker-gzip-indexes" <<'EOF'
Acquire::GzipIndexes "true";
EOF
cat >"${ROOT}/etc/apt/apt.conf.d/docker-no-recommends" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
cat >"${ROOT}/etc/dpkg/dpkg.cfg.d/docker-excludes" <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/lintian/*
EOF
echo force-unsafe-io >"${ROOT}/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
# Never start services from maintainer scripts inside containers.
cat >"${ROOT}/usr/sbin/policy-rc.d" <<'EOF'
#!/bin/sh
exit 101
EOF
chmod 0755 "${ROOT}/usr/sbin/policy-rc.d"

if [[ ${SECURITY_UPGRADE} == 1 ]]; then
  # debootstrap only installs from ${SUITE} itself; pull in -updates/-security.
  log "applying ${SUITE}-updates/${SUITE}-security upgrades in the rootfs"
  chroot_apt() {
    chroot "${ROOT}" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      DEBIAN_FRONTEND=noninteractive LC_ALL=C \
      apt-get -q -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confold "$@"
  }
  chroot_apt update >"${WORK}/apt.log" 2>&1 &&
    chroot_apt -y upgrade >>"${WORK}/apt.log" 2>&1 ||
    { tail -n 30 "${WORK}/apt.log" >&2; die "apt upgrade inside the rootfs failed"; }
fi

# --- slim down ------------------------------------------------------------------
(
  cd "${ROOT}"
  find usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
  find usr/share/doc -mindepth 1 -type d -empty -delete
  rm -rf usr/share/man/* usr/share/info/* usr/share/lintian/* usr/share/linda/*
  find usr/share/locale -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf var/lib/apt/lists/* var/cache/apt/*.bin var/cache/apt/archives/*.deb \
    var/cache/apt/archives/partial/* var/cache/debconf/*-old var/lib/dpkg/*-old \
    var/log/apt/* var/log/*.log var/cache/ldconfig/aux-cache tmp/* var/tmp/* root/.bash_history
  mkdir -p var/lib/apt/lists/partial
  : >var/log/lastlog; : >var/log/wtmp; : >var/log/btmp; : >var/log/faillog 2>/dev/null || true
  # Host-specific files copied by debootstrap; docker provides these at run time.
  rm -f etc/hostname etc/machine-id
  : >etc/resolv.conf
)

# --- (b) import -------------------------------------------------------------------
log "importing as ${BASE_IMAGE}"
tar -C "${ROOT}" --numeric-owner -cf - . |
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'WORKDIR /' \
    --change 'LABEL org.opencontainers.image.title="devcoord-base" org.opencontainers.image.base.name="debian:'"${SUITE}"'-minbase"' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase --include=${INCLUDE} ${SUITE} ${MIRROR}" \
    - "${BASE_IMAGE}" >/dev/null

image_exists "${BASE_IMAGE}" || die "docker import did not produce ${BASE_IMAGE}"
if [[ -n ${OLD_ID} ]]; then
  # Drop the image we just untagged, unless something still uses it.
  docker image rm "${OLD_ID}" >/dev/null 2>&1 || log "kept previous image ${OLD_ID} (still in use)"
fi
log "done: $(docker image inspect -f '{{.Size}}' "${BASE_IMAGE}" | awk '{ printf "%.1f MB", $1 / 1e6 }')"

# --- (c) ---------------------------------------------------------------------------
echo "${BASE_IMAGE}"
