import os
import stat
import subprocess

CONTENT = '#!/bin/sh\necho "report ok: $(ls | wc -l | tr -d \' \') entries"\n'


def test_owner_can_execute():
    assert os.stat("bin/report.sh").st_mode & stat.S_IXUSR


def test_contents_unchanged():
    with open("bin/report.sh") as f:
        assert f.read() == CONTENT


def test_runs_directly():
    out = subprocess.run(["./bin/report.sh"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and out.stdout.startswith("report ok: "), out
