"""One redaction for every store URL form: a password never reaches a message, page, event or log line."""

from __future__ import annotations

import re

__all__ = ["redact_url"]

# libpq connection parameters that hold secrets (``?password=...`` and friends)
_SECRET_PARAMS = re.compile(r"(?i)(^|[?&;])((?:ssl)?password|sslkeylogfile)=([^&;#]*)")
# ``user:password@`` in the authority; multi-host authorities (``h1:5432,h2:5433``) must not matter
_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@]*)@")


def redact_url(url: object) -> str:
    """``url`` with every password replaced by ``***``: in ``user:password@``, in the libpq query
    parameters ``password=``/``sslpassword=``, and in a libpq ``key=value`` string. Never raises; a
    non-string is shown by its repr (bytes redacted as text), clipped."""
    if isinstance(url, (bytes, bytearray)):
        return "b" + repr(redact_url(bytes(url).decode("utf-8", "replace")))
    if not isinstance(url, str):
        text = repr(url)
        return text if len(text) <= 120 else text[:117] + "..."
    match = _AUTHORITY.match(url)
    if match and ":" in match.group(2):
        user = match.group(2).split(":", 1)[0]
        url = f"{match.group(1)}{user}:***@{url[match.end():]}"
    elif not match and "://" not in url and "@" in url.split("/", 1)[0] and ":" in url.split("@", 1)[0]:
        # a URL missing its scheme (``u:pw@host/db``): the part before ``@`` may hold the password
        user, _, rest = url.partition("@")
        url = f"{user.split(':', 1)[0]}:***@{rest}"
    if "://" in url or "?" in url:
        return _SECRET_PARAMS.sub(lambda m: f"{m.group(1)}{m.group(2)}=***", url)
    # libpq's keyword form: ``host=h password=secret`` or ``password='se cret'``
    return re.sub(r"(?i)\b((?:ssl)?password)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", r"\1=***", url)
