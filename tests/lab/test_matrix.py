"""The truth matrix: every situation of ``tests/support/matrix.py`` made in a lab of every
backend and family, and what ``flannelctl doctor`` and ``check`` say of it.

One lab per backend and family, built once (the cells of a lab share it, on one worker),
each situation made, the tools run (doctor on the cell's node, check on n1, at once), the
situation undone and the pair n1 <-> peer seen working again before the next cell. Each
cell asserts doctor's exit status, its first finding (the cause, on the right node, naming
the port, chain, rule or node) and check's verdict for the pair, and for the row of the
lease a situation writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab
from tests.support import netns
from tests.support.matrix import (
    CELLS,
    LABS,
    PORTS,
    SITUATIONS,
    Cell,
    Matrix,
    fill,
    network_config,
    skip_reason,
    verdict_of,
)

pytestmark = [pytest.mark.matrix, pytest.mark.netns, pytest.mark.etcd]

_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def matrix_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Matrix]:
    key = request.param
    reason = skip_reason(key)
    if reason:
        pytest.skip(reason)
    spec = LABS[key]
    lab = Lab(f"{netns.RUN_PREFIX}M{next(_numbers)}", root=tmp_path_factory.mktemp("matrix"))
    try:
        nodes = build(lab, spec.nodes, network_config(spec, lab),
                      second_underlay_from=spec.second_underlay,
                      flanneld_args=("--ip-masq",))
        if spec.backend != "alloc":
            wait_for_mesh(lab, nodes, spec.ipv6, timeout=60)
        yield Matrix(lab, spec)
    finally:
        lab.down()


def _param(cell: Cell) -> object:
    return pytest.param(cell.lab, cell, id=cell.id,
                        marks=pytest.mark.xdist_group(f"matrix-{cell.lab}"))


@pytest.mark.parametrize(("matrix_lab", "cell"), [_param(c) for c in CELLS],
                         indirect=["matrix_lab"])
def test_cell(matrix_lab: Matrix, cell: Cell) -> None:
    m = matrix_lab
    situation = SITUATIONS[cell.situation]
    if situation.frozen:
        m.freeze(1)
    try:
        situation.apply(m, cell)
        with ThreadPoolExecutor(max_workers=2) as pool:
            doctor = pool.submit(m.doctor, cell.node)
            check = pool.submit(m.check, 1)
            code, findings = doctor.result()
            report = check.result()
        says = [fill(text, m, cell) for text in cell.says]
    finally:
        if situation.frozen:
            m.thaw(1)
        situation.undo(m, cell)
    m.healthy(cell.peer, m.spec.ipv6)

    shown = "\n".join(f"[{f['severity']}] {f['check']}: {f['what']}" for f in findings)
    verdict = m.verdict(report, cell.peer, cell.family)
    wrong = [f for f in findings if f["severity"] != "info"]
    assert (code, verdict) == (cell.rc, cell.verdict), f"doctor:\n{shown}\ncheck: {report}"
    if cell.lease:
        assert verdict_of(report, situation.lease) == cell.lease, report
    if verdict == "timeout":
        # check's advice names the probes doctor makes for this backend, and no other.
        advice = str(m.row(report, cell.peer, cell.family)["next"])
        carried = (m.spec.backend, cell.family) in PORTS and \
            not (m.spec.direct_routing and cell.peer == 2)
        assert ("on UDP" in advice) == carried and ("port" in advice) == carried, advice
    if cell.first:
        assert wrong and wrong[0]["check"] == cell.first, shown
        missing = [text for text in says if text not in wrong[0]["what"]]
        assert not missing, f"{missing} not in the first finding:\n{shown}"
    else:
        assert not wrong, shown
        missing = [text for text in says if not any(text in f["what"] for f in findings)]
        assert not missing, f"{missing} in no finding:\n{shown}"
