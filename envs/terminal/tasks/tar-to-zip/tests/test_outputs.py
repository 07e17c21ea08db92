import zipfile

EXPECTED = {
    "logs/app.log": b"started\nstopped\n",
    "logs/2024/jan.log": b"january\n",
    "logs/2024/feb.log": b"february\n",
    "logs/README": b"rotated monthly\n",
}


def test_zip_holds_the_same_files():
    with zipfile.ZipFile("logs.zip") as z:
        files = {i.filename: z.read(i) for i in z.infolist() if not i.is_dir()}
    assert files == EXPECTED
