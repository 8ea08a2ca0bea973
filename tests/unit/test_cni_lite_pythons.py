"""The CNI plugin's JSON decoding and encoding give the same answers under every Python it
supports, with CPython's private C scanner and without it: ``_json`` absent (a minimal
Python), present without ``make_scanner``, or with a scanner that decodes otherwise."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.pythons import CNI_PYTHONS, python_or_skip

ROOT = Path(__file__).resolve().parents[2]

VALID = [
    '{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel",'
    '"delegate":{"hairpinMode":true,"isDefaultGateway":true}}]}',
    ' [1, 2.5e3, -0.0, 12345678901234567890, null, false] ',
    '{"a":"x\\u00e9\\n\\"<&>","b":"\\ud83d\\ude00","c":{"z":{}, "y":[]}}',
    '"plain"', "0", "-0.25", "1e100",
]
INVALID = ["", "{", "[1,]", '{"a":1} x', "nul", "{'a': 1}", "NaN", "[Infinity]", "-Infinity",
           "1e400", "[" * 65 + "]" * 65, '"a\tb"', "1" * 500]

# Runs under the Python tested, as the plugin does (-I -S), after ``_json`` is made absent,
# hollow or different as the mode says.
SCRIPT = r'''
import sys, types
mode, root = sys.argv[1], sys.argv[2]
if mode == "absent":
    sys.modules["_json"] = None
elif mode == "hollow":
    sys.modules["_json"] = types.ModuleType("_json")
elif mode == "different":
    fake = types.ModuleType("_json")
    fake.make_scanner = lambda context: (lambda text, index: ({}, index))
    fake.encode_basestring_ascii = lambda text: text
    sys.modules["_json"] = fake
sys.path.insert(0, root)
from flannel.cni import lite
results = []
for text in sys.stdin.read().split("\0"):
    try:
        results.append(["ok", lite.loads(text)])
    except ValueError:
        results.append(["refused"])
print(lite.dumps({"native": lite.NATIVE_SCANNER, "results": results,
                  "encoded": lite.dumps({"b": "\u00e9\n", "a": [1.0, 2, -0.5]})}))
'''

MODES = {"native": True, "absent": False, "hollow": False, "different": False}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version", CNI_PYTHONS)
def test_decoding_with_and_without_the_private_scanner(version, mode):
    python = python_or_skip(version)
    proc = subprocess.run([python, "-I", "-S", "-c", SCRIPT, mode, str(ROOT)],
                          input="\0".join(VALID + INVALID), capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["native"] is MODES[mode]
    assert answer["results"] == [["ok", json.loads(text)] for text in VALID] \
        + [["refused"]] * len(INVALID)
    assert answer["encoded"] == '{"a":[1,2,-0.5],"b":"\\u00e9\\n"}'
