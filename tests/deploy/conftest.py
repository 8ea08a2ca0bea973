"""The image fixtures of the image tests: built once per session, as CI builds it."""

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.deploy import images

ROOT = Path(__file__).resolve().parents[2]
TAG = "localhost/pyflannel-test:latest"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="session")
def image(request):
    # Under --dist loadgroup, pytest-xdist marks the grouped tests in their node ids; without
    # it every worker would build the image under the same tag.
    if getattr(request.config.option, "loadgroup", False) and any(
            item.get_closest_marker("image") and not item.nodeid.endswith("@image")
            for item in request.session.items):
        pytest.fail("pytest-xdist did not keep the image tests on one worker: install the "
                    "pytest the test extra asks for (./install.sh), or run with -n 0",
                    pytrace=False)
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: run ./install.sh")
    started = time.monotonic()
    base = images.ensure_base_image()
    base_ready = time.monotonic()
    command = [str(ROOT / "deploy" / "build-image.sh"), "--tool", "buildah", "--base", base,
               "--tag", TAG]
    if HOST_CA_BUNDLE.exists():
        # Trust what this host trusts while pip downloads (a TLS-inspecting proxy, if any).
        command += ["--ca-bundle", str(HOST_CA_BUNDLE)]
    result = subprocess.run(command, env=images.environment(), capture_output=True, text=True,
                            timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"\nimage: base ready in {base_ready - started:.1f} s, "
          f"built in {time.monotonic() - base_ready:.1f} s")
    return TAG


@pytest.fixture
def box(image):
    with images.container(image) as name:
        yield name
