"""Downloads: resume from .part, sha256 verification against the recorded table, no second download,
an honest note where no checksum is recorded."""
import hashlib
import io

import pytest

from fairseq_lnpos.data import download
from fairseq_lnpos.data.download import DataError

PAYLOAD = bytes(range(256)) * 1000


class FakeResponse(io.BytesIO):
    def __init__(self, data, status, total):
        super().__init__(data)
        self.status = status
        self.headers = {"Content-Length": str(len(data))} if total else {}


def server(payload=PAYLOAD, honour_range=True, calls=None):
    """A urlopen stand-in that serves ``payload`` and honours Range requests."""
    def opener(req):
        rng = req.get_header("Range")
        if calls is not None:
            calls.append(rng)
        if rng and honour_range:
            start = int(rng.split("=")[1].rstrip("-"))
            return FakeResponse(payload[start:], 206, True)
        return FakeResponse(payload, 200, True)
    return opener


@pytest.fixture
def sums(tmp_path, monkeypatch):
    f = tmp_path / "SHA256SUMS"
    f.write_text(f"# comment\n{hashlib.sha256(PAYLOAD).hexdigest()}  data.tgz\n")
    monkeypatch.setattr(download, "CHECKSUMS", f)
    monkeypatch.setattr(download.recorded_sha256, "__defaults__", (f,))
    return f


def test_resume_from_part_file(tmp_path, sums):
    dest = tmp_path / "data.tgz"
    (tmp_path / "data.tgz.part").write_bytes(PAYLOAD[:1000])
    calls = []
    download.download("http://example.invalid/data.tgz", dest, opener=server(calls=calls), log=lambda m: None)
    assert calls == ["bytes=1000-"]
    assert dest.read_bytes() == PAYLOAD and not (tmp_path / "data.tgz.part").exists()


def test_server_without_range_support_restarts(tmp_path, sums):
    dest = tmp_path / "data.tgz"
    (tmp_path / "data.tgz.part").write_bytes(b"garbage")
    download.download("http://example.invalid/data.tgz", dest, opener=server(honour_range=False), log=lambda m: None)
    assert dest.read_bytes() == PAYLOAD


def test_complete_file_is_not_downloaded_again(tmp_path, sums):
    dest = tmp_path / "data.tgz"
    dest.write_bytes(PAYLOAD)
    calls = []
    download.download("http://example.invalid/data.tgz", dest, opener=server(calls=calls), log=lambda m: None)
    assert calls == []


def test_checksum_mismatch_names_the_file_and_keeps_nothing_final(tmp_path, sums):
    dest = tmp_path / "data.tgz"
    with pytest.raises(DataError, match="data.tgz.*does not match"):
        download.download("http://example.invalid/data.tgz", dest, opener=server(payload=PAYLOAD[::-1]),
                          log=lambda m: None)
    assert not dest.exists() and (tmp_path / "data.tgz.part.bad").exists()
    bad = tmp_path / "data.tgz"
    bad.write_bytes(b"not the file")
    with pytest.raises(DataError, match=str(bad)):
        download.verify(bad, log=lambda m: None)


def test_unknown_checksum_prints_hash_and_where_to_record_it(tmp_path, sums):
    f = tmp_path / "other.tgz"
    f.write_bytes(b"abc")
    msgs = []
    assert download.verify(f, log=msgs.append) == hashlib.sha256(b"abc").hexdigest()
    assert hashlib.sha256(b"abc").hexdigest() in msgs[0] and str(sums) in msgs[0]


def test_network_error_is_one_line_with_the_offline_options(tmp_path, sums):
    def opener(req):
        raise OSError("Network is unreachable")
    with pytest.raises(DataError, match="--archive") as e:
        download.download("http://example.invalid/data.tgz", tmp_path / "data.tgz", opener=opener, log=lambda m: None)
    assert "\n" not in str(e.value)


def test_a_recorded_checksum_is_verified_for_an_archive_passed_by_hand(tmp_path, sums):
    # the table (fixture file in SHA256SUMS format) records data.tgz: the right file is accepted,
    # any other file with that name is refused with one line naming it; the table is looked up by name
    assert download.recorded_sha256("data.tgz") == hashlib.sha256(PAYLOAD).hexdigest()
    assert download.recorded_sha256("other.tgz") is None
    good = tmp_path / "good" / "data.tgz"
    good.parent.mkdir()
    good.write_bytes(PAYLOAD)
    msgs = []
    assert download.verify(good, log=msgs.append) == hashlib.sha256(PAYLOAD).hexdigest()
    assert msgs == [f"verified {good} (sha256 {hashlib.sha256(PAYLOAD).hexdigest()[:12]}...)"]
    wrong = tmp_path / "wrong" / "data.tgz"
    wrong.parent.mkdir()
    wrong.write_bytes(PAYLOAD[:-1] + b"!")
    with pytest.raises(DataError, match=rf"{wrong}: sha256 [0-9a-f]{{64}} does not match the recorded") as e:
        download.verify(wrong, log=lambda m: None)
    assert "\n" not in str(e.value)
    # extract_once verifies before extracting: the wrong archive leaves no extracted folder
    with pytest.raises(DataError, match="does not match"):
        download.extract_once(wrong, tmp_path / "extracted", check=True, log=lambda m: None)
    assert not (tmp_path / "extracted").exists()


def test_shipped_checksum_table_is_well_formed():
    for line in download.CHECKSUMS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split()
            assert len(digest) == 64 and int(digest, 16) >= 0 and name
