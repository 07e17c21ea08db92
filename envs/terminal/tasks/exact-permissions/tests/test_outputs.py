import os
import stat

MODES = {
    "secrets": 0o700,
    "secrets/api.key": 0o600,
    "scripts/build.sh": 0o755,
    "scripts/deploy.sh": 0o755,
    "public/index.html": 0o644,
    "public/style.css": 0o644,
    "config.yml": 0o640,
}


def test_exact_modes():
    got = {path: oct(stat.S_IMODE(os.lstat(path).st_mode)) for path in MODES}
    assert got == {path: oct(mode) for path, mode in MODES.items()}


def test_contents_unchanged():
    with open("secrets/api.key") as f:
        assert f.read() == "example-api-key-0000\n"
    with open("config.yml") as f:
        assert f.read() == "db_password: hunter2\n"
