"""Doctor findings: what is wrong, how bad, how to fix it, and the order they are shown in.

Owns the ranking: by severity, then by a fixed order of causes in which a cause comes before
what it explains (no flanneld explains a missing subnet.env, which explains missing routes,
which explain failing probes). Must not touch: the store, the kernel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SEVERITIES = ("error", "warning", "info")
#: How a note about what could not be judged starts (it says why after "because").
NOT_CHECKED = "not checked: "

#: Check names, causes first; a finding's rank within its severity.
CAUSE_ORDER = (
    "flanneld", "store", "config", "subnet-env", "lease", "duplicates", "identity", "skipped",
    "parked", "sysctl", "forward", "cni", "backend", "device", "vtep-mac", "mtu", "routes",
    "neighbours", "fdb", "engine", "clock", "checksum", "firewall", "underlay", "encap",
    "overlay", "path-mtu", "probes", "encap-filter", "pod-encap",
)


@dataclass(frozen=True)
class Finding:
    check: str  # one of CAUSE_ORDER
    severity: str  # one of SEVERITIES
    what: str
    fix: str = ""

    def as_json(self) -> dict[str, str]:
        return asdict(self)


def rank(findings: list[Finding]) -> list[Finding]:
    """Severity first, then cause order, then the order checks reported them."""
    indexed = list(enumerate(findings))
    indexed.sort(key=lambda pair: (SEVERITIES.index(pair[1].severity),
                                   CAUSE_ORDER.index(pair[1].check), pair[0]))
    return [finding for _, finding in indexed]


def exit_code(findings: list[Finding]) -> int:
    """0 only when nothing is wrong: no error and no warning."""
    return 1 if any(f.severity != "info" for f in findings) else 0


def render(findings: list[Finding]) -> str:
    wrong = [f for f in findings if f.severity != "info"]
    unchecked = sum(f.what.startswith(NOT_CHECKED) for f in findings)
    if not wrong and unchecked:
        lines = [f"healthy: every check that could run passed; {unchecked} not checked "
                 "(below, and why)"]
    elif not wrong:
        lines = ["healthy: every check passed"]
    else:
        errors = sum(f.severity == "error" for f in wrong)
        lines = [f"unhealthy: {errors} error(s), {len(wrong) - errors} warning(s), most "
                 "likely cause first"]
    for number, finding in enumerate(findings, 1):
        lines.append(f"{number}. [{finding.severity}] {finding.check}: {finding.what}")
        if finding.fix:
            lines.append(f"   fix: {finding.fix}")
    return "\n".join(lines)
