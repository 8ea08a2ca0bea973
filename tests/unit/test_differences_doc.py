"""docs/differences.md stays complete: every known difference from Go flannel has a row, every
row is a known difference, and every test a row names exists (a test function in the file
it names, found by reading the file, not by importing it)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "differences.md"

#: Every behaviour of pyflannel known to differ from Go flannel v0.28.9. A difference found
#: goes here and into the table of docs/differences.md.
KNOWN_DIFFERENCES = frozenset({
    # flags and logging
    "bad-flag-exits-2", "values-that-hurt-refused", "unknown-keys-named",
    "eperm-exits-naming-privilege", "subnet-lease-ttl", "klog-vmodule",
    "v-levels", "start-up-options-line",
    # etcd
    "etcd-tls-warning", "etcd-cafile-without-client-cert", "etcd-subnets-directory",
    "etcd-prefix-not-a-regex", "etcd-endpoints-lenient", "etcd-username-without-password",
    "etcd-json-gateway", "lost-race-retried", "subnet-search-hashed", "reservations-honoured",
    "renewal-revokes-old-lease", "remote-ttl-not-looked-up", "etcd-reset-detected",
    "store-errors-classified", "relist-reports-changed-attributes", "etcd-listing-in-pages",
    "etcd-watch-backoff", "answer-budgets",
    # any store, the network config, the interface
    "unusable-records-skipped", "invalid-config-exits-1", "non-masquerade-cidrs",
    "lease-identities-unique", "bad-peers-parked",
    "no-link-local-public-address",
    # data plane and backends
    "continuous-reconcile", "adopts-previous-routes", "readiness-includes-dataplane",
    "blackhole-metric", "vtep-mac-derived", "vxlan-ipv6-mtu", "ipip-mtu", "ipip-ipv6-refused",
    "extension-retries", "extension-ipv6-env", "extension-encap-overhead",
    "cloud-routes-reconciled", "ali-vpc-reconciled",
    "gce-routes-reconciled", "gce-options-and-identity", "cloud-routes-marked",
    "cloud-answers-bounded", "tencent-secret-not-logged", "udp-icmp-reaches-sender",
    "udp-other-backends-not-peers",
    "udp-tun-kept", "udp-runt-no-icmp", "wireguard-kept-across-restarts",
    "wireguard-peers-reconciled", "wireguard-failing-handshakes", "wireguard-genl-messages",
    "wireguard-genl-errors", "neighbours-adopted-any-protocol",
    "ipsec-charon-kept-across-restarts", "ipsec-kernel-libipsec", "ipsec-reconciled",
    "ipsec-psk-mismatch-named", "ipsec-config-checked",
    # rules
    "iptables-refill-chains", "nftables-rechecked", "iptables-mode",
    # health, tools, memory
    "readyz-no-paths", "metrics-and-status", "flannelctl-cleanup", "lazy-store-clients",
    "health-server-bounded", "local-socket", "encap-peers-only", "pod-encap-dropped",
    "peer-probes",
    # files, the image and its tools
    "key-and-tls-files-checked", "subnet-env-dir-warning", "image-paths-are-links",
    "install-conf-checked", "mk-docker-opts-as-data", "image-minimal",
    # errors
    "bug-exits-with-traceback", "cloud-throttling-fails-the-pass",
    # kube
    "kube-watch-resumes", "kube-no-http-proxy", "kube-record-republished",
    "kube-dual-stack-from-footprint", "kube-writes-retried", "kube-readiness-lease-published",
    "kube-start-waits-for-node",
    "kube-pod-cidr-change-reported", "kube-node-name-checked", "kube-watch-reopen-backoff",
    "kube-list-resumes", "kubeconfig-duplicate-key", "kube-http-1-0-keep-alive",
    "kube-no-redirects",
    # Helm chart
    "chart-default-image", "chart-tunnel-mode-json", "chart-values-checked", "chart-extra-keys",
    "chart-objects",
    # CNI
    "cni-del-keeps-config", "cni-del-refused-for-good", "cni-error-codes",
    "cni-data-dir-safety", "cni-exact-numbers",
})

_TEST_ID = re.compile(r"`(tests/[^`:]+\.py::[^`]+)`")


def table_rows(text: str) -> dict[str, list[str]]:
    """Row ID -> the test node IDs its last cell names, for every row of the table."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        row_id = cells[0].strip("`")
        assert row_id not in rows, f"two rows for {row_id}"
        assert len(cells) == 6, f"row {row_id} has {len(cells)} cells, not 6"
        rows[row_id] = _TEST_ID.findall(cells[-1])
    return rows


@functools.cache  # many rows name tests of the same few files
def defined_tests(path: Path) -> frozenset[str]:
    """``name`` and ``Class::name`` of every test function defined in a test file."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{item.name}" for item in node.body
                      if isinstance(item, functions)}
    return frozenset(name for name in names if name.rsplit("::", 1)[-1].startswith("test"))


def resolves(node_id: str) -> bool:
    file, _, name = node_id.partition("::")
    path = ROOT / file
    return path.is_file() and name.split("[", 1)[0] in defined_tests(path)


def test_every_known_difference_has_a_row_and_every_row_is_known():
    rows = table_rows(DOC.read_text())
    assert sorted(KNOWN_DIFFERENCES - rows.keys()) == [], "differences without a row"
    assert sorted(rows.keys() - KNOWN_DIFFERENCES) == [], "rows not in KNOWN_DIFFERENCES"


def test_every_row_names_tests_that_exist():
    rows = table_rows(DOC.read_text())
    assert [row for row, tests in rows.items() if not tests] == [], "rows naming no test"
    missing = [(row, test) for row, tests in rows.items() for test in tests
               if not resolves(test)]
    assert missing == []


def test_the_checks_catch_a_missing_row_and_a_missing_test():
    text = DOC.read_text()
    first = next(line for line in text.splitlines() if line.startswith("| `"))
    assert len(table_rows(text.replace(first + "\n", ""))) == len(table_rows(text)) - 1
    assert not resolves("tests/unit/test_differences_doc.py::test_that_does_not_exist")
    assert not resolves("tests/unit/no_such_file.py::test_x")
    assert resolves("tests/unit/test_differences_doc.py::test_every_row_names_tests_that_exist")
