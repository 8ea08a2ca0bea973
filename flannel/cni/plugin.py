"""The ``flannel`` CNI plugin: a meta-plugin that hands pods to ``bridge`` + ``host-local``.

Owns the CNI protocol side (environment, netconf on stdin, result or error JSON on stdout),
reading subnet.env, building the delegate config exactly as Go flannel's plugin does, saving
it under ``dataDir/<containerID>`` before the delegate runs (DEL uses that copy, never
subnet.env), and exec'ing the delegate from ``CNI_PATH``.
Whatever arrives (stdin, environment, subnet.env, a saved config, a delegate's output), it
answers a CNI result or a CNI error object and exits non-zero on every error.
It is exec'ed once per pod, so it imports only ``os``, ``sys``, ``errno``, ``stat`` and
``flannel.cni.lite`` (no json, ipaddress, subprocess or re: the delegate is started with
posix_spawn), and it runs on Python 3.9 and later.
Must not touch: anything but its data dir and the delegate it runs.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from flannel.cni import lite
from flannel.version import __version__

TYPE_CHECKING = False  # not typing's: importing typing would cost every pod ADD
if TYPE_CHECKING:
    from typing import Any

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
DEFAULT_SUBNET_FILE = "/run/flannel/subnet.env"
DEFAULT_DATA_DIR = "/var/lib/cni/flannel"
MAX_INPUT = 1 << 20  # stdin, subnet.env and a saved config; real ones are a few KiB
MAX_DELEGATE_CONF = 65536  # written to the delegate's stdin pipe in one go, never blocking
MAX_DELEGATE_OUTPUT = 4 << 20
MAX_IFNAME_BYTES = 15  # IFNAMSIZ - 1

# CNI error codes (spec "Error codes").
INCOMPATIBLE_VERSION, UNSUPPORTED_FIELD, INVALID_ENV, IO_FAILURE = 1, 2, 4, 5
DECODING_FAILURE, INVALID_NETWORK_CONFIG, TRY_AGAIN_LATER, INTERNAL = 6, 7, 11, 999
# A delegate answering one of these about a saved config will answer it on every retry.
_PERMANENT_CODES = frozenset((INCOMPATIBLE_VERSION, UNSUPPORTED_FIELD, DECODING_FAILURE,
                              INVALID_NETWORK_CONFIG))

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_EUID = os.geteuid()


class CniError(Exception):
    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details


def _log(message: str) -> None:
    try:
        os.write(2, f"flannel: {message}\n".encode("utf-8", "backslashreplace"))
    except OSError:
        pass  # nowhere left to say it


def _read_bounded(fd: int, what: str, code: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_INPUT:
            raise CniError(code, f"{what} is larger than {MAX_INPUT} bytes")
        chunks.append(chunk)


def _decode(raw: bytes, what: str) -> object:
    try:
        return lite.loads(raw)
    except ValueError as err:
        raise CniError(DECODING_FAILURE, f"{what}: {err}") from None


# ---- subnet.env --------------------------------------------------------------------------

def parse_subnet_env(path: str) -> dict[str, Any]:
    """Read subnet.env as the Go plugin does; CniError names what is wrong or missing."""
    wrap = "failed to load flannel 'subnet.env' file: "
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CniError(TRY_AGAIN_LATER,
                       f"{wrap}open {path}: no such file or directory. Check the flannel pod "
                       "log for this node. (Is flanneld running on this node? It writes this "
                       "file once it holds a lease.)") from None
    except OSError as err:
        raise CniError(IO_FAILURE, f"{wrap}open {path}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CniError(IO_FAILURE, f"{wrap}{path} is not a regular file; point "
                                       "subnetFile at the file flanneld writes")
        data = _read_bounded(fd, f"{wrap}{path}", IO_FAILURE)
    except OSError as err:
        raise CniError(IO_FAILURE, f"{wrap}read {path}: {err.strerror}") from None
    finally:
        os.close(fd)
    return parse_subnet_env_data(data, path)


def _mtu(value: bytes) -> int:
    # Go: strconv.ParseUint(v, 10, 32): plain ASCII digits, at most 2^32-1.
    if not value.isdigit() or len(value.lstrip(b"0")) > 10 or int(value) > 0xFFFFFFFF:
        raise ValueError(f"FLANNEL_MTU={value.decode('utf-8', 'replace')!r} is not an "
                         "unsigned 32-bit integer")
    return int(value)


def parse_subnet_env_data(data: bytes, path: str) -> dict[str, Any]:
    """subnet.env content -> networks and subnets (canonical CIDR strings, masked), mtu,
    ipmasq. Lines are split at the first ``=``; bytes that are not UTF-8 only matter inside
    a value that is used (a comment or an unknown key may hold anything, as upstream)."""
    env: dict[str, Any] = {"networks": [], "ipv6_networks": [], "subnet": None, "ipv6_subnet": None,
                 "mtu": None, "ipmasq": None}
    try:
        for line in data.split(b"\n"):
            key, sep, raw = line.removesuffix(b"\r").partition(b"=")
            if not sep:
                continue
            if key == b"FLANNEL_MTU":
                env["mtu"] = _mtu(raw)
                continue
            if key == b"FLANNEL_IPMASQ":
                env["ipmasq"] = raw == b"true"
                continue
            value = raw.decode("utf-8", "replace")
            if key in (b"FLANNEL_NETWORK", b"FLANNEL_IPV6_NETWORK"):
                target = env["networks" if key == b"FLANNEL_NETWORK" else "ipv6_networks"]
                for item in value.split(","):
                    net = lite.parse_cidr(item)
                    if net not in target:
                        target.append(net)
            elif key in (b"FLANNEL_SUBNET", b"FLANNEL_IPV6_SUBNET"):
                env["subnet" if key == b"FLANNEL_SUBNET" else "ipv6_subnet"] = \
                    lite.parse_cidr(value)
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


# ---- netconf -----------------------------------------------------------------------------

def _string_field(conf: dict[str, Any], field: str, code: int = INVALID_NETWORK_CONFIG) -> str:
    value = conf.get(field)
    if value is None:
        return ""  # as Go decodes null into a string field
    if not isinstance(value, str):
        raise CniError(code, f"failed to load netconf: '{field}' must be a string, not "
                             f"{lite.dumps(value)[:60]}")
    return value


def _object_field(conf: dict[str, Any], field: str) -> dict[str, Any] | None:
    value = conf.get(field)
    if value is not None and not isinstance(value, dict):
        raise CniError(INVALID_NETWORK_CONFIG, f"'{field}' must be a JSON object, not "
                                               f"{lite.dumps(value)[:60]}")
    return value


def _path_field(conf: dict[str, Any], field: str, default: str) -> str:
    path = _string_field(conf, field) or default
    bad = "\0" in path or len(path) > 4095
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        bad = True
    if bad:
        raise CniError(INVALID_NETWORK_CONFIG,
                       f"'{field}' must be a file system path (no NUL byte, valid UTF-8, at "
                       f"most 4095 bytes), not {lite.dumps(path)[:80]}")
    return path


def _conf_version(conf: dict[str, Any]) -> str:
    version = _string_field(conf, "cniVersion", DECODING_FAILURE) or "0.1.0"
    if version not in SUPPORTED_VERSIONS:
        raise CniError(INCOMPATIBLE_VERSION,
                       f"incompatible CNI versions: config is {lite.dumps(version)[:40]}, "
                       f"plugin supports {list(SUPPORTED_VERSIONS)}")
    return version


def load_netconf(raw: bytes) -> dict[str, Any]:
    """The decoded netconf, every field flannel reads checked for type (nothing saved yet)."""
    if len(raw) > MAX_INPUT:
        raise CniError(DECODING_FAILURE, f"failed to load netconf: larger than {MAX_INPUT} "
                                         "bytes")
    conf = _decode(raw, "failed to load netconf")
    if not isinstance(conf, dict):
        raise CniError(DECODING_FAILURE, "failed to load netconf: not a JSON object")
    name = _string_field(conf, "name", DECODING_FAILURE)
    if not name:
        raise CniError(INVALID_NETWORK_CONFIG, "missing network name")
    _check_name("network name", name)
    _conf_version(conf)
    delegate = _object_field(conf, "delegate")
    if delegate is not None:
        if "type" in delegate and not isinstance(delegate["type"], str):
            raise CniError(INVALID_NETWORK_CONFIG,
                           "'delegate' dictionary, if present, must have (string) 'type' field")
        for field in ("name", "ipam"):
            if field in delegate:
                raise CniError(INVALID_NETWORK_CONFIG,
                               f"'delegate' dictionary must not have '{field}' field, it'll be "
                               "set by flannel")
    ipam = _object_field(conf, "ipam")
    if ipam is not None:
        _string_field(ipam, "type")
    _object_field(conf, "runtimeConfig")
    _path_field(conf, "subnetFile", DEFAULT_SUBNET_FILE)
    _path_field(conf, "dataDir", DEFAULT_DATA_DIR)
    return conf


def _route_int(route: dict[str, Any], field: str) -> int | None:
    value = route.get(field)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # Go's map round trip prints 1400.0 as 1400
    if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
        raise ValueError(f"{field} {lite.dumps(value)[:40]} is not an integer")
    return value


def _routes(ipam: dict[str, Any]) -> list[dict[str, Any]]:
    """ipam.routes as Go's types.Route round-trips them: dst/gw canonical (dst keeps its host
    bits), mtu/advmss/priority dropped when 0, table/scope kept when set, other keys dropped."""
    routes = ipam.get("routes") or []
    try:
        if not isinstance(routes, list):
            raise ValueError("must be a list")
        out = []
        for route in routes:
            if not isinstance(route, dict) or not isinstance(route.get("dst"), str):
                raise ValueError(f"{lite.dumps(route)[:80]} has no \"dst\" string")
            entry: dict[str, Any] = {"dst": lite.canonical_cidr(route["dst"])}
            gateway = route.get("gw")
            if gateway is not None and not isinstance(gateway, str):
                raise ValueError(f"gw {lite.dumps(gateway)[:40]} is not a string")
            if gateway:
                entry["gw"] = lite.canonical_ip(gateway)
            for field in ("mtu", "advmss", "priority"):
                if _route_int(route, field):
                    entry[field] = _route_int(route, field)
            for field in ("table", "scope"):
                if _route_int(route, field) is not None:
                    entry[field] = _route_int(route, field)
            out.append(entry)
        return out
    except ValueError as err:
        raise CniError(INVALID_NETWORK_CONFIG,
                       f"failed to read IPAM routes: failed to parse ipam.routes: {err}") from None


def build_delegate(conf: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """The delegate config of an ADD (Go plugin's ``doCmdAdd`` for Linux)."""
    delegate = dict(conf.get("delegate") or {})
    delegate["name"] = conf["name"]
    delegate.setdefault("type", "bridge")
    delegate.setdefault("ipMasq", not env["ipmasq"])
    delegate.setdefault("mtu", env["mtu"])
    if delegate["type"] == "bridge":
        delegate.setdefault("isGateway", True)
    if conf.get("cniVersion"):
        delegate["cniVersion"] = conf["cniVersion"]
    if conf.get("runtimeConfig") is not None:
        delegate["runtimeConfig"] = conf["runtimeConfig"]
    ipam = dict(conf.get("ipam") or {})
    ipam.setdefault("type", "host-local")
    ipam["ranges"] = [[{"subnet": net}] for net in (env["subnet"], env["ipv6_subnet"])
                      if net is not None]
    ipam["routes"] = _routes(ipam) + [{"dst": net} for net in
                                      env["networks"] + env["ipv6_networks"]]
    delegate["ipam"] = ipam
    return delegate


def encode(doc: dict[str, Any]) -> bytes:
    """JSON as Go marshals a map: sorted keys, compact."""
    return lite.dumps(doc).encode()


def _check_name(what: str, name: str) -> None:
    safe = 0 < len(name) <= 255 and name[0].isascii() and name[0].isalnum() \
        and _NAME_CHARS.issuperset(name)
    if not safe:
        raise CniError(INVALID_ENV if what == "container ID" else INVALID_NETWORK_CONFIG,
                       f"{what} {lite.dumps(name)[:280]} is not a safe file name: use letters, "
                       "digits, '_', '.' and '-', starting with a letter or digit")


def _check_ifname(name: str) -> None:
    """As the kernel (and CNI's ValidateInterfaceName) accept interface names."""
    problem = ""
    try:
        size = len(os.fsencode(name))
    except UnicodeEncodeError:
        size = MAX_IFNAME_BYTES + 1
    if size > MAX_IFNAME_BYTES:
        problem = f"is too long (at most {MAX_IFNAME_BYTES} bytes)"
    elif name in (".", ".."):
        problem = "is . or .."
    elif any(char in "/:" or char.isspace() for char in name):
        problem = "contains / or : or whitespace characters"
    if problem:
        raise CniError(INVALID_ENV, f"CNI_IFNAME {lite.dumps(name)[:80]}: interface name "
                                    f"{problem}")


# ---- dataDir -----------------------------------------------------------------------------

def _open_component(parent: int, name: str, path: str) -> int:
    """Open an existing directory below ``parent`` without following a symlink, unless only
    an administrator could have placed it (root-owned link in a directory only its owner may
    write, e.g. /var/run)."""
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        link = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISLNK(link.st_mode):
            raise
    holder = os.fstat(parent)
    if link.st_uid in (0, _EUID) and not holder.st_mode & 0o022:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    raise CniError(IO_FAILURE, f"dataDir {path}: {name!r} is a symbolic link in a directory "
                               "others may write; use a real directory for dataDir")


def open_data_dir(path: str, create: bool) -> int | None:
    """fd of ``path`` opened component by component (missing ones made 0700 when ``create``);
    None when it does not exist. Refuses a dataDir others may write that we did not make."""
    fd = os.open("/" if path.startswith("/") else ".", _DIR_FLAGS)
    created = False
    try:
        for name in (part for part in path.split("/") if part not in ("", ".")):
            try:
                child = _open_component(fd, name, path)
                created = False
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass  # made by a plugin running for another pod: checked below
                else:
                    created = True
                child = _open_component(fd, name, path)
                if created:
                    os.fchmod(child, 0o700)
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if not created and (info.st_mode & 0o022 or info.st_uid != _EUID):
            raise CniError(IO_FAILURE,
                           f"dataDir {path} may be written by others (mode "
                           f"{stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}): run "
                           f"'chown {_EUID} {path} && chmod 0700 {path}', or point dataDir at "
                           "a directory of its own")
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def save_scratch(data_dir: str, container_id: str, data: bytes) -> None:
    """Write ``data_dir/container_id`` durably and atomically (dir 0700, file 0600); the temp
    file is created exclusively, never through a symlink, and removed on every failure."""
    dir_fd = open_data_dir(data_dir, create=True)
    assert dir_fd is not None  # with create=True it is made or refused, never missing
    tmp = f".{os.getpid()}.tmp"  # saved configs start with a letter or digit: no clash
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        except FileExistsError:  # left by a killed plugin that had our pid
            os.unlink(tmp, dir_fd=dir_fd)
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, container_id, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    finally:
        os.close(dir_fd)


# ---- delegate ----------------------------------------------------------------------------

def _valid_plugin_name(plugin_type: str) -> bool:
    return bool(plugin_type) and "/" not in plugin_type and "\0" not in plugin_type \
        and plugin_type not in (".", "..")


def find_plugin(plugin_type: str, cni_path: str) -> str:
    dirs = [d for d in cni_path.split(":") if d]
    if _valid_plugin_name(plugin_type):
        for directory in dirs:
            candidate = os.path.join(directory, plugin_type)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    raise CniError(INTERNAL, f"failed to find plugin {lite.dumps(plugin_type)[:80]} in path "
                             f"{dirs}; install the CNI plugins (Debian: "
                             "containernetworking-plugins) into a directory of CNI_PATH")


def spawn(path: str, data: bytes, env: dict[str, Any]) -> tuple[int, bytes]:
    """Run ``path`` with ``data`` on stdin; (exit status, stdout). Stderr is inherited.

    ``data`` fits in the pipe (MAX_DELEGATE_CONF), so writing it first never blocks; output
    beyond MAX_DELEGATE_OUTPUT ends the delegate.
    """
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        pid = os.posix_spawn(path, [path], env, file_actions=[
            (os.POSIX_SPAWN_DUP2, in_read, 0), (os.POSIX_SPAWN_DUP2, out_write, 1),
            (os.POSIX_SPAWN_CLOSE, in_write), (os.POSIX_SPAWN_CLOSE, out_read)])
    except BaseException:
        os.close(in_write)
        os.close(out_read)
        raise
    finally:
        os.close(in_read)
        os.close(out_write)
    try:
        os.write(in_write, data)
    except BrokenPipeError:
        pass  # it did not read its config: its exit status tells
    finally:
        os.close(in_write)
    chunks, size = [], 0
    try:
        while True:
            chunk = os.read(out_read, 65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_DELEGATE_OUTPUT:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise CniError(INTERNAL, f"delegate plugin {path} printed more than "
                                         f"{MAX_DELEGATE_OUTPUT} bytes; it was stopped")
            chunks.append(chunk)
    finally:
        os.close(out_read)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


def _delegate_error(plugin_type: str, status: int, output: bytes) -> CniError:
    """The delegate's own CNI error, or one of ours saying it gave none."""
    try:
        doc = lite.loads(output)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        code, msg, details = doc.get("code"), doc.get("msg"), doc.get("details")
        if isinstance(code, int) and not isinstance(code, bool) and 0 < code < 2**32 \
                and isinstance(msg, str):
            return CniError(code, msg, details if isinstance(details, str) else "")
    how = f"exit status {status}" if status > 0 else f"killed by signal {-status}"
    shown = output[:200].decode("utf-8", "replace").strip()
    said = f"; its stdout began: {shown!r}" if shown else " and printed nothing on stdout"
    return CniError(INTERNAL, f"delegate plugin {plugin_type} failed ({how}) without a CNI "
                              f"error{said}. See its messages on stderr (in the runtime's log)")


def delegate(command: str, conf: bytes, plugin_type: str, environ: dict[str, Any]) -> bytes:
    """Exec the delegate with the CNI environment; its stdout (the result) when it succeeds."""
    path = find_plugin(plugin_type, environ.get("CNI_PATH", ""))
    try:
        status, output = spawn(path, conf, dict(environ, CNI_COMMAND=command))
    except OSError as err:
        raise CniError(INTERNAL, f"failed to run delegate plugin {path}: {err.strerror}; "
                                 "reinstall it") from None
    if status != 0:
        raise _delegate_error(plugin_type, status, output)
    return output


def _require(environ: dict[str, Any], *names: str) -> None:
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise CniError(INVALID_ENV, f"required env variables [{','.join(missing)}] missing")


def cmd_add(conf: dict[str, Any], environ: dict[str, Any]) -> bytes:
    container_id = environ["CNI_CONTAINERID"]
    env = parse_subnet_env(_path_field(conf, "subnetFile", DEFAULT_SUBNET_FILE))
    plugin = build_delegate(conf, env)
    data = encode(plugin)
    if len(data) > MAX_DELEGATE_CONF:
        raise CniError(INVALID_NETWORK_CONFIG, f"the delegate config would be {len(data)} "
                                               f"bytes; at most {MAX_DELEGATE_CONF} are "
                                               "supported")
    find_plugin(plugin["type"], environ["CNI_PATH"])
    data_dir = _path_field(conf, "dataDir", DEFAULT_DATA_DIR)
    try:
        save_scratch(data_dir, container_id, data)
    except OSError as err:
        raise CniError(IO_FAILURE, f"failed to save the delegate config for {container_id} "
                                   f"in {data_dir}: {err.strerror}") from None
    output = delegate("ADD", data, plugin["type"], environ)
    try:
        result = lite.loads(output)
    except ValueError:
        result = None
    if not isinstance(result, dict):
        shown = output[:200].decode("utf-8", "replace").strip()
        raise CniError(INTERNAL, f"delegate plugin {plugin['type']} succeeded but printed no "
                                 f"CNI result (stdout began: {shown!r})")
    return (lite.dumps(result) + "\n").encode()


# ---- DEL ---------------------------------------------------------------------------------

def _read_saved(dir_fd: int, container_id: str, path: str) -> bytes | None:
    """The saved config's bytes; None when there is none we may use (said on stderr)."""
    try:
        fd = os.open(container_id, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None  # never added, or already deleted: DEL is idempotent
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise CniError(IO_FAILURE, f"failed to read the saved config {path}: "
                                       f"{err.strerror}") from None
        _log(f"{path} is a symbolic link, not a config flannel saved: removed it unread")
        os.unlink(container_id, dir_fd=dir_fd)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            _log(f"{path} is not a regular file, not a config flannel saved: left alone")
            return None
        return _read_bounded(fd, f"the saved config {path}", IO_FAILURE)
    except OSError as err:
        raise CniError(IO_FAILURE, f"failed to read the saved config {path}: "
                                   f"{err.strerror}") from None
    finally:
        os.close(fd)


def _permanent(err: CniError) -> bool:
    """Whether the delegate refused the config itself (it will on every retry). Go plugins
    report a netconf they cannot decode as 999 'failed to load netconf: ...'."""
    return err.code in _PERMANENT_CODES or (
        err.code == INTERNAL and ("failed to load netconf" in err.msg
                                  or "cannot unmarshal" in err.msg))


def _release_address(saved: dict[str, Any], environ: dict[str, Any]) -> str:
    """Ask the saved config's IPAM plugin to free the pod's address; what happened."""
    ipam = saved.get("ipam")
    ipam_type = ipam.get("type") if isinstance(ipam, dict) else None
    if not isinstance(ipam_type, str) or not _valid_plugin_name(ipam_type):
        return "it names no IPAM plugin, so no address could be released"
    conf: dict[str, Any] = {"ipam": ipam, "name": saved.get("name")}
    if isinstance(saved.get("cniVersion"), str):
        conf["cniVersion"] = saved["cniVersion"]
    try:
        delegate("DEL", encode(conf), ipam_type, environ)
    except CniError as err:
        return f"releasing its address through {ipam_type} failed too (code {err.code}: " \
               f"{err.msg}): free it by hand"
    return f"its address was released through {ipam_type}"


def cmd_del(conf: dict[str, Any], environ: dict[str, Any]) -> bytes:
    container_id = environ["CNI_CONTAINERID"]
    data_dir = _path_field(conf, "dataDir", DEFAULT_DATA_DIR)
    path = os.path.join(data_dir, container_id)
    try:
        dir_fd = open_data_dir(data_dir, create=False)
    except OSError as err:
        raise CniError(IO_FAILURE, f"failed to open dataDir {data_dir}: {err.strerror}") \
            from None
    if dir_fd is None:
        return b""
    try:
        data = _read_saved(dir_fd, container_id, path)
        if data is None:
            return b""
        saved, problem = None, ""
        try:
            saved = lite.loads(data)
        except ValueError as err:
            problem = f"is not JSON ({err})"
        if not problem and not isinstance(saved, dict):
            problem = "is not a JSON object"
        plugin_type = saved.get("type") if isinstance(saved, dict) else None
        if not problem and not (isinstance(plugin_type, str)
                                and _valid_plugin_name(plugin_type)):
            problem = "names no valid delegate 'type'"
        # (The isinstance checks repeat what ``problem`` already says, for the type checker.)
        if not problem and isinstance(saved, dict) and isinstance(plugin_type, str):
            try:
                # Re-encoded, so a config saved by an older version with e.g. "mtu": 1400.0
                # reaches the delegate as Go's round trip would have written it.
                delegate("DEL", encode(saved), plugin_type, environ)
            except CniError as err:
                if not _permanent(err):
                    raise  # transient: keep the saved config for the runtime's retry
                problem = f"was refused by {plugin_type} for good (code {err.code}: {err.msg})"
        if problem:
            released = _release_address(saved, environ) if isinstance(saved, dict) \
                else "no address could be released"
            _log(f"DEL {container_id}: the saved config {path} {problem}; {released}; "
                 "removed the saved config (the pod's interface goes with its network "
                 "namespace)")
        # Removed only once done with, so that a retried DEL can still clean up (Go flannel
        # removes it even when the delegate fails transiently, leaking the address).
        try:
            os.unlink(container_id, dir_fd=dir_fd)
        except FileNotFoundError:
            pass  # a concurrent DEL of the same pod got there first
    except OSError as err:
        raise CniError(IO_FAILURE, f"failed to remove the saved config {path}: "
                                   f"{err.strerror}") from None
    finally:
        os.close(dir_fd)
    return b""


# ---- dispatch ----------------------------------------------------------------------------

def version_result(stdin: bytes) -> bytes:
    """VERSION: the requested version (validated) and every supported one."""
    version = SUPPORTED_VERSIONS[-1]
    if stdin.strip():
        request = _decode(stdin, "failed to decode the VERSION request")
        if not isinstance(request, dict):
            raise CniError(DECODING_FAILURE, "failed to decode the VERSION request: not a JSON "
                                             "object")
        if request.get("cniVersion") not in (None, ""):
            version = _conf_version(request)
    return lite.dumps({"cniVersion": version,
                       "supportedVersions": list(SUPPORTED_VERSIONS)}).encode()


_REQUIRED_ENV = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": (), "STATUS": (),
}
_MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


def run(environ: dict[str, Any], stdin: bytes) -> bytes:
    command = environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        return version_result(stdin)
    if not command:
        raise CniError(INVALID_ENV, "required env variables [CNI_COMMAND] missing; this is a "
                                    f"CNI plugin ({about()}), run by a container runtime")
    if command not in _REQUIRED_ENV:
        raise CniError(INVALID_ENV, f"unknown CNI_COMMAND: {lite.dumps(command)[:60]}")
    _require(environ, *_REQUIRED_ENV[command])
    conf = load_netconf(stdin)
    if "CNI_CONTAINERID" in _REQUIRED_ENV[command]:
        _check_name("container ID", environ["CNI_CONTAINERID"])
        _check_ifname(environ["CNI_IFNAME"])
    minimum = _MIN_VERSION.get(command)
    if minimum and SUPPORTED_VERSIONS.index(_conf_version(conf)) < \
            SUPPORTED_VERSIONS.index(minimum):
        raise CniError(INCOMPATIBLE_VERSION, f"config version does not allow {command}")
    if command == "ADD":
        return cmd_add(conf, environ)
    if command == "DEL":
        return cmd_del(conf, environ)
    return b""  # CHECK, GC, STATUS: nothing to do, as upstream


def about() -> str:
    machine = os.uname().machine
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    return f"CNI Plugin flannel version {__version__} (linux/{arch}) commit pyflannel"


def _read_stdin() -> bytes:
    """stdin, at most MAX_INPUT + 1 bytes (more is refused later); empty for a terminal or
    a closed descriptor."""
    try:
        if os.isatty(0):
            return b""
        chunks, size = [], 0
        while size <= MAX_INPUT:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return b""


def _error_version(stdin: bytes) -> str:
    """The cniVersion for an error object: the request's when it is a supported one."""
    try:
        request = lite.loads(stdin) if len(stdin) <= MAX_INPUT else None
    except ValueError:
        request = None
    version = request.get("cniVersion") if isinstance(request, dict) else None
    return version if version in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[-1]


def _write_stdout(data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(1, view):]
    except OSError:
        pass  # the runtime went away: the exit status still tells


def main() -> int:
    stdin = _read_stdin()
    try:
        output = run(dict(os.environ), stdin)
    except CniError as err:
        error = {"cniVersion": _error_version(stdin), "code": err.code, "msg": err.msg}
        if err.details:
            error["details"] = err.details
    except Exception as err:  # a bug: still answer CNI JSON, and say where for the report
        tb = err.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}" \
            if tb is not None else "?"
        error = {"cniVersion": _error_version(stdin), "code": INTERNAL,
                 "msg": f"flannel internal error: {type(err).__name__}: {err}",
                 "details": f"at {where}; please report it with the netconf"}
    else:
        _write_stdout(output)
        return 0
    _write_stdout((lite.dumps(error) + "\n").encode())
    return 1


if __name__ == "__main__":
    sys.exit(main())
