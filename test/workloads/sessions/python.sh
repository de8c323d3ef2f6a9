#!/usr/bin/env bash
# Python: a venv, pip install --no-index from a wheel built here, tests.
set -euo pipefail
cd "$WL_DIR"
python3 -m venv venv
mkdir -p wheels
# A wheel is a zip with metadata: build one offline.
python3 - <<'PY'
import base64, hashlib, zipfile
files = {
    "wlpkg/__init__.py": "def add(a, b):\n    return a + b\n",
    "wlpkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: wlpkg\nVersion: 1.0\n",
    "wlpkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: watcher-workloads\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile("wheels/wlpkg-1.0-py3-none-any.whl", "w") as z:
    for name, body in files.items():
        z.writestr(name, body)
        h = base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={h},{len(body)}")
    record.append("wlpkg-1.0.dist-info/RECORD,,")
    z.writestr("wlpkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
PY
venv/bin/pip install -q --no-index --find-links wheels wlpkg
mkdir -p tests
printf 'import unittest, wlpkg\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(wlpkg.add(2, 3), 5)\n' > tests/test_add.py
venv/bin/python -m unittest discover -q -s tests 2>&1 | tail -1 | grep OK
venv/bin/python -c 'import sys, ssl, locale, json; ssl.create_default_context(); print(json.dumps({"ok": True}))' >/dev/null
echo python-ok
