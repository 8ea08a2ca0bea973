"""Assembles the image's root filesystem in a directory (the final stage copies it onto an
empty image): only what pyflannel runs, taken from the build stage's installed Debian packages.

What goes in:
- the commands flanneld, flannelctl and upstream's manifests run: python3.11, ip and bridge,
  iptables and ip6tables in both variants (legacy and nft, with -save and -restore, and the
  plain names, Debian's nft default), nft, and dash as /bin/sh with coreutils' cat, cp and
  sleep (the kustomization's init container runs cp, minikube's a shell loop, the etcd
  functional test cat);
- the ipsec backend's strongSwan (STRONGSWAN): charon where Go flannel's search finds it,
  swanctl (to look at charon's SAs), Debian's strongswan.conf with charon's and swanctl's own
  settings, and only the plugins the backend uses, each with its file under
  strongswan.d/charon (charon loads modularly: a plugin loads when its file says so);
- every file of Python's standard library packages (libpython3.11-minimal, -stdlib) but for
  those nothing here loads (STDLIB_EXCLUDES), the xtables extension modules both iptables
  variants load, iproute2's tables;
- the shared libraries all of these load, found by ldd, and the ELF interpreter, and those
  the extension modules under each LIBRARIES_OF directory load (the virtualenv: its wheels'
  own libraries are inside it, but they may load system ones too);
- the CA bundle where OpenSSL looks for it, and the few files of /etc that glibc, Python and
  the tools read (users, groups, name service, protocols and services, the OS release);
- a dpkg status entry for each package that gave a file (/var/lib/dpkg/status.d, as
  distroless images have), so image scanners know what the image carries.
Every symbolic link on a path is kept as a link and followed. The build stage's own files
(pip, the compiler of bytecode, apt, perl) never reach the directory.

Usage: python3 assemble-root.py TARGET [LIBRARIES_OF...] (TARGET must not exist).
Must not touch: anything outside TARGET.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

MULTIARCH = sysconfig.get_config_var("MULTIARCH")
PYTHON = "python3.11"

COMMANDS = [
    "/usr/bin/python3", f"/usr/bin/{PYTHON}",
    "/usr/bin/ip", "/usr/sbin/bridge", "/usr/sbin/nft",
    *(f"/usr/sbin/{name}{variant}{action}" for name in ("iptables", "ip6tables")
      for variant in ("", "-legacy", "-nft") for action in ("", "-save", "-restore")),
    "/bin/sh", "/usr/bin/cat", "/usr/bin/cp", "/usr/bin/sleep",
    "/usr/lib/ipsec/charon", "/usr/sbin/swanctl",
]
# charon's plugins for the ipsec backend: its sockets and the kernel's IPsec (netlink, or
# kernel-libipsec's userspace ESP where the kernel has none, loaded by flanneld's own
# strongswan.conf), the VICI socket flanneld talks to, and the crypto of PSK-authenticated
# IKEv2 and ESP (openssl for every proposal, Go's IKE aes256-sha256-modp4096 and ESP
# aes128gcm16-sha256-prfsha256-ecp256 included, with strongSwan's own aes, sha1, sha2, hmac,
# gcm and gmp as Debian loads them too; kdf for prf+, nonce, random and drbg). Certificates,
# EAP, updown scripts and the rest of Debian's plugins serve nothing the backend configures.
STRONGSWAN_PLUGINS = ("kernel-netlink", "kernel-libipsec", "socket-default", "vici",
                      "openssl", "aes", "sha1", "sha2", "hmac", "gcm", "gmp", "kdf", "nonce",
                      "random", "drbg")
STRONGSWAN = [
    # glibc loads libgcc_s (no ldd shows it) when charon and swanctl cancel their threads as
    # they stop: without it they abort instead of removing their TUN device, routes and SAs.
    f"/usr/lib/{MULTIARCH}/libgcc_s.so.1",
    "/etc/strongswan.conf", "/etc/strongswan.d/charon.conf",
    "/etc/strongswan.d/charon-logging.conf", "/etc/strongswan.d/swanctl.conf",
    *(path for plugin in STRONGSWAN_PLUGINS
      for path in (f"/usr/lib/ipsec/plugins/libstrongswan-{plugin}.so",
                   f"/etc/strongswan.d/charon/{plugin}.conf")),
]
DATA = [
    f"/usr/lib/{MULTIARCH}/xtables/*.so", "/etc/iproute2/*", "/etc/iproute2/*/*",
    "/usr/lib/ssl/cert.pem", "/usr/lib/ssl/certs", "/usr/lib/ssl/openssl.cnf",
    "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/protocols",
    "/etc/services", "/etc/os-release", "/etc/debian_version",
]
# The image's own directories (made empty in TARGET, never used here).
DIRECTORIES = {"/tmp": 0o1777, "/var/tmp": 0o1777, "/run": 0o755, "/root": 0o700,  # noqa: S108
               "/opt": 0o755, "/proc": 0o755, "/sys": 0o755, "/dev": 0o755}
LINKS = {"/var/run": "/run"}
STDLIB_PACKAGES = (f"lib{PYTHON}-minimal", f"lib{PYTHON}-stdlib")
# What nothing in the image loads: CPython's own tests and their extension modules, help()'s
# topics, the East Asian codecs (flanneld reads and writes UTF-8 and ASCII only, and with no
# locales Python's encoding is UTF-8 whatever the environment says), and the modules whose
# libraries are heavy and serve only interactive or database use: dbm (Berkeley DB), nis
# (Kerberos), sqlite3, curses and readline.
STDLIB_EXCLUDES = (*(f"/usr/lib/{PYTHON}/{pattern}" for pattern in (
    "test/*", "pydoc_data/*", "lib-dynload/_test*", "lib-dynload/_ctypes_test*",
    "lib-dynload/_xxtestfuzz*", "lib-dynload/xxlimited*", "lib-dynload/_codecs_*",
    "lib-dynload/_multibytecodec*", "lib-dynload/_dbm.*", "lib-dynload/nis.*",
    "lib-dynload/_sqlite3.*", "sqlite3/*", "lib-dynload/_curses*", "curses/*",
    "lib-dynload/readline.*")), "/usr/share/*")


class Root:
    def __init__(self, target: str) -> None:
        self.target = target
        self.done: set[str] = set()

    def inside(self, path: str) -> str:
        return self.target + path

    def directory(self, path: str) -> None:
        """``path`` (links resolved) and its parents, with the build stage's modes."""
        if path == "/" or os.path.isdir(self.inside(path)):
            return
        self.directory(os.path.dirname(path))
        os.mkdir(self.inside(path))
        shutil.copystat(path, self.inside(path))

    def add(self, path: str) -> None:
        """``path`` as the build stage has it: a link stays a link and what it names is
        added too; a directory is made empty; a file is copied, with the libraries an ELF
        file loads."""
        parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        real = os.path.join(parent, os.path.basename(path))
        if real in self.done:
            return
        self.done.add(real)
        self.directory(parent)
        if os.path.islink(real):
            link = os.readlink(real)
            os.symlink(link, self.inside(real))
            self.add(os.path.join(parent, link))
        elif os.path.isdir(real):
            self.directory(real)
        elif os.path.isfile(real):
            shutil.copy2(real, self.inside(real))
            for library in loaded_libraries(real):
                self.add(library)
        else:
            raise SystemExit(f"assemble-root: {path} is neither a file, a directory nor a link")


def loaded_libraries(path: str) -> list[str]:
    """The shared objects an ELF file loads (ldd), the ELF interpreter included."""
    with open(path, "rb") as file:
        if file.read(4) != b"\x7fELF":
            return []
    result = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
    if "not a dynamic executable" in result.stdout + result.stderr \
            or "statically linked" in result.stdout:
        return []
    if result.returncode != 0 or "not found" in result.stdout:
        raise SystemExit(f"assemble-root: ldd {path}: {result.stdout}{result.stderr}")
    found = []
    for line in result.stdout.splitlines():
        words = line.split()
        if "=>" in words and words[words.index("=>") + 1].startswith("/"):
            found.append(words[words.index("=>") + 1])
        elif words and words[0].startswith("/"):
            found.append(words[0])
    return found


def package_files(package: str) -> list[str]:
    listing = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    return [path for path in listing
            if not any(fnmatch.fnmatchcase(path, pattern) for pattern in STDLIB_EXCLUDES)
            and (os.path.islink(path) or os.path.isfile(path))]


def owners() -> dict[str, str]:
    """Each installed file or link (the directories on its path resolved) and the package
    it came from."""
    owner: dict[str, str] = {}
    for listing in glob.glob("/var/lib/dpkg/info/*.list"):
        package = os.path.basename(listing).removesuffix(".list").split(":")[0]
        with open(listing) as file:
            for line in file:
                path = line.rstrip("\n")
                parent = os.path.realpath(os.path.dirname(path) or "/")
                real = os.path.join(parent, os.path.basename(path))
                # Directories are shared by many packages: only files and links tell.
                if not os.path.isdir(real):
                    owner.setdefault(real, package)
    return owner


def write_status(root: Root) -> None:
    """One dpkg status stanza per package that gave a file, as distroless images have them."""
    owner = owners()
    # The CA bundle is made by ca-certificates' configuration, so no package lists it.
    packages = sorted({owner[path] for path in root.done if path in owner}
                      | {"ca-certificates"})
    status = root.inside("/var/lib/dpkg/status.d")
    os.makedirs(status, mode=0o755)
    for package in packages:
        stanza = subprocess.run(["dpkg-query", "-s", package], capture_output=True, text=True,
                                check=True).stdout
        with open(os.path.join(status, package), "x") as file:
            file.write(stanza)


def main(target: str, libraries_of: list[str]) -> None:
    os.mkdir(target, 0o755)
    root = Root(target.rstrip("/"))
    # The merged-/usr links (/bin, /sbin, /lib, /lib64, ...) first: every path under them
    # is copied at its place under /usr.
    for name in sorted(os.listdir("/")):
        if os.path.islink(f"/{name}") and os.readlink(f"/{name}").startswith("usr/"):
            root.add(f"/{name}")
    for path in COMMANDS:
        root.add(path)
    for package in STDLIB_PACKAGES:
        for path in package_files(package):
            root.add(path)
    for pattern in [*DATA, *STRONGSWAN]:
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise SystemExit(f"assemble-root: nothing matches {pattern}")
        for path in matches:
            root.add(path)
    for path, mode in DIRECTORIES.items():
        root.directory(path)
        os.chmod(root.inside(path), mode)
    for path, link in LINKS.items():
        root.directory(os.path.dirname(path))
        os.symlink(link, root.inside(path))
    for top in libraries_of:
        for directory, _, files in sorted(os.walk(top)):
            for name in sorted(files):
                path = os.path.join(directory, name)
                if not os.path.islink(path):
                    for library in loaded_libraries(path):
                        if not library.startswith(top):
                            root.add(library)
    write_status(root)
    size = sum(os.lstat(os.path.join(d, f)).st_size
               for d, _, files in os.walk(target) for f in files)
    print(f"assemble-root: {len(root.done)} paths, {size / 1e6:.1f} MB in {target}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or not all(arg.startswith("/") for arg in sys.argv[1:]):
        raise SystemExit("usage: assemble-root.py TARGET [LIBRARIES_OF...] (absolute paths)")
    main(sys.argv[1], sys.argv[2:])
