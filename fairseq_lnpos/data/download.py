"""Resumable, verified downloads (urllib only) and archive extraction.

A download goes to ``<file>.part`` and resumes from its size with an HTTP Range request; the
finished file is verified against the sha256 recorded in ``SHA256SUMS`` (next to this module)
and only then renamed to its final name. A file already in place is verified, not fetched again.
"""
import hashlib
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

from fairseq_lnpos.common import open_log, read_json, refuse_link, write_json
from fairseq_lnpos.errors import LnposError, StateError

CHECKSUMS = Path(__file__).with_name("SHA256SUMS")
CHUNK = 1 << 20


class DataError(LnposError):
    """Bad input data: the message is one line that names the file and says what to do."""


def recorded_sha256(name, checksums=CHECKSUMS):
    """The sha256 recorded for file ``name`` in SHA256SUMS (``<hex>  <name>`` lines), or None."""
    if not Path(checksums).is_file():
        return None
    for line in Path(checksums).read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and parts[1].lstrip("*") == name:
            return parts[0].lower()
    return None


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def verify(path, name=None, expected=None, log=print):
    """Check ``path`` against the recorded (or given) sha256; raise DataError on a mismatch.

    Where no checksum is recorded the computed one is printed with the place to record it.
    """
    path = Path(path)
    name = name or path.name
    expected = expected or recorded_sha256(name)
    actual = sha256_of(path)
    if expected is None:
        log(f"note: no sha256 recorded for {name}; computed {actual}. If this copy is the official one, "
            f"record it as the line '{actual}  {name}' in {CHECKSUMS}")
        return actual
    if actual != expected:
        raise DataError(
            f"{path}: sha256 {actual} does not match the recorded {expected}: "
            f"delete it and download it again (or pass a correct copy)"
        )
    log(f"verified {path} (sha256 {actual[:12]}...)")
    return actual


OFFLINE = "download it yourself and pass the file with --archive / the folder with --orig"


def download(url, dest, name=None, log=print, opener=urllib.request.urlopen, offline=OFFLINE):
    """Fetch ``url`` to ``dest`` (resuming ``dest.part``), verify it, return ``dest``.

    Does nothing but verify when ``dest`` already exists. ``offline``: what the error of a failed
    download tells the user to do instead.
    """
    dest = Path(dest)
    if dest.is_file():
        log(f"{dest} exists, not downloading again")
        verify(dest, name, log=log)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    refuse_link(part)  # never appended to through a link, nor renamed into place
    start = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={start}-"} if start else {})
    try:
        resp = opener(req)
    except OSError as e:  # URLError, HTTPError and socket errors are all OSErrors
        if start and getattr(e, "code", None) == 416:  # the .part file is already complete
            resp = None
        else:
            raise DataError(f"cannot download {url} ({e}): check the network, or {offline}") from e
    if resp is not None:
        with resp:
            status = getattr(resp, "status", 200)
            mode = "ab" if start and status == 206 else "wb"
            if mode == "wb" and start:
                log(f"server ignored the resume request; downloading {url} from the start")
                start = 0
            total = resp.headers.get("Content-Length")
            total = int(total) + start if total else None
            done, next_report = start, start
            log(f"downloading {url} -> {dest}" + (f" (resuming at {start} bytes)" if start else ""))
            with open_log(part, binary=True, truncate=mode == "wb") as f:
                for block in iter(lambda: resp.read(CHUNK), b""):
                    f.write(block)
                    done += len(block)
                    if done >= next_report:
                        log(f"  {done >> 20} MiB" + (f" of {total >> 20} MiB" if total else ""))
                        next_report = done + (50 << 20)
            if total is not None and done < total:
                raise DataError(f"{part}: download stopped at {done} of {total} bytes: run again to resume")
    try:
        verify(part, name or dest.name, log=log)
    except DataError:
        bad = part.with_name(part.name + ".bad")
        part.replace(bad)
        raise DataError(f"{url}: downloaded file's sha256 does not match the recorded one "
                        f"(kept as {bad}); delete it and run again") from None
    part.replace(dest)
    return dest


class UnsafeMember(DataError):
    """An archive member that would be written outside the extraction folder."""


def check_member(member, root):
    """Refuse (:class:`UnsafeMember`) what tarfile's ``filter="data"`` refuses: absolute names,
    names or link targets that lead outside ``root`` (through ``..`` or links extracted before),
    and device or FIFO files. For Pythons whose tarfile has no filters."""
    root = os.path.realpath(root)

    def inside(path):
        return os.path.commonpath([root, os.path.realpath(path)]) == root

    name = member.name
    if os.path.isabs(name) or name.startswith(("/", "\\")):
        raise UnsafeMember(f"member {name!r} has an absolute path")
    path = os.path.join(root, name)
    if not inside(path):
        raise UnsafeMember(f"member {name!r} would be written outside the extraction folder")
    if member.issym() or member.islnk():
        if os.path.isabs(member.linkname):
            raise UnsafeMember(f"link {name!r} points to the absolute path {member.linkname!r}")
        base = os.path.dirname(path) if member.issym() else root
        if not inside(os.path.join(base, member.linkname)):
            raise UnsafeMember(f"link {name!r} -> {member.linkname!r} points outside the extraction folder")
    elif not (member.isfile() or member.isdir()):
        raise UnsafeMember(f"member {name!r} is a device or FIFO file")


def _data_filter(member, path):
    """tarfile's ``data`` filter, which would extract an absolute name below the folder; such an
    archive is refused instead, as :func:`check_member` does."""
    if os.path.isabs(member.name) or member.name.startswith(("/", "\\")):
        raise UnsafeMember(f"member {member.name!r} has an absolute path")
    return tarfile.data_filter(member, path)


def extract(archive, dest_dir, log=print):
    """Extract a tar(.gz) archive into ``dest_dir`` via a temporary sibling folder, refusing
    absolute names, and members and links that lead outside it (tarfile's ``filter="data"`` where
    this Python has it, :func:`check_member` member by member where not)."""
    archive, dest_dir = Path(archive), Path(dest_dir)
    tmp = dest_dir.with_name("." + dest_dir.name + ".extracting")
    if tmp.exists():
        _rmtree(tmp)
    tmp.mkdir(parents=True)
    filter_errors = (UnsafeMember,) + ((tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ())
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter=_data_filter)
            else:
                for member in tar:  # checked one by one, after the links extracted before it
                    check_member(member, tmp)
                    tar.extract(member, tmp)
    except filter_errors as e:
        _rmtree(tmp)
        raise UnsafeMember(f"{archive}: refusing to extract it: {e}: download the archive again from its "
                           "official address") from None
    except (tarfile.TarError, EOFError, OSError) as e:
        _rmtree(tmp)
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise DataError(f"{archive}: not a readable tar archive ({reason}): delete it and download it again") from e
    except BaseException:
        _rmtree(tmp)
        raise
    log(f"extracted {archive} -> {dest_dir}")
    tmp.replace(dest_dir)
    return dest_dir


def _rmtree(path):
    shutil.rmtree(path, ignore_errors=True)


def extract_once(archive, dest_dir, name=None, check=True, log=print):
    """Verify (with ``check``) and extract ``archive`` into ``dest_dir`` unless this very file
    (path, size, mtime) was extracted there before."""
    archive, dest_dir = Path(archive), Path(dest_dir)
    st = archive.stat()
    key = {"archive": str(archive.resolve()), "size": st.st_size, "mtime": int(st.st_mtime)}
    stamp = dest_dir / ".extracted.json"
    try:
        if read_json(stamp, missing_ok=True) == key:
            log(f"[orig] {archive} already extracted in {dest_dir}: skipped")
            return dest_dir
    except StateError:  # a damaged stamp: extract again
        pass
    if check:
        log(f"[orig] verifying {archive}")
        verify(archive, name, log=log)
    _rmtree(dest_dir)
    extract(archive, dest_dir, log=log)
    write_json(stamp, key)
    return dest_dir
