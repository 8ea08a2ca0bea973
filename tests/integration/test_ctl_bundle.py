"""``flannelctl bundle`` against a real etcd: what the archive holds, that secrets are gone,
and that it is written once, privately, and never over an existing file."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
LEASE = '{"PublicIP":"192.168.1.11","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}}'  # noqa: E501


def bundle(etcd, prefix: str, tmp_path: Path, output: Path) -> subprocess.CompletedProcess:
    log = tmp_path / "flanneld.log"
    log.write_text("I1122 starting flanneld --etcd-password=hunter2 --iface=eth0\n")
    (tmp_path / "subnet.env").write_text("FLANNEL_NETWORK=10.244.0.0/16\n"
                                         "FLANNEL_SUBNET=10.244.1.1/24\n")
    return subprocess.run(
        [FLANNELCTL, "bundle", "-o", str(output), f"--etcd-endpoints={etcd.endpoint}",
         f"--etcd-prefix={prefix}", f"--subnet-file={tmp_path / 'subnet.env'}",
         f"--log-file={log}"], capture_output=True, text=True, timeout=120, check=False)


def test_bundle_holds_the_node_and_the_store_without_secrets(etcd, prefix, tmp_path):
    etcd.ctl("put", f"{prefix}/config", '{"Network": "10.244.0.0/16"}')
    etcd.ctl("put", f"{prefix}/subnets/10.244.1.0-24", LEASE)
    output = tmp_path / "node.tar.gz"
    proc = bundle(etcd, prefix, tmp_path, output)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {output} (")
    assert proc.stdout.splitlines()[1] == (
        f"store read: etcd {etcd.endpoint}, prefix {prefix}, from the flags given; subnet.env "
        f"{tmp_path / 'subnet.env'}")
    assert ("note: healthz, readyz, status, metrics: skipped (no flanneld runs in this network "
            "namespace; give --health-url" in proc.stdout)
    assert output.stat().st_mode & 0o777 == 0o600
    with tarfile.open(output) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
                 for m in tar.getmembers()}
    for name in ("links.json", "addresses.json", "routes4.json", "rules4.json",
                 "neighbours.json", "fdb.json", "sysctls.txt", "subnet.env", "leases.json",
                 "config.json", "doctor.json", "flanneld-cmdline.txt", "NOTES.txt"):
        assert name in files, name
    assert any(link["ifname"] == "lo" for link in json.loads(files["links.json"]))
    [lease] = json.loads(files["leases.json"])
    assert (lease["subnet"], lease["vtep_mac"]) == ("10.244.1.0/24", "0e:00:00:00:00:01")
    assert "FLANNEL_SUBNET=10.244.1.1/24" in files["subnet.env"]
    assert files["logs/flanneld.log"] == ("I1122 starting flanneld --etcd-password=<redacted> "
                                          "--iface=eth0\n")
    assert "hunter2" not in "".join(files.values())
    assert not list(tmp_path.glob(".node.tar.gz.partial-*"))
    again = bundle(etcd, prefix, tmp_path, output)
    assert again.returncode == 1
    assert again.stderr == (f"flannelctl bundle: cannot write {output}: {output} exists; give "
                            "another --output\n")


def test_unreachable_store_is_a_note_not_a_failure(tmp_path):
    output = tmp_path / "b.tar.gz"
    proc = subprocess.run([FLANNELCTL, "bundle", "-o", str(output),
                           "--etcd-endpoints=http://127.0.0.1:9",
                           f"--subnet-file={tmp_path / 'none.env'}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(output) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers()}
        notes = tar.extractfile(next(m for m in tar.getmembers()
                                     if m.name.endswith("NOTES.txt"))).read().decode()
    assert "leases.txt" in names
    assert f"subnet.env: {tmp_path / 'none.env'}: No such file or directory" in notes
