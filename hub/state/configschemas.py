"""The configuration schemas of pushed models (edgefleet.configschemas), read from the hub's
artifact store when an apply needs them; kept by digest (a schema never changes under one)."""

from __future__ import annotations

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.configschemas import FILE_NAME, ConfigSchema, SchemaError, parse_schema
from edgefleet.errors import EdgefleetError
from hub.state.cache import Cache
from hub.state.sharedblobs import SharedBlobs

MAX_KEPT = 256


class SchemaUnavailable(EdgefleetError):
    """A pushed schema this hub cannot read now (the apply is refused, retryable)."""


class ConfigSchemas:
    def __init__(self, cache: Cache, blobs: ArtifactStore, shared: SharedBlobs | None) -> None:
        self.cache = cache
        self.blobs = blobs
        self.shared = shared
        self._kept: dict[str, ConfigSchema] = {}

    async def of(self, model: str, version: str) -> ConfigSchema | None:
        """The schema model ``version`` carries; ``None`` when it carries none or was not
        pushed. SchemaUnavailable when its bytes cannot be read or no longer parse."""
        record = self.cache.models.get((model, version))
        digest = record.extras.get(FILE_NAME) if record is not None else None
        if digest is None:
            return None
        kept = self._kept.get(digest)
        if kept is not None:
            return kept
        if self.shared is not None:
            await self.shared.ensure_local(digest)
        try:
            schema = parse_schema(self.blobs.path_for(digest).read_bytes())
        except OSError as exc:
            raise SchemaUnavailable(
                f"the config schema of model {model} {version} cannot be read on this hub "
                f"({exc.strerror}): nothing applied; retry"
            ) from None
        except SchemaError as exc:
            raise SchemaUnavailable(f"model {model} {version}: {exc}") from None
        if len(self._kept) >= MAX_KEPT:
            self._kept.clear()
        self._kept[digest] = schema
        return schema
