"""Where chunks, capsule manifests and workspace records live."""

from sojourn.repository.repo import Repository, open_repository, resolve_url

__all__ = ["Repository", "open_repository", "resolve_url"]
