EXPECTED = {
    "config/app.conf": (
        "# application settings\n"
        "api_url = https://api.example.org/v2\n"
        "fallback = https://api.example.org/v1\n"
        "legacy_mirror = old-apiXexample.com\n"
    ),
    "config/db/primary.ini": "[primary]\nhost = db.internal\naudit_hook = http://api.example.org:8080/audit\n",
    "config/extra settings/cache.conf": "warm_from=api.example.org;ttl=60\n",
}


def read(path):
    with open(path) as f:
        return f.read()


def test_hostnames_replaced_and_nothing_else_changed():
    for path, text in EXPECTED.items():
        assert read(path) == text, path


def test_docs_untouched():
    assert read("docs/migration.md") == "We moved from old-api.example.com to api.example.org in March.\n"
