"""Hub plumbing for ascend configs: resolve a local path or a Hub repo id to a file, upload files.

All Hub I/O goes through ``huggingface_hub`` (its cache, offline mode and tokens); every Hub
failure becomes one `AscendConfigNotFoundError` (an ``OSError``, as diffusers raises) naming what
was tried.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["AscendConfigNotFoundError", "resolve_config_file", "upload_config", "upload_files"]


class AscendConfigNotFoundError(OSError):
    """No ascend config could be found locally or downloaded from the Hub."""


def resolve_config_file(
    dir_or_repo_id: str | os.PathLike,
    filename: str,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool | None = None,
    token: str | bool | None = None,
    subfolder: str | None = None,
) -> str:
    """Local path of ``filename`` for a directory, a file path, or a Hub repo id.

    Args:
        dir_or_repo_id: a local directory holding ``filename`` (in ``subfolder`` if given), a
            path to the file itself, or a Hub repo id (``"org/name"``).
        filename: the file name, e.g. ``"ascend_config.json"``.
        revision, cache_dir, local_files_only, token, subfolder: as in ``hf_hub_download``.

    Returns:
        A readable local file path.

    Raises:
        AscendConfigNotFoundError: neither a local file nor a successful Hub download.

    >>> import tempfile, os
    >>> from diffusers_ascend.hub import resolve_config_file
    >>> d = tempfile.mkdtemp(); open(os.path.join(d, "a.json"), "w").close()
    >>> resolve_config_file(d, "a.json") == os.path.join(d, "a.json")
    True
    """
    if not isinstance(dir_or_repo_id, (str, os.PathLike)):
        raise TypeError(f"expected a local path or a Hub repo id (str), got {type(dir_or_repo_id).__name__}")
    local = os.fspath(dir_or_repo_id)
    if os.path.isfile(local):
        return local
    if os.path.isdir(local):
        path = os.path.join(local, subfolder or "", filename)
        if os.path.isfile(path):
            return path
        raise AscendConfigNotFoundError(f"{path} does not exist: the directory {local!r} holds no {filename}")
    if isinstance(dir_or_repo_id, os.PathLike):
        raise AscendConfigNotFoundError(f"{local!r} is neither a directory nor a file")
    _check_repo_id(local)

    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(
            repo_id=local,
            filename=filename,
            subfolder=subfolder or None,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=bool(local_files_only),
            token=token,
        )
    except Exception as e:  # offline + not cached, missing repo/file/revision, HTTP errors
        where = f"{local}/{subfolder + '/' if subfolder else ''}{filename}" + (f"@{revision}" if revision else "")
        offline = " (offline: HF_HUB_OFFLINE or local_files_only)" if _offline(local_files_only) else ""
        head = local.split("/")[0]
        hint = (
            f" ({head!r} is a local folder: if you meant a path in it, {local!r} does not exist)"
            if "/" in local and os.path.isdir(head)
            else ""
        )
        raise AscendConfigNotFoundError(
            f"could not find {filename}: {local!r} is not a local directory or file, and downloading "
            f"{where} from the Hub failed{offline}: {type(e).__name__}: {e}{hint}"
        ) from e


def _check_repo_id(text: str) -> None:
    """Refuses at once, before any network call (a mistyped path would cost the Hub client's retries),
    a string that is no existing path and cannot be a Hub repo id (more than one slash, a leading
    ``.`` or ``/``, ``..``, a backslash...): huggingface_hub's own rules."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as e:
        raise AscendConfigNotFoundError(
            f"{text!r} is neither an existing local directory or file nor a valid Hub repo id "
            f"('name' or 'namespace/name'; {e}): check the path"
        ) from None


def _offline(local_files_only: bool | None) -> bool:
    from huggingface_hub import constants

    return bool(local_files_only) or bool(constants.HF_HUB_OFFLINE)


def upload_config(json_text: str, repo_id: str, filename: str, **kwargs: Any) -> Any:
    """Creates the model repo if missing (``exist_ok=True``) and uploads ``json_text`` as ``filename``.

    Args:
        kwargs: ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr`` (see `upload_files`).

    Returns:
        The ``CommitInfo`` of ``HfApi.upload_file``.

    >>> from diffusers_ascend.hub import upload_config
    >>> upload_config("{}", "me/repo", "ascend_config.json")  # doctest: +SKIP
    """
    return upload_files({filename: json_text.encode("utf-8")}, repo_id, **kwargs)


def upload_files(
    files: dict[str, str | bytes],
    repo_id: str,
    token: str | bool | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
) -> Any:
    """Creates the model repo if missing (``exist_ok=True``) and uploads ``files`` (path in repo ->
    local path or bytes): one file with ``HfApi.upload_file``, several in one commit.

    Returns:
        The ``CommitInfo`` of the upload.

    >>> from diffusers_ascend.hub import upload_files
    >>> upload_files({"ascend_cache.json": b"{}"}, "me/repo")  # doctest: +SKIP
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    if len(files) == 1:
        ((path_in_repo, content),) = files.items()
        return api.upload_file(
            path_or_fileobj=content,
            path_in_repo=path_in_repo,
            repo_id=repo_id,
            repo_type="model",
            revision=revision,
            commit_message=commit_message,
            create_pr=create_pr,
        )
    ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=content) for name, content in files.items()]
    return api.create_commit(
        repo_id=repo_id,
        operations=ops,
        repo_type="model",
        revision=revision,
        commit_message=commit_message or f"Upload {len(ops)} files",
        create_pr=create_pr,
    )
