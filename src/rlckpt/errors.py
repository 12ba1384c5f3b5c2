"""Exception hierarchy: every error rlckpt raises on purpose derives from RlckptError.

Messages name the step, the path and the cause, so a user can act on them without a debugger.
"""

from __future__ import annotations


class RlckptError(Exception):
    """Base of every error rlckpt raises on purpose."""


# --- store -------------------------------------------------------------------------------------


class StoreError(RlckptError):
    """A problem with the bundle store or a bundle in it."""


class StoreUnavailableError(StoreError):
    """The store URL cannot be reached (bad bucket, no server, no permission)."""


class StoreConfigError(StoreError, ValueError):
    """The store cannot be set up as given: empty or malformed URL, unknown protocol, missing filesystem
    package, an endpoint that is not an http(s) URL, unknown or ill-typed storage options, no credentials.
    Retrying does not help; the URL, the options or the environment must change."""


class InvalidPathError(StoreError, ValueError):
    """A relative path inside a bundle is unsafe (``..``, absolute, backslash, empty)."""


class InvalidStepError(StoreError, ValueError):
    """A step is negative or not an integer."""


class BundleExistsError(StoreError):
    """A committed bundle for this step already exists (or another writer won the race)."""


class UncommittedBundleError(StoreError):
    """The bundle has no valid COMMIT marker, or does not exist: it must not be read."""


class CorruptBundleError(StoreError):
    """A committed bundle fails verification: names the file and what differs."""


class NewerFormatError(StoreError):
    """A store record (manifest, COMMIT) is of a format newer than this rlckpt reads: written by a newer
    rlckpt. One line naming the record, its format and the version that wrote it. Not corruption: the
    bundle is neither read nor taken for corrupt (no fallback past it, no quarantine); upgrade to read it."""


class UnsafeContentError(CorruptBundleError):
    """A file of a bundle holds what rlckpt will not deserialize, whatever its digest says: a pickle that
    names a global outside the allowlist for that file, or bytes not in the format that file must have.
    Names the file (and the item inside it) and the global; nothing of it was loaded. Digests prove a
    bundle intact, not who wrote it, so this is how a bundle forged by someone who can write the run's
    storage is refused (docs/security.md)."""


class SignatureError(CorruptBundleError):
    """A store with a verify key refuses a bundle it cannot prove the key's holder committed for this run:
    the bundle does not verify, like a corrupt one (a resume passes over it loudly, retention never counts
    it), though its bytes may be intact. One line naming the step and why (docs/security.md)."""


class UnsignedBundleError(SignatureError):
    """The bundle's COMMIT carries no signature (written without a signing key, or before COMMIT format 3)."""


class BadSignatureError(SignatureError):
    """The bundle's COMMIT carries a signature the verify key does not accept: made by another key, not
    over this COMMIT (a bit flipped, the bundle moved to another step), or for another run."""


class RunIdentityError(StoreError):
    """A run is another run than the one asked for: its run record (`_run.json`) names another id, so the
    bundles signed for the one would not verify in the other (a replica must take its source's record)."""


class TransactionStateError(StoreError):
    """A transaction was used after commit/abort, or committed twice."""


class UnsafeStoreError(StoreError):
    """The server does not enforce create-exclusive writes, so exclusivity cannot be promised."""


class ParticipantError(StoreError):
    """A multi-participant commit was refused: a participant missing, duplicated or joined without sealing
    (it could still write into the bundle), a receipt of another transaction or malformed, or two writers
    claiming one path (the same file, or a file where another path needs a directory). Nothing is
    published. Also: a second process joining a transaction under a name already in it."""


class UnreadableBundleError(StoreError):
    """A commit was refused because readers would refuse the bundle it was about to publish: its manifest
    over the cap readers accept (too many files, too much metadata) or not in a form they accept. Nothing
    is published, and the step can be saved again."""


class SharedStorageError(StoreError):
    """A participant cannot see the transaction's staging dir: on local disk every participant must share
    one filesystem (NFS, Lustre, ...); an object store needs nothing shared."""


class LostWriteError(StoreError):
    """A file a transaction wrote is missing, resized or joined by a stranger before COMMIT: nothing is
    committed (gc or another writer touched what this transaction owns)."""


class ReplicaError(StoreError):
    """A replica (a committed bundle copied to another store under its own txid, its COMMIT and manifest
    carried verbatim) cannot be committed: the files copied are not the manifest's (one missing, extra, of
    another size or digest), or the records are not of the transaction's step and txid. Nothing is
    published, and the copy can be tried again."""


class MalformedRecordError(StoreError, ValueError):
    """A store record (the write-ahead intent) is not in the form this rlckpt writes: a field missing, of
    another type, unknown, or a format it does not read. Names the record and the field. An intent that
    does not read still holds its step: it ages by its modification time (docs/store-protocol.md)."""


class UnsafeObjectError(StoreError):
    """An object in a run cannot be read safely: larger than its cap, or not a regular file."""


class OversizedObjectError(UnsafeObjectError):
    """A metadata object (COMMIT, manifest, intent) is larger than the cap for its kind."""


class IrregularFileError(UnsafeObjectError):
    """A path inside a run on local disk is a symlink, FIFO, socket or device, not a regular file."""


# --- signing keys --------------------------------------------------------------------------------


class KeyFileError(RlckptError, ValueError):
    """A signing or verify key file cannot be used: missing, not a regular file, a private key that group
    or others may read or write, not a PEM Ed25519 key of the kind asked for, or (keygen) a key file
    already there. One line naming the file; never any key material. The command line or the file must
    change (the CLI exits 64)."""


# --- data plane ----------------------------------------------------------------------------------


class DataPlaneError(RlckptError):
    """A data-plane (TransferQueue) operation failed or was refused."""


class MissingSamplesError(DataPlaneError, KeyError):
    """Rows asked for are not in the data plane; names the missing keys."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class RestoreRefusedError(DataPlaneError):
    """A data-plane restore was refused: the data plane was already touched, or a load failed."""


# --- Ray cluster ---------------------------------------------------------------------------------


class ClusterError(RlckptError):
    """The Ray cluster a run starts or joins cannot run it."""


class ClusterUnavailableError(ClusterError):
    """No Ray cluster answers at the address given (nothing listens there, or no answer within the connect
    timeout), or joining it failed. A retry may help once the cluster is up."""


class ClusterConfigError(ClusterError, ValueError):
    """The cluster cannot hold what the run asks for, or the address cannot name one: a malformed address, a
    resource no node offers, more trainer ranks than its nodes hold. The command line (or the cluster) must
    change; retrying does not help."""


# --- replay buffer -------------------------------------------------------------------------------


class ReplayError(RlckptError):
    """A replay-buffer index problem."""


class InventoryMismatchError(ReplayError):
    """The data plane's rows differ from the replay index; lists what is missing and extra."""


class ReplayStateError(ReplayError):
    """A replay index cannot be loaded: a field missing, of another type or unknown (named with its path),
    a format this rlckpt does not read, or a digest, partition or group size mismatch."""


# --- controller / checkpoint ------------------------------------------------------------------


class CheckpointError(RlckptError):
    """A save or restore of a whole run bundle failed."""


class SaveFailedError(CheckpointError):
    """A save of the run failed and the run stops: a periodic save with ``--save-failure stop``, or the
    final save of a stopping run (there is no next step to try again)."""


class RestoreOrderError(CheckpointError):
    """An object was built out of the asserted restore order."""


class BundleFormatError(CheckpointError):
    """A bundle's run-bundle format cannot be resumed by this rlckpt: written by a newer one, or not by
    `rlckpt train` at all. One line naming the format, its writer and what to do instead."""


class ShardedCheckpointError(CheckpointError):
    """A DCP (torch.distributed.checkpoint) save or load through rlckpt.dcp cannot go on as asked: a
    bundle without `.metadata` under the prefix, ranks that opened different bundles, a writer used
    for a second save of its one transaction, an unsupported DCP mode. Names the step and the file."""


class ShardWriteError(CheckpointError):
    """One rank's write of its staged shards into a save's transaction failed (checkpoint/rank_save.py): on this
    rank, or on another one (DCP fails the write on every rank at once). Names the participant, the step and,
    in ``failures``, each failing rank's cause in one line. This rank's files are dropped; the coordinator
    aborts the transaction, so nothing of the save is committed."""

    def __init__(self, message: str, failures: str = "") -> None:
        super().__init__(message)
        self.failures = failures or message  # "rank <r>: <Class>: <message>; ...", as the callers name them


class FinalSaveAbortedError(CheckpointError):
    """A run asked to save and stop (SIGTERM, a deadline) ran out of its grace period before its final
    save committed: that save was aborted (nothing of it committed, no intent or staging left) and the
    newest committed bundle is still the resume point. Names the step, the grace and that bundle."""

    def __init__(self, message: str, reason: str = "preempted", last_committed_step: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason  # why the run was stopping: "preempted" or "deadline"
        self.last_committed_step = last_committed_step


class CheckpointerError(CheckpointError):
    """A call of `rlckpt.Checkpointer` (save, wait, restore) failed on some rank of the job, and so on every
    rank: each raises it with the same message, naming the step, the rank(s) and the cause. A save that
    raises it committed nothing; a restore that raises it loaded nothing the caller may use."""


class SaveTimeoutError(CheckpointerError):
    """A Checkpointer save did not commit within the time `wait(timeout=...)` gave it (a stop's grace
    period): it was abandoned before its COMMIT (aborted: nothing of it committed, the newest committed
    bundle stays the resume point). Names the step and the time."""


class RankGroupError(CheckpointerError):
    """A collective of the Checkpointer's own gloo groups failed: a rank died, or did not reach the same
    call within the group's timeout (every rank must make the same Checkpointer calls in the same order).
    Names the call and the cause; a save in flight is aborted."""


class RankDiedError(RankGroupError):
    """A peer's connection closed in the middle of a collective: its process ended (killed, crashed, or
    exited without closing its Checkpointer), as gloo reports it within a second."""


class RankTimeoutError(RankGroupError):
    """A peer did not reach the same collective within the group's timeout (`group_timeout_s`): it is alive
    but elsewhere (another call, a hang, still uploading)."""


class ExtraPieceError(CheckpointerError, ValueError):
    """An extra piece of a Checkpointer save cannot be saved as a file no reader refuses: a name that is not
    1-64 of [A-Za-z0-9_-], a value that is neither plain JSON data nor tensors in plain containers (a custom
    object would need pickle), or one nested deeper than a restore reads. Names the piece, the path inside
    it and the type. Also the save's metrics or metadata that a restore would not read. Nothing is saved."""


class TrainerGroupError(CheckpointError):
    """A call to the trainer ranks failed: a rank raised, died, or did not answer within its timeout.
    Names the call (and its step) and each failed rank with its cause. A failed save of the policy
    aborts the whole transaction (nothing committed); a rank that died leaves the group unusable."""


# --- grpo ----------------------------------------------------------------------------------------


class GRPOError(RlckptError):
    """A problem in the tiny GRPO (policy, trainer, generation, dataloader)."""


class InvalidBatchError(GRPOError, ValueError):
    """Rollout rows or a training batch are malformed: names the field and what is wrong."""


class TrainerStateError(GRPOError, CheckpointError):
    """A saved trainer state cannot be loaded: wrong format, config, or tensor shapes."""


class LoaderStateError(GRPOError, CheckpointError):
    """A saved dataloader position cannot be loaded: a field missing, of another type or unknown (named with
    its path), a format this rlckpt does not read, or a position for another loader (seed, batch size or
    task differ)."""


class WeightsNotSetError(GRPOError):
    """A generation worker was asked to generate before it received any weights."""


class ExportError(CheckpointError):
    """An export of a bundle's tensors (`rlckpt export`, `rlckpt.export_safetensors`, `rlckpt.load_state`) cannot
    go on as asked: an output that exists and is not empty, a piece the bundle does not hold, a rename that
    gives two tensors one name. Nothing that looks complete is left at the output."""
