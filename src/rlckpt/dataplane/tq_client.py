"""DataPlaneClient over TransferQueue (``transfer_queue``, SimpleStorage backend) on Ray.

TQ keeps one client per process in module globals, and one controller per Ray cluster (a named
actor). ``bootstrap=True`` starts controller + storage units and owns them; ``bootstrap=False``
only connects and never calls ``tq.close()`` (that would kill the shared controller).
TQ's sync API runs in worker threads (``run_blocking``) so the caller's event loop never blocks.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlckpt.dataplane import ray_cluster  # noqa: F401  (sets Ray/TQ env defaults before ray import)
from rlckpt.dataplane.base import SNAPSHOT_METADATA_FILE, DataPlaneClient, FieldValue
from rlckpt.dataplane.fields import batch_fields, check_json_metadata, check_keys, densify, rows_of
from rlckpt.dataplane.row_parser import PARSERS
from rlckpt.dataplane.threads import run_blocking
from rlckpt.dataplane.tq_snapshot_check import vetted_copy
from rlckpt.errors import DataPlaneError, MissingSamplesError, RestoreRefusedError
from rlckpt.formats import load_json

logger = logging.getLogger(__name__)

CONTROLLER_NAME = "TransferQueueController"
CONTROLLER_NAMESPACE = "transfer_queue"

# One storage unit: fewest actors (each takes a Ray CPU label); a snapshot must be loaded into
# a TQ with the same unit count, so every rlckpt process uses this default unless told.
DEFAULT_TQ_CONFIG: dict[str, Any] = {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}


def controller_running() -> bool:
    """True when the current Ray cluster already has a TransferQueue controller."""
    import ray

    try:
        ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    except ValueError:
        return False
    return True


class TransferQueueClient(DataPlaneClient):
    """TransferQueue adapter; see the module docstring for bootstrap vs connect-only.

    ``row_parser`` picks how storage units keep rows (``rlckpt.dataplane.row_parser``):
    ``"numpy"`` (default, fastest snapshots), ``"torch"`` (cloned tensors), or ``"none"``
    (TQ's default: rows are views of their whole put batch; only for the benchmark that shows
    the snapshot blow-up this causes).
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        bootstrap: bool,
        row_parser: str = "numpy",
    ) -> None:
        super().__init__()
        if row_parser not in PARSERS:
            raise ValueError(f"TransferQueueClient: row_parser must be one of {sorted(PARSERS)}, got {row_parser!r}")
        import ray
        import transfer_queue as tq

        if not ray.is_initialized():
            raise DataPlaneError("TransferQueueClient: connect to a Ray cluster first (start_local_ray)")
        running = controller_running()
        if bootstrap and running:
            raise DataPlaneError(
                "TransferQueueClient(bootstrap=True): a TransferQueue controller already runs on this "
                "Ray cluster; connect with bootstrap=False"
            )
        if not bootstrap and not running:
            raise DataPlaneError(
                "TransferQueueClient(bootstrap=False): no TransferQueue controller on this Ray cluster; "
                "the bootstrap client (and any restore) must come first"
            )
        self.bootstrap = bootstrap
        self._data_parser = PARSERS[row_parser]
        self._closed = False
        tq.init(dict(config) if config is not None else dict(DEFAULT_TQ_CONFIG))
        logger.info("TransferQueue %s", "started (owned by this client)" if bootstrap else "connected")

    # --- helpers -------------------------------------------------------------------------------

    def _check_open(self, where: str) -> None:
        if self._closed:
            raise DataPlaneError(f"{where}: TransferQueueClient is closed")

    @staticmethod
    def _list_sync(partition_id: str | None) -> dict[str, dict[str, Any]]:
        import transfer_queue as tq

        return tq.kv_list(partition_id) or {}

    def _missing_keys(self, partition_id: str, keys: Sequence[str]) -> list[str]:
        present = set(self._list_sync(partition_id).get(partition_id, {}))
        return [k for k in keys if k not in present]

    # --- data ----------------------------------------------------------------------------------

    async def put_samples(
        self,
        partition_id: str,
        keys: Sequence[str],
        fields: Mapping[str, FieldValue],
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        where = f"put_samples(partition={partition_id!r})"
        self._check_open(where)
        keys = check_keys(keys, where)
        if not keys:
            return
        batched = batch_fields(fields, len(keys), where)
        if tags is not None and len(tags) != len(keys):
            raise DataPlaneError(f"{where}: {len(tags)} tags for {len(keys)} keys")
        self._guard.mark_touched()
        try:
            await run_blocking(self._put_sync, partition_id, keys, batched, tags)
        except DataPlaneError:
            raise
        except Exception as exc:
            raise DataPlaneError(f"{where}: TransferQueue put of {len(keys)} rows failed: {exc}") from exc

    def _put_sync(
        self,
        partition_id: str,
        keys: list[str],
        batched: dict[str, torch.Tensor],
        tags: Sequence[Mapping[str, Any]] | None,
    ) -> None:
        import transfer_queue as tq
        from tensordict import TensorDict

        tq.kv_batch_put(
            keys=keys,
            partition_id=partition_id,
            fields=TensorDict(batched, batch_size=[len(keys)]),
            tags=[dict(t) for t in tags] if tags is not None else None,
            data_parser=self._data_parser,
        )

    async def get_samples(
        self,
        partition_id: str,
        keys: Sequence[str],
        fields: Sequence[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        where = f"get_samples(partition={partition_id!r})"
        self._check_open(where)
        keys = check_keys(keys, where)
        if not keys:
            return {}
        self._guard.mark_touched()
        return await run_blocking(self._get_sync, partition_id, keys, fields, where)

    def _get_sync(
        self, partition_id: str, keys: list[str], fields: Sequence[str] | None, where: str
    ) -> dict[str, torch.Tensor]:
        data = self._fetch(partition_id, keys, fields, where)
        names = list(fields) if fields is not None else list(data.keys())
        return {name: densify(name, data.get(name), where) for name in names}

    def _fetch(self, partition_id: str, keys: list[str], fields: Sequence[str] | None, where: str) -> Any:
        """TQ's batch for ``keys``: exactly that many rows, or MissingSamplesError naming the missing keys."""
        import transfer_queue as tq

        try:
            data = tq.kv_batch_get(
                keys=keys, partition_id=partition_id, select_fields=list(fields) if fields is not None else None
            )
        except Exception as exc:  # TQ: ValueError for unknown keys / unready fields
            missing = self._missing_keys(partition_id, keys)
            if missing:
                raise MissingSamplesError(
                    f"{where}: {len(missing)} of {len(keys)} keys missing: {missing[:20]}"
                ) from exc
            raise DataPlaneError(f"{where}: TransferQueue get failed (fields={fields}): {exc}") from exc
        rows = int(data.batch_size[0]) if len(data.batch_size) else 0
        if rows != len(keys):  # TQ returns fewer rows with only a log warning
            missing = self._missing_keys(partition_id, keys)
            raise MissingSamplesError(
                f"{where}: got {rows} of {len(keys)} rows; missing keys: {missing[:20] or 'unknown'}"
            )
        return data

    async def get_rows(
        self, partition_id: str, keys: Sequence[str], fields: Sequence[str]
    ) -> dict[str, list[torch.Tensor]]:
        where = f"get_rows(partition={partition_id!r})"
        self._check_open(where)
        keys = check_keys(keys, where)
        if not keys:
            return {}
        self._guard.mark_touched()
        return await run_blocking(self._get_rows_sync, partition_id, keys, list(fields), where)

    def _get_rows_sync(
        self, partition_id: str, keys: list[str], fields: list[str], where: str
    ) -> dict[str, list[torch.Tensor]]:
        data = self._fetch(partition_id, keys, fields, where)
        return {name: rows_of(name, data.get(name), where) for name in fields}

    async def is_empty(self) -> bool:
        self._check_open("is_empty")
        return not await run_blocking(self._list_sync, None)

    async def clear_samples(self, partition_id: str, keys: Sequence[str]) -> None:
        import transfer_queue as tq

        where = f"clear_samples(partition={partition_id!r})"
        self._check_open(where)
        keys = check_keys(keys, where)
        if not keys:
            return
        self._guard.mark_touched()
        try:
            await run_blocking(tq.kv_clear, keys=keys, partition_id=partition_id)
        except Exception as exc:
            raise DataPlaneError(f"{where}: TransferQueue clear of {len(keys)} rows failed: {exc}") from exc

    async def list_sample_ids(self, partition_id: str) -> list[str]:
        self._check_open(f"list_sample_ids(partition={partition_id!r})")
        listing = await run_blocking(self._list_sync, partition_id)
        return sorted(listing.get(partition_id, {}))

    # --- snapshot ------------------------------------------------------------------------------

    async def save_checkpoint(self, local_dir: str | Path, metadata: Mapping[str, Any]) -> None:
        import transfer_queue as tq

        local_dir = Path(local_dir).resolve()  # the storage actors write it: absolute path
        where = f"save_checkpoint({local_dir})"
        self._check_open(where)
        meta = check_json_metadata(metadata, where)
        try:
            await run_blocking(tq.save_checkpoint, local_dir, metadata=meta)
        except Exception as exc:
            raise DataPlaneError(f"{where}: TransferQueue snapshot failed: {exc}") from exc

    async def load_checkpoint(self, local_dir: str | Path) -> dict[str, Any]:
        import transfer_queue as tq

        local_dir = Path(local_dir).resolve()
        where = f"load_checkpoint({local_dir})"
        self._check_open(where)
        self._guard.check_may_load(str(local_dir))
        holding = await run_blocking(self._list_sync, None)
        if holding:
            counts = {pid: len(rows) for pid, rows in sorted(holding.items())[:10]}
            raise RestoreRefusedError(
                f"restore from {local_dir} refused: TransferQueue already holds partitions (rows) {counts}; "
                "some client wrote before the restore"
            )
        # TQ's actors unpickle what they load with plain pickle: they get a vetted copy, never local_dir
        # (tq_snapshot_check). A refused snapshot leaves TQ untouched and this client able to load.
        vetted = Path(tempfile.mkdtemp(prefix=f".{local_dir.name}.vetted-", dir=local_dir.parent))
        try:
            await run_blocking(vetted_copy, local_dir, vetted)
            with self._guard.loading(str(local_dir)):
                meta = load_json((vetted / SNAPSHOT_METADATA_FILE).read_bytes(), SNAPSHOT_METADATA_FILE)
                await run_blocking(tq.load_checkpoint, vetted)
        finally:
            shutil.rmtree(vetted, ignore_errors=True)
        logger.info("TransferQueue restored from %s", local_dir)
        return dict(meta.get("user_metadata", {}))

    async def close(self) -> None:
        """Owning client: shut TQ down (controller + storage units). Connect-only: just detach."""
        import transfer_queue as tq

        if self._closed:
            return
        self._closed = True
        if self.bootstrap:
            await run_blocking(tq.close)
            logger.info("TransferQueue shut down")
