"""Every byte fetched is inside the savepoint (issue 31, items 2, 3 and 8).

* a server that answers a savepoint's state files with ``302`` (to another port, to another
  path of its own): no redirect is followed, a :class:`RedirectRefusedError` names the file and
  the target, and no request reaches the target;
* a relative handle ``%2e%2e/%2e%2e/team-b/<file>``: percent-decoded once, before confinement,
  and refused (with and without ``STATEQUERY_ALLOWED_ROOTS``); what is checked is what is
  requested;
* untyped leftovers: ``os.path.realpath`` failing with ``EINVAL`` while a link is swapped, and
  the "Exception ignored in FTPFileSystem.__del__" traceback of ``statequery inspect ftp://``.

The savepoint is the real canonical heap savepoint, served by a loopback HTTP server."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.loopback import counting_http_server, static_http_server

import statequery
from statequery.exceptions import RedirectRefusedError, StorageError
from statequery.io import FileIO, is_under, join_location, normalize_location
from tests.conftest import fixture_dir

CANONICAL = "datastream-hashmap-canonical"
USER_STATE = "35c43c75-67c4-434b-9a81-93ef78b4a37b"  # the user-state operator's state file
ROOT = Path(__file__).resolve().parents[2]


def _rows(location: str | Path, io: FileIO | None = None) -> dict[str, int]:
    sp = statequery.open(str(location), io=io or FileIO(), use_snapshot=False)
    return {t: sp.read(t).num_rows for t in sp.state_meta().column("table_name").to_pylist()}


def _served_copy(www: Path) -> Path:
    """A copy of the canonical savepoint at ``www/sp/<name>``."""
    src = fixture_dir(CANONICAL)
    sp = www / "sp" / src.name
    shutil.copytree(src, sp)
    return sp


def _state_files(sp: Path) -> list[str]:
    return sorted(f.name for f in sp.iterdir() if f.name != "_metadata")


# -- redirects ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("allowed", "methods"), [(False, ("HEAD", "GET")), (True, ("HEAD", "GET")),
                                                  (False, ("GET",))])
def test_redirect_to_another_port_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allowed: bool, methods: tuple[str, ...]
) -> None:
    """The issue's attack: state files answered with ``302`` to a metadata-endpoint lookalike on
    another loopback port. Followed, its bytes were parsed as state and quoted in the error.
    Also when only the ranged reads are redirected (the size check answered ``200``)."""
    www = tmp_path / "www"
    sp = _served_copy(www)
    names = _state_files(sp)
    with counting_http_server() as target:
        creds = f"{target.url}/latest/meta-data/iam/security-credentials/role"

        def redirect(method: str, path: str) -> str | None:
            return creds if method in methods and path.rsplit("/", 1)[-1] in names else None

        with static_http_server(str(www), redirect=redirect) as own:
            uri = f"{own.url}/sp/{sp.name}/_metadata"
            if allowed:
                monkeypatch.setenv("STATEQUERY_ALLOWED_ROOTS", f"{own.url}/sp")
            with pytest.raises(RedirectRefusedError) as info:
                _rows(uri)
            message = str(info.value)
            assert f"{own.url}/sp/{sp.name}/" in message  # the file
            assert creds in message and "302" in message  # the target
            assert "a,b" not in message  # nothing of what the target would have sent
            assert any(r.endswith("/_metadata") for r in own.requests)
            assert any(r.split("/")[-1] in names for r in own.requests)
            if methods == ("GET",):
                assert any(r.startswith("HEAD ") and r.split("/")[-1] in names
                           for r in own.requests)
    assert target.requests == []


def test_redirect_to_another_path_of_the_same_server_is_not_followed(tmp_path: Path) -> None:
    """A ``302`` to a path of the same host and port outside the savepoint (where the very bytes
    are: followed, the read would succeed): refused, that path never requested."""
    www = tmp_path / "www"
    sp = _served_copy(www)
    baseline = _rows(sp)
    elsewhere = www / "team-b"
    elsewhere.mkdir()
    for name in _state_files(sp):
        shutil.copy(sp / name, elsewhere / name)

    def redirect(method: str, path: str) -> str | None:
        name = path.rsplit("/", 1)[-1]
        return f"/team-b/{name}" if path.startswith("/sp/") and name != "_metadata" else None

    with static_http_server(str(www), redirect=redirect) as own:
        with pytest.raises(RedirectRefusedError, match=r"302 \(a redirect to '/team-b/"):
            _rows(f"{own.url}/sp/{sp.name}/_metadata")
        assert not [r for r in own.requests if "/team-b/" in r]
    # served without redirects, the same savepoint reads in full over http
    with static_http_server(str(www)) as own:
        assert _rows(f"{own.url}/sp/{sp.name}/_metadata") == baseline


def test_a_request_asking_to_follow_redirects_is_stopped_before_the_target(tmp_path: Path) -> None:
    """Defence in depth: a call into the HTTP client that asks to follow redirects (fsspec's
    ``allow_redirects=True``) is stopped by the session's redirect hook before the second
    request is sent."""
    (tmp_path / "f").write_bytes(b"state")
    with counting_http_server() as target, static_http_server(
            str(tmp_path), redirect=lambda method, path: f"{target.url}/creds") as own:
        fs = FileIO({})._filesystem(f"{own.url}/f")
        with pytest.raises(RedirectRefusedError, match=r"/f: the server answered 302 .*/creds"):
            fs.fs.cat_file(f"{own.url}/f", allow_redirects=True)  # type: ignore[attr-defined]
        assert own.requests == ["GET /f"]
    assert target.requests == []


# -- percent-encoded dot segments ------------------------------------------------------------


def _rewrite_relative(sp: Path, name: str, new: str) -> None:
    """Rewrite the relative handle naming ``name`` in ``sp/_metadata`` (a Java ``writeUTF``
    string: two length bytes, then the text) to ``new``."""
    meta = sp / "_metadata"
    data = meta.read_bytes()
    old = name.encode()
    at = data.index(len(old).to_bytes(2, "big") + old)
    meta.write_bytes(data[:at] + len(new).to_bytes(2, "big") + new.encode()
                     + data[at + 2 + len(old):])


@pytest.mark.parametrize("allowed", [False, True])
def test_percent_encoded_dot_segments_in_a_relative_handle_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allowed: bool
) -> None:
    """``%2e%2e/%2e%2e/team-b/<file>`` has no literal ``..``: the HTTP client used to normalise
    it to ``/team-b/<file>``, another team's directory (where the file is, so the read
    succeeded)."""
    www = tmp_path / "www"
    sp = _served_copy(www)
    (www / "team-b").mkdir()
    (sp / USER_STATE).rename(www / "team-b" / USER_STATE)
    _rewrite_relative(sp, USER_STATE, f"%2e%2e/%2e%2e/team-b/{USER_STATE}")
    with static_http_server(str(www)) as own:
        if allowed:
            monkeypatch.setenv("STATEQUERY_ALLOWED_ROOTS", f"{own.url}/sp/{sp.name}")
        with pytest.raises(StorageError, match=r"escapes .*percent-decoded: '\.\./\.\./team-b/"):
            _rows(f"{own.url}/sp/{sp.name}/_metadata")
        assert own.requests  # the savepoint itself was read
        assert not [r for r in own.requests if "team-b" in r]


def test_url_paths_are_decoded_once_and_sent_as_checked(tmp_path: Path) -> None:
    """What confinement checks is the path the request carries: dot segments, encoded or not,
    are gone before the check, and a doubly encoded ``%252e`` stays a literal ``%2e`` name
    (requested as ``%252e``, never decoded a second time into ``..``)."""
    assert normalize_location("http://h:1/sp/a/%2e%2e/%2E%2e/x") == "http://h:1/x"
    assert normalize_location("http://h:1/sp/%252e%252e/x") == "http://h:1/sp/%252e%252e/x"
    assert normalize_location("https://h/a%20b/./c") == "https://h/a%20b/c"
    assert normalize_location("https://h/x?a=b c&d=%26") == "https://h/x?a=b%20c&d=%26"
    for loc in ("http://h:1/sp/a/%2e%2e/%2E%2e/x", "http://h/a%25b/c/", "https://h/%7e/x y",
                "http://h/x?q=1 2%20"):
        once = normalize_location(loc)
        assert normalize_location(once) == once
    assert not is_under("http://h:1/sp/x/%2e%2e/%2e%2e/team-b/f", "http://h:1/sp/x")
    assert not is_under("http://h:1/sp/x/%2E%2E/y", "http://h:1/sp/x")
    base = "http://h:1/sp/x"
    for bad in ("%2e%2e/%2e%2e/team-b/f", "a/%2e%2e/%2e%2e/f", "%2fetc%2fpasswd", "..%2fy",
                "%2e%2e", "a%00b"):
        with pytest.raises(StorageError):
            join_location(base, bad)
    assert join_location(base, "a/%2e%2e/f") == "http://h:1/sp/x/f"
    assert join_location(base, "%252e%252e/f") == "http://h:1/sp/x/%252e%252e/f"
    # local and object-store names are literal: no percent-decoding there
    assert join_location("/sp/x", "%2e%2e/f") == "/sp/x/%2e%2e/f"
    assert join_location("s3://b/sp/x", "%2e%2e/f") == "s3://b/sp/x/%2e%2e/f"

    # over a real server: a file whose name holds "%2e" is requested as "%252e", literally
    www = tmp_path / "www"
    sp = _served_copy(www)
    baseline = _rows(sp)
    odd = f"%2e%2e{USER_STATE}"
    (sp / USER_STATE).rename(sp / odd)
    _rewrite_relative(sp, USER_STATE, odd.replace("%", "%25"))
    with static_http_server(str(www)) as own:
        assert _rows(f"{own.url}/sp/{sp.name}/_metadata") == baseline
        assert any(r.endswith(f"/sp/{sp.name}/%252e%252e{USER_STATE}") for r in own.requests)


def test_absolute_handle_with_encoded_dot_segments_is_refused_with_allowed_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An absolute handle on the savepoint's own host, ``.../chk-1/%2e%2e/%2e%2e/team-b/<f>``:
    with allowed roots set, handles must stay in the checkpoint's tree; the encoded dot segments
    no longer hide that it does not."""
    from support.checkpoints import FIXTURE, edited_copy, read_everything

    www = tmp_path / "www"
    www.mkdir()
    team_b = www / "team-b"
    shutil.copytree(fixture_dir(FIXTURE).parent / "shared", team_b)
    holder: list[str] = []

    def rewrite(p: str) -> str:
        return f"{holder[0]}/{job}/chk-1/%2e%2e/%2e%2e/team-b/{p.rsplit('/', 1)[1]}"

    job = fixture_dir(FIXTURE).parent.name
    with static_http_server(str(www)) as own:
        holder.append(own.url)
        chk = edited_copy(www, rewrite)
        shutil.rmtree(chk.parent / "shared")
        monkeypatch.setenv("STATEQUERY_ALLOWED_ROOTS", f"{own.url}/{job}")
        with pytest.raises(StorageError, match=r"refuses to read: it is outside the allowed"):
            read_everything(f"{own.url}/{job}/chk-1/_metadata")  # type: ignore[arg-type]
        assert not [r for r in own.requests if "team-b" in r]


# -- untyped leftovers -------------------------------------------------------------------------


def test_link_swapped_while_it_is_resolved_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``os.path.realpath`` lstat's a name, sees a link, then readlink's it: when the link is
    replaced by a file in between, the kernel answers ``EINVAL``. Here the swap happens at
    exactly that moment (the real rename, the real readlink)."""
    src = fixture_dir(CANONICAL)
    sp = tmp_path / "sp" / src.name
    shutil.copytree(src, sp)
    (sp / "sub").mkdir()
    (sp / USER_STATE).rename(sp / "sub" / USER_STATE)
    (sp / USER_STATE).symlink_to(Path("sub") / USER_STATE)
    victim = str(sp / USER_STATE)
    real_readlink: Callable[..., str] = os.readlink
    swaps: list[str] = []

    def readlink(path: str | os.PathLike[str], *args: object, **kw: object) -> str:
        if os.fspath(path) == victim and not swaps:
            swaps.append(victim)
            tmp = victim + ".swap"
            shutil.copy(sp / "sub" / USER_STATE, tmp)
            os.replace(tmp, victim)  # the link is now a regular file
        return real_readlink(path, *args, **kw)

    monkeypatch.setattr(os, "readlink", readlink)
    with pytest.raises(StorageError, match=rf"cannot check where .*{USER_STATE} resolves") as e:
        _rows(sp)
    assert swaps == [victim]
    cause = e.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.EINVAL


def test_cli_ftp_nothing_listening_prints_one_line() -> None:
    """``statequery inspect ftp://127.0.0.1:1/x``: one line, exit 1, and no "Exception ignored
    in FTPFileSystem.__del__" traceback (printed when a half-built fsspec instance was freed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STATEQUERY_RETRIES": "1"}
    proc = subprocess.run([sys.executable, "-m", "statequery.cli", "inspect", "ftp://127.0.0.1:1/x"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequery: "), proc.stderr
    assert "ftp://127.0.0.1:1/x" in lines[0]
