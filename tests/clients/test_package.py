"""The browser client ships with the package: every file of clients/web is package data
(through the ``duplex/web`` link), and the app serves each one."""

from __future__ import annotations

import fnmatch
import tomllib

from duplex.transport._app import WEB_TYPES, web_files

from ..helpers import ROOT


def test_every_web_file_is_package_data_and_served() -> None:
    web = sorted(p.name for p in (ROOT / "clients" / "web").iterdir())
    assert "index.html" in web and "worklets.js" in web
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["duplex"]
    for name in web:
        assert any(fnmatch.fnmatch(f"web/{name}", p) for p in patterns), name
        assert name[name.rindex(".") :] in WEB_TYPES
    assert (ROOT / "duplex" / "web").resolve() == (ROOT / "clients" / "web").resolve()
    assert sorted(web_files()) == web


def test_the_page_needs_no_key_but_host_and_origin_still_hold() -> None:
    from duplex.transport._access import AccessPolicy, AccessSettings, Allowed, digest

    policy = AccessPolicy(AccessSettings(key_digests=(digest("k"),)))
    own = {"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:8000"}

    def decide(headers: dict[str, str], public: bool) -> object:
        return policy.decide("http", headers, peer="p", bound_port=8000, now=0.0, public=public)

    assert isinstance(decide(own, True), Allowed)
    assert decide(own, False).status == 401  # type: ignore[attr-defined]
    assert decide({**own, "origin": "http://evil.example"}, True).status == 403  # type: ignore[attr-defined]
    assert decide({"host": "evil.example:8000"}, True).status == 421  # type: ignore[attr-defined]
