"""The ``flannel`` CNI plugin: a meta-plugin that hands pods to ``bridge`` + ``host-local``.

Owns the CNI protocol side (environment, netconf on stdin, result or error JSON on stdout),
reading subnet.env, building the delegate config exactly as Go flannel's plugin does, saving
it under ``dataDir/<containerID>`` before the delegate runs (DEL uses that copy, never
subnet.env), and exec'ing the delegate from ``CNI_PATH``.
It is exec'ed once per pod, so it imports only ``os``, ``sys`` and ``flannel.cni.lite``
(no json, ipaddress, subprocess or re: the delegate is started with posix_spawn).
Must not touch: anything but its data dir and the delegate it runs.
"""

from __future__ import annotations

import os
import sys

from flannel.cni import lite
from flannel.version import __version__

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
DEFAULT_SUBNET_FILE = "/run/flannel/subnet.env"
DEFAULT_DATA_DIR = "/var/lib/cni/flannel"

# CNI error codes (spec "Error codes").
INCOMPATIBLE_VERSION, INVALID_ENV, IO_FAILURE, DECODING_FAILURE = 1, 4, 5, 6
INVALID_NETWORK_CONFIG, TRY_AGAIN_LATER, INTERNAL = 7, 11, 999

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class CniError(Exception):
    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details


class DelegateFailed(Exception):
    """The delegate plugin failed; its own output (usually error JSON) is passed through."""

    def __init__(self, output: bytes) -> None:
        super().__init__(output.decode(errors="replace"))
        self.output = output


def parse_subnet_env(path: str) -> dict:
    """Read subnet.env as the Go plugin does; CniError names what is missing.

    Networks and subnets are canonical CIDR strings, masked.
    """
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        raise CniError(TRY_AGAIN_LATER,
                       f"failed to load flannel 'subnet.env' file: open {path}: no such file or "
                       "directory. Check the flannel pod log for this node. (Is flanneld "
                       "running on this node? It writes this file once it holds a lease.)"
                       ) from None
    except OSError as err:
        raise CniError(IO_FAILURE, f"failed to load flannel 'subnet.env' file: open {path}: "
                                   f"{err.strerror}") from None
    env: dict = {"networks": [], "ipv6_networks": [], "subnet": None, "ipv6_subnet": None,
                 "mtu": None, "ipmasq": None}
    try:
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                continue
            if key in ("FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK"):
                target = env["networks" if key == "FLANNEL_NETWORK" else "ipv6_networks"]
                for item in value.split(","):
                    net = lite.parse_cidr(item)
                    if net not in target:
                        target.append(net)
            elif key in ("FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET"):
                env["subnet" if key == "FLANNEL_SUBNET" else "ipv6_subnet"] = \
                    lite.parse_cidr(value)
            elif key == "FLANNEL_MTU":
                if not value.isdigit():
                    raise ValueError(f"FLANNEL_MTU={value!r} is not an unsigned integer")
                env["mtu"] = int(value)
            elif key == "FLANNEL_IPMASQ":
                env["ipmasq"] = value == "true"
    except ValueError as err:
        raise CniError(INTERNAL, f"failed to load flannel 'subnet.env' file: {path}: {err}. "
                                 "Check the flannel pod log for this node.") from None
    missing = []
    if not env["networks"] and not env["ipv6_networks"]:
        missing.append("FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK")
    if env["subnet"] is None and env["ipv6_subnet"] is None:
        missing.append("FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET")
    if env["mtu"] is None:
        missing.append("FLANNEL_MTU")
    if env["ipmasq"] is None:
        missing.append("FLANNEL_IPMASQ")
    if missing:
        raise CniError(INTERNAL, f"failed to load flannel 'subnet.env' file: {path} is missing "
                                 f"{', '.join(missing)}. Check the flannel pod log for this "
                                 "node.")
    return env


def load_netconf(raw: bytes) -> dict:
    try:
        conf = lite.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise CniError(DECODING_FAILURE, f"failed to load netconf: {err}") from None
    if not isinstance(conf, dict):
        raise CniError(DECODING_FAILURE, "failed to load netconf: not a JSON object")
    version = conf.get("cniVersion") or "0.1.0"
    if version not in SUPPORTED_VERSIONS:
        raise CniError(INCOMPATIBLE_VERSION,
                       f"incompatible CNI versions: config is {version!r}, plugin supports "
                       f"{list(SUPPORTED_VERSIONS)}")
    delegate = conf.get("delegate")
    if delegate is not None:
        if not isinstance(delegate, dict):
            raise CniError(INVALID_NETWORK_CONFIG, "'delegate' must be a JSON object")
        if "type" in delegate and not isinstance(delegate["type"], str):
            raise CniError(INVALID_NETWORK_CONFIG,
                           "'delegate' dictionary, if present, must have (string) 'type' field")
        for field in ("name", "ipam"):
            if field in delegate:
                raise CniError(INVALID_NETWORK_CONFIG,
                               f"'delegate' dictionary must not have '{field}' field, it'll be "
                               "set by flannel")
    if conf.get("ipam") is not None and not isinstance(conf["ipam"], dict):
        raise CniError(INVALID_NETWORK_CONFIG, "'ipam' must be a JSON object")
    return conf


def _routes(ipam: dict) -> list:
    routes = ipam.get("routes") or []
    try:
        if not isinstance(routes, list):
            raise ValueError("must be a list")
        out = []
        for route in routes:
            if not isinstance(route, dict) or not isinstance(route.get("dst"), str):
                raise ValueError(f"{lite.dumps(route)} has no \"dst\" string")
            entry = {"dst": lite.parse_cidr(route["dst"])}
            if route.get("gw") is not None:
                entry["gw"] = lite.canonical_ip(route["gw"])
            out.append(entry)
        return out
    except (TypeError, ValueError) as err:
        raise CniError(INVALID_NETWORK_CONFIG,
                       f"failed to read IPAM routes: failed to parse ipam.routes: {err}") from None


def build_delegate(conf: dict, env: dict) -> dict:
    """The delegate config of an ADD (Go plugin's ``doCmdAdd`` for Linux)."""
    delegate = dict(conf.get("delegate") or {})
    delegate["name"] = conf.get("name", "")
    delegate.setdefault("type", "bridge")
    delegate.setdefault("ipMasq", not env["ipmasq"])
    delegate.setdefault("mtu", env["mtu"])
    if delegate["type"] == "bridge":
        delegate.setdefault("isGateway", True)
    if conf.get("cniVersion"):
        delegate["cniVersion"] = conf["cniVersion"]
    if "runtimeConfig" in conf:
        delegate["runtimeConfig"] = conf["runtimeConfig"]
    ipam = dict(conf.get("ipam") or {})
    ipam.setdefault("type", "host-local")
    ipam["ranges"] = [[{"subnet": net}] for net in (env["subnet"], env["ipv6_subnet"])
                      if net is not None]
    ipam["routes"] = _routes(ipam) + [{"dst": net} for net in
                                      env["networks"] + env["ipv6_networks"]]
    delegate["ipam"] = ipam
    return delegate


def encode(doc: dict) -> bytes:
    """JSON as Go marshals a map: sorted keys, compact."""
    return lite.dumps(doc).encode()


def _check_name(what: str, name: str) -> None:
    safe = 0 < len(name) <= 255 and name[0].isascii() and name[0].isalnum() \
        and _NAME_CHARS.issuperset(name)
    if not safe:
        raise CniError(INVALID_ENV if what == "container ID" else INVALID_NETWORK_CONFIG,
                       f"{what} {name!r} is not a safe file name: use letters, digits, '_', '.' "
                       "and '-', starting with a letter or digit")


def save_scratch(data_dir: str, container_id: str, data: bytes) -> None:
    """Write ``data_dir/container_id`` durably and atomically (dir 0700, file 0600)."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    path = os.path.join(data_dir, container_id)
    tmp = os.path.join(data_dir, f".{container_id}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def find_plugin(plugin_type: str, cni_path: str) -> str:
    dirs = [d for d in cni_path.split(":") if d]
    if "/" not in plugin_type:
        for directory in dirs:
            candidate = os.path.join(directory, plugin_type)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    raise CniError(INTERNAL, f'failed to find plugin "{plugin_type}" in path {dirs}; install '
                             "the CNI plugins (Debian: containernetworking-plugins) into a "
                             "directory of CNI_PATH")


def spawn(path: str, data: bytes, env: dict) -> tuple[int, bytes]:
    """Run ``path`` with ``data`` on stdin; (exit status, stdout). Stderr is inherited."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        pid = os.posix_spawn(path, [path], env, file_actions=[
            (os.POSIX_SPAWN_DUP2, in_read, 0), (os.POSIX_SPAWN_DUP2, out_write, 1),
            (os.POSIX_SPAWN_CLOSE, in_write), (os.POSIX_SPAWN_CLOSE, out_read)])
    finally:
        os.close(in_read)
        os.close(out_write)
    try:
        # Configs are far below the pipe's capacity: write all, then read the result.
        os.write(in_write, data)
    finally:
        os.close(in_write)
    chunks = []
    try:
        while chunk := os.read(out_read, 65536):
            chunks.append(chunk)
    finally:
        os.close(out_read)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


def delegate(command: str, conf: bytes, plugin_type: str, environ: dict) -> bytes:
    """Exec the delegate with the CNI environment; its stdout is the result."""
    path = find_plugin(plugin_type, environ.get("CNI_PATH", ""))
    code, output = spawn(path, conf, dict(environ, CNI_COMMAND=command))
    if code != 0:
        raise DelegateFailed(output)
    return output


def _require(environ: dict, *names: str) -> None:
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise CniError(INVALID_ENV, f"required env variables [{','.join(missing)}] missing")


def cmd_add(conf: dict, environ: dict) -> bytes:
    _require(environ, "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH")
    container_id = environ["CNI_CONTAINERID"]
    _check_name("container ID", container_id)
    _check_name("network name", conf.get("name", ""))
    env = parse_subnet_env(conf.get("subnetFile") or DEFAULT_SUBNET_FILE)
    plugin = build_delegate(conf, env)
    data = encode(plugin)
    find_plugin(plugin["type"], environ["CNI_PATH"])
    try:
        save_scratch(conf.get("dataDir") or DEFAULT_DATA_DIR, container_id, data)
    except OSError as err:
        raise CniError(IO_FAILURE, f"failed to save the delegate config for {container_id}: "
                                   f"{err}") from None
    return delegate("ADD", data, plugin["type"], environ)


def cmd_del(conf: dict, environ: dict) -> bytes:
    _require(environ, "CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH")
    container_id = environ["CNI_CONTAINERID"]
    _check_name("container ID", container_id)
    path = os.path.join(conf.get("dataDir") or DEFAULT_DATA_DIR, container_id)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return b""  # never added, or already deleted: DEL is idempotent
    try:
        plugin_type = lite.loads(data)["type"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        print(f"flannel: ignoring unparsable saved config {path}: {err}", file=sys.stderr)
        return b""
    output = delegate("DEL", data, plugin_type, environ)
    # Removed only after the delegate succeeded, so that a retried DEL can still clean up
    # (Go flannel removes it even when the delegate fails, leaking the IP).
    os.unlink(path)
    return output


def version_result(conf_version: str | None) -> bytes:
    return lite.dumps({"cniVersion": conf_version or SUPPORTED_VERSIONS[-1],
                       "supportedVersions": list(SUPPORTED_VERSIONS)}).encode()


def run(environ: dict, stdin: bytes) -> bytes:
    command = environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        try:
            conf_version = lite.loads(stdin).get("cniVersion") if stdin.strip() else None
        except (ValueError, AttributeError, UnicodeDecodeError):
            conf_version = None
        return version_result(conf_version)
    if not command:
        raise CniError(INVALID_ENV, "required env variables [CNI_COMMAND] missing; this is a "
                                    f"CNI plugin ({about()}), run by a container runtime")
    conf = load_netconf(stdin)
    if command == "ADD":
        return cmd_add(conf, environ)
    if command == "DEL":
        return cmd_del(conf, environ)
    if command in ("CHECK", "GC", "STATUS"):
        return b""
    raise CniError(INVALID_ENV, f"unknown CNI_COMMAND: {command}")


def about() -> str:
    machine = os.uname().machine
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    return f"CNI Plugin flannel version {__version__} (linux/{arch}) commit pyflannel"


def main() -> int:
    stdin = sys.stdin.buffer.read() if not sys.stdin.isatty() else b""
    version = SUPPORTED_VERSIONS[-1]
    try:
        version = (lite.loads(stdin).get("cniVersion") or version) if stdin.strip() else version
    except (ValueError, AttributeError, UnicodeDecodeError):
        pass
    try:
        output = run(dict(os.environ), stdin)
    except CniError as err:
        error = {"cniVersion": version, "code": err.code, "msg": err.msg}
        if err.details:
            error["details"] = err.details
        sys.stdout.write(lite.dumps(error) + "\n")
        return 1
    except DelegateFailed as err:
        sys.stdout.buffer.write(err.output)
        return 1
    sys.stdout.buffer.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
