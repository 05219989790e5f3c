"""Storage URLs as autogemm shows them: with the password hidden, in the URL itself and in any text
that quotes it (an error message, a progress line), so that tables, JSON, reports and the claim
board can be shared.

The password is found by the URL's shape alone, never by parsing it as a database URL: a URL that
does not parse (a bad port, an unescaped '@') is exactly the one that ends up in an error message.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

HIDDEN = "***"
# scheme://user:PASSWORD@...: the user name holds no ':', '/' or '@'; the password runs to the last
# '@' (one left unescaped in a password hides the host too, rather than showing half the password)
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@?#]*):(?P<password>.*)@", re.DOTALL)
# libpq takes the password as a query parameter too: ...?password=...
_QUERY = re.compile(r"(?P<head>[?&](?:ssl)?password=)(?P<password>[^&#]*)", re.IGNORECASE)
# a URL with a password quoted inside a longer text (whitespace and quotes end it)
_IN_TEXT = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@?#\s'\"]*):(?P<password>[^\s'\"]*)@")


def passwords(url: str) -> list[str]:
    """The secrets a URL holds (as written, and percent-decoded), longest first."""
    found = []
    match = _USERINFO.match(url)
    if match and match.group("password"):
        found.append(match.group("password"))
    found += [m.group("password") for m in _QUERY.finditer(url) if m.group("password")]
    found += [unquote(p) for p in found]
    return sorted(set(found), key=len, reverse=True)


def shown_url(url: str) -> str:
    """`url` with its password hidden (user, host, database and the rest kept as written)."""
    if not isinstance(url, str):
        return repr(url)
    shown = _USERINFO.sub(lambda m: f"{m.group('head')}:{HIDDEN}@", url, count=1)
    return _QUERY.sub(lambda m: m.group("head") + HIDDEN, shown)


def hide_passwords(text: str, url: str | None = None) -> str:
    """`text` with `url` shown as `shown_url` shows it, and every password it or any other URL in
    the text holds replaced by ***."""
    text = str(text)
    if url:
        text = text.replace(url, shown_url(url))
        for secret in passwords(url):
            text = text.replace(secret, HIDDEN)
    text = _IN_TEXT.sub(lambda m: f"{m.group('head')}:{HIDDEN}@", text)
    return _QUERY.sub(lambda m: m.group("head") + HIDDEN, text)
