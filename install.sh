#!/usr/bin/env bash
# Installs what pyflannel needs on a Debian machine, idempotently:
# the system packages (a real etcd, the CNI plugins, the kernel tools) and a
# virtualenv at .venv holding pyflannel with its test extras.
set -euo pipefail
cd "$(dirname "$0")"

packages=(
    etcd-server etcd-client containernetworking-plugins iproute2 iptables nftables
    iputils-ping iperf3 wireguard-tools wireguard-go openssl procps
    # The ipsec backend: strongSwan's charon with VICI, its crypto (AES-GCM, ECP, MODP) and
    # kernel-libipsec (userspace ESP: this kernel has none); swanctl to look at it.
    strongswan-charon libstrongswan-standard-plugins libcharon-extra-plugins strongswan-swanctl
    # The image and plain-host tests: buildah builds from a debootstrap base, in a chroot.
    buildah debootstrap util-linux ca-certificates
    # Other architectures' Debian roots run under qemu-user-static, called explicitly
    # (tests/integration/test_foreign_arches.py). Without its recommends (binfmt-support),
    # installing it registers no binfmt handler.
    qemu-user-static file
    # The vm lane (tests/vm): Debian's own kernel, whose ipip, wireguard and ESP modules this
    # host's kernel may lack, booted by virtme-ng (the test extra) over the host's root file
    # system in qemu; busybox for virtme-ng's initramfs. The kernel package only adds files
    # (/boot, /lib/modules, an initramfs no boot loader here reads): the running kernel and
    # its boot setup are not changed.
    qemu-system-x86 linux-image-amd64 busybox-static
)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# pyflannel (the runtime package, with its test extras) and flannel-lab (lab/, a distribution
# of its own: the lab never enters pyflannel's wheel or image).
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' -e ./lab
