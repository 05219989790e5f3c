"""Where the data that ships with autogemm lives: templates, search spaces, tuned results.

A wheel carries them inside the package (`autogemm/templates`, ...); a source checkout (and an
editable install) keeps them at the top of the repository, beside the package.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"autogemm's {name}/ directory is missing (looked in {_PACKAGE} and beside it); "
        "reinstall the package"
    )


def templates_dir() -> Path:
    """The kernel templates. ``$AUTOGEMM_TEMPLATE_DIR`` puts a directory in front of the shipped
    templates: a template found there replaces the shipped one of that name (and can include the
    shipped one as ``base/<name>``). The tests use it for deliberately broken variants."""
    return _data_dir("templates")


def template_override_dir() -> Path | None:
    override = os.environ.get("AUTOGEMM_TEMPLATE_DIR")
    if not override:
        return None
    path = Path(override).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"AUTOGEMM_TEMPLATE_DIR={override} is not a directory")
    return path


def search_spaces_dir() -> Path:
    return _data_dir("search_spaces")


def user_cache_dir() -> Path:
    """Where tuned results, studies and compiled kernels are kept: ``$AUTOGEMM_CACHE_DIR`` if set,
    else the platform's user cache directory (``~/.cache/autogemm`` on Linux)."""

    override = os.environ.get("AUTOGEMM_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs  # (lazy: only the user cache directory needs it)

    return Path(platformdirs.user_cache_dir("autogemm", appauthor=False))


def cubin_dir() -> Path:
    """Where compiled kernels are kept (keyed by source digest, architecture and compiler version,
    so that any number of processes can share them): ``$AUTOGEMM_CUBIN_DIR`` if set, else
    ``cubin/`` in the cache directory."""

    override = os.environ.get("AUTOGEMM_CUBIN_DIR")
    return Path(override).expanduser() if override else user_cache_dir() / "cubin"


def shipped_cache_dir() -> Path | None:
    """Tuned results shipped with autogemm: the repository's ``cache/``, which a wheel carries as
    ``autogemm/tuned``. None when there is none."""
    for candidate in (_PACKAGE / "tuned", _PACKAGE.parent / "cache"):
        if candidate.is_dir():
            return candidate
    return None
