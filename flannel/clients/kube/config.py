"""Where the Kubernetes API server is and how to prove who we are to it.

Owns: reading a kubeconfig file (its current context's cluster and user: server,
certificate-authority(-data) (the data winning, as in client-go), insecure-skip-tls-verify
(refused with a certificate authority, as client-go does), tls-server-name, token, tokenFile,
client-certificate(-data) + client-key(-data), username + password, and exec credential
plugins of client.authentication.k8s.io v1 and v1beta1), the in-cluster service account
(``KUBERNETES_SERVICE_HOST``/``_PORT``, its CA and a token file re-read as it rotates), and
``--kube-api-url`` as the server over either. Every bad field is refused with a message
naming the field and the file; a proxy variable client-go would honour is reported
(``ignored_proxy``). Key material from ``*-data`` fields reaches ssl only through
``auth.load_key_pair`` (a 0600 file removed at once); it is never logged.
Must not touch: how credentials are obtained (auth), requests (client), the kernel.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flannel.clients.kube.auth import (
    BasicAuth,
    Credentials,
    ExecPlugin,
    StaticToken,
    TokenFile,
    load_key_pair,
)
from flannel.files.fileutil import read_head

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Kubeconfig files with embedded certificates are a few tens of KiB.
MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class KubeConfigError(Exception):
    """The client configuration is unusable; the message names the field and the file."""


@dataclass
class ClusterConfig:
    """The server to talk to, the TLS context for it, and the credentials to send."""

    server: str  # scheme://host[:port][/prefix], no user info: for messages
    host: str
    port: int
    context: ssl.SSLContext | None
    server_hostname: str | None
    credentials: Credentials
    where: str  # where this configuration came from, for messages
    #: The server URL's path ("/k8s/clusters/c-abc" behind Rancher), without a trailing
    #: slash: client-go puts it in front of every request path, and so do we.
    path_prefix: str = ""

    @property
    def host_header(self) -> str:
        """host[:port] rebuilt from its parts, so user info in the URL never reaches it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.server.startswith("https:") else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class _Server:
    url: str  # for messages
    host: str
    port: int
    path_prefix: str


def _server(url: str, what: str) -> _Server:
    parts = urlsplit(url)
    # Messages show the URL without its user info: it may hold a password.
    url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    try:
        port = parts.port
    except ValueError:
        raise KubeConfigError(f"{what}: {url!r} has a bad port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise KubeConfigError(f"{what}: {url!r} is not an http(s)://host[:port][/path] URL")
    prefix = parts.path.rstrip("/")
    if parts.query or parts.fragment or \
            not all(c.isprintable() and not c.isspace() for c in prefix):
        raise KubeConfigError(f"{what}: {url!r}: only a plain path may follow the host")
    port = port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    return _Server(shown + prefix, parts.hostname, port, prefix)


def _tls(ca_file: str | None, ca_data: bytes | None, insecure: bool,
         where: str) -> ssl.SSLContext:
    # Not create_default_context: a given CA must be the only one trusted, as in client-go.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        if ca_file:
            context.load_verify_locations(cafile=ca_file)
        elif ca_data:
            context.load_verify_locations(cadata=ca_data.decode("ascii", "replace"))
        else:
            context.load_default_certs()
    except (ssl.SSLError, OSError, ValueError) as err:
        raise KubeConfigError(f"{where}: the certificate authority is not usable: "
                              f"{getattr(err, 'strerror', None) or err}") from None
    return context


def in_cluster(environ: dict[str, str], api_url: str = "",
               account_dir: str = SERVICE_ACCOUNT_DIR) -> ClusterConfig | None:
    """The service account's config, or None when not running in a pod."""
    token = os.path.join(account_dir, "token")
    if not os.path.exists(token):
        return None
    where = f"the service account in {account_dir}"
    if api_url:
        server = api_url
    else:
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeConfigError(f"{where}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
                                  "must be set (or give --kube-api-url)")
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    found = _server(server, "--kube-api-url" if api_url else where)
    ca = os.path.join(account_dir, "ca.crt")
    context = None
    if found.url.startswith("https:"):
        context = _tls(ca if os.path.exists(ca) else None, None, False, f"{where} (ca.crt)")
    return ClusterConfig(found.url, found.host, found.port, context, found.host,
                         TokenFile(token), where, found.path_prefix)


def from_url(api_url: str) -> ClusterConfig:
    found = _server(api_url, "--kube-api-url")
    context = _tls(None, None, False, "--kube-api-url") if found.url.startswith("https:") \
        else None
    return ClusterConfig(found.url, found.host, found.port, context, found.host, Credentials(),
                         "--kube-api-url", found.path_prefix)


class _Fields:
    """Typed access to one mapping of a kubeconfig, every refusal naming field and file."""

    def __init__(self, data: Any, path: str, file: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise KubeConfigError(f"{file}: {path} must be a mapping")
        self.data, self.path, self.file = data, path, file

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def refuse(self, key: str, why: str) -> KubeConfigError:
        return KubeConfigError(f"{self.file}: {self.name(key)} {why}")

    def text(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise self.refuse(key, "must be a string")
        return value

    def flag(self, key: str) -> bool:
        value = self.data.get(key, False)
        if not isinstance(value, bool):
            raise self.refuse(key, "must be true or false")
        return value

    def base64(self, key: str) -> bytes | None:
        text = self.text(key)
        if text is None:
            return None
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise self.refuse(key, "is not base64") from None

    def path_of(self, key: str, base: str) -> str | None:
        text = self.text(key)
        if text is None:
            return None
        return text if os.path.isabs(text) else os.path.join(base, text)

    def named(self, key: str, name: str) -> _Fields:
        """The entry called ``name`` in the list ``key`` (clusters, users, contexts)."""
        entries = self.data.get(key) or []
        if not isinstance(entries, list):
            raise self.refuse(key, "must be a list")
        for index, entry in enumerate(entries):
            if isinstance(entry, dict) and entry.get("name") == name:
                inner = key[:-1]  # clusters -> cluster
                return _Fields(entry.get(inner), f"{key}[{index}].{inner}", self.file)
        raise self.refuse(key, f"has no entry named {name!r}")


def _read_file(path: str, what: str, limit: int) -> bytes:
    try:
        data, more = read_head(path, limit)
    except OSError as err:
        raise KubeConfigError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if more:
        raise KubeConfigError(f"{what} {path} is larger than the limit of {limit} bytes")
    return data


def _load_yaml(raw: bytes, path: str) -> Any:
    """The document of a kubeconfig file, read as client-go reads it: YAML 1.1 (``yes``,
    ``on`` are booleans). ruamel.yaml's pure Python safe loader: no compiled part, the same on
    every architecture; only kubeconfig users import it."""
    from ruamel.yaml import YAML
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import YAMLError

    loader = YAML(typ="safe", pure=True)
    loader.version = (1, 1)
    try:
        return loader.load(raw)
    except DuplicateKeyError as err:
        # The error's text holds the values, which may be credentials: name the line only.
        line = err.problem_mark.line + 1 if err.problem_mark is not None else 0
        raise KubeConfigError(f"{path}: a key appears twice in one mapping at line {line}: "
                              "keep one of them") from None
    except YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise KubeConfigError(f"{path}: not valid YAML{at}") from None
    except RecursionError:
        raise KubeConfigError(f"{path}: nests too deeply") from None


def from_kubeconfig(path: str, api_url: str = "") -> ClusterConfig:
    """The current context of a kubeconfig file; ``api_url`` replaces its server."""
    raw = _read_file(path, "the kubeconfig file", MAX_KUBECONFIG_BYTES)
    root = _Fields(_load_yaml(raw, path), "", path)
    base = os.path.dirname(os.path.abspath(path))
    current = root.text("current-context")
    if current is None:
        raise root.refuse("current-context", "is not set")
    context = root.named("contexts", current)
    cluster_name, user_name = context.text("cluster"), context.text("user")
    if cluster_name is None:
        raise context.refuse("cluster", "is not set")
    cluster = root.named("clusters", cluster_name)
    server_text = api_url or cluster.text("server")
    if server_text is None:
        raise cluster.refuse("server", "is not set")
    what = "--kube-api-url" if api_url else f"{path}: {cluster.name('server')}"
    found = _server(server_text, what)
    user = root.named("users", user_name) if user_name else _Fields({}, "user", path)
    context_tls = None
    if found.url.startswith("https:"):
        ca_data = cluster.base64("certificate-authority-data")
        # As client-go: the embedded data wins over the file.
        ca_file = None if ca_data else cluster.path_of("certificate-authority", base)
        field_name = "certificate-authority-data" if ca_data else "certificate-authority"
        insecure = cluster.flag("insecure-skip-tls-verify")
        if insecure and (ca_data or ca_file):
            raise cluster.refuse("insecure-skip-tls-verify", f"is set together with "
                                 f"{cluster.name(field_name)}: specifying a root "
                                 "certificates file with the insecure flag is not allowed; "
                                 "remove one of them")
        context_tls = _tls(ca_file, ca_data, insecure, f"{path}: {cluster.name(field_name)}")
        _client_certificate(context_tls, user, base)
    server_hostname = cluster.text("tls-server-name") or found.host
    return ClusterConfig(found.url, found.host, found.port, context_tls, server_hostname,
                         _credentials(user, base, context_tls, path), f"the kubeconfig {path}",
                         found.path_prefix)


def _client_certificate(context: ssl.SSLContext, user: _Fields, base: str) -> None:
    cert_file, key_file = user.path_of("client-certificate", base), user.path_of("client-key",
                                                                                 base)
    cert_data, key_data = user.base64("client-certificate-data"), user.base64("client-key-data")
    has_cert, has_key = bool(cert_file or cert_data), bool(key_file or key_data)
    if has_cert != has_key:
        missing = "client-key(-data)" if has_cert else "client-certificate(-data)"
        raise user.refuse(missing, "is not set, but is needed with the other half of the pair")
    if not has_cert:
        return
    try:
        if cert_file and key_file:
            context.load_cert_chain(cert_file, key_file)
        else:
            cert = cert_data if cert_data else _read_file(
                str(cert_file), "the client certificate", MAX_KUBECONFIG_BYTES)
            key = key_data if key_data else _read_file(
                str(key_file), "the client key", MAX_KUBECONFIG_BYTES)
            load_key_pair(context, cert, key)
    except (ssl.SSLError, OSError) as err:
        raise user.refuse("client-certificate", "and client-key are not a usable PEM "
                          f"certificate and key: {getattr(err, 'strerror', None) or err}"
                          ) from None


def _credentials(user: _Fields, base: str, context: ssl.SSLContext | None,
                 file: str) -> Credentials:
    for unsupported in ("auth-provider", "as", "impersonate"):
        if user.data.get(unsupported):
            raise user.refuse(unsupported, "is not supported by flanneld; use a token, a "
                              "client certificate or an exec plugin")
    token, token_file = user.text("token"), user.path_of("tokenFile", base)
    username, password = user.text("username"), user.text("password")
    # A token file wins over a token: it is re-read, so a rotated token is picked up.
    if token_file:
        return TokenFile(token_file)
    if token:
        return StaticToken(token, f"the token of {user.path} in {file}")
    exec_spec = user.data.get("exec")
    if exec_spec is not None:
        return _exec_plugin(_Fields(exec_spec, user.name("exec"), file), base, context)
    if username is not None or password is not None:
        if not username or password is None:
            raise user.refuse("username" if not username else "password",
                              "is not set, but is needed with the other")
        return BasicAuth(username, password, f"the user name and password of {user.path} in "
                                             f"{file}")
    return Credentials()


def _exec_plugin(spec: _Fields, base: str, context: ssl.SSLContext | None) -> ExecPlugin:
    api_version = spec.text("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise spec.refuse("apiVersion", f"must be one of {', '.join(EXEC_API_VERSIONS)}")
    command = spec.text("command")
    if command is None:
        raise spec.refuse("command", "is not set")
    if os.sep in command and not os.path.isabs(command):
        command = os.path.join(base, command)  # as client-go: relative to the kubeconfig
    args = spec.data.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise spec.refuse("args", "must be a list of strings")
    env_list = spec.data.get("env") or []
    env: dict[str, str] = {}
    if not isinstance(env_list, list):
        raise spec.refuse("env", "must be a list of {name, value}")
    for index, item in enumerate(env_list):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or \
                not isinstance(item.get("value"), str) or not item["name"] or \
                "=" in item["name"] or "\0" in item["name"] + item["value"]:
            raise spec.refuse(f"env[{index}]", "must be {name: NAME, value: VALUE} strings")
        env[item["name"]] = item["value"]
    return ExecPlugin(command, list(args), env, api_version, context, spec.file)


def ignored_proxy(config: ClusterConfig, environ: dict[str, str]) -> str | None:
    """The proxy variable client-go would use for this server and we do not (flanneld
    connects directly), or None: set, and its NO_PROXY does not cover the host. The
    matching is client-go's (golang.org/x/net/http/httpproxy): ``*``, an IP, a CIDR, a domain
    (its subdomains too), an optional port; loopback is never proxied."""
    scheme = "HTTPS" if config.server.startswith("https:") else "HTTP"
    name = next((n for n in (f"{scheme}_PROXY", f"{scheme.lower()}_proxy") if environ.get(n)),
                None)
    if name is None or config.host == "localhost":
        return None
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = \
            ipaddress.ip_address(config.host)
    except ValueError:
        address = None
    if address is not None and address.is_loopback:
        return None
    no_proxy = environ.get("NO_PROXY") or environ.get("no_proxy") or ""
    host = config.host.lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return None
        if not entry:
            continue
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            network = None
        if network is not None:
            if address is not None and address in network:
                return None
            continue
        name_part, _, port = entry.rpartition(":") if entry.count(":") == 1 else \
            (entry, "", "")
        if port and port != str(config.port):
            continue
        domain = name_part.strip("[]").lstrip(".")
        if host == domain or host.endswith("." + domain):
            return None
    return name


def client_config(api_url: str, kubeconfig_file: str, environ: dict[str, str],
                  account_dir: str = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    """The kubeconfig file; else the in-cluster service account (``api_url`` as its server
    if given); else ``api_url`` without credentials."""
    if kubeconfig_file:
        return from_kubeconfig(kubeconfig_file, api_url)
    found = in_cluster(environ, api_url, account_dir)
    if found is not None:
        return found
    if api_url:
        return from_url(api_url)
    raise KubeConfigError("not running in a cluster: give --kubeconfig-file or --kube-api-url")
