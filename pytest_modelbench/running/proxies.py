"""Forward proxies for hosted endpoints, read from the environment as requests and curl read them
(``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``, ``NO_PROXY``)."""

from __future__ import annotations

import base64
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Proxy:
    """A forward proxy from ``HTTP_PROXY``/``HTTPS_PROXY`` (user:password@ becomes Basic auth)."""

    host: str
    port: int
    authorization: str | None = None


def proxy_for(base_url: str, environ: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy the environment names for ``base_url``, as requests and curl read it:
    ``HTTPS_PROXY``/``HTTP_PROXY`` (or lower case) by scheme, ``ALL_PROXY`` otherwise, and
    none for a host ``NO_PROXY`` lists (names, domain suffixes, IPs, ``*``)."""
    env = os.environ if environ is None else environ
    proxies = {
        key[: -len("_proxy")].lower(): value
        for key, value in env.items()
        if key.lower().endswith("_proxy") and value
    }
    parts = urlsplit(base_url)
    raw = proxies.get(parts.scheme) or proxies.get("all")
    if not raw or not parts.hostname:
        return None
    if "no" in proxies and _bypassed(parts.hostname, parts.port, proxies["no"]):
        return None
    proxy = urlsplit(raw if "://" in raw else f"http://{raw}")
    if proxy.scheme not in ("http", "") or not proxy.hostname:
        raise ValueError(f"proxy {raw!r}: only http:// proxies are supported")
    authorization = None
    if proxy.username is not None:
        token = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        authorization = "Basic " + base64.b64encode(token.encode()).decode()
    return Proxy(proxy.hostname, proxy.port or 80, authorization)


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    host = host.lower().strip("[]")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and port is not None and entry_port != str(port):
            continue
        name = name.strip("[]").lstrip(".")
        if host == name or host.endswith("." + name) or _in_network(host, name):
            return True
    return False


def _in_network(host: str, entry: str) -> bool:
    """``entry`` as an address or CIDR block (``127.0.0.0/8``) containing ``host``."""
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
